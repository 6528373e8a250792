#include "dsl/Kernel.h"

#include "codegen/CompileCache.h"
#include "codegen/Ptxas.h"
#include "dsl/Capture.h"
#include "ir/Hash.h"
#include "ir/Interpreter.h"
#include "ir/Passes.h"
#include "ir/Verifier.h"
#include "runtime/Device.h"
#include "runtime/DeviceBuffer.h"
#include "runtime/Module.h"
#include "runtime/Stream.h"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory_resource>
#include <string_view>

namespace flextile::dsl {

KernelArg::KernelArg(const runtime::DeviceBuffer& b) : kind_(Kind::Device), device_(b.address()), bytes_(b.bytes()) {}

KernelArg::KernelArg(const Tensor& t) {
  if (!t.defined()) throw Error("kernel argument: an empty Tensor");
  if (t.isHost()) {
    kind_ = Kind::Host;
    host_ = t.hostData();
  } else {
    kind_ = Kind::Device;
    device_ = t.deviceAddress();
  }
  bytes_ = t.extentBytes();
}

KernelArg KernelArg::deviceAddress(uint64_t address, size_t bytes) {
  KernelArg a;
  a.kind_ = Kind::Device;
  a.device_ = address;
  a.bytes_ = bytes;
  return a;
}

std::string KernelArg::describe() const {
  switch (kind_) {
    case Kind::Device: return "a device buffer of " + std::to_string(bytes_) + " bytes";
    case Kind::Host: return "a host buffer of " + std::to_string(bytes_) + " bytes";
    case Kind::Integer: return "the integer " + std::to_string(integer_);
    case Kind::Real: return "the number " + std::to_string(real_);
  }
  return "?";
}

struct Kernel::Compiled {
  codegen::CompiledKernel code;
  std::unique_ptr<runtime::Module> module;  // loaded on first run
  std::optional<runtime::Kernel> function;
  runtime::TensorMapCache tensorMapCache;   // the last maps of code.tensorMaps, per recipe
  // The kernel waits for its prior grids itself (dsl wait_for_prior_grids: griddepcontrol.wait in
  // its PTX), so it is launched with programmatic stream serialization.
  bool programmaticLaunch = false;
  // The programs of its thread block cluster (cluster_all_gather: .reqnctapercluster in its PTX);
  // grid axis 0 must be a multiple of it.
  int64_t clusterSize = 1;
};

struct Kernel::RecentLaunch {
  // The launch options a trace is chosen by (constantsKey's fields).
  std::vector<int64_t> constants;
  int numWarps = 0, numStages = 0;
  bool tma = false, warpSpecialize = false, reassociate = false;
  const Traced* traced = nullptr;
  // What else the launch key holds (compiled): the specialization and the code generator's target.
  std::vector<int64_t> divisibility, ones;
  const runtime::Device* device = nullptr;
  std::string settings;
  Compiled* compiled = nullptr;

