#include "autotune/TuneCache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <tuple>

#include "codegen/CompileCache.h"
#include "dsl/Tensor.h"
#include "ir/Hash.h"
#include "runtime/Device.h"

#ifndef FLEXTILE_VERSION
#define FLEXTILE_VERSION "unknown"
#endif

namespace flextile::autotune {

namespace fs = std::filesystem;

namespace {
constexpr const char* kFormat = "flextile-autotune-cache 1";

void warn(const std::string& m) { std::fprintf(stderr, "flextile: warning: %s\n", m.c_str()); }
}  // namespace

std::optional<GpuIdentity> currentGpu() {
  static const std::optional<GpuIdentity> gpu = []() -> std::optional<GpuIdentity> {
    if (!dsl::deviceAvailable()) return std::nullopt;
    try {
      runtime::Device& d = runtime::Device::current();
      return GpuIdentity{d.name(), d.capability(), d.driverVersion()};
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }();
  return gpu;
}

int64_t lengthBucket(int64_t L, int64_t S) {
  int64_t b = 128;
  while (b < std::max(L, S)) b *= 2;
  return b;
}

namespace {
// What both templates' keys hold, through the GQA ratio. The hash decides (it covers the mods'
// bodies and captured dtypes/ranks); the names and capture signature are in the text for people
// reading the file.
std::string commonKey(const attention::FlexAttentionProblem& p, const GpuIdentity& gpu, const char* templateName) {
  const std::string mods = p.scoreMod + "|" + p.maskMod + "|" + p.captures;
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(p.modHash));
  return gpu.name + " sm" + std::to_string(gpu.capability) + " driver " + std::to_string(gpu.driver) + " flextile " +
         FLEXTILE_VERSION + " " + templateName + " mods " + hash + " (" + mods + ") " +
         std::string(ir::dtypeName(p.dtype)) + " D" + std::to_string(p.D) +
         // v's own head dim where it differs (keys of equal dims unchanged)
         (p.valueDim() != p.D ? " DV" + std::to_string(p.valueDim()) : std::string()) + " gqa" +
         std::to_string(p.Hkv ? p.Hq / p.Hkv : 0);
}
}  // namespace

std::string tuneKey(const attention::FlexAttentionProblem& p, const GpuIdentity& gpu) {
  return commonKey(p, gpu, "flex_attention_fwd") + " len" + std::to_string(lengthBucket(p.L, p.S));
}

std::string backwardTuneKey(const attention::FlexAttentionProblem& p, const GpuIdentity& gpu) {
  return commonKey(p, gpu, "flex_attention_bwd") + " len" + std::to_string(lengthBucket(p.L, p.S));
}

namespace {
// The decode key's buckets: queries (next power of two), KV length, B x KV heads (next power of two).
std::tuple<int64_t, int64_t, int64_t> decodeBuckets(const attention::FlexAttentionProblem& p) {
  int64_t queries = 1, groups = 1;
  while (queries < p.L) queries *= 2;
  while (groups < p.B * p.Hkv) groups *= 2;
  return {queries, lengthBucket(1, p.S), groups};
}
}  // namespace

std::string decodeTuneKey(const attention::FlexAttentionProblem& p, const GpuIdentity& gpu) {
  const auto [queries, length, groups] = decodeBuckets(p);
  return commonKey(p, gpu, "flex_attention_decode") + " q" + std::to_string(queries) + " len" +
         std::to_string(length) + " groups" + std::to_string(groups);
}

TuneCache::TuneCache(fs::path file, GpuIdentity gpu) : file_(std::move(file)), gpu_(std::move(gpu)) {}

fs::path TuneCache::defaultFile(const GpuIdentity& gpu) {
  std::string slug;
  for (char c : gpu.name) slug += std::isalnum(static_cast<unsigned char>(c)) ? char(std::tolower(c)) : '_';
  std::optional<fs::path> dir = codegen::userCacheDirectory();
  return dir ? *dir / "autotune" / (slug + "-sm" + std::to_string(gpu.capability) + ".json") : fs::path();
}

TuneCache* TuneCache::forCurrentGpu() {
  static std::unique_ptr<TuneCache> cache = []() -> std::unique_ptr<TuneCache> {
    std::optional<GpuIdentity> gpu = currentGpu();
    if (!gpu) return nullptr;
    fs::path file = defaultFile(*gpu);
    if (file.empty()) return nullptr;
    return std::make_unique<TuneCache>(file, *gpu);
  }();
  return cache.get();
}

// The entries of the file on disk; an absent file is empty, a damaged or foreign one is empty
// with `problem` saying why.
Json TuneCache::readEntries(std::string& problem) const {
  std::ifstream in(file_, std::ios::binary);
  if (!in) return Json::obj();
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    Json doc = parseJson(ss.str());
    const Json* format = doc.find("format");
    const Json* gpu = doc.find("gpu");
    const Json* cc = doc.find("capability");
    const Json* driver = doc.find("driver");
    const Json* entries = doc.find("entries");
    if (!format || format->string != kFormat) problem = "not a FlexTile autotune cache (format)";
    else if (!gpu || gpu->string != gpu_.name || !cc || int(cc->number) != gpu_.capability)
      problem = "written for another GPU (" + (gpu ? gpu->string : "?") + ")";
    else if (!driver || int(driver->number) != gpu_.driver)
      problem = "written under driver " + (driver ? std::to_string(int(driver->number)) : "?") + ", now " +
                std::to_string(gpu_.driver);
    else if (!entries || !entries->isObject()) problem = "no entries object";
    else return *entries;
  } catch (const Error& e) {
    problem = std::string("corrupt: ") + e.what();
  }
  return Json::obj();
}

