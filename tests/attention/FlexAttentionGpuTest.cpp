// flex_attention on the GPU (label gpu; every test skips without one):
// device tensors, variants built with their captures and mask lists on the
// device, against the float64 reference: every variant, GQA and MQA, lengths
// up to 8192, fully masked rows, the configs the tuner visits, strided views,
// and a repeated call that neither retraces nor recompiles.
//
// Budget (gpu/TestBudget.h, docs/testing.md): every shape and variant runs each time, the configs
// per shape are a random sample (all of them with FLEXTILE_GPU_TESTS_FULL=1), and large problems
// are checked on a sample of rows (FlexAttentionCheck.h's referenceFor).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>

#include "FlexAttentionCheck.h"
#include "MaskTestUtil.h"
#include "attention_templates/FlexAttentionCommon.h"
#include "attention_templates/Variants.h"
#include "gpu/GpuTest.h"
#include "ir/Parser.h"
#include "runtime/Device.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"  // designated initializers leave members default

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::testing;
using dsl::CapturedTensor;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;
using dsl::Tile;

namespace {

constexpr MemorySpace kDevice = MemorySpace::Device, kHost = MemorySpace::Host;

// The tuner's usual points and the default (no config given); all tile the
// default 128 x 128 mask blocks. 64 x 64 on 8 warps: on sm_90a the warpgroups split N.
const std::vector<std::optional<FlexAttentionConfig>> kConfigs = {
    std::nullopt, FlexAttentionConfig{128, 64, 8, 2}, FlexAttentionConfig{64, 64, 4, 2},
    FlexAttentionConfig{128, 32, 8, 3}, FlexAttentionConfig{64, 64, 8, 2}};

FlexAttentionOptions withConfig(const std::optional<FlexAttentionConfig>& c) {
  FlexAttentionOptions o;
  o.config = c;
  return o;
}

std::string configName(const std::optional<FlexAttentionConfig>& c) { return c ? c->describe() : "default"; }

const std::vector<AttentionCase> kVariantCases = {
    {.B = 1, .Hq = 2, .Hkv = 2, .L = 1, .S = 1, .D = 64, .dtype = DType::BF16},
    {.B = 2, .Hq = 4, .Hkv = 1, .L = 3, .S = 5, .D = 128, .dtype = DType::F16},
    {.B = 1, .Hq = 8, .Hkv = 2, .L = 127, .S = 129, .D = 64, .dtype = DType::BF16},
    {.B = 2, .Hq = 4, .Hkv = 4, .L = 128, .S = 128, .D = 128, .dtype = DType::BF16},
    {.B = 1, .Hq = 4, .Hkv = 1, .L = 129, .S = 127, .D = 64, .dtype = DType::F16},
    {.B = 1, .Hq = 4, .Hkv = 1, .L = 300, .S = 192, .D = 96, .dtype = DType::F32},
    {.B = 2, .Hq = 8, .Hkv = 2, .L = 1000, .S = 1000, .D = 128, .dtype = DType::BF16},
    {.B = 1, .Hq = 2, .Hkv = 1, .L = 1000, .S = 777, .D = 64, .dtype = DType::F16},
};

// The two shapes the schedule tests (TMA, warp specialization, hoisted loads) run every variant
// at: the yardstick's head dim with GQA 4:1 and lengths off the block, and a padded head dim in
// f16 with MQA and unequal lengths.
const std::vector<AttentionCase> kScheduleCases = {
    {.B = 2, .Hq = 8, .Hkv = 2, .L = 1000, .S = 1000, .D = 128, .dtype = DType::BF16},
    {.B = 1, .Hq = 4, .Hkv = 1, .L = 129, .S = 383, .D = 80, .dtype = DType::F16},
};

// Random q, k, v of a case on the device, an output to write, and the float64 reference that the
// configs run on these inputs share.
struct CaseInputs {
  Tensor q, k, v, out;
  ReferenceResult ref;
};
CaseInputs randomInputs(SeededRandom& rng, const AttentionCase& c, const VariantInstance& inst) {
  Tensor q = randomTensor(rng, c.dtype, {c.B, c.Hq, c.L, c.D}, kDevice);
  Tensor k = randomTensor(rng, c.dtype, {c.B, c.Hkv, c.S, c.D}, kDevice);
  Tensor v = randomTensor(rng, c.dtype, {c.B, c.Hkv, c.S, c.D}, kDevice);
  Tensor out = Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.D}, kDevice);
  ReferenceResult ref = referenceFor(q, k, v, inst.refScore, inst.refMask, inst.mask, {}, rng());
  return {q, k, v, out, std::move(ref)};
}

}  // namespace

// The tests that run every variant are one test per variant
// (EveryVariant/FlexAttentionGpuSchedule.<test>/<variant>), so that the GPU suite's shards
// (scripts/gpu_run.sh) share them: as one test each they took up to 75 s.
class FlexAttentionGpuSchedule : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(EveryVariant, FlexAttentionGpuSchedule, ::testing::ValuesIn(variantNames()), variantParamName);

// Every variant x every shape x the configs (one sampled per shape, so each config runs for about
// a quarter of the pairs; every one with FLEXTILE_GPU_TESTS_FULL=1), captures and lists on the
// device; one reference per (variant, shape) serves its configs.
TEST_P(FlexAttentionGpuSchedule, EveryShapeEveryConfig) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  ConfigSample configs(kConfigs, 1, rng);
  const Variant& var = variant(GetParam());
  for (AttentionCase c : kVariantCases) {
    if (!inScope(c.work())) continue;
    c.context = "variant " + var.name;
    VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kDevice, BlockSizes{}, rng()});
    auto [q, k, v, out, ref] = randomInputs(rng, c, inst);
    for (const auto& config : configs.next())
      if (!runAndCompare(q, k, v, out, ref, c.describe(), inst.score, inst.mask, withConfig(config))) return;
  }
}

