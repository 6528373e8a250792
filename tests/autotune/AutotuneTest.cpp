// autotune/: config space, pruning rules, the per-GPU cache (keys, round trip,
// corrupt and foreign files), the config resolver hook, and a parallel compile
// of a config grid (through ptxas when present). GPU timing: label gpu.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "attention_templates/FlexAttention.h"
#include "attention_templates/Variants.h"
#include "autotune/Autotune.h"
#include "autotune/Json.h"
#include "autotune/Sweep.h"
#include "autotune/TuneCache.h"
#include "codegen/CompileCache.h"
#include "codegen/Ptxas.h"
#include "gpu/GpuTest.h"
#include "runtime/DriverError.h"

namespace flextile {
namespace {

namespace fs = std::filesystem;
using namespace flextile::attention;
using namespace flextile::autotune;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;
using dsl::Tile;

struct TempDir {
  fs::path path;
  TempDir() {
    std::random_device rd;
    path = fs::temp_directory_path() / ("flextile-tune-test-" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

FlexAttentionProblem problem(int64_t D = 128, DType dt = DType::BF16) {
  return FlexAttentionProblem{dt,  2,   16,  16,  8192, 8192, D, "noop", "causal", "|", 0x1234, 128, 128,
                              MemorySpace::Device};
}

TEST(AutotuneSpace, DefaultSpaceHoldsTheDefaultConfigAndIsAProduct) {
  for (int64_t D : {64, 128, 256}) {
    ConfigSpace s = defaultSpace(DType::BF16, D);
    auto configs = s.configs();
    EXPECT_EQ(s.specialize, (std::vector<attention::WarpSpecialization>{attention::WarpSpecialization::Auto,
                                                                        attention::WarpSpecialization::Off}));
    // The tiles times the choices of specialization; the loop schedules add, on the 8-warp
    // 128-row pipelined tiles, every combination of turns, defer, persistent programs and no-skew
    // but none and defer with persistent or no-skew (9 of 16) where the kernel may be specialized,
    // and defer alone (1) where it may not (Off). Skew is Auto (overlapped on the turns) or Off.
    using attention::LoopSchedule;
    const size_t tiles = s.blockM.size() * s.blockN.size() * s.warps.size() * s.stages.size() * s.specialize.size();
    const size_t scheduled = s.blockN.size() * 2;  // BM 128, w8, s 2 and 3
    EXPECT_EQ(configs.size(), tiles + scheduled * (9 + 1));
    EXPECT_EQ(s.skew, (std::vector<LoopSchedule>{LoopSchedule::Auto, LoopSchedule::Off}));
    for (const FlexAttentionConfig& c : configs) {
      if (c.turns == LoopSchedule::Auto && c.defer == LoopSchedule::Auto && c.persistent == LoopSchedule::Auto &&
          c.skew == LoopSchedule::Auto && c.overlap == LoopSchedule::Auto)
        continue;
      EXPECT_TRUE(c.num_warps == 8 && c.block_m == 128 && c.num_stages > 1) << c.describe();
      if (c.turns == LoopSchedule::On || c.persistent == LoopSchedule::On) {
        EXPECT_NE(c.warp_specialize, attention::WarpSpecialization::Off) << c.describe();
      }
      EXPECT_FALSE(c.defer == LoopSchedule::On && c.persistent == LoopSchedule::On) << c.describe();
      EXPECT_FALSE(c.defer == LoopSchedule::On && c.skew == LoopSchedule::On) << c.describe();
      EXPECT_FALSE(c.overlap == LoopSchedule::On && c.skew != LoopSchedule::On) << c.describe();
      if (c.skew == LoopSchedule::Off) {
        EXPECT_NE(c.warp_specialize, attention::WarpSpecialization::Off) << c.describe();
        EXPECT_NE(c.defer, LoopSchedule::On) << c.describe();
      }
    }
    for (std::optional<codegen::Target> target :
         {std::optional<codegen::Target>(), std::optional(codegen::Target::sm80()), std::optional(codegen::Target::sm90a())})
      for (int64_t tiles : {int64_t(1), attention::kManyQueryTiles}) {
        const FlexAttentionConfig d = defaultFlexAttentionConfig(DType::BF16, D, target, tiles);
        EXPECT_NE(std::find(configs.begin(), configs.end(), d), configs.end()) << d.describe();
      }
  }
}

TEST(AutotunePruning, StaticRulesGiveReasons) {
  const DeviceLimits h200 = DeviceLimits::of(codegen::Target::sm90a());
  const FlexAttentionProblem p = problem();
  EXPECT_FALSE(pruneBeforeCompile({128, 64, 8, 2}, p, h200));
  auto expectReason = [&](FlexAttentionConfig c, const FlexAttentionProblem& pr, const DeviceLimits& l,
                          const std::string& word) {
    auto why = pruneBeforeCompile(c, pr, l);
    ASSERT_TRUE(why) << c.describe();
    EXPECT_NE(why->find(word), std::string::npos) << *why;
  };
  expectReason({128, 64, 16, 2}, p, DeviceLimits{227 * 1024, 256, 65536}, "threads");
  expectReason({64, 64, 8, 2}, p, h200, "warps");
  expectReason({96, 64, 4, 2}, p, h200, "powers of two");
  FlexAttentionProblem smallBlocks = p;
  smallBlocks.kvBlockSize = 32;
  expectReason({128, 64, 8, 2}, smallBlocks, h200, "KV block");
  smallBlocks = p;
  smallBlocks.qBlockSize = 64;
  expectReason({128, 64, 8, 2}, smallBlocks, h200, "Q block");
  // 4 stages of 256 x 256 x 2 bytes for K and V: 1 MB, over any GPU.
  FlexAttentionProblem wide = problem(256);
  wide.kvBlockSize = 256;
  expectReason({128, 256, 8, 4}, wide, h200, "shared memory");
  // The same config fits the 227 KB of sm_90a at 1 stage (no ring).
  EXPECT_FALSE(pruneBeforeCompile({64, 64, 4, 1}, wide, h200));
}

TEST(AutotunePruning, CompiledRulesUseSharedMemoryRegistersAndSpills) {
  const DeviceLimits l = DeviceLimits::of(codegen::Target::sm80());
  EXPECT_EQ(l.sharedBytesPerBlock, 163 * 1024);
  const FlexAttentionConfig c{128, 64, 8, 2};
  EXPECT_FALSE(pruneAfterCompile(c, 64 * 1024, 200, 0, l));
  EXPECT_FALSE(pruneAfterCompile(c, 64 * 1024, -1, 0, l)) << "unknown registers (no ptxas) do not prune";
  EXPECT_NE(pruneAfterCompile(c, 200 * 1024, 200, 0, l)->find("shared memory"), std::string::npos);
  EXPECT_NE(pruneAfterCompile({128, 64, 16, 2}, 1024, 255, 0, l)->find("registers"), std::string::npos);
  EXPECT_NE(pruneAfterCompile(c, 1024, 255, 4096, l)->find("spills"), std::string::npos);
  EXPECT_FALSE(pruneAfterCompile(c, 1024, 255, 16, l)) << "a few spilled bytes are timed, not pruned";
}

TEST(AutotuneCache, EveryKeyFieldChangesTheKey) {
  const GpuIdentity gpu{"NVIDIA H200", 90, 12080};
  const FlexAttentionProblem p = problem();
  const std::string base = tuneKey(p, gpu);
  EXPECT_EQ(tuneKey(problem(), gpu), base) << "same inputs, same key";
  std::vector<std::pair<std::string, std::string>> changed;
  auto with = [&](const std::string& what, auto edit) {
    FlexAttentionProblem q = p;
    GpuIdentity g = gpu;
    edit(q, g);
    changed.push_back({what, tuneKey(q, g)});
  };
  with("gpu name", [](auto&, auto& g) { g.name = "NVIDIA H100"; });
  with("capability", [](auto&, auto& g) { g.capability = 80; });
  with("driver", [](auto&, auto& g) { g.driver = 12090; });
  with("score mod", [](auto& q, auto&) { q.scoreMod = "soft_cap(20)"; });
  with("mask mod", [](auto& q, auto&) { q.maskMod = "sliding_window(1024)"; });
  with("captures", [](auto& q, auto&) { q.captures = "f32[1]|"; });
  with("mod hash", [](auto& q, auto&) { q.modHash = 0x1235; });
  with("dtype", [](auto& q, auto&) { q.dtype = DType::F16; });
  with("head dim", [](auto& q, auto&) { q.D = 64; });
  with("gqa", [](auto& q, auto&) { q.Hkv = 4; });
  with("length bucket", [](auto& q, auto&) { q.L = q.S = 16384; });
  for (const auto& [what, key] : changed) EXPECT_NE(key, base) << what;
  // Lengths within one bucket share the tuned config.
  FlexAttentionProblem near = p;
  near.L = near.S = 8000;
  EXPECT_EQ(tuneKey(near, gpu), base);
  EXPECT_EQ(lengthBucket(1, 1), 128);
  EXPECT_EQ(lengthBucket(129, 64), 256);
}

// The key follows what the mods compute, not what they are called: a user who edits a mod and keeps
// its name must not get the old mod's tuned config (regression: the key hashed the names).
TEST(AutotuneCache, KeyFollowsTheModsBodiesNotTheirNames) {
  using attention::MaskMod;
  using attention::ScoreMod;
  using dsl::Tile;
  const GpuIdentity gpu{"NVIDIA H200", 90, 12080};
  const dsl::Tensor q = dsl::Tensor::empty(DType::BF16, {1, 2, 256, 64}, MemorySpace::Host);
  const dsl::Tensor k = dsl::Tensor::empty(DType::BF16, {1, 2, 256, 64}, MemorySpace::Host);
  auto keyOf = [&](const ScoreMod& score, const MaskMod& mask) {
    const auto blocks = attention::createBlockMask(mask, 1, 1, 256, 256, {128, 128}, MemorySpace::Host);
    return tuneKey(attention::flexAttentionProblem(q, k, score, blocks), gpu);
  };
  const MaskMod causal("mine", [](const Tile&, const Tile&, const Tile& qi, const Tile& kv) { return kv <= qi; });
  const MaskMod stricter("mine", [](const Tile&, const Tile&, const Tile& qi, const Tile& kv) { return kv < qi; });
  const MaskMod renamed("other", [](const Tile&, const Tile&, const Tile& qi, const Tile& kv) { return kv <= qi; });
  EXPECT_NE(causal.structuralHash(), stricter.structuralHash());
  EXPECT_EQ(causal.structuralHash(), renamed.structuralHash());
  EXPECT_NE(attention::sliding_window_mask(1024).structuralHash(), attention::sliding_window_mask(512).structuralHash());
  const ScoreMod cap20 = attention::soft_cap(20), cap30 = attention::soft_cap(30);
  EXPECT_NE(cap20.structuralHash(), cap30.structuralHash());
  EXPECT_NE(cap20.structuralHash(), attention::noop_score().structuralHash());
  // Captured tensors count by dtype and rank, not by value: new slopes keep the key.
  auto slopes = [](DType dt, float x) {
    const std::vector<float> values{x, x / 2};
    dsl::Tensor t = dsl::Tensor::fromHost(values, {2}, MemorySpace::Host);
    if (dt != DType::F32) t = dsl::Tensor::zeros(dt, {2}, MemorySpace::Host);
    return attention::alibi(dsl::capture(t, "slopes"));
  };
  EXPECT_EQ(slopes(DType::F32, 0.5f).structuralHash(), slopes(DType::F32, 0.25f).structuralHash());
  EXPECT_NE(slopes(DType::F32, 0.5f).structuralHash(), slopes(DType::F16, 0.5f).structuralHash());

  const ScoreMod none = attention::noop_score();
  EXPECT_NE(keyOf(none, causal), keyOf(none, stricter)) << "same name, another body";
  EXPECT_EQ(keyOf(none, causal), keyOf(none, MaskMod(causal))) << "a copy is the same mod";
}

// v's own head dim is part of the key: a config tuned at D = 192 with DV = 128 (its V ring narrower)
// must not serve D = DV = 192, nor the reverse; equal dims keep the key they had (tune files
// written before stay valid). The pruning's ring bound counts V's width too.
TEST(AutotuneCache, KeyHoldsVsOwnHeadDim) {
  const GpuIdentity gpu{"NVIDIA H200", 90, 12080};
  auto tensor = [](int64_t d) { return dsl::Tensor::empty(DType::BF16, {1, 2, 256, d}, MemorySpace::Host); };
  const dsl::Tensor q = tensor(192), v128 = tensor(128), v192 = tensor(192);
  const auto none = attention::noop_score();
  const std::string equal = tuneKey(attention::flexAttentionProblem(q, q, v192, none, std::nullopt), gpu);
  const std::string mla = tuneKey(attention::flexAttentionProblem(q, q, v128, none, std::nullopt), gpu);
  EXPECT_EQ(equal, tuneKey(attention::flexAttentionProblem(q, q, none, std::nullopt), gpu));
  EXPECT_NE(mla, equal);
  EXPECT_NE(mla.find(" D192 DV128 "), std::string::npos) << mla;
  EXPECT_NE(decodeTuneKey(attention::flexAttentionProblem(q, q, v128, none, std::nullopt), gpu),
            decodeTuneKey(attention::flexAttentionProblem(q, q, v192, none, std::nullopt), gpu));
  // Two stages of 128 keys: K at 192 (two chunks, 128 + 64: detail::headDimSplit) and V at 256 take
  // 224 KB, within sm_90a's 227; K at 256 and V at 256 take 256 KB (K's width counted for both, the
  // bound before DV; K padded to 256, the bound before the split).
  DeviceLimits limits = DeviceLimits::of(codegen::Target::sm90a());
  const attention::FlexAttentionConfig c{64, 128, 4, 2};
  EXPECT_FALSE(pruneBeforeCompile(c, attention::flexAttentionProblem(q, q, v128, none, std::nullopt), limits));
  EXPECT_FALSE(pruneBeforeCompile(c, attention::flexAttentionProblem(q, q, tensor(256), none, std::nullopt), limits));
  const dsl::Tensor q256 = tensor(256);
  const auto why = pruneBeforeCompile(c, attention::flexAttentionProblem(q256, q256, none, std::nullopt), limits);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("shared memory"), std::string::npos) << *why;
}

TEST(AutotuneCache, RoundTripCorruptAndForeignFiles) {
  TempDir dir;
  const GpuIdentity gpu{"NVIDIA H200", 90, 12080};
  const fs::path file = dir.path / "autotune" / "h200.json";
  const std::string key = tuneKey(problem(), gpu);
  {
    TuneCache cache(file, gpu);
    EXPECT_FALSE(cache.find(key));
    cache.put(key, {{64, 32, 4, 3}, 1.5, 2.0, "B=2"});
    cache.put("another", {{128, 64, 8, 2, attention::WarpSpecialization::Off}, 1.0, 1.0, ""});
    cache.put("a third", {{128, 128, 8, 2, attention::WarpSpecialization::On}, 1.0, 1.0, ""});
    cache.put("a fourth", {{128, 128, 8, 3, attention::WarpSpecialization::Auto, attention::LoopSchedule::On,
                            attention::LoopSchedule::Off, attention::LoopSchedule::Auto, attention::LoopSchedule::On,
                            attention::LoopSchedule::On},
                           1.0, 1.0, ""});
  }
  {
    TuneCache cache(file, gpu);  // a new process reads the file
    auto t = cache.find(key);
    ASSERT_TRUE(t);
    EXPECT_EQ(t->config, (FlexAttentionConfig{64, 32, 4, 3}));
    EXPECT_DOUBLE_EQ(t->ms, 1.5);
    // Warp specialization: "off" and "on" kept, absent is Auto.
    EXPECT_EQ(cache.find("another")->config.warp_specialize, attention::WarpSpecialization::Off);
    EXPECT_EQ(cache.find("a third")->config.warp_specialize, attention::WarpSpecialization::On);
    EXPECT_EQ(cache.find("a third")->config.describe(), "BM128 BN128 w8 s2 ws");
    EXPECT_EQ(cache.find("another")->config.describe(), "BM128 BN64 w8 s2 no-ws");
    // The loop schedules likewise ("on", "off", absent Auto).
    EXPECT_EQ(cache.find("a fourth")->config.describe(), "BM128 BN128 w8 s3 turns no-defer skew overlap");
    EXPECT_EQ(cache.find("a third")->config.turns, attention::LoopSchedule::Auto);
    EXPECT_EQ(cache.size(), 4u);
    EXPECT_NO_THROW(parseJson([&] {
      std::ifstream in(file);
      std::stringstream ss;
      ss << in.rdbuf();
      return ss.str();
    }()));
  }
  for (const GpuIdentity& other : {GpuIdentity{"NVIDIA A100", 80, 12080}, GpuIdentity{"NVIDIA H200", 90, 13000}}) {
    ::testing::internal::CaptureStderr();
    TuneCache cache(file, other);
    EXPECT_FALSE(cache.find(key));
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("warning"), std::string::npos) << err;
    EXPECT_NE(err.find(file.string()), std::string::npos) << err;
  }
  for (const std::string& damage : {std::string("{\"format\": \"flextile-autotune-cache 1\", \"entr"),
                                    std::string("not json"), std::string("[1, 2]")}) {
    std::ofstream(file, std::ios::trunc) << damage;
    ::testing::internal::CaptureStderr();
    TuneCache cache(file, gpu);
    EXPECT_FALSE(cache.find(key)) << damage;
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("warning: autotune cache"), std::string::npos) << err;
    cache.put(key, {{64, 64, 4, 2}, 1, 1, ""});  // rebuilt
    TuneCache again(file, gpu);
    ASSERT_TRUE(again.find(key));
    EXPECT_EQ(again.find(key)->config, (FlexAttentionConfig{64, 64, 4, 2}));
    EXPECT_EQ(again.size(), 1u);
  }
}

TEST(AutotuneResolver, FlexAttentionUsesTheResolversConfigWhenUsable) {
  const int64_t L = 200, D = 64;
  Tensor q = Tensor::empty(DType::BF16, {1, 2, L, D}, MemorySpace::Host);
  Tensor k = Tensor::empty(DType::BF16, {1, 2, L, D}, MemorySpace::Host);
  const BlockMask mask = causalBlockMask(1, 1, L, L, {128, 128});
  FlexAttentionProblem seen{};
  FlexAttentionConfig answer{64, 32, 4, 1};
  setFlexAttentionConfigResolver([&](const FlexAttentionProblem& p) -> std::optional<FlexAttentionConfig> {
    seen = p;
    return answer;
  });
  EXPECT_EQ(plan_flex_attention(q, k, k, noop_score(), mask).config, answer);
  EXPECT_EQ(seen.maskMod, "causal");
  EXPECT_EQ(seen.L, L);
  EXPECT_EQ(seen.qBlockSize, 128);
  // An explicit config wins over the resolver.
  FlexAttentionOptions o;
  o.config = FlexAttentionConfig{128, 64, 8, 2};
  EXPECT_EQ(plan_flex_attention(q, k, k, noop_score(), mask, o).config, *o.config);
  // A resolved config that cannot tile the mask is ignored.
  answer = {256, 32, 8, 1};
  EXPECT_EQ(plan_flex_attention(q, k, k, noop_score(), mask).config, defaultFlexAttentionConfig(DType::BF16, D));
  // A mod that refuses the small probe tiles its structural hash is traced on still runs, with the
  // default config (the resolver is not asked); the real trace sees the template's tiles.
  answer = {64, 32, 4, 1};
  seen = {};
  const ScoreMod picky("picky", [](const dsl::Tile& s, const dsl::Tile&, const dsl::Tile&, const dsl::Tile& qi,
                                   const dsl::Tile&) {
    if (qi.shape()[0] < 32) throw Error("picky: wants at least 32 query rows, got " + std::to_string(qi.shape()[0]));
    return s;
  });
  EXPECT_EQ(plan_flex_attention(q, k, k, picky, mask).config, defaultFlexAttentionConfig(DType::BF16, D));
  EXPECT_EQ(seen.L, 0) << "the resolver was asked about a mod whose hash could not be traced";
  // autotune's resolver: host tensors are never tuned.
  installResolver();
  EXPECT_EQ(plan_flex_attention(q, k, k, noop_score(), mask).config, defaultFlexAttentionConfig(DType::BF16, D));
}

// The winner must beat the default by TuneOptions::minSpeedup; a lead within it (noise) keeps the
// default and says so on the faster config.
TEST(AutotuneSweep, ALeadWithinTheMarginKeepsTheDefault) {
  auto report = [](double defaultMs, double otherMs, CandidateStatus defaultStatus = CandidateStatus::Timed) {
    TuneReport r;
    r.candidates.resize(3);
    r.candidates[0].config = {64, 64, 4, 2};
    r.candidates[0].status = defaultStatus;
    r.candidates[0].ms = defaultMs;
    r.candidates[1].config = {128, 64, 8, 2};
    r.candidates[1].status = CandidateStatus::Timed;
    r.candidates[1].ms = otherMs;
    r.candidates[2].config = {128, 128, 8, 2};
    r.candidates[2].status = CandidateStatus::Pruned;  // never chosen, whatever its time
    r.candidates[2].ms = 0.1;
    r.defaultIndex = 0;
    return r;
  };
  TuneReport r = report(1.00, 0.99);
  sweep::chooseBest(r, 1.02);
  EXPECT_EQ(r.best, 0) << formatReport(r);
  EXPECT_NE(r.candidates[1].reason.find("1.010× the default: under the 1.020× a winner needs"), std::string::npos)
      << r.candidates[1].reason;
  r = report(1.00, 0.95);
  sweep::chooseBest(r, 1.02);
  EXPECT_EQ(r.best, 1);
  EXPECT_EQ(r.candidates[1].reason, "");
  r = report(1.00, 0.99);
  sweep::chooseBest(r, 1.0);
  EXPECT_EQ(r.best, 1) << "1: the fastest";
  r = report(0.5, 0.99, CandidateStatus::Wrong);
  sweep::chooseBest(r, 1.02);
  EXPECT_EQ(r.best, 1) << "a default that did not time cannot stay";
  r = report(0.98, 0.99);
  sweep::chooseBest(r, 1.02);
  EXPECT_EQ(r.best, 0) << "the default fastest";
}

// A compile that throws is a pruning only when the error's kind says the config needs more of the
// GPU than the target has; the message's words do not count.
TEST(AutotuneSweep, CompileFailuresAreClassifiedByTheirKind) {
  EXPECT_EQ(statusOfCompileFailure(Error("needs 300000 bytes of shared memory", ErrorKind::ResourceLimit)),
            Candidate::Status::Pruned);
  EXPECT_EQ(statusOfCompileFailure(Error("too big", ErrorKind::ResourceLimit)), Candidate::Status::Pruned);
  EXPECT_EQ(statusOfCompileFailure(Error("a bug near the shared memory planner", ErrorKind::Internal)),
            Candidate::Status::Failed);
  EXPECT_EQ(statusOfCompileFailure(Error("shared memory")), Candidate::Status::Failed);
  EXPECT_EQ(statusOfCompileFailure(std::runtime_error("shared memory")), Candidate::Status::Failed);
  EXPECT_EQ(statusOfCompileFailure(runtime::DriverError("cuModuleLoadData", 218)), Candidate::Status::Failed);
}

// End to end: a score mod that transposes its [128, 128] f32 score tile converts it through shared
// memory (64 KiB) inside the key loop, next to the 128 KiB K/V ring of a 128 x 128 tile with
// 2 stages. The ring alone passes the static estimate on sm_80; the shared-memory planner then
// refuses the whole kernel (ErrorKind::ResourceLimit, through the pass pipeline and the template),
// which prunes the config with the planner's reason.
TEST(AutotuneSweep, ThePlannersSharedMemoryRefusalPrunes) {
  const int64_t L = 256, D = 128;
  Tensor q = Tensor::empty(DType::BF16, {1, 1, L, D}, MemorySpace::Host);
  ScoreMod transposed("plus_transpose", [](const Tile& s, const Tile&, const Tile&, const Tile&, const Tile&) {
    return s + s.trans();
  });
  BlockMask mask = causalBlockMask(1, 1, L, L, {128, 128}, MemorySpace::Host);
  ConfigSpace space{{128}, {128}, {8}, {2}};
  TuneOptions o;
  o.threads = 1;
  o.runPtxas = false;
  o.target = codegen::Target::sm80();
  TuneReport r = tuneFlexAttention(q, q, q, transposed, mask, space, o);
  bool sawRefusal = false;
  for (const Candidate& c : r.candidates) {
    if (!(c.config == FlexAttentionConfig{128, 128, 8, 2})) continue;
    SCOPED_TRACE(c.reason);
    EXPECT_EQ(c.status, Candidate::Status::Pruned);
    EXPECT_NE(c.reason.find("bytes of shared memory, sm_80 allows"), std::string::npos);
    sawRefusal = true;
  }
  EXPECT_TRUE(sawRefusal);
}

TEST(AutotuneSweep, DryRunCompilesAGridInParallelAndReportsEveryConfig) {
  const int64_t L = 256, D = 32;
  Tensor q = Tensor::empty(DType::BF16, {1, 2, L, D}, MemorySpace::Host);
  VariantInstance inst = variant("causal").make({1, 2, L, L, MemorySpace::Host, {128, 128}, 1});
  ConfigSpace space{{64, 128}, {32, 256}, {4, 8}, {2}};  // BN 256 cannot tile the 128 mask block
  TuneOptions o;
  o.threads = 2;
  o.target = codegen::Target::sm80();
  std::vector<std::string> lines;
  o.progress = [&](const std::string& l) { lines.push_back(l); };
  TuneReport r = tuneFlexAttention(q, q, q, inst.score, inst.mask, space, o);
  EXPECT_FALSE(r.timed);
  EXPECT_EQ(r.best, -1);
  ASSERT_GE(r.defaultIndex, 0);
  // The default (BM128 BN64 w8 s2) is added; on sm_80 (no setmaxnreg) the space's Off twins of
  // each tile are dropped as the same kernel as Auto.
  space.specialize = {attention::WarpSpecialization::Auto, attention::WarpSpecialization::Off};
  const size_t expected = space.configs().size() / 2 + 1;
  ASSERT_EQ(r.candidates.size(), expected);
  int compiled = 0;
  const bool ptxas = codegen::findPtxas().has_value();
  for (const Candidate& c : r.candidates) {
    SCOPED_TRACE(c.config.describe() + ": " + c.reason);
    if (c.config.block_n == 256 || (c.config.block_m == 64 && c.config.num_warps == 8)) {
      EXPECT_EQ(c.status, Candidate::Status::Pruned);
      EXPECT_FALSE(c.reason.empty());
      continue;
    }
    EXPECT_TRUE(c.status == Candidate::Status::Compiled || c.status == Candidate::Status::Pruned);
    if (c.status == Candidate::Status::Compiled) {
      ++compiled;
      EXPECT_GT(c.sharedBytes, 0);
      if (ptxas) {
        EXPECT_GT(c.registers, 0) << "ptxas -v ran";
      }
    }
  }
  EXPECT_GE(compiled, 3);
  EXPECT_NE(formatReport(r).find("dry run"), std::string::npos);
  // ptxas's report and cubin are kept in each kernel's compile-cache entry (a later launch loads that
  // cubin; a second sweep does not assemble again).
  codegen::CompileCache& cache = codegen::CompileCache::global();
  if (ptxas && cache.enabled()) {
    for (const Candidate& c : r.candidates) {
      if (c.status != Candidate::Status::Compiled) continue;
      SCOPED_TRACE(c.config.describe());
      FlexAttentionOptions opts;
      opts.config = c.config;
      const FlexAttentionPlan plan = plan_flex_attention(q, q, q, inst.score, inst.mask, opts, true, *o.target);
      ASSERT_NE(plan.compiled->irHash, 0u);
      std::optional<codegen::CompiledKernel> entry = cache.load({plan.compiled->irHash, *o.target});
      ASSERT_TRUE(entry);
      EXPECT_EQ(entry->cubin.substr(0, 4), std::string("\x7f" "ELF"));
      EXPECT_NE(entry->ptxasInfo.find("Used "), std::string::npos) << entry->ptxasInfo;
    }
  }
  EXPECT_FALSE(lines.empty());
}

// The decode's sweep, dry (host shapes, sm_90a): the space's product with the default first, a
// BLOCK_N the mask's blocks cannot take pruned before compiling, and every config whose plan another
// runs (an aim at more programs an SM than its ring lets reside, or the default's own aim) pruned
// after planning with the config it runs as.
TEST(AutotuneDecode, DryRunPrunesWhatTheMaskRefusesAndWhatAnotherConfigRuns) {
  const int64_t B = 8, Hq = 32, Hkv = 8, S = 8192, D = 128;
  alignas(1024) static std::byte block[1024];
  const Tensor q = Tensor::hostView(block, DType::BF16, {B, Hq, 1, D});
  const Tensor kv = Tensor::hostView(block, DType::BF16, {B, Hkv, S, D});
  const BlockMask mask = slidingWindowBlockMask(1, 1, S, S, {4096}, {128, 128}, MemorySpace::Host);
  const DecodeConfigSpace space{{64, 256}, {4}, {2, 4}, {1, 2, 3}};
  TuneOptions o;
  o.threads = 2;
  o.runPtxas = false;
  o.target = codegen::Target::sm90a();
  const DecodeTuneReport r =
      tuneFlexDecode(q, kv, kv, noop_score(), mask, {.query_offset = S - 1}, space, o);
  EXPECT_FALSE(r.timed);
  EXPECT_EQ(r.best, -1);
  ASSERT_EQ(r.defaultIndex, 0) << formatReport(r);
  EXPECT_EQ(r.candidates[0].config, defaultFlexDecodeConfig(DType::BF16, D));
  ASSERT_EQ(r.candidates.size(), space.configs().size() + 1);
  auto find = [&](const char* text) -> const DecodeCandidate& {
    const FlexDecodeConfig want = FlexDecodeConfig::parse(text);
    for (const DecodeCandidate& c : r.candidates)
      if (c.config == want) return c;
    ADD_FAILURE() << text << " not in the sweep";
    return r.candidates[0];
  };
  for (const DecodeCandidate& c : r.candidates) {
    SCOPED_TRACE(c.config.describe() + ": " + c.reason);
    EXPECT_TRUE(c.status == CandidateStatus::Compiled || c.status == CandidateStatus::Pruned);
    if (c.config.block_n == 256) {
      EXPECT_NE(c.reason.find("wider than the BlockMask's KV block 128"), std::string::npos);
    }
  }
  EXPECT_EQ(r.candidates[0].status, CandidateStatus::Compiled);
  EXPECT_GT(r.candidates[0].sharedBytes, 0);
  // The default ring (64 KB) lets three programs reside: aims 1, 2 (the default's) and 3 give 2, 4
  // and 6 splits of the window's 66 steps...
  EXPECT_NE(find("64,4,2,0,per-sm=2").reason.find("runs as BN64 w4 s2 splits auto ("), std::string::npos);
  EXPECT_EQ(find("64,4,2,0,per-sm=3").status, CandidateStatus::Compiled);
  EXPECT_EQ(find("64,4,2,0,per-sm=1").status, CandidateStatus::Compiled);
  // ...a four-stage ring (128 KB) lets one: aims 2 and 3 run as 1.
  EXPECT_EQ(find("64,4,4,0,per-sm=1").status, CandidateStatus::Compiled);
  for (const char* same : {"64,4,4,0,per-sm=2", "64,4,4,0,per-sm=3"})
    EXPECT_NE(find(same).reason.find("runs as BN64 w4 s4 splits auto per-sm 1"), std::string::npos) << same;
  const std::string table = formatReport(r);
  EXPECT_NE(table.find("TB/s"), std::string::npos) << table;
  EXPECT_NE(table.find("dry run"), std::string::npos) << table;
}

// Decode entries: their own key (the template, queries, B x KV heads), their own fields, and the
// forward's lookups never read one (nor the decode's a forward entry).
TEST(AutotuneCache, DecodeKeysAndEntries) {
  const GpuIdentity gpu{"NVIDIA H200", 90, 12080};
  FlexAttentionProblem p = problem();
  p.B = 8, p.Hq = 32, p.Hkv = 8, p.L = 1, p.S = 32768;
  const std::string base = decodeTuneKey(p, gpu);
  EXPECT_NE(base, tuneKey(p, gpu));
  auto keyWith = [&](auto edit) {
    FlexAttentionProblem x = p;
    edit(x);
    return decodeTuneKey(x, gpu);
  };
  EXPECT_NE(keyWith([](auto& x) { x.L = 2; }), base);
  EXPECT_EQ(keyWith([](auto& x) { x.L = 3; }), keyWith([](auto& x) { x.L = 4; }));
  EXPECT_NE(keyWith([](auto& x) { x.B = 1; }), base) << "B x KV heads 8 against 64";
  EXPECT_EQ(keyWith([](auto& x) { x.B = 7; }), base) << "56 groups round up to 64";
  EXPECT_NE(keyWith([](auto& x) { x.S = 2048; }), base);
  EXPECT_EQ(keyWith([](auto& x) { x.S = 30000; }), base);
  EXPECT_NE(keyWith([](auto& x) { x.modHash = 0x99; }), base);
  EXPECT_NE(keyWith([](auto& x) { x.Hkv = 4; }), base);

  TempDir dir;
  const fs::path file = dir.path / "autotune" / "h200.json";
  const FlexDecodeConfig tuned = FlexDecodeConfig::parse("32,4,3,0,per-sm=1,no-cluster");
  {
    TuneCache cache(file, gpu);
    EXPECT_TRUE(cache.putDecode(base, {tuned, 0.05, 0.052, "B=8 Hq=32 Hkv=8 L=1 S=32768 D=128"}));
    EXPECT_TRUE(cache.put(tuneKey(p, gpu), {{128, 64, 8, 2}, 1, 1, ""}));
  }
  TuneCache cache(file, gpu);  // a new process reads the file
  const std::optional<TunedDecodeConfig> t = cache.findDecode(base);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->config, tuned);
  EXPECT_DOUBLE_EQ(t->defaultMs, 0.052);
  EXPECT_EQ(t->shape, "B=8 Hq=32 Hkv=8 L=1 S=32768 D=128");
  EXPECT_FALSE(cache.find(base)) << "a decode entry is no forward config";
  EXPECT_FALSE(cache.findDecode(tuneKey(p, gpu))) << "a forward entry is no decode config";
  EXPECT_TRUE(cache.find(tuneKey(p, gpu)));
}

// The backward's sweep, dry (host shapes, sm_90a): the product of its tile lists with the default
// pair first, a tile the mask cannot take and a forward-only schedule pruned before compiling with
// the kernel named, every other pair compiled.
TEST(AutotuneBackward, DryRunPrunesWhatEitherKernelCannotTake) {
  const int64_t B = 1, H = 4, L = 640, D = 64;
  const Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
  const Tensor lse = Tensor::empty(DType::F32, {B, H, L}, MemorySpace::Host);
  const BlockMask mask = causalBlockMask(1, 1, L, L, {64, 64}, MemorySpace::Host);
  FlexAttentionConfig deferred{64, 64, 4, 2};
  deferred.defer = LoopSchedule::On;
  const BackwardConfigSpace space{{{64, 64, 4, 2}, {32, 32, 4, 2}}, {{64, 64, 4, 2}, {256, 64, 8, 2}, deferred}};
  TuneOptions o;
  o.threads = 2;
  o.runPtxas = false;
  o.target = codegen::Target::sm90a();
  const BackwardTuneReport r = tuneFlexAttentionBackward(q, q, q, q, lse, q, noop_score(), mask, space, o);
  EXPECT_FALSE(r.timed);
  EXPECT_EQ(r.best, -1);
  ASSERT_EQ(r.defaultIndex, 0) << formatReport(r);
  // The call's own default for a mask of 64-row blocks (narrowed to 64 × 64 on one warpgroup for
  // both kernels), which the space holds: moved first, not added.
  EXPECT_EQ(r.candidates[0].config, plan_flex_attention_backward(q, q, q, q, lse, q, noop_score(), mask, {},
                                                                  codegen::Target::sm90a())
                                        .config);
  EXPECT_EQ(r.candidates[0].config, (FlexAttentionBackwardConfig{{64, 64, 4, 2}, {64, 64, 4, 2}}));
  ASSERT_EQ(r.candidates.size(), space.configs().size()) << formatReport(r);
  int compiled = 0;
  for (size_t i = 0; i < r.candidates.size(); ++i) {
    const BackwardCandidate& c = r.candidates[i];
    SCOPED_TRACE(c.config.describe() + ": " + c.reason);
    if (c.config.dq.block_m == 256) {
      EXPECT_EQ(c.status, CandidateStatus::Pruned);
      EXPECT_EQ(c.reason.rfind("dq: ", 0), 0u);
    } else if (c.config.dq.defer == LoopSchedule::On) {
      EXPECT_EQ(c.status, CandidateStatus::Pruned);
      EXPECT_NE(c.reason.find("dq: defer is a schedule of the forward's loop"), std::string::npos);
    } else {
      EXPECT_EQ(c.status, CandidateStatus::Compiled);
      EXPECT_GT(c.sharedBytes, 0);
      ++compiled;
    }
  }
  EXPECT_EQ(compiled, 2);
  const std::string table = formatReport(r);
  EXPECT_NE(table.find("TFLOP/s"), std::string::npos) << table;
  EXPECT_NE(table.find("dry run"), std::string::npos) << table;
  // The default spaces hold what they say.
  EXPECT_EQ(defaultBackwardSpace(DType::BF16, 128).configs().size(), 36u);
  EXPECT_EQ(defaultBackwardSpace(DType::BF16, 192).configs().size(), 25u);
  EXPECT_EQ(defaultBackwardSpace(DType::F32, 64).configs().size(), 9u);
}

// Backward entries: their own key and fields (two tiles), and neither the forward's nor the
// decode's lookups read one (nor the backward's theirs); a damaged tile gives no entry.
TEST(AutotuneCache, BackwardKeysAndEntries) {
  const GpuIdentity gpu{"NVIDIA H200", 90, 12080};
  const FlexAttentionProblem p = problem();
  const std::string key = backwardTuneKey(p, gpu);
  EXPECT_NE(key, tuneKey(p, gpu));
  EXPECT_NE(key, decodeTuneKey(p, gpu));
  FlexAttentionProblem longer = p;
  longer.L = longer.S = 4 * p.S;
  EXPECT_NE(backwardTuneKey(longer, gpu), key) << "the length bucket";

  TempDir dir;
  const fs::path file = dir.path / "autotune" / "h200.json";
  FlexAttentionBackwardConfig pair{{64, 128, 8, 2, WarpSpecialization::On}, {128, 64, 8, 3, WarpSpecialization::On}};
  pair.dq.turns = LoopSchedule::On;
  {
    TuneCache cache(file, gpu);
    EXPECT_TRUE(cache.putBackward(key, {pair, 2.5, 2.7, "B=2 H=16 L=8192 S=8192 D=128"}));
    EXPECT_TRUE(cache.put(tuneKey(p, gpu), {{128, 64, 8, 2}, 1, 1, ""}));
  }
  TuneCache cache(file, gpu);  // a new process reads the file
  const std::optional<TunedBackwardConfig> t = cache.findBackward(key);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->config, pair) << t->config.describe();
  EXPECT_DOUBLE_EQ(t->ms, 2.5);
  EXPECT_DOUBLE_EQ(t->defaultMs, 2.7);
  EXPECT_EQ(t->shape, "B=2 H=16 L=8192 S=8192 D=128");
  EXPECT_FALSE(cache.find(key)) << "a backward entry is no forward config";
  EXPECT_FALSE(cache.findDecode(key)) << "a backward entry is no decode config";
  EXPECT_FALSE(cache.findBackward(tuneKey(p, gpu))) << "a forward entry is no backward config";
  EXPECT_TRUE(cache.find(tuneKey(p, gpu)));

