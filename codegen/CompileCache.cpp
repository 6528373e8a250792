#include "codegen/CompileCache.h"
#include "codegen/LowerToLLVM.h"
#include "codegen/TensorCores.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <llvm/Config/llvm-config.h>
#include <llvm/Support/xxhash.h>

#include <atomic>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "codegen/NVPTXTarget.h"
#include "codegen/Ptxas.h"
#include "ir/Dump.h"
#include "ir/Hash.h"

#ifndef FLEXTILE_VERSION
#define FLEXTILE_VERSION "unknown"
#endif

namespace flextile::codegen {

namespace fs = std::filesystem;

namespace {

// Version 2: the checksum is xxh3 (FNV-1a, a multiply per byte, was a fifth of a warm hit).
constexpr const char* kMagic = "FLEXTILE-KERNEL 2\n";
constexpr std::string_view kMagicFamily = "FLEXTILE-KERNEL ";

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The build of this library: a rebuilt compiler must not read the kernels
// another build wrote, and FLEXTILE_VERSION alone does not change per build.
std::string buildIdentity() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&buildIdentity), &info) && info.dli_fname) {
    struct stat st {};
    if (::stat(info.dli_fname, &st) == 0)
      return std::to_string(st.st_size) + "-" + std::to_string(st.st_mtim.tv_sec) + "." +
             std::to_string(st.st_mtim.tv_nsec);
  }
  return "unknown";
}

bool envOff(const char* name) {
  const char* s = std::getenv(name);
  return s && (std::string_view(s) == "0" || std::string_view(s) == "off" || std::string_view(s) == "false");
}

// Dumps show stages as they are produced; a disk hit would produce none.
bool dumpsRequested() {
  for (const char* stage : {"ir", "passes", "llvm-lowered", "llvm", "ptx"})
    if (ir::dumpEnabled(stage)) return true;
  return false;
}

void warn(const std::string& message) { std::fprintf(stderr, "flextile: warning: %s\n", message.c_str()); }

// ---- entry format ------------------------------------------------------------
// kMagic, then fields "<name> <byte count>\n<bytes>\n", then
// "end <16 hex digits>\n": the xxh3 hash of everything before "end".

uint64_t checksum(std::string_view bytes) { return llvm::xxh3_64bits(llvm::StringRef(bytes.data(), bytes.size())); }

void putField(std::string& out, std::string_view name, std::string_view value) {
  out += name;
  out += ' ';
  out += std::to_string(value.size());
  out += '\n';
  out += value;
  out += '\n';
}

std::string typeText(const ir::Type& t) {
  if (!t.isScalar()) throw Error("compile cache: kernel parameter of tile type " + t.str());
  return t.isPointer() ? "ptr " + std::string(ir::dtypeName(t.pointee())) : std::string(ir::dtypeName(t.dtype()));
}

ir::Type parseTypeText(std::string_view s) {
  const bool pointer = s.starts_with("ptr ");
  if (pointer) s.remove_prefix(4);
  std::optional<ir::DType> d = ir::parseDType(s);
  if (!d) throw Error("unknown parameter dtype '" + std::string(s) + "'");
  return pointer ? ir::Type::pointer(*d) : ir::Type(*d);
}

// Who wrote an intact entry of another key or format, for the warning: its key text, or its
// header line.
std::string entryOrigin(std::string_view bytes) {
  const std::string_view keyField = "\nkey ";
  if (bytes.starts_with(kMagic)) {
    const size_t at = bytes.find(keyField);
    const size_t start = at == std::string_view::npos ? at : bytes.find('\n', at + 1);
    if (start != std::string_view::npos) {
      const size_t stop = bytes.find('\n', start + 1);
      if (stop != std::string_view::npos) return "key '" + std::string(bytes.substr(start + 1, stop - start - 1)) + "'";
    }
  }
  return "header '" + std::string(bytes.substr(0, std::min(bytes.find('\n'), size_t(40)))) + "'";
}

}  // namespace