void TuneCache::loadLocked() {
  if (loaded_) return;
  loaded_ = true;
  std::string problem;
  entries_ = readEntries(problem);
  generation_.fetch_add(1, std::memory_order_release);
  if (!problem.empty())
    warn("autotune cache " + file_.string() + " is " + problem + "; ignoring it (it is rebuilt on the next tune)");
}

namespace {
// A config's three-way choices (WarpSpecialization, LoopSchedule: Auto, Off, On) as entry fields:
// "on" or "off", absent for Auto (and anything else read back is Auto).
template <class Choice>
Choice choiceOf(const Json& entry, const char* key) {
  const Json* v = entry.find(key);
  if (!v || v->kind != Json::Kind::String) return Choice::Auto;
  return v->string == "on" ? Choice::On : v->string == "off" ? Choice::Off : Choice::Auto;
}
template <class Choice>
void putChoice(Json& entry, const char* key, Choice c) {
  if (c != Choice::Auto) entry.object[key] = Json::str(c == Choice::On ? "on" : "off");
}
}  // namespace

std::optional<Json> TuneCache::entry(const std::string& key) {
  std::lock_guard lock(mutex_);
  loadLocked();
  const Json* e = entries_.find(key);
  return e ? std::optional<Json>(*e) : std::nullopt;
}