// The forward with its loops rotated by defer-accumulation (opt-in; codegen/passes/
// DeferAccumulation.cpp): every variant at the default config and on one warpgroup, lengths off
// the block, GQA.
TEST_P(FlexAttentionGpuSchedule, DeferredAccumulation) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const Variant& var = variant(GetParam());
  ScopedSetenv defer("FLEXTILE_DEFER_ACCUMULATION", "1");
  for (AttentionCase c : {AttentionCase{.B = 2, .Hq = 8, .Hkv = 2, .L = 1000, .S = 1000, .D = 128, .dtype = DType::BF16},
                          AttentionCase{.B = 1, .Hq = 4, .Hkv = 1, .L = 129, .S = 383, .D = 64, .dtype = DType::F16}}) {
    c.context = "variant " + var.name + ", deferred accumulation";
    VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kDevice, BlockSizes{}, rng()});
    for (const std::optional<FlexAttentionConfig>& config : {std::optional<FlexAttentionConfig>{}, std::optional{FlexAttentionConfig{64, 64, 4, 2}}})
      if (!checkFlexAttention(rng, c, kDevice, inst.score, inst.mask, inst.refScore, inst.refMask, withConfig(config)))
        return;
  }
}

// K and V copied by TMA (the default on sm_90a: codegen/passes/Pipeline.cpp): every variant at
// the default config, on one warpgroup and at three stages, lengths off the block (the boxes'
// zero fill), a padded head dim, GQA; the compiled kernel must take its tensor maps. (Every
// other forward test runs the same schedule; FLEXTILE_TMA=0 runs them on cp.async.)
TEST_P(FlexAttentionGpuSchedule, TmaCopies) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const char* env = std::getenv("FLEXTILE_TMA");
  const bool tmaTarget = runtime::Device::current().capabilityMajor() >= 9 && !(env && std::strcmp(env, "0") == 0);
  const Variant& var = variant(GetParam());
  for (AttentionCase c : kScheduleCases) {
    if (!inScope(c.work())) continue;
    c.context = "variant " + var.name + ", TMA";
    VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kDevice, BlockSizes{}, rng()});
    for (const std::optional<FlexAttentionConfig>& config :
         {std::optional<FlexAttentionConfig>{}, std::optional{FlexAttentionConfig{64, 64, 4, 2}},
          std::optional{FlexAttentionConfig{128, 64, 8, 3}}}) {
      if (tmaTarget) {
        Tensor q = Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.D}, kDevice);
        Tensor k = Tensor::empty(c.dtype, {c.B, c.Hkv, c.S, c.D}, kDevice);
        FlexAttentionPlan plan = plan_flex_attention(q, k, k, inst.score, inst.mask, withConfig(config), true);
        // The yardstick variants' loops take TMA; a loop that waits for the CTA (a gather's layout
        // conversion through shared memory: the bias table) keeps the cp.async ring. K and V take a
        // map each, K two where its head dim is split into two chunks (detail::headDimSplit: the
        // split dim here, 80 = 64 + 16, copies panels of two widths; V's 16-column chunk is too
        // narrow for the forward to split it).
        const bool yardstick = var.name != "bias";
        const size_t maps = attention::detail::headDimSplit(c.D) ? 3 : 2;
        if (yardstick) {
          ASSERT_EQ(plan.compiled->tensorMaps.size(), maps) << c.context << " " << plan.config.describe();
        }
      }
      if (!checkFlexAttention(rng, c, kDevice, inst.score, inst.mask, inst.refScore, inst.refMask, withConfig(config)))
        return;
    }
  }
}

// The two warpgroups taking turns at their products (opt-in: FLEXTILE_PINGPONG=1,
// codegen/passes/Pingpong.cpp), with and without the defer-accumulation rotation: every variant
// on two warpgroups, lengths off the block, GQA, a padded head dim.
TEST_P(FlexAttentionGpuSchedule, WarpgroupTurns) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const Variant& var = variant(GetParam());
  ::setenv("FLEXTILE_PINGPONG", "1", 1);
  struct Unset {
    ~Unset() {
      ::unsetenv("FLEXTILE_PINGPONG");
      ::unsetenv("FLEXTILE_DEFER_ACCUMULATION");
    }
  } unset;
  for (const char* defer : {"0", "1"}) {
    ::setenv("FLEXTILE_DEFER_ACCUMULATION", defer, 1);
    for (AttentionCase c : kScheduleCases) {
      if (!inScope(c.work())) continue;
      c.context = "variant " + var.name + ", warpgroup turns, defer " + defer;
      VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kDevice, BlockSizes{}, rng()});
      for (const FlexAttentionConfig& config : {FlexAttentionConfig{128, 128, 8, 2}, FlexAttentionConfig{128, 64, 8, 3}})
        if (!checkFlexAttention(rng, c, kDevice, inst.score, inst.mask, inst.refScore, inst.refMask, withConfig(config)))
          return;
    }
  }
}