static std::string skippedPassesIdentity() {
  std::string out = "; skips";
  for (const std::string& p : skippedLLVMPasses()) out += " " + p;
  return out + "; " + llvmPipeline();
}

std::string compilerVersion() {
  static const std::string v =
      std::string("flextile ") + FLEXTILE_VERSION + "; LLVM " + LLVM_VERSION_STRING + "; build " + buildIdentity() +
      (fpFusionEnabled() ? "" : "; no fp fusion") + skippedPassesIdentity();
  // The wgmma switches are read on every compile (tests and benchmarks flip
  // them within one process), so they are appended here rather than frozen.
  return v + codegenSwitches();
}

namespace {
std::string readCodegenSwitches() {
  std::string out = wgmmaSettingsIdentity();
  if (const char* e = std::getenv("FLEXTILE_BULK_REDUCE"); e && std::strcmp(e, "0") == 0) out += "; FLEXTILE_BULK_REDUCE=0";
  if (const char* e = std::getenv("FLEXTILE_BULK_TENSOR"); e && std::strcmp(e, "0") == 0)
    out += "; FLEXTILE_BULK_TENSOR=0";
  if (const char* e = std::getenv("FLEXTILE_RING_BARRIERS"); e && (!std::strcmp(e, "0") || !std::strcmp(e, "1")))
    out += std::string("; FLEXTILE_RING_BARRIERS=") + e;
  for (const char* name : {"FLEXTILE_DEFER_ACCUMULATION", "FLEXTILE_TMA", "FLEXTILE_PINGPONG", "FLEXTILE_WARP_SPECIALIZE",
                           "FLEXTILE_HOIST_INVARIANT_LOADS", "FLEXTILE_FOLD_SCALES", "FLEXTILE_REGROUP_SUMS", "FLEXTILE_PREFETCH_LOADS",
                           "FLEXTILE_HOIST_BARRIER_INITS", "FLEXTILE_TMA_IN_STAGING_LOOPS", "FLEXTILE_FOLD_INVARIANT_TERMS",
                           "FLEXTILE_STAGE_AT_FIRST_USE", "FLEXTILE_SHARE_RINGS", "FLEXTILE_EXP2_FTZ"})
    if (const char* e = std::getenv(name); e && (!std::strcmp(e, "0") || !std::strcmp(e, "1")))
      out += std::string("; ") + name + "=" + e;
  if (const std::string tree = reduceTreeSetting(); tree != "sum") out += "; FLEXTILE_REDUCE_TREE=" + tree;
  if (const char* e = std::getenv("FLEXTILE_EXP2_EMULATION"); e && *e) out += std::string("; FLEXTILE_EXP2_EMULATION=") + e;
  if (const char* e = std::getenv("FLEXTILE_PRODUCER_REGISTERS"); e && *e) out += std::string("; FLEXTILE_PRODUCER_REGISTERS=") + e;
  return out;
}
}  // namespace

uint64_t environmentGeneration() {
  struct Seen {
    std::vector<const char*> entries;  // the entries' addresses, without the null
    uint64_t generation = 0;
  };
  thread_local Seen kept;
  Seen& k = kept;  // one thread-local lookup
  std::vector<const char*>& seen = k.entries;
  uint64_t& generation = k.generation;
  const char* const* env = environ;
  size_t i = 0;
  if (env)
    while (i < seen.size() && env[i] == seen[i]) ++i;  // stops at a null too: `seen` holds none
  if (generation && i == seen.size() && (env ? env[i] == nullptr : seen.empty())) return generation;
  size_t n = 0;
  while (env && env[n]) ++n;
  seen.assign(env, env + n);
  return ++generation;
}

const std::string& codegenSwitches() {
  // Asked on every launch: two dozen getenv scans of the whole environment cost half a
  // microsecond there, so the answer is kept per thread and formed again only when the
  // environment changed (a test's setenv).
  thread_local KeptWhileEnvironmentStays<std::optional<std::string>> kept;
  std::optional<std::string>& switches = kept.get();
  if (!switches) switches = readCodegenSwitches();
  return *switches;
}