namespace {
double numberIn(const Json& entry, const char* key) {
  const Json* v = entry.find(key);
  return v && v->kind == Json::Kind::Number ? v->number : -1.0;
}

// A tile's fields (the forward's entries hold them at the top level, the backward's under "dkdv"
// and "dq"); nullopt for a damaged one.
std::optional<attention::FlexAttentionConfig> tileOf(const Json& e) {
  attention::FlexAttentionConfig c{int64_t(numberIn(e, "block_m")), int64_t(numberIn(e, "block_n")),
                                   int(numberIn(e, "num_warps")), int(numberIn(e, "num_stages"))};
  c.warp_specialize = choiceOf<attention::WarpSpecialization>(e, "warp_specialize");
  c.turns = choiceOf<attention::LoopSchedule>(e, "turns");
  c.defer = choiceOf<attention::LoopSchedule>(e, "defer");
  c.persistent = choiceOf<attention::LoopSchedule>(e, "persistent");
  c.skew = choiceOf<attention::LoopSchedule>(e, "skew");
  c.overlap = choiceOf<attention::LoopSchedule>(e, "overlap");
  if (c.block_m <= 0 || c.block_n <= 0 || c.num_warps <= 0 || c.num_stages <= 0) return std::nullopt;
  return c;
}

void putTile(Json& e, const attention::FlexAttentionConfig& c) {
  e.object["block_m"] = Json::num(double(c.block_m));
  e.object["block_n"] = Json::num(double(c.block_n));
  e.object["num_warps"] = Json::num(c.num_warps);
  e.object["num_stages"] = Json::num(c.num_stages);
  putChoice(e, "warp_specialize", c.warp_specialize);
  putChoice(e, "turns", c.turns);
  putChoice(e, "defer", c.defer);
  putChoice(e, "persistent", c.persistent);
  putChoice(e, "skew", c.skew);
  putChoice(e, "overlap", c.overlap);
}

// The fields every entry has after its config.
template <class Tuned>
void readTimes(const Json& e, Tuned& t) {
  t.ms = numberIn(e, "ms");
  t.defaultMs = numberIn(e, "default_ms");
  if (const Json* s = e.find("shape")) t.shape = s->string;
}
template <class Tuned>
void putTimes(Json& e, const Tuned& t) {
  e.object["ms"] = Json::num(t.ms);
  e.object["default_ms"] = Json::num(t.defaultMs);
  e.object["shape"] = Json::str(t.shape);
}
}  // namespace

std::optional<TunedConfig> TuneCache::find(const std::string& key) {
  const std::optional<Json> e = entry(key);
  if (!e || e->find("kernel")) return std::nullopt;  // a decode or backward entry is no forward config
  const std::optional<attention::FlexAttentionConfig> c = tileOf(*e);
  if (!c) return std::nullopt;  // a damaged entry: the default is used (the resolver also validates)
  TunedConfig t;
  t.config = *c;
  readTimes(*e, t);
  return t;
}

std::optional<TunedBackwardConfig> TuneCache::findBackward(const std::string& key) {
  const std::optional<Json> e = entry(key);
  if (!e) return std::nullopt;
  const Json *kernel = e->find("kernel"), *dkdv = e->find("dkdv"), *dq = e->find("dq");
  if (!kernel || kernel->string != "backward" || !dkdv || !dq) return std::nullopt;
  const std::optional<attention::FlexAttentionConfig> dkdvTile = tileOf(*dkdv), dqTile = tileOf(*dq);
  if (!dkdvTile || !dqTile) return std::nullopt;  // damaged: the default is used
  TunedBackwardConfig t;
  t.config = {*dkdvTile, *dqTile};
  readTimes(*e, t);
  return t;
}

std::optional<TunedDecodeConfig> TuneCache::findDecode(const std::string& key) {
  const std::optional<Json> e = entry(key);
  if (!e) return std::nullopt;
  auto num = [&](const char* k) { return numberIn(*e, k); };
  TunedDecodeConfig t;
  t.config.block_n = int64_t(num("block_n"));
  t.config.num_warps = int(num("num_warps"));
  t.config.num_stages = int(num("num_stages"));
  t.config.splits = int64_t(num("splits"));
  t.config.programs_per_sm = int(num("programs_per_sm"));
  t.config.cluster_merge = choiceOf<attention::LoopSchedule>(*e, "cluster_merge");
  t.config.warp_specialize = choiceOf<attention::WarpSpecialization>(*e, "warp_specialize");
  readTimes(*e, t);
  const Json* kernel = e->find("kernel");
  if (!kernel || kernel->string != "decode" || t.config.block_n <= 0 || t.config.num_warps <= 0 ||
      t.config.num_stages <= 0 || t.config.splits < 0 || t.config.programs_per_sm < 0)
    return std::nullopt;  // a damaged entry: the default is used (the resolver also validates)
  return t;
}