namespace {
// One variant at each of kScheduleCases, one float64 reference per shape, under each skew setting
// (FLEXTILE_SKEW, FLEXTILE_SKEW_OVERLAP) at its configs (all with `skew` On).
void checkSkewedWalks(const Variant& var,
                      const std::vector<std::pair<std::string, std::vector<FlexAttentionConfig>>>& modes) {
  SeededRandom rng;
  for (AttentionCase c : kScheduleCases) {
    if (!inScope(c.work())) continue;
    VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kDevice, BlockSizes{}, rng()});
    auto [q, k, v, out, ref] = randomInputs(rng, c, inst);
    for (const auto& [mode, configs] : modes) {
      ScopedSetenv every("FLEXTILE_SKEW", mode.rfind("all", 0) == 0 ? "all" : "");
      ScopedSetenv overlap("FLEXTILE_SKEW_OVERLAP", mode.find("overlap") != std::string::npos ? "1" : "0");
      for (FlexAttentionConfig config : configs) {
        config.skew = LoopSchedule::On;
        const std::string context = "variant " + var.name + ", " + c.describe() + ", skewed walks " + mode;
        if (!runAndCompare(q, k, v, out, ref, context, inst.score, inst.mask, withConfig(config))) return;
      }
    }
  }
}

FlexAttentionConfig perTileConfig() {
  FlexAttentionConfig c{128, 128, 8, 2};
  c.persistent = LoopSchedule::Off;
  return c;
}
}  // namespace

// The skewed walks (FlexAttentionConfig::skew): iteration t issues Q·K_t and P·V_{t−1} in one
// turn, Q·K_lo and P·V_{hi−1} peeled into loops of at most one iteration whose stages hold K alone
// and V alone, on one set of rings (shared across a persistent program's tiles). Every variant with
// the full walks skewed on the default schedules (persistent programs with shared rings where the
// rule gives them), with a program per tile, on one warpgroup and at three stages; every walk
// skewed (FLEXTILE_SKEW=all) on the default tile. Lengths off the block, GQA, a padded head dim. A
// wrong stage or parity shows as wrong rows or a hang (the binary's timeout).
TEST_P(FlexAttentionGpuSchedule, SkewedWalks) {
  FLEXTILE_REQUIRE_GPU();
  checkSkewedWalks(variant(GetParam()), {{"", {{128, 128, 8, 2}, perTileConfig(), {64, 64, 4, 2}, {128, 64, 8, 3}}}, {"all", {{128, 128, 8, 2}}}});
}

// The same overlapped (FLEXTILE_SKEW_OVERLAP=1): Q·Kᵀ of step t, then P·V of step t − 1 with P
// carried, and the softmax of step t while that product runs (wgmma_wait pending 1).
TEST_P(FlexAttentionGpuSchedule, OverlappedSkewedWalks) {
  FLEXTILE_REQUIRE_GPU();
  checkSkewedWalks(variant(GetParam()), {{"overlap", {{128, 128, 8, 2}, perTileConfig(), {64, 64, 4, 2}, {128, 64, 8, 3}}},
                    {"all+overlap", {{128, 128, 8, 2}}}});
}

// The overlapped walks with a ring set per loop (FLEXTILE_SHARE_RINGS=0), where the peeled
// one-step loops' barriers are invalidated with the phase their refill no longer completes.
TEST_P(FlexAttentionGpuSchedule, SkewedWalksOnARingSetPerLoop) {
  FLEXTILE_REQUIRE_GPU();
  ScopedSetenv apart("FLEXTILE_SHARE_RINGS", "0");
  checkSkewedWalks(variant(GetParam()), {{"overlap", {{128, 128, 8, 2}, perTileConfig()}}});
}

// Rings that outlive their loop (docs/architecture.md), forced on every variant whatever the
// default rule says: persistent programs (their walks sharing the rings across tiles), persistent
// programs with a ring per walk, and the two walks of a program per tile sharing their rings.
// Lengths off the block, GQA, a padded head dim, on the default 8-warp tile (and on 3 stages for
// the persistent mode). A wrong slot or parity shows as wrong rows or a hang (the test binary's
// timeout).
TEST_P(FlexAttentionGpuSchedule, RingsThatOutliveTheirLoop) {
  FLEXTILE_REQUIRE_GPU();
  if (runtime::Device::current().capabilityMajor() < 9) GTEST_SKIP() << "TMA rings need sm_90a";
  SeededRandom rng;
  const Variant& var = variant(GetParam());
  const std::vector<std::vector<std::pair<const char*, const char*>>> modes = {
      {{"FLEXTILE_FORWARD_PERSISTENT", "1"}},
      {{"FLEXTILE_FORWARD_PERSISTENT", "1"}, {"FLEXTILE_SHARE_RINGS", "0"}},
      {{"FLEXTILE_FORWARD_PERSISTENT", "0"}, {"FLEXTILE_SHARE_RINGS", "1"}}};
  for (const auto& mode : modes) {
    std::vector<std::unique_ptr<flextile::testing::ScopedSetenv>> set;
    std::string name;
    for (const auto& [switchName, value] : mode) {
      set.push_back(std::make_unique<flextile::testing::ScopedSetenv>(switchName, value));
      name += std::string(name.empty() ? "" : " ") + switchName + "=" + value;
    }
    for (AttentionCase c : kScheduleCases) {
      if (!inScope(c.work())) continue;
      c.context = "variant " + var.name + ", " + name;
      VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kDevice, BlockSizes{}, rng()});
      // A mod that gathers per score keeps a program per tile (its loads and rings are the
      // consumers' own, and with the tile loop's Q ring they need 256 KB, which the compiler
      // refuses by name: docs/performance.md).
      if (mode.front().first == std::string("FLEXTILE_FORWARD_PERSISTENT") && mode.front().second == std::string("1") &&
          inst.score.gathersPerElement())
        continue;
      // The default tile for every mode; 3 stages (the slots wrap at another count) for the
      // persistent one only, to keep the test within its shard's budget.
      std::vector<FlexAttentionConfig> configs{FlexAttentionConfig{128, 128, 8, 2}};
      if (&mode == &modes.front()) configs.push_back(FlexAttentionConfig{128, 64, 8, 3});
      for (const FlexAttentionConfig& config : configs)
        if (!checkFlexAttention(rng, c, kDevice, inst.score, inst.mask, inst.refScore, inst.refMask, withConfig(config)))
          return;
    }
  }
}

