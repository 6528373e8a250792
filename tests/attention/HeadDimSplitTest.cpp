// The split head dim of the forward and the backward (detail::headDimSplit): where a head dim sits
// just past a power of two (192 = 128 + 64, 96 = 64 + 32, 80 = 64 + 16), Q·Kᵀ is the sum of two
// chunks' products instead of one product over the padded width, and an accumulator over it (dQ,
// dK; V's side: dV, the forward's output) a tile a chunk. Which dims split, the forward and the backward against float64
// before the passes and after sm_90a's (wgmma chained through the accumulator, a TMA box per chunk,
// the producer warpgroup, skewed walks, persistent programs with a split last round, a paged K/V),
// the forward against the decode template (which pads), and what the sm_90a kernel issues for it.
#include <gtest/gtest.h>

#include "tests/TextCount.h"
#include "FlexAttentionBackwardCheck.h"
#include "FlexAttentionDecodeCheck.h"
#include "HeadDimCheck.h"
#include "PagedKVCheck.h"
#include "attention_templates/FlexAttentionCommon.h"
#include "attention_templates/Variants.h"
#include "codegen/Ptxas.h"
#include "gpu/GpuTest.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"  // designated initializers leave members default

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::testing;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

namespace {

constexpr MemorySpace kHost = MemorySpace::Host;

using Dims = HeadDims;
// MLA's prefill (192 / 128), equal dims that split (96, 80: the backward splits V too, the forward
// pads it, its second chunk narrower than 64 columns), chunks of 16 columns (80 = 64 + 16,
// 48 = 32 + 16), and a second chunk that pads (176 = 128 + 48, in 64 columns; V's too, which the
// forward splits).
const Dims kSplitDims[] = {{192, 128}, {96, 96}, {80, 80}, {48, 64}, {176, 176}};

using flextile::testing::count;

}  // namespace

TEST(HeadDimSplit, SplitsWhereTheChunksAreNarrowerThanThePadding) {
  for (auto [D, first] : std::vector<std::pair<int64_t, int64_t>>{
           {192, 128}, {160, 128}, {176, 128}, {96, 64}, {80, 64}, {48, 32}, {16, 0}, {32, 0}, {64, 0},
           {112, 0}, {128, 0}, {208, 0}, {224, 0}, {240, 0}, {256, 0}}) {
    EXPECT_EQ(attention::detail::headDimSplit(D), first) << "D = " << D;
    EXPECT_EQ(attention::detail::tileColumns(D), first ? first + attention::detail::paddedHeadDim(D - first) : attention::detail::paddedHeadDim(D));
  }
  EXPECT_EQ(attention::detail::tileColumns(192), 192);
  EXPECT_EQ(attention::detail::tileColumns(80), 80);
  // V's split (the forward asks for chunks of 64 columns or more; the backward for any).
  EXPECT_EQ(attention::detail::valueDimSplit(96), 64);
  EXPECT_EQ(attention::detail::valueDimSplit(96, 64), 0);
  EXPECT_EQ(attention::detail::valueDimSplit(160, 64), 0);
  EXPECT_EQ(attention::detail::valueDimSplit(192, 64), 128);
  EXPECT_EQ(attention::detail::valueDimSplit(176, 64), 128);
  {
    ScopedSetenv vOff("FLEXTILE_SPLIT_VALUE_DIM", "0");
    EXPECT_EQ(attention::detail::valueDimSplit(192), 0);
    EXPECT_EQ(attention::detail::headDimSplit(192), 128);
  }
  ScopedSetenv off("FLEXTILE_SPLIT_HEAD_DIM", "0");
  EXPECT_EQ(attention::detail::headDimSplit(192), 0);
  EXPECT_EQ(attention::detail::valueDimSplit(192), 0);
  EXPECT_EQ(attention::detail::tileColumns(192), 256);
}

// On the interpreter: keys ending mid-block, GQA 2:1, masks with rows that see no key, a score_mod.
TEST(HeadDimSplit, ForwardMatchesTheReference) {
  SeededRandom rng;
  size_t index = 0;
  for (Dims dims : kSplitDims) {
    if (!runsInThisBuild(rng.seed(), index++, 2)) continue;
    const std::string label = dims.describe();
    if (!checkVariantsAt(rng, label, {"full", "causal", "softcap", "document"}, dims,
                         {.config = FlexAttentionConfig{32, 32, 4, 2}}))
      return;
  }
}

