// Many threads at once on the process-wide caches: flex_attention through the interpreter with
// different mods, shapes, dtypes and configs sharing the mods' trace and kernel caches, PTX
// compiles of the forward template sharing dsl::Kernel's in-memory cache and the disk compile
// cache, and the autotune cache. Every result is checked (the float64 reference, the PTX of a
// single-threaded compile); under ThreadSanitizer (scripts/sanitize.sh thread) any data race fails
// the run. Shapes stay tiny: TSan slows the interpreter about tenfold.
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "FlexAttentionBackwardCheck.h"
#include "FlexAttentionCheck.h"
#include "MaskTestUtil.h"
#include "PagedKVCheck.h"
#include "attention_templates/Variants.h"
#include "autotune/TuneCache.h"
#include "codegen/CompileCache.h"
#include "dsl/DSL.h"
#include "gpu/GpuTest.h"
#include "ir/Hash.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace flextile {
namespace {

namespace fs = std::filesystem;
using namespace flextile::attention;
using namespace flextile::testing;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

constexpr int kThreads = 8;

struct TempDir {
  fs::path path;
  TempDir() {
    std::random_device rd;
    path = fs::temp_directory_path() / ("flextile-threads-" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Runs body(thread) on kThreads threads released together, so the first touches of each cache
// (trace, compile, list upload) race.
template <class F>
void onThreads(F body) {
  std::barrier start(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t] {
      start.arrive_and_wait();
      body(t);
    });
  for (auto& th : pool) th.join();
}

struct SharedCase {
  std::string variant;
  AttentionCase shape;
  VariantInstance instance;
};

// Variants with captured tensors (alibi's slopes, bias's table, document's ids), a
// score-only mod (softcap) and structural masks; shapes not multiples of the blocks, GQA, all
// three dtypes.
std::vector<SharedCase> sharedCases(uint64_t seed) {
  const std::vector<AttentionCase> shapes = {
      {.B = 1, .Hq = 2, .Hkv = 1, .L = 37, .S = 53, .D = 32, .dtype = DType::BF16},
      {.B = 2, .Hq = 4, .Hkv = 2, .L = 45, .S = 45, .D = 64, .dtype = DType::F16},
      {.B = 1, .Hq = 2, .Hkv = 2, .L = 17, .S = 70, .D = 32, .dtype = DType::F32},
  };
  std::vector<SharedCase> out;
  for (const char* name : {"causal", "alibi", "softcap", "document", "bias"})
    for (const AttentionCase& c : shapes)
      out.push_back({name, c, variant(name).make({c.B, c.Hq, c.L, c.S, MemorySpace::Host, {32, 32}, seed})});
  return out;
}

TEST(ConcurrencyThreads, FlexAttentionWithSharedModsShapesAndDtypesMatchesTheReference) {
  SeededRandom rng;
  const uint64_t seed = rng();
  const std::vector<SharedCase> cases = sharedCases(seed);
  const std::vector<FlexAttentionConfig> configs = {{32, 16, 4, 2}, {32, 32, 4, 1}};
  std::atomic<int> checked{0};
  onThreads([&](int t) {
    std::mt19937_64 local(seed + uint64_t(t));
    for (int round = 0; round < 4; ++round) {
      // Neighbouring threads take the same case in the same round: the same mods, kernel and
      // mask lists at the same moment.
      const SharedCase& c = cases[size_t((t / 2 + round * 5) % int(cases.size()))];
      const FlexAttentionConfig config = configs[size_t((t + round) % 2)];
      SCOPED_TRACE("thread " + std::to_string(t) + " round " + std::to_string(round) + " seed " +
                   std::to_string(seed) + " variant " + c.variant);
      AttentionCase shape = c.shape;
      shape.context = c.variant;
      if (checkFlexAttention(local, shape, MemorySpace::Host, c.instance.score, c.instance.mask, c.instance.refScore,
                             c.instance.refMask, {.config = config}))
        ++checked;
    }
  });
  EXPECT_EQ(checked.load(), kThreads * 4);
}

// Threads that make their own mods of one variant (the same traced body: one structural hash)
// while others run: the mods' state and the forward-kernel cache keyed by it are shared.
TEST(ConcurrencyThreads, FreshModsOfOneVariantOnManyThreads) {
  SeededRandom rng;
  const uint64_t seed = rng();
  std::atomic<int> checked{0};
  onThreads([&](int t) {
    std::mt19937_64 local(seed + uint64_t(t));
    SCOPED_TRACE("thread " + std::to_string(t) + " seed " + std::to_string(seed));
    const int64_t L = 20 + 7 * t;
    VariantInstance inst = variant(t % 2 ? "sliding_window" : "prefix_lm").make({1, 2, L, L, MemorySpace::Host, {32, 32}, seed});
    AttentionCase c{.B = 1, .Hq = 2, .Hkv = 1, .L = L, .S = L, .D = 32, .dtype = t % 3 ? DType::BF16 : DType::F32};
    if (checkFlexAttention(local, c, MemorySpace::Host, inst.score, inst.mask, inst.refScore, inst.refMask,
                           {.config = FlexAttentionConfig{32, 16, 4, 2}}))
      ++checked;
  });
  EXPECT_EQ(checked.load(), kThreads);
}

// The other templates at once on shared mods: the decode template (a few queries, no config:
// split KV, GQA packing, its list and kernel caches), the backward (three kernels, the mods'
// reverse-mode traces) and the paged forward (its own kernel of the mods).
TEST(ConcurrencyThreads, DecodeBackwardAndPagedTemplatesOnManyThreads) {
  SeededRandom rng;
  const uint64_t seed = rng();
  const BlockSizes blocks{32, 32};
  const VariantInstance decodeMods = variant("alibi").make({2, 4, 3, 77, MemorySpace::Host, blocks, seed});
  const VariantInstance backwardMods = variant("softcap").make({1, 2, 33, 40, MemorySpace::Host, blocks, seed});
  const BlockMask pagedMask = causalBlockMask(1, 1, 45, 45, blocks, MemorySpace::Host);
  std::atomic<int> checked{0};
  onThreads([&](int t) {
    std::mt19937_64 local(seed + uint64_t(t));
    SCOPED_TRACE("thread " + std::to_string(t) + " seed " + std::to_string(seed));
    for (int round = 0; round < 2; ++round) {
      bool ok = false;
      switch ((t + round) % 3) {
        case 0: {
          AttentionCase c{.B = 2, .Hq = 4, .Hkv = 2, .L = 3, .S = 77, .D = 32, .dtype = DType::BF16, .context = "decode"};
          ok = checkFlexAttention(local, c, MemorySpace::Host, decodeMods.score, decodeMods.mask, decodeMods.refScore,
                                  decodeMods.refMask);
          break;
        }
        case 1: {
          AttentionCase c{.B = 1, .Hq = 2, .Hkv = 1, .L = 33, .S = 40, .D = 32, .dtype = DType::F32, .context = "backward"};
          BackwardCheck check;
          check.refScore = backwardMods.refScore;
          check.refScoreGrad = backwardMods.refScoreGrad;
          check.refMask = backwardMods.refMask;
          check.forwardConfig = FlexAttentionConfig{32, 16, 4, 2};
          check.options.config = FlexAttentionBackwardConfig{{16, 32, 4, 2}, {32, 16, 4, 2}};
          ok = checkBackward(local, c, MemorySpace::Host, backwardMods.score, backwardMods.mask, check);
          break;
        }
        default: {
          PagedCase c{.B = 2, .Hq = 4, .Hkv = 2, .L = 45, .D = 32, .pageSize = 16, .lengths = {45, 29}, .S = 45,
                      .dtype = DType::F16, .context = "paged"};
          ok = checkPaged(local, c, MemorySpace::Host, noop_score(), pagedMask, nullptr, refCausal(),
                          {.config = FlexAttentionConfig{32, 16, 4, 2}});
          break;
        }
      }
      if (ok) ++checked;
    }
  });
  EXPECT_EQ(checked.load(), kThreads * 2);
}

// Regression (TSan): variants() returned the registry itself and variant() a reference into a
// vector that registerVariant grew, so a variant registered on one thread while another looked
// one up or listed them was a data race, and a reallocation left the reader's reference dangling.
TEST(ConcurrencyThreads, RegisteringVariantsWhileOthersLookThemUp) {
  const size_t builtins = variants().size();
  constexpr int kPerThread = 40;
  std::atomic<int> lookups{0};
  onThreads([&](int t) {
    if (t % 2 == 0) {
      for (int i = 0; i < kPerThread; ++i)
        registerVariant({"concurrency_test_" + std::to_string(t) + "_" + std::to_string(i), "registered by a test",
                         [](const VariantInputs&) { return VariantInstance{}; }});
      return;
    }
    for (int i = 0; i < kPerThread; ++i) {
      const Variant& causal = variant("causal");
      EXPECT_EQ(causal.name, "causal");
      EXPECT_TRUE(causal.make({1, 1, 64, 64, MemorySpace::Host, {32, 32}, 1}).mask.has_value());
      size_t named = 0;
      for (const Variant& v : variants()) named += !v.name.empty();
      EXPECT_GE(named, builtins);
      ++lookups;
    }
  });
  EXPECT_EQ(lookups.load(), kThreads / 2 * kPerThread);
  EXPECT_EQ(variants().size(), builtins + size_t(kThreads / 2 * kPerThread));
  EXPECT_EQ(variant("concurrency_test_0_0").description, "registered by a test");
}

// The config hooks (detail::ResolverSlot) replaced while other threads' calls consult them: each
// plan takes the default or one of the two resolvers' configs, never a torn one, and a resolver
// that replaces the hooks from inside a call (as a tuner that installs its cache may) deadlocks
// nothing. Under ThreadSanitizer a slot read without its lock fails the run.
TEST(ConcurrencyThreads, ConfigResolversReplacedWhileCallsConsultThem) {
  const Tensor q = Tensor::zeros(DType::BF16, {1, 2, 64, 64}, MemorySpace::Host);
  const Tensor one = Tensor::zeros(DType::BF16, {1, 2, 1, 64}, MemorySpace::Host);
  const FlexAttentionConfig forwardDefault = plan_flex_attention(q, q, q, noop_score(), std::nullopt).config;
  const FlexDecodeConfig decodeDefault = plan_flex_decode(one, q, q, noop_score(), std::nullopt).config;
  const FlexAttentionConfig a{32, 32, 4, 2}, b{16, 32, 4, 1};
  const FlexDecodeConfig da{.block_n = 32, .num_warps = 4, .num_stages = 2, .splits = 2},
      db{.block_n = 16, .num_warps = 4, .num_stages = 3, .splits = 3};
  constexpr int kRounds = 60;
  std::atomic<int> planned{0};
  onThreads([&](int t) {
    for (int i = 0; i < kRounds; ++i) {
      if (t == 0) {
        const int which = i % 3;
        setFlexAttentionConfigResolver(which == 2 ? FlexAttentionConfigResolver{}
                                                  : [c = which ? b : a](const FlexAttentionProblem&) {
                                                      return std::optional<FlexAttentionConfig>(c);
                                                    });
        setFlexDecodeConfigResolver(which == 2 ? FlexDecodeConfigResolver{}
                                               : [c = which ? db : da](const FlexAttentionProblem&) {
                                                   return std::optional<FlexDecodeConfig>(c);
                                                 });
      } else if (t == 1 && i % 10 == 0) {
        // A resolver that empties the hooks while it answers.
        setFlexAttentionConfigResolver([a](const FlexAttentionProblem&) {
          setFlexAttentionConfigResolver({});
          return std::optional<FlexAttentionConfig>(a);
        });
      } else {
        const FlexAttentionConfig c = plan_flex_attention(q, q, q, noop_score(), std::nullopt).config;
        EXPECT_TRUE(c == forwardDefault || c == a || c == b) << c.describe();
        const FlexDecodeConfig d = plan_flex_decode(one, q, q, noop_score(), std::nullopt).config;
        EXPECT_TRUE(d == decodeDefault || d == da || d == db) << d.describe();
        ++planned;
      }
    }
  });
  setFlexAttentionConfigResolver({});
  setFlexDecodeConfigResolver({});
  EXPECT_GE(planned.load(), (kThreads - 2) * kRounds);
}

// PTX of the forward template for several (mods, config, target) at once, each key compiled by
// two threads together: the in-memory caches and the disk cache (this test binary's
// FLEXTILE_CACHE_DIR) must give both threads one kernel, and no torn entry may be read.
TEST(ConcurrencyThreads, ForwardTemplateCompilesToPtxOnManyThreads) {
  const int64_t L = 300, D = 64;
  Tensor q = Tensor::empty(DType::BF16, {1, 2, L, D}, MemorySpace::Host);
  Tensor k = Tensor::empty(DType::BF16, {1, 2, L, D}, MemorySpace::Host);
  const VariantInstance causal = variant("causal").make({1, 2, L, L, MemorySpace::Host, {64, 64}, 1});
  const VariantInstance softcap = variant("softcap").make({1, 2, L, L, MemorySpace::Host, {64, 64}, 1});
  struct Job {
    const VariantInstance* mods;
    FlexAttentionConfig config;
    codegen::Target target;
  };
  const std::vector<Job> jobs = {{&causal, {64, 64, 4, 2}, codegen::Target::sm80()},
                                 {&softcap, {64, 32, 4, 2}, codegen::Target::sm80()},
                                 {&causal, {64, 64, 4, 2}, codegen::Target::sm90a()},
                                 {&softcap, {64, 64, 4, 1}, codegen::Target::sm90a()}};
  const codegen::CompileCache::Stats before = codegen::CompileCache::global().stats();
  std::mutex mutex;
  std::map<size_t, std::vector<std::string>> ptx;  // per job, from every thread that compiled it
  onThreads([&](int t) {
    const size_t j = size_t(t) % jobs.size();
    const Job& job = jobs[j];
    const FlexAttentionPlan plan =
        plan_flex_attention(q, k, k, job.mods->score, job.mods->mask, {.config = job.config}, true, job.target);
    ASSERT_NE(plan.compiled, nullptr);
    std::lock_guard lock(mutex);
    ptx[j].push_back(plan.compiled->ptx);
  });
  const codegen::CompileCache::Stats after = codegen::CompileCache::global().stats();
  EXPECT_EQ(after.corrupt, before.corrupt) << "a torn entry was read";
  EXPECT_EQ(after.storeFailures, before.storeFailures);
  for (size_t j = 0; j < jobs.size(); ++j) {
    ASSERT_EQ(ptx[j].size(), size_t(kThreads) / jobs.size()) << "job " << j;
    for (const std::string& p : ptx[j]) {
      EXPECT_FALSE(p.empty());
      EXPECT_EQ(p, ptx[j][0]) << "job " << j << ": threads got different PTX for one key";
    }
  }
}

// The disk layer alone: every thread compiles the same few functions through one cache folder,
// the first wave racing to store, the second reading what the first stored.
TEST(ConcurrencyThreads, CompileCacheStoresAndLoadsOnManyThreads) {
  TempDir dir;
  codegen::CompileCache cache(dir.path);
  std::vector<std::unique_ptr<ir::Function>> functions;
  std::vector<uint64_t> hashes;
  std::vector<std::string> expected;
  for (int block : {64, 128, 256}) {
    dsl::Kernel scale = dsl::kernel("scale", [](dsl::Ptr<dsl::f32> x, dsl::Ptr<dsl::f32> y, dsl::Int n, dsl::Float a,
                                                dsl::Const<int> BLOCK) {
      auto offs = dsl::program_id(0) * BLOCK + dsl::arange(0, BLOCK);
      auto ok = offs < n;
      dsl::store(y + offs, dsl::load(x + offs, ok) * a, ok);
    });
    functions.push_back(scale.trace({.constants = {block}}));
    hashes.push_back(ir::structuralHash(*functions.back()));
    expected.push_back(codegen::compile(*functions.back(), {codegen::Target::sm80()}).ptx);
  }
  for (int wave = 0; wave < 2; ++wave)
    onThreads([&](int t) {
      for (size_t i = 0; i < functions.size(); ++i) {
        const size_t f = (i + size_t(t)) % functions.size();
        const codegen::CompiledKernel k =
            codegen::compileCached(*functions[f], hashes[f], {codegen::Target::sm80()}, cache);
        EXPECT_EQ(k.ptx, expected[f]) << "thread " << t << " wave " << wave;
        if (wave == 1) {
          EXPECT_TRUE(k.fromCache) << "thread " << t << ": the first wave's entry is missing";
        }
      }
    });
  const codegen::CompileCache::Stats s = cache.stats();
  EXPECT_EQ(s.corrupt, 0u);
  EXPECT_EQ(s.storeFailures, 0u);
  EXPECT_EQ(s.hits, size_t(kThreads) * functions.size() * 2 - s.misses);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    EXPECT_EQ(e.path().extension(), ".ftk") << "a temporary file was left behind: " << e.path();
    ++files;
  }
  EXPECT_EQ(files, functions.size());
}

// Regression: load() took the entry's size from the path after opening it, so an entry replaced
// between the two (a rewrite that completes ptxas output, or another process's store) was read
// short of a longer old file, called corrupt, warned about and overwritten. Writers here replace
// one key's entry with a shorter and a longer version while readers load it.
TEST(ConcurrencyThreads, ALoadRacingARewriteOfItsEntryIsNeverCorrupt) {
  TempDir dir;
  codegen::CompileCache cache(dir.path);
  dsl::Kernel scale = dsl::kernel("scale", [](dsl::Ptr<dsl::f32> x, dsl::Ptr<dsl::f32> y, dsl::Int n,
                                              dsl::Const<int> BLOCK) {
    auto offs = dsl::program_id(0) * BLOCK + dsl::arange(0, BLOCK);
    dsl::store(y + offs, dsl::load(x + offs, offs < n), offs < n);
  });
  auto f = scale.trace({.constants = {128}});
  const codegen::CompileCacheKey key{ir::structuralHash(*f), codegen::Target::sm80()};
  codegen::CompiledKernel shortEntry = codegen::compile(*f, {codegen::Target::sm80()});
  codegen::CompiledKernel longEntry = shortEntry;
  longEntry.ptxasInfo = std::string(256 * 1024, 'p');  // what a ptxas completion adds, and more
  cache.store(key, longEntry);
  std::atomic<bool> stop{false};
  std::atomic<int> loads{0};
  std::vector<std::thread> pool;
  for (int w = 0; w < 2; ++w)
    pool.emplace_back([&, w] {
      for (int i = 0; i < 300; ++i) cache.store(key, (i + w) % 2 ? shortEntry : longEntry);
      stop = true;
    });
  for (int r = 0; r < 4; ++r)
    pool.emplace_back([&] {
      while (!stop) {
        std::optional<codegen::CompiledKernel> k = cache.load(key);
        ASSERT_TRUE(k) << "an entry vanished while being replaced";
        EXPECT_TRUE(k->ptxasInfo.empty() || k->ptxasInfo == longEntry.ptxasInfo);
        ++loads;
      }
    });
  for (auto& th : pool) th.join();
  EXPECT_GT(loads.load(), 0);
  EXPECT_EQ(cache.stats().corrupt, 0u);
}

// Threads putting into one TuneCache, and two TuneCache objects on one file (as two processes
// would hold): every entry ends up in the file.
TEST(ConcurrencyThreads, TuneCachePutsFromManyThreadsAndObjectsKeepEveryEntry) {
  TempDir dir;
  const autotune::GpuIdentity gpu{"Test GPU", 90, 12080};
  const fs::path file = dir.path / "autotune" / "test.json";
  autotune::TuneCache a(file, gpu), b(file, gpu);
  onThreads([&](int t) {
    for (int i = 0; i < 5; ++i)
      EXPECT_TRUE((t % 2 ? a : b).put("key " + std::to_string(t) + "." + std::to_string(i),
                                      {{64, 32, 4, 1 + i % 3}, double(t), double(i), "B=1"}));
  });
  autotune::TuneCache reader(file, gpu);
  EXPECT_EQ(reader.size(), size_t(kThreads) * 5);
  for (int t = 0; t < kThreads; ++t)
    for (int i = 0; i < 5; ++i) {
      auto e = reader.find("key " + std::to_string(t) + "." + std::to_string(i));
      ASSERT_TRUE(e) << t << "." << i << " was lost";
      EXPECT_EQ(e->config, (FlexAttentionConfig{64, 32, 4, 1 + i % 3}));
      EXPECT_EQ(e->ms, double(t));
    }
}

}  // namespace
}  // namespace flextile
