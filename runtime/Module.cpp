#include "runtime/Module.h"
#include "runtime/FaultInjection.h"

#include "runtime/Device.h"
#include "runtime/DriverApi.h"
#include "runtime/DriverError.h"

#include <cstdlib>
#include <cctype>
#include <cstdio>
#include <vector>

namespace flextile::runtime {

struct Module::State {
  cu::Module handle = nullptr;
  Device* device = nullptr;
  std::string name;
  std::string infoLog;
  double jitMilliseconds = 0;
  std::vector<std::string> entries;
  bool fromCubin = false;
  std::string cubinFallbackReason;
  std::string jitImage;
  std::string jitImageFailure;

  ~State() {
    if (!handle) return;
    cu::Result result = cu::api().ctxSetCurrent(static_cast<cu::Context>(device->context()));
    // A module dies with the mod whose kernels it holds, which may be right after an asynchronous
    // launch from it (a temporary BlockMask): let that work finish before its code is unloaded.
    // (Its own error, if any, is the launch's and was or will be reported by a checked call.)
    if (result == cu::kSuccess) {
      (void)cu::api().ctxSynchronize();
      result = cu::api().moduleUnload(handle);
    }
    if (result != cu::kSuccess && result != cu::kErrorDeinitialized)
      std::fprintf(stderr, "flextile: %s\n",
                   DriverError::format("cuModuleUnload", result, "module '" + name + "'").c_str());
  }
};

std::vector<std::string> ptxEntryNames(const std::string& ptx) {
  std::vector<std::string> names;
  const std::string keyword = ".entry";
  for (size_t at = ptx.find(keyword); at != std::string::npos; at = ptx.find(keyword, at + keyword.size())) {
    size_t begin = at + keyword.size();
    if (begin >= ptx.size() || !std::isspace(static_cast<unsigned char>(ptx[begin]))) continue;
    while (begin < ptx.size() && std::isspace(static_cast<unsigned char>(ptx[begin]))) ++begin;
    size_t end = begin;
    while (end < ptx.size() && (std::isalnum(static_cast<unsigned char>(ptx[end])) || ptx[end] == '_' ||
                                ptx[end] == '$' || ptx[end] == '.'))
      ++end;
    if (end > begin) names.push_back(ptx.substr(begin, end - begin));
  }
  return names;
}

namespace {
// A module's state before anything is loaded, its device made current.
std::shared_ptr<Module::State> newState(const std::string& ptx, const std::string& name, Device* device) {
  auto state = std::make_shared<Module::State>();
  state->device = device ? device : &Device::current();
  state->name = name;
  state->entries = ptxEntryNames(ptx);
  state->device->makeCurrent();
  return state;
}

// The JIT's options for cuModuleLoadDataEx and cuLinkCreate: it writes its logs into these buffers
// and the bytes it used back into the size slots (so the object stays where it was made).
struct JitLogs {
  static constexpr size_t kBytes = 64 * 1024;
  std::vector<char> info = std::vector<char>(kBytes, '\0'), error = std::vector<char>(kBytes, '\0');
  float wallMilliseconds = 0;
  cu::JitOption options[6] = {cu::kJitInfoLogBuffer,  cu::kJitInfoLogBufferSizeBytes, cu::kJitErrorLogBuffer,
                              cu::kJitErrorLogBufferSizeBytes, cu::kJitLogVerbose, cu::kJitWallTime};
  void* values[6] = {info.data(),
                     reinterpret_cast<void*>(static_cast<uintptr_t>(kBytes - 1)),
                     error.data(),
                     reinterpret_cast<void*>(static_cast<uintptr_t>(kBytes - 1)),
                     reinterpret_cast<void*>(static_cast<uintptr_t>(1)),
                     &wallMilliseconds};
  static constexpr unsigned count = 6;
  JitLogs() = default;
  JitLogs(const JitLogs&) = delete;
  JitLogs& operator=(const JitLogs&) = delete;
  // " + the JIT's error log" for an error message.
  std::string errorSuffix() const {
    std::string log = error.data();
    while (!log.empty() && std::isspace(static_cast<unsigned char>(log.back()))) log.pop_back();
    return log.empty() ? "; the JIT wrote no error log" : "; JIT error log:\n" + log;
  }
};
}  // namespace

namespace {
// FLEXTILE_JIT_LOG=1: the driver JIT's own report of each module it compiles (registers, spills,
// per entry), on stderr. The JIT may allocate otherwise than the offline ptxas (docs/performance.md).
void reportJitLog(const std::string& name, const std::string& info) {
  static const bool wanted = [] {
    const char* v = std::getenv("FLEXTILE_JIT_LOG");
    return v && *v && std::string(v) != "0";
  }();
  if (wanted) std::fprintf(stderr, "flextile: JIT log of module '%s':\n%s\n", name.c_str(), info.c_str());
}
}  // namespace

Module::Module(const std::string& ptx, const std::string& name, Device* device) : state_(newState(ptx, name, device)) {
  JitLogs logs;
  maybeInjectFault(FaultSite::ModuleLoad, name);
  cu::Module handle = nullptr;
  cu::Result result = cu::api().moduleLoadDataEx(&handle, ptx.c_str(), JitLogs::count, logs.options, logs.values);
  if (result != cu::kSuccess) {
    std::string context = "loading PTX module '" + name + "' (" + std::to_string(ptx.size()) + " bytes) for " +
                          state_->device->name() + " (sm_" + std::to_string(state_->device->capability()) + ")";
    throw DriverError("cuModuleLoadDataEx", result, context + logs.errorSuffix());
  }
  state_->handle = handle;
  state_->infoLog = logs.info.data();
  state_->jitMilliseconds = logs.wallMilliseconds;
  reportJitLog(name, state_->infoLog);
}

Module Module::jitKeepingImage(const std::string& ptx, const std::string& name, Device* device) {
  Module m;
  m.state_ = newState(ptx, name, device);
  const cu::Api& api = cu::api();
  JitLogs logs;
  const std::string where = "JIT-compiling PTX module '" + name + "' (" + std::to_string(ptx.size()) + " bytes) for " +
                            m.state_->device->name() + " (sm_" + std::to_string(m.state_->device->capability()) + ")";
  cu::LinkState link = nullptr;
  cu::check(api.linkCreate(JitLogs::count, logs.options, logs.values, &link), "cuLinkCreate_v2", where);
  // The image belongs to the link state: copied out before it is destroyed, on every path.
  struct Destroy {
    cu::LinkState link;
    ~Destroy() { (void)cu::api().linkDestroy(link); }
  } destroyLater{link};
  auto fail = [&](const char* function, cu::Result result) {
    throw DriverError(function, result, where + logs.errorSuffix());
  };
  // The driver reads the PTX up to its terminating zero (the size counts it).
  if (cu::Result r = api.linkAddData(link, cu::kJitInputPtx, const_cast<char*>(ptx.c_str()), ptx.size() + 1,
                                     name.c_str(), 0, nullptr, nullptr);
      r != cu::kSuccess)
    fail("cuLinkAddData_v2", r);
  void* image = nullptr;
  size_t imageBytes = 0;
  if (cu::Result r = api.linkComplete(link, &image, &imageBytes); r != cu::kSuccess) fail("cuLinkComplete", r);
  m.state_->jitImage.assign(static_cast<const char*>(image), imageBytes);
  cu::Module handle = nullptr;
  cu::check(api.moduleLoadDataEx(&handle, m.state_->jitImage.data(), 0, nullptr, nullptr), "cuModuleLoadDataEx",
            "loading the cubin the JIT made of '" + name + "'");
  m.state_->handle = handle;
  m.state_->infoLog = logs.info.data();
  m.state_->jitMilliseconds = logs.wallMilliseconds;
  reportJitLog(name, m.state_->infoLog);
  return m;
}

Module Module::fromCompiled(const std::string& ptx, const std::string& cubin, const std::string& name, Device* device,
                            bool keepJitImage) {
  auto jit = [&] {
    if (!keepJitImage) return Module(ptx, name, device);
    try {
      return jitKeepingImage(ptx, name, device);
    } catch (const DriverError& e) {
      // Keeping the cubin is an optimization: a linker that fails must not fail the load. The plain
      // JIT runs instead and throws its own error (with its log) if the PTX itself is at fault.
      Module plain(ptx, name, device);
      plain.state_->jitImageFailure = e.what();
      return plain;
    }
  };
  if (cubin.empty()) return jit();
  maybeInjectFault(FaultSite::ModuleLoad, name);
  Module m;
  m.state_ = newState(ptx, name, device);
  cu::Module handle = nullptr;
  const cu::Result result = cu::api().moduleLoadDataEx(&handle, cubin.data(), 0, nullptr, nullptr);
  if (result == cu::kSuccess) {
    m.state_->handle = handle;
    m.state_->fromCubin = true;
    return m;
  }
  Module fallback = jit();
  fallback.state_->cubinFallbackReason = DriverError::format(
      "cuModuleLoadDataEx", result, "the cubin of '" + name + "' (" + std::to_string(cubin.size()) + " bytes) for " +
                                        fallback.state_->device->name() + " (sm_" +
                                        std::to_string(fallback.state_->device->capability()) + ")");
  return fallback;
}

const std::string& Module::jitImage() const { return state_->jitImage; }
const std::string& Module::jitImageFailure() const { return state_->jitImageFailure; }

bool Module::loadedFromCubin() const { return state_->fromCubin; }
const std::string& Module::cubinFallbackReason() const { return state_->cubinFallbackReason; }

const std::string& Module::name() const { return state_->name; }
const std::string& Module::infoLog() const { return state_->infoLog; }
double Module::jitMilliseconds() const { return state_->jitMilliseconds; }
const std::vector<std::string>& Module::entryNames() const { return state_->entries; }

Kernel Module::function(const std::string& name) const {
  Device* device = state_->device;
  device->makeCurrent();
  const cu::Api& api = cu::api();
  cu::Function function = nullptr;
  if (cu::Result result = api.moduleGetFunction(&function, state_->handle, name.c_str()); result != cu::kSuccess) {
    std::string entries;
    for (const std::string& entry : state_->entries) entries += (entries.empty() ? "" : ", ") + entry;
    throw DriverError("cuModuleGetFunction", result,
                      "no kernel '" + name + "' in module '" + state_->name + "' (its entries: " +
                          (entries.empty() ? "none" : entries) + ")");
  }

  Kernel kernel;
  kernel.module_ = state_;
  kernel.function_ = function;
  kernel.device_ = device;
  kernel.name_ = name;
  std::string where = "kernel '" + name + "'";
  auto attribute = [&](cu::FunctionAttribute which, const char* what) {
    int value = 0;
    cu::check(api.funcGetAttribute(&value, which, function), "cuFuncGetAttribute", where + ", " + what);
    return value;
  };
  KernelAttributes& attributes = kernel.attributes_;
  attributes.registersPerThread = attribute(cu::kFuncNumRegs, "registers");
  attributes.localBytesPerThread = attribute(cu::kFuncLocalSizeBytes, "local memory");
  attributes.staticSharedBytes = attribute(cu::kFuncSharedSizeBytes, "static shared memory");
  attributes.constBytes = attribute(cu::kFuncConstSizeBytes, "constant memory");
  attributes.maxThreadsPerBlock = attribute(cu::kFuncMaxThreadsPerBlock, "max threads per block");
  attributes.ptxVersion = attribute(cu::kFuncPtxVersion, "PTX version");
  attributes.binaryVersion = attribute(cu::kFuncBinaryVersion, "binary version");
  kernel.dynamicSharedLimit_ =
      std::make_shared<std::atomic<int>>(attribute(cu::kFuncMaxDynamicSharedSizeBytes, "max dynamic shared memory"));
  kernel.limits_ = kernel.computeLimits();
  return kernel;
}

}  // namespace flextile::runtime