// After sm_90a's passes: one and two warpgroups (wgmma, a TMA box and ring per chunk), the producer
// warpgroup, the skewed and overlapped walks (K's chunks staged a step ahead of V), persistent
// programs with the last round split, and a paged K/V whose chunks are read through the page table.
TEST(HeadDimSplit, ForwardAfterTheSm90aPasses) {
  SeededRandom rng;
  InterpretAfterPasses scope("sm_90a");
  size_t index = 0;
  for (Dims dims : kSplitDims) {
    if (!runsInThisBuild(rng.seed(), index++, 5)) continue;  // under the sanitizers one dim a run
    const std::string label = "sm_90a " + dims.describe();
    for (const FlexAttentionConfig& config :
         {FlexAttentionConfig{64, 64, 4, 2}, FlexAttentionConfig{128, 64, 8, 2},
          FlexAttentionConfig{128, 64, 8, 2, WarpSpecialization::On}, FlexAttentionConfig::parse("128,64,8,2,skew"),
          FlexAttentionConfig::parse("128,64,8,2,skew,overlap")})
      if (!checkVariantsAt(rng, label + " " + config.describe(), {"full", "sliding_window", "alibi"}, dims,
                           {.config = config}))
        return;
    if (!checkPersistentSplitLastRound(rng, label, dims)) return;
    PagedCase pc{.B = 3, .Hq = 4, .Hkv = 2, .L = 70, .D = dims.D, .pageSize = 64, .lengths = {200, 0, 130},
                 .sharedPrefixPages = 1, .context = "paged, " + label, .DV = dims.DV};
    if (!checkPaged(rng, pc, kHost, noop_score(), std::nullopt, nullptr, nullptr,
                    {.config = FlexAttentionConfig{64, 64, 4, 2}}))
      return;
  }
}

// The backward, whose kernels split the head dim as the forward does (dq: Q's, K's and dQ's chunks;
// dkdv: K's resident chunks, Q's streamed ones and dK's; and V's side where DV splits, 96 and 80):
// on the interpreter, and after sm_90a's passes on mma.sync, one warpgroup (wgmma), two with the
// producer warpgroup (TMA boxes per chunk), and the atomic dQ; masked rows, keys off the block, GQA.
TEST(HeadDimSplit, BackwardMatchesTheReference) {
  SeededRandom rng;
  size_t index = 0;
  auto check = [&](Dims dims, const FlexAttentionBackwardConfig& config, const std::string& label,
                   DqAccumulation dqAccumulation = DqAccumulation::Separate) {
    return checkBackwardVariantsAt(rng, label + " " + dims.describe() + " " + config.describe(), dims, 140, 130, 128,
                                   FlexAttentionConfig{64, 64, 4, 2},
                                   {.dq_accumulation = dqAccumulation, .config = config});
  };
  // Under the sanitizers one dim of the five on the interpreter a run, and one of the four after
  // the passes in about four runs in five (the test was 57 CPU-seconds there at one in three).
  for (Dims dims : kSplitDims) {
    if (!runsInThisBuild(rng.seed(), index++, 5)) continue;
    if (!check(dims, {{32, 32, 4, 2}, {32, 32, 4, 2}}, "interpreter")) return;
  }
  InterpretAfterPasses scope("sm_90a");
  // dkdv on mma.sync and on one and two warpgroups (and specialized), each beside a dq tile.
  const auto ws = WarpSpecialization::On;
  const std::vector<FlexAttentionBackwardConfig> configs{{{16, 32, 4, 2}, {64, 64, 4, 2}},
                                                         {{16, 64, 4, 2}, {128, 64, 8, 2, ws}},
                                                         {{32, 128, 8, 2}, {16, 32, 4, 2}},
                                                         {{64, 128, 8, 2, ws}, {64, 32, 4, 2}}};
  for (Dims dims : {Dims{192, 128}, Dims{96, 96}, Dims{176, 128}, Dims{80, 80}}) {
    if (!runsInThisBuild(rng.seed(), index++, 5)) continue;
    for (const FlexAttentionBackwardConfig& config : configs)
      if (!check(dims, config, "sm_90a")) return;
    // The default for these dims (past D = 128: dkdv 64 × 64 on two warpgroups splitting N, dq 128 × 64
    // specialized).
    if (!check(dims,
               defaultFlexAttentionBackwardConfig(DType::BF16, dims.D, codegen::Target::sm90a(), false,
                                                  DqAccumulation::Separate, dims.DV),
               "sm_90a default"))
      return;
    // The atomic dQ: dkdv adds each chunk's share at its columns.
    if (!check(dims, {{16, 64, 4, 2}, {16, 64, 4, 2}}, "sm_90a atomic dQ", DqAccumulation::Atomic)) return;
  }
}

// The decode template (which pads) and the prefill template (which splits) on the same queries, L in
// {1, 5}, a window with query offsets, against float64 and each other.
TEST(HeadDimSplit, DecodeAgreesWithTheSplitPrefill) {
  SeededRandom rng;
  size_t index = 0;
  for (Dims dims : {Dims{192, 128}, Dims{96, 96}}) {
    if (!runsInThisBuild(rng.seed(), index++, 2)) continue;
    for (int64_t L : {1, 5})
      for (const char* name : {"full", "sliding_window"}) {
        AttentionCase c{.B = 2, .Hq = 4, .Hkv = 1, .L = L, .S = 300, .D = dims.D, .dtype = DType::BF16,
                        .context = "decode against the split prefill, " + dims.describe(),
                        .DV = dims.DV};
        if (!checkDecodeVariant(rng, variant(name), c, kHost)) return;
      }
  }
}