  bool sameTrace(const LaunchOptions& o) const {
    return numWarps == o.num_warps && numStages == o.num_stages && tma == o.tma && warpSpecialize == o.warp_specialize &&
           reassociate == o.reassociate && constants == o.constants;
  }
};

namespace {
// Enough for a template's few specializations launched in turn (a decode's kernel, a forward's
// main and merge kernels, a backward's three).
constexpr size_t kRecentLaunches = 8;
}  // namespace

Kernel::Kernel(std::string name, Tracer tracer, size_t numConstants)
    : name_(std::move(name)), tracer_(std::move(tracer)), numConstants_(numConstants) {}
Kernel::~Kernel() = default;
Kernel::Kernel(Kernel&& o) noexcept
    : name_(std::move(o.name_)), tracer_(std::move(o.tracer_)), numConstants_(o.numConstants_),
      traces_(std::move(o.traces_)), cache_(std::move(o.cache_)), launches_(std::move(o.launches_)),
      recent_(std::move(o.recent_)) {}

std::unique_ptr<ir::Function> Kernel::trace(const TraceOptions& options) const {
  return traceWithCaptures(options).function;
}

Kernel::Traced Kernel::traceWithCaptures(const TraceOptions& options) const {
  if (options.constants.size() != numConstants_)
    throw Error("kernel '" + name_ + "': expects " + std::to_string(numConstants_) + " Const<> values, got " +
                std::to_string(options.constants.size()));
  if (options.num_warps < 1 || options.num_warps > 16 || (options.num_warps & (options.num_warps - 1)))
    throw Error("kernel '" + name_ + "': num_warps must be 1, 2, 4, 8 or 16, got " + std::to_string(options.num_warps));
  Traced t;
  t.function = std::make_unique<ir::Function>(name_);
  ir::Function& f = *t.function;
  if (options.num_stages < 1 || options.num_stages > 4)
    throw Error("kernel '" + name_ + "': num_stages must be 1, 2, 3 or 4, got " + std::to_string(options.num_stages));
  f.attrs()["num_warps"] = int64_t(options.num_warps);
  f.attrs()["num_stages"] = int64_t(options.num_stages);
  if (options.tma) f.attrs()["tma"] = int64_t(1);
  if (options.warp_specialize) f.attrs()["warp_specialize"] = int64_t(1);
  if (options.reassociate) f.attrs()["reassociate"] = int64_t(1);
  {
    TraceContext ctx(f);
    tracer_(f, options.constants);
    ctx.builder().setInsertionPointToEnd(&f.body());
    ctx.builder().setLoc({});
    ctx.builder().ret();
    size_t captured = 0;
    for (const CaptureParams& c : ctx.captures()) {
      t.captures.push_back(c.slot);
      captured += captureParamCount(*c.slot);
    }
    t.ownParams = f.params().size() - captured;
  }
  // FLEXTILE_CANONICAL_ORDER=1: the traced order no longer depends on the host compiler
  // (ir/passes/CanonicalOrder.cpp); opt-in until its kernels are timed.
  if (const char* e = std::getenv("FLEXTILE_CANONICAL_ORDER"); e && std::string_view(e) == "1") ir::canonicalOrder(f);
  ir::verify(f);
  t.paramKinds.reserve(f.params().size());
  for (const auto* p : f.params()) {
    const ir::Type& type = p->type();
    t.paramKinds.push_back(type.isPointer()                ? ParamKind::Pointer
                           : !ir::isInteger(type.dtype())  ? ParamKind::Number
                           : type.dtype() == DType::I32    ? ParamKind::I32
                                                           : ParamKind::OtherInteger);
  }
  return t;
}

namespace {

// Largest power of two (up to 16) dividing v: what the code generator may
// assume about an argument (Triton's divisible-by-16 specialization).
int64_t divisibility(uint64_t v) { return v == 0 ? 16 : int64_t(1) << std::min(std::countr_zero(v), 4); }

// Compiling accepts either kind of buffer (only alignment matters); running
// needs device buffers, interpreting host ones.
enum class ArgMode { Device, Host, Either };

void checkArgs(const std::string& name, const ir::Function& f, const std::vector<KernelArg>& args, ArgMode mode) {
  if (args.size() != f.params().size())
    throw Error("kernel '" + name + "': expects " + std::to_string(f.params().size()) + " run-time arguments, got " +
                std::to_string(args.size()));
  for (size_t i = 0; i < args.size(); ++i) {
    const ir::Type& t = f.params()[i]->type();
    const KernelArg& a = args[i];
    auto bad = [&](const std::string& want) {
      throw Error("kernel '" + name + "': argument " + std::to_string(i) + " (" + t.str() + ") expects " + want +
                  ", got " + a.describe());
    };
    if (t.isPointer()) {
      if (mode == ArgMode::Device && a.kind() != KernelArg::Kind::Device) bad("a device buffer");
      if (mode == ArgMode::Host && a.kind() != KernelArg::Kind::Host)
        bad("a host buffer (std::vector or std::span)");
      if (a.kind() != KernelArg::Kind::Device && a.kind() != KernelArg::Kind::Host) bad("a buffer");
    } else if (ir::isInteger(t.dtype())) {
      if (a.kind() != KernelArg::Kind::Integer) bad("an integer");
      if (t.dtype() == DType::I32 && (a.integer() < INT32_MIN || a.integer() > INT32_MAX)) bad("an i32 value");
    } else if (a.kind() != KernelArg::Kind::Real && a.kind() != KernelArg::Kind::Integer) {
      bad("a number");
    }
  }
}

// Appends `sep` and the decimal digits of x, without a temporary string: the keys below are
// formed on every launch from dozens of integers.
void appendInt(std::string& k, char sep, int64_t x) {
  char digits[24];
  digits[0] = sep;
  const auto [end, ec] = std::to_chars(digits + 1, digits + sizeof digits, x);
  k.append(digits, size_t(end - digits));
}

std::string constantsKey(const LaunchOptions& o) {
  std::string k;
  k.reserve(16 + 12 * o.constants.size());
  appendInt(k, 'w', o.num_warps);
  appendInt(k, 's', o.num_stages);
  if (o.tma) k += 't';
  if (o.warp_specialize) k += 'p';
  if (o.reassociate) k += 'r';
  for (auto c : o.constants) appendInt(k, ',', c);
  return k;
}

}  // namespace

namespace {
// The launch options that select the trace of these trace options (the trace cache's key), and
// the trace options a launch's trace is made with: the fields both share.
LaunchOptions asLaunch(const TraceOptions& o) {
  return {.constants = o.constants, .num_warps = o.num_warps, .num_stages = o.num_stages, .tma = o.tma,
          .warp_specialize = o.warp_specialize, .reassociate = o.reassociate};
}
TraceOptions asTrace(const LaunchOptions& o) {
  return {.constants = o.constants, .num_warps = o.num_warps, .num_stages = o.num_stages, .tma = o.tma,
          .warp_specialize = o.warp_specialize, .reassociate = o.reassociate};
}
}  // namespace

const Kernel::Traced& Kernel::tracedEntry(const LaunchOptions& options) {
  return tracedEntry(options, constantsKey(options));
}

const Kernel::Traced& Kernel::tracedEntry(const LaunchOptions& options, const std::string& key) {
  std::lock_guard lock(mutex_);
  auto it = traces_.find(key);
  if (it == traces_.end()) it = traces_.emplace(key, traceWithCaptures(asTrace(options))).first;
  return it->second;
}

const ir::Function& Kernel::traced(const LaunchOptions& options) { return *tracedEntry(options).function; }

const ir::Function& Kernel::cachedTrace(const TraceOptions& options) { return traced(asLaunch(options)); }

std::vector<std::shared_ptr<CaptureSlot>> Kernel::captures(const TraceOptions& options) {
  return tracedEntry(asLaunch(options)).captures;
}

size_t Kernel::numTraces() const {
  std::lock_guard lock(mutex_);
  return traces_.size();
}

size_t Kernel::numCompiled() const {
  std::lock_guard lock(mutex_);
  return cache_.size();
}

std::vector<KernelArg> Kernel::withCaptures(const Traced& t, const std::vector<KernelArg>& args,
                                            std::optional<MemorySpace> space) {
  if (t.captures.empty()) return args;
  if (args.size() != t.ownParams)
    throw Error("kernel '" + name_ + "': expects " + std::to_string(t.ownParams) +
                " run-time arguments (the captured tensors are passed automatically), got " +
                std::to_string(args.size()));
  std::vector<KernelArg> all = args;
  for (auto& a : captureArguments(t.captures, space, name_)) all.push_back(a);
  return all;
}

// What the code generator may assume about each argument (the attribute arg_divisibility).
static std::vector<int64_t> argumentDivisibility(const ir::Function& f, const std::vector<KernelArg>& args) {
  std::vector<int64_t> div;
  div.reserve(args.size());  // one allocation a launch, not one per doubling (seven at the decode's 40 arguments)
  for (size_t i = 0; i < args.size(); ++i) {
    const KernelArg& a = args[i];
    if (a.kind() == KernelArg::Kind::Device) div.push_back(divisibility(a.deviceAddress()));
    else if (a.kind() == KernelArg::Kind::Host) div.push_back(divisibility(reinterpret_cast<uintptr_t>(a.hostPointer())));
    else if (a.kind() == KernelArg::Kind::Integer && ir::isInteger(f.params()[i]->type().dtype()))
      div.push_back(divisibility(uint64_t(a.integer())));
    else div.push_back(1);
  }
  return div;
}

// The integer arguments equal to 1, which a specialization treats as the constant 1 (as Triton
// does): a captured tensor's unit stride then leaves its gathers' addresses contiguous, so they
// load as vectors (the document mask's per-key ids), and products by 1 fold away.
static std::vector<int64_t> argumentsEqualToOne(const ir::Function& f, const std::vector<KernelArg>& args) {
  std::vector<int64_t> ones;
  for (size_t i = 0; i < args.size() && i < f.params().size(); ++i)
    if (args[i].kind() == KernelArg::Kind::Integer && ir::isInteger(f.params()[i]->type().dtype()) &&
        f.params()[i]->type().isScalar() && args[i].integer() == 1)
      ones.push_back(int64_t(i));
  return ones;
}

Kernel::Compiled& Kernel::compiled(const LaunchOptions& options, const std::vector<KernelArg>& args,
                                   std::optional<codegen::Target> target) {
  const std::string key = constantsKey(options);
  return compiled(options, args, target, *tracedEntry(options, key).function, key);
}

Kernel::Compiled& Kernel::compiled(const LaunchOptions& options, const std::vector<KernelArg>& args,
                                   std::optional<codegen::Target> target, const ir::Function& f,
                                   const std::string& constants) {
  const std::vector<int64_t> div = argumentDivisibility(f, args);
  const std::vector<int64_t> ones = argumentsEqualToOne(f, args);
  if (!target) {
    auto& dev = runtime::Device::current();
    target = codegen::Target::fromCapability(dev.capabilityMajor(), dev.capabilityMinor());
  }
  // The launch key is cheap to form; the structural hash is taken only when
  // a new specialization is compiled.
  // The wgmma switches change the code of one specialization (tests and
  // benchmarks compare both within a process).
  const std::string& settings = codegen::codegenSwitches();
  std::string launchKey = constants;
  launchKey.reserve(launchKey.size() + 64 + settings.size() + 4 * div.size());
  launchKey += '|';
  launchKey += target->smName();
  launchKey += settings;
  for (auto d : div) appendInt(launchKey, ',', d);
  for (auto i : ones) {
    launchKey += ",=1";
    appendInt(launchKey, '@', i);
  }
  {
    std::lock_guard lock(mutex_);
    if (auto it = launches_.find(launchKey); it != launches_.end()) return *it->second;
  }
  auto spec = f.clone();
  spec->attrs()["arg_divisibility"] = div;
  if (!ones.empty()) {
    // The parameters stay (the launch passes them); their uses read a constant 1 instead.
    spec->attrs()["arg_equal_to_one"] = ones;
    ir::Block& body = spec->body();
    for (int64_t i : ones) {
      ir::Value* param = spec->params()[size_t(i)];
      ir::Value* one = body.insert(body.ops().begin(), spec->createOp(ir::OpKind::Constant, {}, {param->type()},
                                                                      {{"value", int64_t(1)}}, {}))
                           ->result();
      spec->replaceAllUsesWith(param, one);
    }
  }
  const uint64_t hash = ir::structuralHash(*spec);
  const std::string key = std::to_string(hash) + "/" + target->smName() + settings;
  {
    std::lock_guard lock(mutex_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      launches_[launchKey] = it->second.get();
      return *it->second;
    }
  }
  // Compiled without the lock, so the autotuner's threads compile configs of
  // one kernel in parallel; two threads racing on one key both compile and the
  // first entry stays.
  auto c = std::make_unique<Compiled>();
  // The disk layer (codegen/CompileCache.h) below this in-memory one.
  // Which kernels the offline ptxas assembles, so that the launch loads its cubin rather than the
  // driver JIT's (codegen/Ptxas.h: by default the warp-specialized ones, which the JIT spills).
  const codegen::OfflineAssembly assembly = codegen::offlineAssembly();
  codegen::CompileOptions compileOptions{*target};
  compileOptions.runPtxas = assembly == codegen::OfflineAssembly::Always;
  compileOptions.runPtxasIfWarpSpecialized = assembly == codegen::OfflineAssembly::WarpSpecialized;
  c->code = codegen::compileCached(*spec, hash, compileOptions,
                                   codegen::CompileCache::global());
  std::lock_guard lock(mutex_);
  auto it = cache_.emplace(key, std::move(c)).first;
  launches_[launchKey] = it->second.get();
  return *it->second;
}

const codegen::CompiledKernel& Kernel::compile(const LaunchOptions& options, const std::vector<KernelArg>& given,
                                               std::optional<codegen::Target> target) {
  const auto args = withCaptures(tracedEntry(options), given, std::nullopt);
  checkArgs(name_, traced(options), args, ArgMode::Either);
  return compiled(options, args, target).code;
}

// Which machine code a launch loads, best first: the ptxas cubin the autotuner assembled (it is
// the binary whose registers and spills were judged), else the cubin the driver's JIT made of this
// PTX on this GPU and driver in an earlier process (codegen/CompileCache.h), else the PTX, JIT-
// compiled through the driver's linker so that its cubin goes into the compile cache entry.
// FLEXTILE_DRIVER_CUBINS=0 turns driver cubins off (neither read nor kept): the path before they
// existed, for bench/first_call.sh's comparison.
void Kernel::loadModule(Compiled& c) {
  const codegen::CompiledKernel& code = c.code;
  runtime::Device& device = runtime::Device::current();
  const std::string identity = device.codeIdentity();
  codegen::CompileCache& cache = codegen::CompileCache::global();
  static const bool driverCubins = [] {
    const char* v = std::getenv("FLEXTILE_DRIVER_CUBINS");
    return !(v && (std::string_view(v) == "0" || std::string_view(v) == "off"));
  }();
  const codegen::DriverCubin* kept = code.cubin.empty() && driverCubins ? code.driverCubinFor(identity) : nullptr;
  const std::string& image = kept ? kept->image : code.cubin;
  const bool keepJitImage = driverCubins && cache.enabled() && code.irHash != 0;
  auto module = std::make_unique<runtime::Module>(
      runtime::Module::fromCompiled(code.ptx, image, code.name, &device, keepJitImage));
  if (kept && !module->cubinFallbackReason().empty())
    std::fprintf(stderr,
                 "flextile: warning: the driver refused the cached cubin of kernel '%s' (%s); JIT-compiled its PTX "
                 "instead and replaced the cubin\n",
                 code.name.c_str(), module->cubinFallbackReason().c_str());
  if (!module->jitImageFailure().empty())
    std::fprintf(stderr, "flextile: warning: kernel '%s': the driver's linker failed (%s); JIT-compiled its PTX the "
                 "plain way, and its cubin is not kept\n", code.name.c_str(), module->jitImageFailure().c_str());
  if (!module->jitImage().empty())
    cache.storeDriverCubin(codegen::CompileCacheKey{code.irHash, code.target}, code.ptx,
                           codegen::DriverCubin{identity, module->jitImage()});
  c.function = module->function(code.name);
  c.programmaticLaunch = code.ptx.find("griddepcontrol.wait") != std::string::npos;
  if (const size_t at = code.ptx.find(".reqnctapercluster "); at != std::string::npos)
    c.clusterSize = std::strtoll(code.ptx.c_str() + at + std::strlen(".reqnctapercluster "), nullptr, 10);
  c.module = std::move(module);
}

namespace {
// A recipe's tensor map for these arguments: dims and strides innermost first, strides in bytes.
runtime::TensorMapDesc tensorMapDesc(const std::string& kernel, const codegen::TensorMapRecipe& r,
                                     const std::vector<KernelArg>& args) {
  auto value = [&](const codegen::TensorMapOperand& o) -> int64_t {
    return o.param >= 0 ? args[size_t(o.param)].integer() : o.constant;
  };
  runtime::TensorMapDesc d;
  d.globalAddress = args[size_t(r.baseParam)].deviceAddress();
  switch (r.dtype) {
    case DType::BF16: d.dtype = runtime::TensorMapDType::BF16; break;
    case DType::F16: d.dtype = runtime::TensorMapDType::F16; break;
    case DType::F32: d.dtype = runtime::TensorMapDType::F32; break;
    case DType::I32: d.dtype = runtime::TensorMapDType::I32; break;
    default: throw Error("kernel '" + kernel + "': no TMA tensor map for " + std::string(ir::dtypeName(r.dtype)) + " elements");
  }
  const size_t rank = r.dims.size();
  const int64_t eb = ir::byteWidth(r.dtype);
  for (size_t k = rank; k-- > 0;) {
    const int64_t dim = value(r.dims[k]);
    if (dim < 1)
      throw Error("kernel '" + kernel + "': the tensor of TMA map " + r.str() + " has dim " + std::to_string(k) + " = " +
                  std::to_string(dim) + "; TMA needs at least 1");
    d.globalDims.push_back(uint64_t(dim));
    d.boxDims.push_back(uint32_t(r.box[k]));
  }
  for (size_t k = rank - 1; k-- > 0;) d.globalStrides.push_back(uint64_t(value(r.strides[k]) * eb));
  d.swizzle = r.swizzleBytes == 128  ? runtime::TensorMapSwizzle::Bytes128
              : r.swizzleBytes == 64 ? runtime::TensorMapSwizzle::Bytes64
              : r.swizzleBytes == 32 ? runtime::TensorMapSwizzle::Bytes32
                                     : runtime::TensorMapSwizzle::None;
  d.l2Promotion = runtime::TensorMapL2Promotion::Bytes256;
  return d;
}

template <class Encode>
runtime::TensorMap encodeNamed(const std::string& kernel, const codegen::TensorMapRecipe& r, Encode&& encode) {
  try {
    return encode();
  } catch (const std::exception& e) {
    throw Error("kernel '" + kernel + "': its TMA tensor map (" + r.str() + ") cannot describe these arguments: " + e.what());
  }
}
}  // namespace

runtime::TensorMap encodeTensorMap(const std::string& kernel, const codegen::TensorMapRecipe& r,
                                   const std::vector<KernelArg>& args) {
  runtime::TensorMapDesc d = tensorMapDesc(kernel, r, args);
  return encodeNamed(kernel, r, [&] { return runtime::TensorMap(std::move(d)); });
}

const Kernel::Traced* Kernel::recentTrace(const LaunchOptions& options) const {
  for (const RecentLaunch& r : recent_)
    if (r.sameTrace(options)) return r.traced;
  return nullptr;
}

Kernel::Compiled* Kernel::recentCompiled(const Traced& traced, std::span<const int64_t> divisibility,
                                         std::span<const int64_t> ones, const runtime::Device* device,
                                         const std::string& settings) const {
  // One trace per constantsKey: the same trace is the same launch options' fields.
  for (const RecentLaunch& r : recent_)
    if (r.traced == &traced && r.device == device && std::ranges::equal(r.divisibility, divisibility) &&
        std::ranges::equal(r.ones, ones) &&
        r.settings == settings)
      return r.compiled;
  return nullptr;
}

void Kernel::runArgs(const LaunchOptions& options, const std::vector<KernelArg>& given) {
  const Traced* recent;
  {
    std::lock_guard lock(mutex_);
    recent = recentTrace(options);
  }
  std::string key;
  if (!recent) key = constantsKey(options);
  const Traced& t = recent ? *recent : tracedEntry(options, key);
  std::vector<KernelArg> withCaptured;  // the given ones are used as they are where nothing was captured
  if (!t.captures.empty()) withCaptured = withCaptures(t, given, MemorySpace::Device);
  const std::vector<KernelArg>& args = t.captures.empty() ? given : withCaptured;
  // One pass over the arguments by their parameters' kinds: checked, and the launch key's facts
  // (what argumentDivisibility and argumentsEqualToOne give) formed; checkArgs says what is wrong
  // when one does not fit. Every launch does this for its forty-odd arguments, so its scratch
  // lives on the stack: no allocation for up to a hundred-odd arguments.
  std::array<std::byte, 4096> stack;
  std::pmr::monotonic_buffer_resource arena(stack.data(), stack.size());
  std::pmr::vector<int64_t> div(&arena), ones(&arena);
  div.reserve(args.size());
  bool fits = args.size() == t.paramKinds.size();
  for (size_t i = 0; fits && i < args.size(); ++i) {
    const KernelArg& a = args[i];
    switch (t.paramKinds[i]) {
      case ParamKind::Pointer:
        fits = a.kind() == KernelArg::Kind::Device;
        div.push_back(divisibility(a.deviceAddress()));
        break;
      case ParamKind::I32:
        fits = a.kind() == KernelArg::Kind::Integer && a.integer() >= INT32_MIN && a.integer() <= INT32_MAX;
        [[fallthrough]];
      case ParamKind::OtherInteger:
        fits = fits && a.kind() == KernelArg::Kind::Integer;
        div.push_back(divisibility(uint64_t(a.integer())));
        if (a.integer() == 1) ones.push_back(int64_t(i));
        break;
      case ParamKind::Number:
        fits = a.kind() == KernelArg::Kind::Real || a.kind() == KernelArg::Kind::Integer;
        div.push_back(1);
        break;
    }
  }
  if (!fits) {
    checkArgs(name_, *t.function, args, ArgMode::Device);
    throw Error("kernel '" + name_ + "': the arguments do not fit its parameters");  // (checkArgs names which)
  }
  for (int a = 0; a < 3; ++a)
    if (options.grid[a] < 1 || options.grid[a] > (a == 0 ? INT32_MAX : 65535))
      throw Error("kernel '" + name_ + "': grid dimension " + std::to_string(a) + " is " +
                  std::to_string(options.grid[a]) + ", outside what CUDA allows");
  // Every field of compiled's launch key, as values (the target follows from the device). The
  // device is asked for after the checks: their errors name the arguments, not a missing driver.
  const runtime::Device* device = &runtime::Device::current();
  const std::string& settings = codegen::codegenSwitches();
  Compiled* found;
  {
    std::lock_guard lock(mutex_);
    found = recentCompiled(t, div, ones, device, settings);
  }
  if (!found) {
    if (key.empty()) key = constantsKey(options);
    found = &compiled(options, args, std::nullopt, *t.function, key);
    std::lock_guard lock(mutex_);
    recent_.insert(recent_.begin(), RecentLaunch{options.constants, options.num_warps, options.num_stages, options.tma,
                                                 options.warp_specialize, options.reassociate, &t,
                                                 {div.begin(), div.end()}, {ones.begin(), ones.end()}, device,
                                                 settings, found});
    if (recent_.size() > kRecentLaunches) recent_.pop_back();
  }
  Compiled& c = *found;
  const codegen::CompiledKernel& code = c.code;
  {
    std::lock_guard lock(mutex_);
    if (!c.module) loadModule(c);
  }
  if (options.grid[0] % c.clusterSize != 0)
    throw Error("kernel '" + name_ + "': grid dimension 0 is " + std::to_string(options.grid[0]) +
                ", not a multiple of its thread block cluster's " + std::to_string(c.clusterSize) +
                " programs (cluster_all_gather)");
  // Kernel parameters in the ABI of codegen/Compiler.h (the driver copies them at the launch).
  std::pmr::vector<uint64_t> storage(args.size(), &arena);
  std::pmr::vector<void*> ptrs(args.size(), &arena);
  for (size_t i = 0; i < args.size(); ++i) {
    const ir::Type& t = code.params[i];
    void* slot = &storage[i];
    if (t.isPointer()) storage[i] = args[i].deviceAddress();
    else if (t.dtype() == DType::I32) *static_cast<int32_t*>(slot) = int32_t(args[i].integer());
    else if (t.dtype() == DType::I64) *static_cast<int64_t*>(slot) = args[i].integer();
    else {
      double v = args[i].kind() == KernelArg::Kind::Real ? args[i].real() : double(args[i].integer());
      *static_cast<float*>(slot) = float(v);
    }
    ptrs[i] = slot;
  }
  // The TMA tensor maps, from the arguments their recipes name (codegen/TensorMaps.h).
  std::vector<runtime::TensorMap> maps;
  maps.reserve(code.tensorMaps.size());
  for (size_t i = 0; i < code.tensorMaps.size(); ++i) {
    const codegen::TensorMapRecipe& r = code.tensorMaps[i];
    const runtime::TensorMapDesc d = tensorMapDesc(name_, r, args);
    maps.push_back(encodeNamed(name_, r, [&] { return c.tensorMapCache.get(i, d); }));
  }
  for (const runtime::TensorMap& m : maps) ptrs.push_back(const_cast<void*>(m.data()));
  c.function->launch({unsigned(options.grid[0]), unsigned(options.grid[1]), unsigned(options.grid[2])},
                     unsigned(code.threadsPerProgram()), unsigned(code.sharedBytes), ptrs.data(), options.stream,
                     c.programmaticLaunch);
}

// FLEXTILE_INTERPRET_AFTER_PASSES=<target> (sm_80, sm_90a, ...): the interpreter runs the IR after
// the compiler's tile passes for that target (codegen::tilePassPipeline: layouts, the pipeline's
// rings and async copies, wgmma's waits and resident tiles) instead of the traced IR, so host
// tests check what those passes write against the float64 references. The arguments specialize
// the IR as a compile for them would (arg_divisibility), so the passes decide as they would there.
static std::unique_ptr<ir::Function> afterTilePasses(const ir::Function& f, const std::vector<KernelArg>& args) {
  const char* name = std::getenv("FLEXTILE_INTERPRET_AFTER_PASSES");
  if (!name || !*name) return nullptr;
  const std::optional<codegen::Target> target = codegen::Target::fromName(name);
  if (!target) throw Error(std::string("FLEXTILE_INTERPRET_AFTER_PASSES names no known target: '") + name + "'");
  std::unique_ptr<ir::Function> g = f.clone();
  g->attrs()["arg_divisibility"] = argumentDivisibility(f, args);
  codegen::runTilePasses(*g, *target);
  return g;
}

void Kernel::interpretArgs(const LaunchOptions& options, const std::vector<KernelArg>& given) {
  const auto args = withCaptures(tracedEntry(options), given, MemorySpace::Host);
  const std::unique_ptr<ir::Function> passed = afterTilePasses(traced(options), args);
  const ir::Function* f = passed ? passed.get() : &traced(options);
  checkArgs(name_, *f, args, ArgMode::Host);
  std::vector<ir::InterpArg> iargs;
  for (size_t i = 0; i < args.size(); ++i) {
    const KernelArg& a = args[i];
    if (a.kind() == KernelArg::Kind::Host) iargs.push_back(ir::InterpArg::buffer(a.hostPointer(), a.bytes(), "arg" + std::to_string(i)));
    else if (a.kind() == KernelArg::Kind::Integer && ir::isInteger(f->params()[i]->type().dtype()))
      iargs.push_back(ir::InterpArg::integer(a.integer()));
    else iargs.push_back(ir::InterpArg::real(a.kind() == KernelArg::Kind::Real ? a.real() : double(a.integer())));
  }
  ir::interpret(*f, iargs, options.grid);
}

}  // namespace flextile::dsl