size_t TuneCache::size() {
  std::lock_guard lock(mutex_);
  loadLocked();
  return entries_.object.size();
}

namespace {
// An exclusive flock on `path` (created if absent) while alive; other processes block.
class FileLock {
 public:
  explicit FileLock(const fs::path& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error("cannot open the lock file " + path.string() + ": " + std::strerror(errno));
    while (::flock(fd_, LOCK_EX) != 0)
      if (errno != EINTR) {
        const int e = errno;
        ::close(fd_);
        throw Error("cannot lock " + path.string() + ": " + std::strerror(e));
      }
  }
  ~FileLock() { ::close(fd_); }  // closing releases the lock
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};
}  // namespace

bool TuneCache::put(const std::string& key, const TunedConfig& t) {
  Json e = Json::obj();
  putTile(e, t.config);
  putTimes(e, t);
  return store(key, std::move(e));
}

bool TuneCache::putBackward(const std::string& key, const TunedBackwardConfig& t) {
  Json e = Json::obj(), dkdv = Json::obj(), dq = Json::obj();
  e.object["kernel"] = Json::str("backward");
  putTile(dkdv, t.config.dkdv);
  putTile(dq, t.config.dq);
  e.object["dkdv"] = std::move(dkdv);
  e.object["dq"] = std::move(dq);
  putTimes(e, t);
  return store(key, std::move(e));
}

bool TuneCache::putDecode(const std::string& key, const TunedDecodeConfig& t) {
  Json e = Json::obj();
  e.object["kernel"] = Json::str("decode");
  e.object["block_n"] = Json::num(double(t.config.block_n));
  e.object["num_warps"] = Json::num(t.config.num_warps);
  e.object["num_stages"] = Json::num(t.config.num_stages);
  e.object["splits"] = Json::num(double(t.config.splits));
  e.object["programs_per_sm"] = Json::num(t.config.programs_per_sm);
  putChoice(e, "cluster_merge", t.config.cluster_merge);
  putChoice(e, "warp_specialize", t.config.warp_specialize);
  putTimes(e, t);
  return store(key, std::move(e));
}

bool TuneCache::store(const std::string& key, Json e) {
  std::lock_guard lock(mutex_);
  loadLocked();
  // Kept in memory whatever the disk says, so this process uses what it tuned.
  entries_.object[key] = std::move(e);
  generation_.fetch_add(1, std::memory_order_release);
  std::string why;
  try {
    std::error_code ec;
    fs::create_directories(file_.parent_path(), ec);
    if (ec) throw Error("cannot create " + file_.parent_path().string() + ": " + ec.message());
    // Every process rewrites the whole file: without the lock and the re-read, two processes
    // tuning at once each wrote the entries they had loaded plus their own, and the last rename
    // lost the other's (ConcurrencyThreads.TuneCachePutsFromManyThreadsAndObjectsKeepEveryEntry,
    // ConcurrencyProcesses.SharedCacheFolderKeepsEveryEntryIntact).
    FileLock fileLock(file_.string() + ".lock");
    std::string problem;  // a damaged or foreign file was warned about at load and is replaced
    for (auto& [k, v] : readEntries(problem).object)
      if (k != key) entries_.object[k] = v;
    Json doc = Json::obj();
    doc.object["format"] = Json::str(kFormat);
    doc.object["gpu"] = Json::str(gpu_.name);
    doc.object["capability"] = Json::num(gpu_.capability);
    doc.object["driver"] = Json::num(gpu_.driver);
    doc.object["flextile"] = Json::str(FLEXTILE_VERSION);
    doc.object["entries"] = entries_;
    const std::string text = doc.dump(2) + "\n";
    static std::atomic<int> counter{0};
    const fs::path tmp = file_.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << text;
      out.close();
      if (!out) {
        fs::remove(tmp, ec);
        throw Error("cannot write " + tmp.string());
      }
    }
    fs::rename(tmp, file_, ec);
    if (ec) {
      fs::remove(tmp, ec);
      throw Error("cannot replace " + file_.string() + ": " + ec.message());
    }
  } catch (const Error& err) {
    why = err.what();
  }
  if (why.empty()) return true;
  // The tuned config stays in memory: a cache that cannot be written is not an error.
  if (!warnedStore_) warn("autotune cache: " + why + " (tuned configs are kept in memory only)");
  warnedStore_ = true;
  return false;
}