// The tiles handed out heaviest first (FLEXTILE_TILE_ORDER=1, BlockMask::heaviestTilesFirst, the
// order uploaded once a mask): every variant on its default schedule (a program per tile reading
// its tile from the order, persistent programs dealing the order in rounds) and forced persistent.
// Lengths off the block, GQA, a padded head dim. A tile computed twice and another never shows as
// poisoned rows.
TEST_P(FlexAttentionGpuSchedule, TilesHeaviestFirst) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const Variant& var = variant(GetParam());
  ScopedSetenv ordered("FLEXTILE_TILE_ORDER", "1");
  for (const char* persistent : {"", "1"}) {
    ScopedSetenv dealt("FLEXTILE_FORWARD_PERSISTENT", persistent);
    for (AttentionCase c : kScheduleCases) {
      if (!inScope(c.work())) continue;
      c.context = "variant " + var.name + ", " + c.describe() + ", tiles heaviest first, persistent '" + persistent + "'";
      VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kDevice, BlockSizes{}, rng()});
      if (*persistent && inst.score.gathersPerElement()) continue;  // (as RingsThatOutliveTheirLoop)
      if (!checkFlexAttention(rng, c, kDevice, inst.score, inst.mask, inst.refScore, inst.refMask,
                              withConfig(FlexAttentionConfig{128, 128, 8, 2})))
        return;
    }
  }
}

// A persistent forward that splits its last round (the rule: tiles that walk alike, no mask): pieces
// of the round's tiles walked by every program, then folded by the merge kernel. No mask, more
// tiles than SMs (256 and 192 tiles on the H200's 132: a whole round, then 124 and 60 tiles cut),
// GQA, lengths off the block, a padded head dim, lse too; two calls each (the partials' scratch is
// reused), with shared rings and with a ring per walk, and with the merge launched as a
// programmatic dependent (FLEXTILE_PROGRAMMATIC_LAUNCH=1: it waits for the forward itself).
TEST(FlexAttentionGpu, PersistentForwardSplitsItsLastRound) {
  FLEXTILE_REQUIRE_GPU();
  if (runtime::Device::current().capabilityMajor() < 9) GTEST_SKIP() << "persistent programs take the sm_90a turns";
  SeededRandom rng;
  flextile::testing::ScopedSetenv persistent("FLEXTILE_FORWARD_PERSISTENT", "1");
  for (auto [shared, pdl] : {std::pair{"1", "0"}, std::pair{"0", "0"}, std::pair{"1", "1"}})
    for (AttentionCase c : {AttentionCase{.B = 1, .Hq = 8, .Hkv = 2, .L = 4096, .S = 4096, .D = 128},
                            AttentionCase{.B = 2, .Hq = 4, .Hkv = 4, .L = 3000, .S = 2500, .D = 80}})
      for (int call = 0; call < 2; ++call) {
        flextile::testing::ScopedSetenv rings("FLEXTILE_SHARE_RINGS", shared);
        flextile::testing::ScopedSetenv launch("FLEXTILE_PROGRAMMATIC_LAUNCH", pdl);
        c.dtype = DType::BF16;
        c.context = std::string("split last round, shared rings ") + shared + ", programmatic merge " + pdl +
                    ", call " + std::to_string(call);
        const FlexAttentionOptions options = withConfig(FlexAttentionConfig{128, 128, 8, 2});
        Tensor q = Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.D}, kDevice);
        Tensor k = Tensor::empty(c.dtype, {c.B, c.Hkv, c.S, c.D}, kDevice);
        ASSERT_TRUE(plan_flex_attention(q, k, k, noop_score(), std::nullopt, options).lastRoundSplit) << c.context;
        if (!checkFlexAttention(rng, c, kDevice, noop_score(), std::nullopt, nullptr, nullptr, options)) return;
      }
}

// A producer warpgroup of its own fills the TMA rings (opt-in: FLEXTILE_WARP_SPECIALIZE=1,
// codegen/passes/WarpSpecialize.cpp), with and without the consumers' warpgroup turns: every
// variant on one and on two consumer warpgroups, lengths off the block, GQA, a padded head dim.
// The yardstick variants' kernels must launch the producer warps.
TEST_P(FlexAttentionGpuSchedule, WarpSpecialized) {
  FLEXTILE_REQUIRE_GPU();
  if (runtime::Device::current().capabilityMajor() < 9) GTEST_SKIP() << "warp specialization needs sm_90a";
  SeededRandom rng;
  ScopedSetenv specialized("FLEXTILE_WARP_SPECIALIZE", "1");
  const Variant& var = variant(GetParam());
  for (const char* pingpong : {"0", "1"}) {
    ScopedSetenv turns("FLEXTILE_PINGPONG", pingpong);
    for (AttentionCase c : kScheduleCases) {
      if (!inScope(c.work())) continue;
      c.context = "variant " + var.name + ", warp-specialized, pingpong " + pingpong;
      VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kDevice, BlockSizes{}, rng()});
      for (const std::optional<FlexAttentionConfig>& config :
           {std::optional<FlexAttentionConfig>{}, std::optional{FlexAttentionConfig{64, 64, 4, 2}},
            std::optional{FlexAttentionConfig{128, 64, 8, 3}}}) {
        Tensor q = Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.D}, kDevice);
        Tensor k = Tensor::empty(c.dtype, {c.B, c.Hkv, c.S, c.D}, kDevice);
        FlexAttentionPlan plan = plan_flex_attention(q, k, k, inst.score, inst.mask, withConfig(config), true);
        if (var.name != "bias") {
          ASSERT_EQ(plan.compiled->producerWarps, 4) << c.context << " " << plan.config.describe();
        }
        if (!checkFlexAttention(rng, c, kDevice, inst.score, inst.mask, inst.refScore, inst.refMask, withConfig(config)))
          return;
      }
    }
  }
}