std::optional<fs::path> userCacheDirectory() {
  if (const char* d = std::getenv("FLEXTILE_CACHE_DIR"); d && *d) return fs::path(d);
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return fs::path(d) / "flextile";
  if (const char* d = std::getenv("HOME"); d && *d) return fs::path(d) / ".cache" / "flextile";
  return std::nullopt;
}

std::string CompileCacheKey::text() const {
  return "ir " + hex16(irHash) + "; target " + target.smName() + "; " + compiler + "; format 1";
}

std::string CompileCacheKey::fileName() const { return hex16(ir::hashText(text())) + ".ftk"; }

std::string serializeCompiledKernel(const CompileCacheKey& key, const CompiledKernel& k) {
  std::string out = kMagic;
  putField(out, "key", key.text());
  putField(out, "name", k.name);
  putField(out, "capability", std::to_string(k.target.capability));
  putField(out, "arch_specific", k.target.archSpecific ? "1" : "0");
  putField(out, "num_warps", std::to_string(k.numWarps));
  if (k.producerWarps) putField(out, "producer_warps", std::to_string(k.producerWarps));
  putField(out, "shared_bytes", std::to_string(k.sharedBytes));
  std::string params;
  for (const ir::Type& t : k.params) params += typeText(t) + "\n";
  putField(out, "params", params);
  putField(out, "tensor_maps", tensorMapRecipesText(k.tensorMaps));
  putField(out, "ir", k.ir);
  putField(out, "llvm", k.llvmIR);
  putField(out, "ptx", k.ptx);
  putField(out, "ptxas", k.ptxasInfo);
  putField(out, "cubin", k.cubin);
  // Optional fields (entries written before them parse as having none).
  for (size_t i = 0; i < k.driverCubins.size(); ++i) {
    putField(out, "driver_cubin_identity." + std::to_string(i), k.driverCubins[i].identity);
    putField(out, "driver_cubin." + std::to_string(i), k.driverCubins[i].image);
  }
  out += "end " + hex16(checksum(out)) + "\n";
  return out;
}