void installResolver() {
  attention::setFlexAttentionConfigResolver(
      [](const attention::FlexAttentionProblem& p) -> std::optional<attention::FlexAttentionConfig> {
        if (p.space != dsl::MemorySpace::Device) return std::nullopt;  // the interpreter is not tuned
        TuneCache* cache = TuneCache::forCurrentGpu();
        if (!cache) return std::nullopt;
        std::optional<TunedConfig> t = cache->find(tuneKey(p, *currentGpu()));
        if (!t) return std::nullopt;
        return t->config;
      });
  attention::setFlexDecodeConfigResolver(
      [](const attention::FlexAttentionProblem& p) -> std::optional<attention::FlexDecodeConfig> {
        if (p.space != dsl::MemorySpace::Device) return std::nullopt;
        TuneCache* cache = TuneCache::forCurrentGpu();
        if (!cache) return std::nullopt;
        // A decode step asks every call; the key's text costs more than the rest of the lookup, so
        // each thread keeps its answers by the fields the key is made of, until the cache changes.
        using Fields = std::tuple<std::string, std::string, std::string, uint64_t, int, int64_t, int64_t, int64_t,
                                  std::tuple<int64_t, int64_t, int64_t>>;
        thread_local std::map<Fields, std::optional<attention::FlexDecodeConfig>> memo;
        thread_local uint64_t memoGeneration = ~uint64_t(0);
        if (const uint64_t g = cache->generation(); g != memoGeneration) {
          memo.clear();
          memoGeneration = g;
        }
        const Fields fields{p.scoreMod, p.maskMod, p.captures, p.modHash, int(p.dtype),
                            p.D, p.valueDim(), p.Hkv ? p.Hq / p.Hkv : 0, decodeBuckets(p)};
        if (auto it = memo.find(fields); it != memo.end()) return it->second;
        std::optional<TunedDecodeConfig> t = cache->findDecode(decodeTuneKey(p, *currentGpu()));
        return memo[fields] = t ? std::optional(t->config) : std::nullopt;
      },
      // With nothing tuned, a decode step builds no problem and no key.
      [] {
        TuneCache* cache = TuneCache::forCurrentGpu();
        return cache && cache->size() > 0;
      });
  attention::setFlexAttentionBackwardConfigResolver(
      [](const attention::FlexAttentionProblem& p) -> std::optional<attention::FlexAttentionBackwardConfig> {
        if (p.space != dsl::MemorySpace::Device) return std::nullopt;
        TuneCache* cache = TuneCache::forCurrentGpu();
        if (!cache) return std::nullopt;
        std::optional<TunedBackwardConfig> t = cache->findBackward(backwardTuneKey(p, *currentGpu()));
        if (!t) return std::nullopt;
        return t->config;
      });
}

namespace {
// Installed when libflextile loads, so flex_attention picks tuned configs
// without the program naming the autotuner.
const bool resolverInstalled [[maybe_unused]] = [] {
  const char* off = std::getenv("FLEXTILE_AUTOTUNE_CACHE");
  if (off && std::string_view(off) == "0") return false;
  installResolver();
  return true;
}();
}  // namespace

}  // namespace flextile::autotune