// 64 query rows on 8 warps: on sm_90a the warpgroups split N (Layout::wgmmaAccumulator), each
// issuing its share of S and of P·V at an offset into the K and V slots, the softmax's row
// reductions crossing warpgroups, P staged in shared memory (at D = 80, padded to 128, V's halves
// are whole panels too). Unspecialized and with the producer warpgroup.
TEST_P(FlexAttentionGpuSchedule, WarpgroupsSplittingN) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const Variant& var = variant(GetParam());
  for (AttentionCase c : kScheduleCases) {
    if (!inScope(c.work())) continue;
    c.context = "variant " + var.name + ", 64 rows on 8 warps";
    VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kDevice, BlockSizes{}, rng()});
    auto [q, k, v, out, ref] = randomInputs(rng, c, inst);
    for (const FlexAttentionConfig& config :
         {FlexAttentionConfig{64, 64, 8, 2}, FlexAttentionConfig{64, 64, 8, 2, WarpSpecialization::On}})
      if (!runAndCompare(q, k, v, out, ref, c.describe(), inst.score, inst.mask, withConfig(config))) return;
  }
}

// Loop-invariant loads hoisted before the walks and per-step reads issued a step early
// (codegen/passes/HoistInvariantLoads.cpp, PrefetchLoads.cpp; the forward template asks for both,
// the backward for the hoist): forced on every kernel here, the decode template's too, at the
// default config and on one warpgroup, lengths off the block, GQA, a padded head dim.
TEST(FlexAttentionGpu, HoistedAndPrefetchedLoadsEveryVariant) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  ScopedSetenv hoisted("FLEXTILE_HOIST_INVARIANT_LOADS", "1");
  ScopedSetenv prefetched("FLEXTILE_PREFETCH_LOADS", "1");
  for (const Variant& var : variants())
    for (AttentionCase c : kScheduleCases) {
      if (!inScope(c.work())) continue;
      c.context = "variant " + var.name + ", hoisted invariant loads";
      VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kDevice, BlockSizes{}, rng()});
      for (const std::optional<FlexAttentionConfig>& config :
           {std::optional<FlexAttentionConfig>{}, std::optional{FlexAttentionConfig{64, 64, 4, 2}}})
        if (!checkFlexAttention(rng, c, kDevice, inst.score, inst.mask, inst.refScore, inst.refMask, withConfig(config)))
          return;
    }
}

// The yardstick's window and prefix cut at 8192 (the one long case: the float64 reference is slow).
TEST(FlexAttentionGpu, Length8192) {
  FLEXTILE_REQUIRE_GPU();
  FLEXTILE_SKIP_WHEN_SMALL("only lengths of 8190");
  SeededRandom rng;
  for (const char* name : {"sliding_window", "prefix_lm"}) {
    AttentionCase c{.B = 1, .Hq = 2, .Hkv = 1, .L = 8190, .S = 8190, .D = 128, .dtype = DType::BF16};
    c.context = std::string("variant ") + name;
    VariantInstance inst = variant(name).make({c.B, c.Hq, c.L, c.S, kDevice, BlockSizes{}, rng()});
    if (!checkFlexAttention(rng, c, kDevice, inst.score, inst.mask, inst.refScore, inst.refMask)) return;
  }
}

// Small windows and prefixes (the yardstick's cover small inputs whole), per-head windows under GQA.
TEST(FlexAttentionGpu, SmallWindowsAndPrefixes) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  for (int64_t W : {1, 7, 100, 300}) {
    AttentionCase c{.B = 2, .Hq = 4, .Hkv = 1, .L = 1000, .S = 1000, .D = 64, .dtype = DType::BF16};
    if (!inScope(c.work())) break;
    c.context = "window " + std::to_string(W);
    BlockMask m = slidingWindowBlockMask(1, 1, c.L, c.S, {W}, {}, kDevice);
    if (!checkFlexAttention(rng, c, kDevice, noop_score(), m, nullptr, refWindow({W}))) return;
  }
  const std::vector<int64_t> windows{3, 17, 200, 1000};
  AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 700, .S = 650, .D = 128, .dtype = DType::F16};
  c.context = "per-head windows";
  BlockMask m = slidingWindowBlockMask(1, 4, c.L, c.S, windows, {}, kDevice);
  if (inScope(c.work()) && !checkFlexAttention(rng, c, kDevice, noop_score(), m, nullptr, refWindow(windows))) return;
  for (int64_t P : {1, 60, 300}) {
    AttentionCase p{.B = 1, .Hq = 8, .Hkv = 1, .L = 500, .S = 520, .D = 64, .dtype = DType::BF16};
    if (!inScope(p.work())) break;
    p.context = "prefix " + std::to_string(P);
    if (!checkFlexAttention(rng, p, kDevice, noop_score(), prefixLmBlockMask(1, 1, p.L, p.S, P), nullptr,
                            refPrefix(P)))
      return;
  }
}