std::optional<CompiledKernel> parseCompiledKernel(const CompileCacheKey& key, std::string_view bytes) {
  const std::string_view magic = kMagic;
  if (!bytes.starts_with(magic)) {
    if (bytes.starts_with(kMagicFamily)) return std::nullopt;  // another format version: a miss, rewritten
    throw Error("not a FlexTile kernel file (bad header)");
  }
  // The checksum first: a truncated or altered file fails here.
  const size_t end = bytes.rfind("end ");
  if (end == std::string_view::npos || bytes.size() != end + 4 + 16 + 1 || bytes.back() != '\n')
    throw Error("truncated (no checksum line)");
  if (bytes.substr(end + 4, 16) != hex16(checksum(bytes.substr(0, end))))
    throw Error("checksum mismatch");
  std::map<std::string, std::string_view, std::less<>> fields;
  size_t pos = magic.size();
  while (pos < end) {
    const size_t space = bytes.find(' ', pos), newline = bytes.find('\n', pos);
    if (space == std::string_view::npos || newline == std::string_view::npos || space > newline)
      throw Error("malformed field header at byte " + std::to_string(pos));
    const std::string name(bytes.substr(pos, space - pos));
    size_t length = 0;
    try {
      length = std::stoull(std::string(bytes.substr(space + 1, newline - space - 1)));
    } catch (...) {
      throw Error("malformed length of field '" + name + "'");
    }
    const size_t start = newline + 1;
    if (start + length + 1 > end || bytes[start + length] != '\n') throw Error("field '" + name + "' overruns the file");
    fields[name] = bytes.substr(start, length);
    pos = start + length + 1;
  }
  auto field = [&](const char* name) -> std::string_view {
    auto it = fields.find(name);
    if (it == fields.end()) throw Error(std::string("missing field '") + name + "'");
    return it->second;
  };
  auto number = [&](const char* name) {
    try {
      return std::stoi(std::string(field(name)));
    } catch (const Error&) {
      throw;
    } catch (...) {
      throw Error(std::string("field '") + name + "' is not a number");
    }
  };
  if (field("key") != key.text()) return std::nullopt;
  CompiledKernel k;
  k.name = field("name");
  k.target = Target{number("capability"), number("arch_specific") != 0};
  k.numWarps = number("num_warps");
  if (fields.count("producer_warps")) k.producerWarps = number("producer_warps");  // optional: 0 when absent
  k.sharedBytes = number("shared_bytes");
  std::string_view params = field("params");
  while (!params.empty()) {
    const size_t nl = params.find('\n');
    if (nl == std::string_view::npos) throw Error("malformed params field");
    k.params.push_back(parseTypeText(params.substr(0, nl)));
    params.remove_prefix(nl + 1);
  }
  // Entries written before TMA had no tensor maps.
  if (auto it = fields.find("tensor_maps"); it != fields.end()) k.tensorMaps = parseTensorMapRecipesText(std::string(it->second));
  k.ir = field("ir");
  k.llvmIR = field("llvm");
  k.ptx = field("ptx");
  k.ptxasInfo = field("ptxas");
  k.cubin = field("cubin");
  for (size_t i = 0;; ++i) {
    auto identity = fields.find("driver_cubin_identity." + std::to_string(i));
    auto image = fields.find("driver_cubin." + std::to_string(i));
    if (identity == fields.end() && image == fields.end()) break;
    if (identity == fields.end() || image == fields.end())
      throw Error("driver cubin " + std::to_string(i) + " lacks its " + (identity == fields.end() ? "identity" : "image"));
    if (identity->second.empty() || image->second.empty())
      throw Error("driver cubin " + std::to_string(i) + " has an empty " + (identity->second.empty() ? "identity" : "image"));
    k.driverCubins.push_back({std::string(identity->second), std::string(image->second)});
  }
  if (k.ptx.empty() || k.name.empty()) throw Error("empty PTX or kernel name");
  if (!(k.target == key.target)) throw Error("target " + k.target.smName() + " differs from the key's");
  return k;
}

const DriverCubin* CompiledKernel::driverCubinFor(const std::string& identity) const {
  for (const DriverCubin& c : driverCubins)
    if (c.identity == identity) return &c;
  return nullptr;
}

void addDriverCubin(CompiledKernel& kernel, DriverCubin cubin) {
  std::vector<DriverCubin> kept{std::move(cubin)};
  for (DriverCubin& c : kernel.driverCubins)
    if (c.identity != kept.front().identity && kept.size() < kMaxDriverCubins) kept.push_back(std::move(c));
  kernel.driverCubins = std::move(kept);
}

CompileCache::CompileCache(fs::path dir) : dir_(std::move(dir)) {}

CompileCache& CompileCache::global() {
  static CompileCache cache([] {
    if (envOff("FLEXTILE_CACHE")) return fs::path();
    std::optional<fs::path> base = userCacheDirectory();
    return base ? *base / "kernels" : fs::path();
  }());
  return cache;
}

bool CompileCache::storeDriverCubin(const CompileCacheKey& key, const std::string& ptx, DriverCubin cubin) {
  if (!enabled()) return false;
  // Read again rather than trusting the caller's copy: another process may have added the cubin
  // of another GPU meanwhile (two writers racing keep one of the two, which costs a JIT later).
  std::optional<CompiledKernel> entry = load(key);
  if (!entry || entry->ptx != ptx) return false;
  addDriverCubin(*entry, std::move(cubin));
  const size_t failuresBefore = stats().storeFailures;
  store(key, *entry);
  return stats().storeFailures == failuresBefore;
}

CompileCache::Stats CompileCache::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