// What the split buys on sm_90a at MLA's dims: Q·Kᵀ over 192 columns is 12 wgmma k-steps a product
// instead of 16 over the padded 256, every product still on wgmma, K's chunks copied by TMA in fewer
// panels, nothing spilled beyond what the padded kernel spills. Against the same
// kernel with FLEXTILE_SPLIT_HEAD_DIM=0.
TEST(HeadDimSplit, Sm90aIssuesFewerProductsAndSpillsNoMore) {
  if (!assemblesInThisBuild()) GTEST_SKIP() << "ptxas not found or a sanitized build: not assembling";
  const codegen::Target target = codegen::Target::sm90a();
  const int64_t B = 2, Hq = 16, N = 8192;
  Tensor q = Tensor::zeros(DType::BF16, {B, Hq, N, 192}, kHost);
  Tensor v = Tensor::zeros(DType::BF16, {B, Hq, N, 128}, kHost);
  SeededRandom rng;
  const VariantInstance causal = variant("causal").make({B, Hq, N, N, kHost, BlockSizes{}, rng()});
  auto kernel = [&](const char* split) {
    ScopedSetenv s("FLEXTILE_SPLIT_HEAD_DIM", split);
    const FlexAttentionPlan plan = plan_flex_attention(q, q, v, noop_score(), causal.mask, {}, true, target);
    return std::tuple{plan.compiled->ptx, codegen::runPtxas(plan.compiled->ptx, target),
                      plan.compiled->tensorMaps.size()};
  };
  const auto [splitPtx, splitReport, splitMaps] = kernel("1");
  const auto [paddedPtx, paddedReport, paddedMaps] = kernel("0");
  // K's chunks are copied in 64-column panels of one tensor map (3 panels a step instead of 4).
  EXPECT_EQ(splitMaps, paddedMaps);
  const int splitCopies = count(splitPtx, R"(cp\.async\.bulk\.tensor)");
  EXPECT_GT(splitCopies, 0);
  EXPECT_LT(splitCopies, count(paddedPtx, R"(cp\.async\.bulk\.tensor)"));
  // At D = 80 K's chunks are 64 and 16 columns: panels of two widths, a map each, beside V's (whose
  // 16-column chunk the forward does not split off: valueDimSplit's minimum).
  Tensor q80 = Tensor::zeros(DType::BF16, {B, Hq, N, 80}, kHost);
  EXPECT_EQ(plan_flex_attention(q80, q80, q80, noop_score(), causal.mask, {}, true, target).compiled->tensorMaps.size(),
            3u);
  const int splitProducts = count(splitPtx, R"(wgmma\.mma_async)"), paddedProducts = count(paddedPtx, R"(wgmma\.mma_async)");
  std::printf("D=192 DV=128 causal: %d wgmma split, %d padded; spills %d / %d bytes\n", splitProducts, paddedProducts,
              splitReport.spillStoreBytes, paddedReport.spillStoreBytes);
  EXPECT_GT(splitProducts, 0);
  EXPECT_EQ(count(splitPtx, R"(mma\.sync)"), 0);
  // Per walk and warpgroup, Q·Kᵀ's 16 instructions (k = 16 each) become 12 and P·V keeps its 4
  // (64 keys): 20 → 16.
  EXPECT_EQ(splitProducts * 20, paddedProducts * 16);
  EXPECT_LE(splitReport.spillStoreBytes, paddedReport.spillStoreBytes) << splitReport.log;

  // The backward's dkdv on one warpgroup: per query step Sᵀ = K·Qᵀ's 16 k-steps become 12, dPᵀ keeps
  // its 8 (DV = 128), dV's product its one, and dK's one 256-column product becomes one a chunk:
  // 26 → 23.
  Tensor lse = Tensor::zeros(DType::F32, {B, Hq, N}, kHost);
  auto dkdv = [&](const char* split) {
    ScopedSetenv s("FLEXTILE_SPLIT_HEAD_DIM", split);
    const FlexAttentionBackwardPlan plan = plan_flex_attention_backward(
        q, q, v, v, lse, v, noop_score(), causal.mask,
        {.config = FlexAttentionBackwardConfig{{16, 64, 4, 2}, {64, 64, 4, 2}}}, target);
    for (size_t i = 0; i < plan.kernelNames.size(); ++i)
      if (plan.kernelNames[i].find("dkdv") != std::string::npos)
        return std::pair{plan.compiled[i]->ptx, codegen::runPtxas(plan.compiled[i]->ptx, target)};
    ADD_FAILURE() << "no dkdv kernel in the plan";
    return std::pair{std::string(), codegen::PtxasReport{}};
  };
  const auto [splitDkdv, splitDkdvReport] = dkdv("1");
  const auto [paddedDkdv, paddedDkdvReport] = dkdv("0");
  const int splitDkdvProducts = count(splitDkdv, R"(wgmma\.mma_async)");
  EXPECT_GT(splitDkdvProducts, 0);
  EXPECT_EQ(count(splitDkdv, R"(mma\.sync)"), 0);
  EXPECT_EQ(splitDkdvProducts * 26, count(paddedDkdv, R"(wgmma\.mma_async)") * 23);
  EXPECT_LE(splitDkdvReport.spillStoreBytes, paddedDkdvReport.spillStoreBytes) << splitDkdvReport.log;
}