// out 0 and lse -inf for rows without an allowed key, in partial blocks, in
// whole empty query blocks, everywhere, and through a score_mod of -inf.
TEST(FlexAttentionGpu, FullyMaskedRows) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  MaskMod everyThirdRowBlind("every_third_row_blind", [](const Tile&, const Tile&, const Tile& q, const Tile& kv) {
    return (q % 3 != 0) & (kv <= q);
  });
  RefMaskFn refEveryThird = [](int64_t, int64_t, int64_t q, int64_t kv) { return q % 3 != 0 && kv <= q; };
  MaskMod firstRowsBlind("first_300_rows_blind",
                         [](const Tile&, const Tile&, const Tile& q, const Tile& kv) { return (q >= 300) & (kv <= q); });
  RefMaskFn refFirstRows = [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= 300 && kv <= q; };
  ScoreMod killRows("kill_every_third_row", [](const Tile& s, const Tile&, const Tile&, const Tile& q, const Tile&) {
    return where(q % 3 == 0, -INFINITY, s);
  });
  RefScoreFn refKill = [](double s, int64_t, int64_t, int64_t q, int64_t) { return q % 3 == 0 ? -INFINITY : s; };
  ConfigSample configs(kConfigs, 2, rng);  // two per shape: the three shapes cover all four
  for (AttentionCase c : {AttentionCase{.B = 2, .Hq = 4, .Hkv = 1, .L = 1000, .S = 1000, .D = 64, .dtype = DType::BF16},
                          AttentionCase{.B = 1, .Hq = 2, .Hkv = 2, .L = 1, .S = 7, .D = 128, .dtype = DType::F16},
                          AttentionCase{.B = 1, .Hq = 8, .Hkv = 2, .L = 513, .S = 200, .D = 128, .dtype = DType::BF16}}) {
    if (!inScope(c.work())) continue;
    for (const auto& config : configs.next()) {
      const FlexAttentionOptions o = withConfig(config);
      c.context = "every third row blind " + configName(config);
      BlockMask m = createBlockMask(everyThirdRowBlind, 1, 1, c.L, c.S, {}, kDevice);
      if (!checkFlexAttention(rng, c, kDevice, noop_score(), m, nullptr, refEveryThird, o)) return;
      c.context = "first 300 rows blind " + configName(config);
      BlockMask m2 = createBlockMask(firstRowsBlind, 1, 1, c.L, c.S, {}, kDevice);
      if (!checkFlexAttention(rng, c, kDevice, noop_score(), m2, nullptr, refFirstRows, o)) return;
      c.context = "nothing allowed " + configName(config);
      BlockMask none = createBlockMask(or_masks(std::vector<MaskMod>{}), 1, 1, c.L, c.S, {}, kDevice);
      if (!checkFlexAttention(rng, c, kDevice, noop_score(), none, nullptr,
                              [](int64_t, int64_t, int64_t, int64_t) { return false; }, o))
        return;
      c.context = "score_mod -inf rows " + configName(config);
      if (!checkFlexAttention(rng, c, kDevice, killRows, causalBlockMask(1, 1, c.L, c.S), refKill, refCausal(), o))
        return;
    }
  }
}

// Mask algebra with device-captured document ids, per (b, h) lists.
TEST(FlexAttentionGpu, MaskAlgebra) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const int64_t B = 2, Hq = 4, Hkv = 2, L = 1000, S = 900;
  if (!inScope(B * Hq * L * S)) GTEST_SKIP() << "FLEXTILE_GPU_TEST_SMALL=1: only L=1000 S=900";
  const std::vector<MaskCombo> combos = maskAlgebraCombos(rng, B, Hq, L, 6, kDevice, 10);
  for (const MaskCombo& combo : combos)
    for (DType dt : {DType::BF16, DType::F16}) {
      AttentionCase c{.B = B, .Hq = Hq, .Hkv = Hkv, .L = L, .S = S, .D = 128, .dtype = dt, .context = combo.name};
      BlockMask m = createBlockMask(combo.mod, combo.maskB, combo.maskH, L, S, {}, kDevice);
      if (!checkFlexAttention(rng, c, kDevice, noop_score(), m, nullptr, combo.ref)) return;
    }
}