std::optional<CompiledKernel> CompileCache::load(const CompileCacheKey& key) {
  if (!enabled()) return std::nullopt;
  const fs::path path = pathOf(key);
  std::string bytes;
  {
    // One read of the whole file (a streambuf copy was a fifth of a warm hit).
    std::FILE* in = std::fopen(path.c_str(), "rb");
    if (!in) {
      std::lock_guard lock(mutex_);
      ++stats_.misses;
      return std::nullopt;
    }
    // The size of the file this handle opened, not of whatever the path names by now: another
    // thread or process may rename a new entry over it in between (a size taken from the path
    // read a shorter old file as a truncated new one, called it corrupt and rewrote it).
    struct stat st {};
    bytes.resize(::fstat(::fileno(in), &st) == 0 ? size_t(st.st_size) : 0);
    bytes.resize(std::fread(bytes.data(), 1, bytes.size(), in));
    std::fclose(in);
  }
  try {
    std::optional<CompiledKernel> k = parseCompiledKernel(key, bytes);
    std::lock_guard lock(mutex_);
    if (k) {
      ++stats_.hits;
      return k;
    }
    ++stats_.misses;
    ++stats_.foreign;
    // Intact, but another compiler (version, build or settings) or entry format wrote it: a
    // miss, said once per cache so that a rebuilt library does not print a line per kernel.
    if (!warnedForeign_)
      warn("compile cache entry " + path.string() + " was written by another FlexTile build or format (" +
           entryOrigin(bytes) + "); recompiling and overwriting it (further such entries are replaced silently)");
    warnedForeign_ = true;
    return std::nullopt;
  } catch (const Error& e) {
    warn("compile cache entry " + path.string() + " is corrupt (" + e.what() + "); recompiling and overwriting it");
    std::lock_guard lock(mutex_);
    ++stats_.corrupt;
    ++stats_.misses;
    return std::nullopt;
  }
}

void CompileCache::store(const CompileCacheKey& key, const CompiledKernel& kernel) {
  if (!enabled()) return;
  static std::atomic<uint64_t> counter{0};
  const fs::path path = pathOf(key);
  std::string why;
  try {
    const std::string bytes = serializeCompiledKernel(key, kernel);
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) throw Error("cannot create " + dir_.string() + ": " + ec.message(), ErrorKind::Io);
    // A name no other thread or process uses, in the same folder (rename is
    // atomic only within one file system).
    const fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid()) + "." +
                         std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id())) + "." +
                         std::to_string(counter++);
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), std::streamsize(bytes.size()));
      out.close();
      if (!out) {
        fs::remove(tmp, ec);
        throw Error("cannot write " + tmp.string(), ErrorKind::Io);
      }
    }
    fs::rename(tmp, path, ec);
    if (ec) {
      fs::remove(tmp, ec);
      throw Error("cannot rename into " + path.string() + ": " + ec.message(), ErrorKind::Io);
    }
  } catch (const Error& e) {
    why = e.what();
  }
  std::lock_guard lock(mutex_);
  if (why.empty()) {
    ++stats_.stores;
    return;
  }
  ++stats_.storeFailures;
  if (!warnedStore_) warn("compile cache: " + why + " (kernels are not kept on disk)");
  warnedStore_ = true;
}

CompiledKernel compileCached(const ir::Function& f, uint64_t irHash, const CompileOptions& options,
                             CompileCache& cache) {
  if (!cache.enabled() || dumpsRequested()) return compile(f, options);
  const auto start = std::chrono::steady_clock::now();
  const CompileCacheKey key{irHash, options.target};
  if (std::optional<CompiledKernel> hit = cache.load(key)) {
    const bool wantsPtxas = options.runPtxas || (options.runPtxasIfWarpSpecialized && hit->producerWarps > 0);
    if (wantsPtxas && hit->ptxasInfo.empty()) {
      PtxasReport report = runPtxas(hit->ptx, hit->target);
      hit->ptxasInfo = report.log;
      hit->cubin = report.cubin;
      cache.store(key, *hit);
    }
    hit->fromCache = true;
    hit->irHash = irHash;
    hit->compileMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return *hit;
  }
  CompiledKernel k = compile(f, options);
  k.irHash = irHash;
  cache.store(key, k);
  return k;
}

}  // namespace flextile::codegen