  // A damaged tile (no warps) in a file written by hand: no entry, the default runs.
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  Json doc = parseJson(text.str());
  doc.object["entries"].object[key].object["dq"].object.erase("num_warps");
  std::ofstream(file) << doc.dump(2);
  EXPECT_FALSE(TuneCache(file, gpu).findBackward(key));
}

// flex_attention_backward asks the resolver when given no config and dQ is the dq kernel's; an
// explicit config wins, atomic dQ never asks, and a pair the call cannot take is ignored.
TEST(AutotuneResolver, FlexAttentionBackwardUsesTheResolversPairWhenUsable) {
  const int64_t L = 200, D = 64;
  const Tensor q = Tensor::empty(DType::BF16, {1, 2, L, D}, MemorySpace::Host);
  const Tensor lse = Tensor::empty(DType::F32, {1, 2, L}, MemorySpace::Host);
  const BlockMask mask = causalBlockMask(1, 1, L, L, {128, 128});
  const auto sm90a = codegen::Target::sm90a();
  auto plan = [&](const FlexAttentionBackwardOptions& o = {}) {
    return plan_flex_attention_backward(q, q, q, q, lse, q, noop_score(), mask, o, sm90a).config;
  };
  setFlexAttentionBackwardConfigResolver({});
  const FlexAttentionBackwardConfig untuned = plan();
  FlexAttentionProblem seen{};
  int asked = 0;
  FlexAttentionBackwardConfig answer{{32, 64, 4, 2}, {64, 32, 4, 2}};
  ASSERT_NE(answer, untuned);
  setFlexAttentionBackwardConfigResolver(
      [&](const FlexAttentionProblem& p) -> std::optional<FlexAttentionBackwardConfig> {
        seen = p;
        ++asked;
        return answer;
      });
  EXPECT_EQ(plan(), answer);
  EXPECT_EQ(seen.maskMod, "causal");
  EXPECT_EQ(seen.L, L);
  EXPECT_EQ(seen.D, D);
  EXPECT_EQ(seen.qBlockSize, 128);
  FlexAttentionBackwardOptions explicitConfig;
  explicitConfig.config = FlexAttentionBackwardConfig{{64, 64, 4, 2}, {64, 64, 4, 2}};
  EXPECT_EQ(plan(explicitConfig), *explicitConfig.config);
  asked = 0;
  FlexAttentionBackwardOptions atomic;
  atomic.dq_accumulation = DqAccumulation::Atomic;
  EXPECT_EQ(plan(atomic), defaultFlexAttentionBackwardConfig(DType::BF16, D, sm90a, false, DqAccumulation::Atomic));
  EXPECT_EQ(asked, 0) << "atomic dQ is not tuned";
  answer = {{32, 64, 4, 2}, {256, 32, 8, 2}};  // dq's 256 rows do not tile the mask's 128-row blocks
  EXPECT_EQ(plan(), untuned);
  answer = {{32, 64, 4, 2}, {64, 32, 4, 2}};
  answer.dkdv.persistent = LoopSchedule::On;  // a forward-only schedule
  EXPECT_EQ(plan(), untuned);
  // A mod that refuses the probe tiles its structural hash is traced on runs the default, the
  // resolver unasked (once the problem was built outside the resolver's guard, and the call threw).
  answer = {{32, 64, 4, 2}, {64, 32, 4, 2}};
  asked = 0;
  const ScoreMod picky("picky", [](const dsl::Tile& s, const dsl::Tile&, const dsl::Tile&, const dsl::Tile&,
                                   const dsl::Tile& kv) {
    // The probe's kv_idx is [1, 16] (attention_templates/Mods.cpp); the kernels' are [BLOCK_N, 1]
    // (dkdv) and [1, BLOCK_N] (dq) with 32 keys at least here.
    if (kv.shape()[0] == 1 && kv.shape()[1] == 16) throw Error("picky: refuses a kv_idx of [1, 16]");
    return s;
  });
  // (A mod the probes do not fit counts as one that gathers per score: the cautious default.)
  EXPECT_EQ(plan_flex_attention_backward(q, q, q, q, lse, q, picky, mask, {}, sm90a).config,
            defaultFlexAttentionBackwardConfig(DType::BF16, D, sm90a, true));
  EXPECT_EQ(asked, 0) << "the resolver was asked about a mod whose hash could not be traced";
  // autotune's resolver: host tensors are never tuned.
  installResolver();
  EXPECT_EQ(plan(), untuned);
  setFlexAttentionBackwardConfigResolver({});
}

}  // namespace
}  // namespace flextile