// wgmma in a loop that converts a layout through shared memory (docs/performance.md, "Wrong rows
// with wgmma"): the mask mod compares document ids ^ 1, which loads them in one layout and
// compares them in another. D = 64 at BLOCK_N 64 is where the H200 returned wrong rows in every
// iteration after the first, until the backend kept such loops' blocks in order (38b2184). The
// plan is checked to really use wgmma.
namespace {
// Per loop that converts a layout (through shared memory), whether it is warp-specialized.
std::vector<bool> conversionLoopsSpecialized(const std::string& irText) {
  std::vector<bool> out;
  const ir::Module m = ir::parseModule(irText, "compiled kernel");
  std::function<bool(const ir::Block&)> converts = [&](const ir::Block& b) {
    for (const auto& op : b.ops()) {
      if (op->kind() == ir::OpKind::ConvertLayout) return true;
      for (const auto& r : op->regions())
        if (converts(*r)) return true;
    }
    return false;
  };
  for (const auto& f : m.functions)
    f->walk([&](const ir::Op& op) {
      if (op.kind() == ir::OpKind::For && converts(*op.regions().front())) out.push_back(op.hasAttr("ws"));
    });
  return out;
}

// The shifted-documents mask's loop converts the ids through shared memory; `expectTma` says
// whether its K/V rings are TMA's (then warp-specialized) or cp.async's.
void checkSharedConversionsInWgmmaLoops(SeededRandom& rng, bool expectTma) {
  for (auto [B, Hq, Hkv, L, S] : std::vector<std::array<int64_t, 5>>{{1, 8, 2, 127, 129}, {2, 4, 1, 1000, 1000}, {1, 2, 2, 300, 777}}) {
    std::vector<int32_t> ids(size_t(B * S));
    int32_t doc = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i % size_t(S) == 0 || rng() % 97 == 0) ++doc;
      ids[i] = doc;
    }
    CapturedTensor idsT = dsl::capture(Tensor::fromHost(ids, {B, S}).to(kDevice), "ids");
    MaskMod docs = and_masks(causal_mask(), MaskMod("shifted_documents",
                                                    [idsT](const Tile& b, const Tile&, const Tile& q, const Tile& kv) {
                                                      return (idsT(b, q) ^ 1) == (idsT(b, kv) ^ 1);
                                                    },
                                                    {idsT}));
    RefMaskFn ref = [ids, S](int64_t b, int64_t, int64_t q, int64_t kv) {
      return kv <= q && ids[size_t(b * S + q)] == ids[size_t(b * S + kv)];
    };
    BlockMask mask = createBlockMask(docs, B, 1, L, S, {}, kDevice);
    for (const FlexAttentionConfig config : {FlexAttentionConfig{64, 64, 4, 2}, FlexAttentionConfig{128, 64, 8, 2}}) {
      AttentionCase c{.B = B, .Hq = Hq, .Hkv = Hkv, .L = L, .S = S, .D = 64, .dtype = DType::BF16};
      c.context = "shifted documents, " + config.describe();
      // Device tensors: the mask mod captures device ids, and a plan needs every tensor in one space.
      const Tensor dq = Tensor::empty(DType::BF16, {B, Hq, L, 64}, kDevice), dk = Tensor::empty(DType::BF16, {B, Hkv, S, 64}, kDevice);
      auto plan = plan_flex_attention(dq, dk, dk, noop_score(), mask, {.config = config}, true, codegen::Target::sm90a());
      ASSERT_NE(plan.compiled->ptx.find("wgmma.mma_async"), std::string::npos) << c.context << ": the loop is not on wgmma";
      // The loop with the mask's conversions is warp-specialized (TMA rings) or not; the loop over
      // full blocks, without a mask, is specialized either way (when the mask has full blocks).
      const std::vector<bool> specialized = conversionLoopsSpecialized(plan.compiled->ir);
      ASSERT_FALSE(specialized.empty()) << c.context << ": no loop converts through shared memory";
      for (bool s : specialized) {
        ASSERT_EQ(s, expectTma) << c.context;
      }
      if (expectTma) {
        ASSERT_NE(plan.compiled->ptx.find("cp.async.bulk.tensor"), std::string::npos) << c.context;
      }
      // Every shape and config, even after a failure: which of them fail tells a race from a layout.
      checkFlexAttention(rng, c, kDevice, noop_score(), mask, nullptr, ref, {.config = config});
    }
  }
}
}  // namespace

TEST(FlexAttentionGpu, WgmmaInLoopsWithSharedConversions) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  checkSharedConversionsInWgmmaLoops(rng, false);
}

// The same loops on TMA rings with a producer warpgroup (opt-in: FLEXTILE_TMA_IN_STAGING_LOOPS=1).
// Without specialization such a loop gave wrong rows from row 66 on (2026-12-02, not understood);
// specialized, the conversions' barriers are the consumers' own. This test says whether that holds.
TEST(FlexAttentionGpu, WgmmaInLoopsWithSharedConversionsOnTmaRings) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  ScopedSetenv staging("FLEXTILE_TMA_IN_STAGING_LOOPS", "1");
  checkSharedConversionsInWgmmaLoops(rng, true);
}

// Decode-like row slices: one query block, one query mid-block.
TEST(FlexAttentionGpu, SlicedRows) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const int64_t L = 1000, S = 1000;
  const BlockMask window = slidingWindowBlockMask(1, 1, L, S, {300}, {}, kDevice);
  for (auto [start, count, offset, length] :
       {std::tuple<int64_t, int64_t, std::optional<int64_t>, std::optional<int64_t>>{0, 1, {}, {}},
        {3, 2, {}, {}}, {7, 1, {}, {}}, {7, 1, 999, 1}, {4, 1, 555, 1}, {4, 1, 520, 33}}) {
    BlockMask slice = window.sliceRows(start, count, offset, length);
    AttentionCase c{.B = 2, .Hq = 8, .Hkv = 1, .L = slice.qLen(), .S = S, .D = 128, .dtype = DType::BF16};
    if (!inScope(c.work())) continue;
    c.context = "window 300 slice at " + std::to_string(slice.qOffset());
    if (!checkFlexAttention(rng, c, kDevice, noop_score(), slice, nullptr, refWindow({300}),
                            {.config = FlexAttentionConfig{64, 64, 4, 2}}))
      return;
  }
}

// q as a [B, L, H, D] device buffer viewed as [B, H, L, D], k and v in one
// packed buffer, out with padded rows (the padding must stay untouched).
TEST(FlexAttentionGpu, StridedDeviceViews) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const int64_t B = 2, Hq = 4, Hkv = 2, L = 300, S = 257, D = 128;
  const DType dt = DType::BF16;
  const int64_t eb = 2;
  auto randomValues = [&](int64_t elements) {
    std::vector<Eigen::bfloat16> v(static_cast<size_t>(elements));
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto& x : v) x = Eigen::bfloat16(u(rng));
    return v;
  };
  std::vector<Eigen::bfloat16> qHost = randomValues(B * L * Hq * D), kvHost = randomValues(B * S * 2 * Hkv * D);
  Tensor qBuf = Tensor::fromHost(qHost, {B * L * Hq * D}, kDevice);
  Tensor kvBuf = Tensor::fromHost(kvHost, {B * S * 2 * Hkv * D}, kDevice);
  const std::vector<int64_t> qStrides{L * Hq * D, D, Hq * D, 1}, kvStrides{S * 2 * Hkv * D, D, 2 * Hkv * D, 1};
  Tensor q = Tensor::deviceView(qBuf.deviceAddress(), dt, {B, Hq, L, D}, qStrides);
  Tensor k = Tensor::deviceView(kvBuf.deviceAddress(), dt, {B, Hkv, S, D}, kvStrides);
  Tensor v = Tensor::deviceView(kvBuf.deviceAddress() + uint64_t(Hkv * D * eb), dt, {B, Hkv, S, D}, kvStrides);
  const int64_t pitch = D + 64;
  const std::vector<int64_t> outStrides{L * Hq * pitch, pitch, Hq * pitch, 1};
  std::vector<Eigen::bfloat16> sentinel(size_t(B * L * Hq * pitch), Eigen::bfloat16(NAN));
  Tensor outBuf = Tensor::fromHost(sentinel, {B * L * Hq * pitch}, kDevice);
  Tensor out = Tensor::deviceView(outBuf.deviceAddress(), dt, {B, Hq, L, D}, outStrides);
  Tensor lse = Tensor::empty(DType::F32, {B, Hq, L}, kDevice);
  BlockMask mask = causalBlockMask(1, 1, L, S);
  flex_attention_into(q, k, v, noop_score(), mask, out, &lse);
  // The reference reads the same layouts through host views.
  Tensor qh = Tensor::hostView(qHost.data(), dt, {B, Hq, L, D}, qStrides);
  Tensor kh = Tensor::hostView(kvHost.data(), dt, {B, Hkv, S, D}, kvStrides);
  Tensor vh = Tensor::hostView(kvHost.data() + Hkv * D, dt, {B, Hkv, S, D}, kvStrides);
  std::vector<Eigen::bfloat16> outHost = outBuf.toHost<Eigen::bfloat16>();
  Tensor oh = Tensor::hostView(outHost.data(), dt, {B, Hq, L, D}, outStrides);
  ReferenceResult ref = referenceAttention(qh, kh, vh, nullptr, refCausal(), 1.0 / std::sqrt(double(D)));
  EXPECT_TRUE(compareWithReference(oh, lse, ref, D, dt));
  for (int64_t r = 0; r < B * L * Hq; ++r)
    for (int64_t d = D; d < pitch; ++d)
      if (!std::isnan(float(outHost[size_t(r * pitch + d)]))) {
        ADD_FAILURE() << "out row " << r << " was written past D at " << d;
        return;
      }
}

// A second call with the same mods (new inputs, new captured values) finds
// the traced and compiled kernel again.
TEST(FlexAttentionGpu, RepeatedCallsNeitherRetraceNorRecompile) {
  FLEXTILE_REQUIRE_GPU();
  FLEXTILE_SKIP_WHEN_SMALL("only L=1000 (a cache test, not a kernel's)");
  SeededRandom rng;
  const int64_t H = 4, L = 1000;
  std::vector<float> slopes(static_cast<size_t>(H));
  CapturedTensor captured = dsl::capture(Tensor::zeros(DType::F32, {H}, kDevice), "slopes");
  ScoreMod mod = alibi(captured);
  BlockMask mask = causalBlockMask(1, 1, L, L);
  auto refScore = [&slopes](double s, int64_t, int64_t h, int64_t q, int64_t kv) {
    return s + double(slopes[size_t(h)]) * double(kv - q);
  };
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    for (auto& x : slopes) x = std::uniform_real_distribution<float>(0.01f, 0.5f)(rng);
    if (round < 2)
      captured.tensor().copyFromHost(slopes);
    else
      captured.rebind(Tensor::fromHost(slopes, {H}, kDevice));
    AttentionCase c{.B = 2, .Hq = H, .Hkv = 2, .L = L, .S = L, .D = 128, .dtype = DType::BF16, .context = "alibi"};
    if (!checkFlexAttention(rng, c, kDevice, mod, mask, refScore, refCausal())) return;
  }
  const dsl::Kernel* kernel = forwardKernel(mask.maskMod(), mod, DType::BF16);
  ASSERT_NE(kernel, nullptr) << "no forward kernel cached for the mods";
  EXPECT_EQ(kernel->numTraces(), 1u);
  EXPECT_EQ(kernel->numCompiled(), 1u);
}

// The same inputs give the same answer on the GPU as through the interpreter.
TEST(FlexAttentionGpu, MatchesTheInterpreter) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const int64_t B = 1, Hq = 4, Hkv = 1, L = 200, S = 150, D = 64;
  Tensor q = randomTensor(rng, DType::F16, {B, Hq, L, D}, kHost);
  Tensor k = randomTensor(rng, DType::F16, {B, Hkv, S, D}, kHost);
  Tensor v = randomTensor(rng, DType::F16, {B, Hkv, S, D}, kHost);
  const FlexAttentionOptions o{.return_lse = true, .config = FlexAttentionConfig{64, 32, 4, 2}};
  FlexAttentionResult host = flex_attention(q, k, v, soft_cap(20), causalBlockMask(1, 1, L, S), o);
  FlexAttentionResult dev = flex_attention(q.to(kDevice), k.to(kDevice), v.to(kDevice), soft_cap(20),
                                           causalBlockMask(1, 1, L, S), o);
  const std::vector<double> a = toDoubles(host.out), b = toDoubles(dev.out.to(kHost));
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  EXPECT_LE(worst, 2e-3);  // the GPU's tanh and exp2 approximations against the interpreter's libm
  const std::vector<float> la = host.lse.toHost<float>(), lb = dev.lse.to(kHost).toHost<float>();
  for (size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(la[i], lb[i], 1e-3) << "lse " << i;
}
