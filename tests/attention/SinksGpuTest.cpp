// FlexAttentionOptions::sinks on the GPU: the default kernels of every variant (wgmma, TMA rings, a
// producer warpgroup where the GPU has them), a persistent forward that splits its last round (the
// merge kernel folds the sink), the decode's splits, fused and cluster merges, the paged cache, and
// the backward's default kernels with dsinks, against the float64 reference; outputs poisoned first.
#include <gtest/gtest.h>

#include "FlexAttentionBackwardCheck.h"
#include "FlexAttentionDecodeCheck.h"
#include "PagedKVCheck.h"
#include "gpu/GpuTest.h"
#include "runtime/Device.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::testing;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

namespace {
constexpr MemorySpace kDevice = MemorySpace::Device;
}  // namespace

TEST(SinksGpu, EveryVariantWithItsDefaultKernel) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  // One case a variant (each is a kernel of its own to compile: the GPU suite's time is short).
  int i = 0;
  for (const Variant& var : variants())
    for (AttentionCase c : {i++ % 2 ? AttentionCase{.B = 2, .Hq = 8, .Hkv = 2, .L = 1000, .S = 1100, .D = 128}
                                    : AttentionCase{.B = 1, .Hq = 4, .Hkv = 4, .L = 333, .S = 257, .D = 64,
                                                    .dtype = DType::F16}}) {
      c.context = "variant " + var.name;
      VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kDevice, BlockSizes{}, rng()});
      FlexAttentionOptions o{.return_max_scores = true};
      o.sinks = randomSinks(rng, c.Hq, kDevice, c.S);
      if (!checkFlexAttention(rng, c, kDevice, inst.score, inst.mask, inst.refScore, inst.refMask, o)) return;
    }
}

TEST(SinksGpu, PersistentForwardSplittingItsLastRound) {
  FLEXTILE_REQUIRE_GPU();
  if (runtime::Device::current().capabilityMajor() < 9) GTEST_SKIP() << "persistent programs take the sm_90a turns";
  SeededRandom rng;
  flextile::testing::ScopedSetenv persistent("FLEXTILE_FORWARD_PERSISTENT", "1");
  AttentionCase c{.B = 1, .Hq = 8, .Hkv = 2, .L = 4096, .S = 4096, .D = 128, .context = "persistent"};
  FlexAttentionOptions options{.config = FlexAttentionConfig{128, 128, 8, 2}};
  options.sinks = randomSinks(rng, c.Hq, kDevice, c.S);
  Tensor q = Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.D}, kDevice);
  Tensor k = Tensor::empty(c.dtype, {c.B, c.Hkv, c.S, c.D}, kDevice);
  const FlexAttentionPlan plan = plan_flex_attention(q, k, k, noop_score(), std::nullopt, options);
  EXPECT_GT(plan.persistentPrograms, 0);
  ASSERT_TRUE(plan.lastRoundSplit);
  checkFlexAttention(rng, c, kDevice, noop_score(), std::nullopt, nullptr, nullptr, options);
}

TEST(SinksGpu, DecodeSplitsAndTheirMerge) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const DecodeCheck how{.splits = {0, 1, 5}, .blocks = {128, 128}, .prefillConfig = {64, 64, 4, 2}, .sinks = true};
  for (const char* name : {"causal", "sliding_window"})
    for (AttentionCase c : {AttentionCase{.B = 2, .Hq = 32, .Hkv = 8, .L = 1, .S = 4097, .D = 128},
                            AttentionCase{.B = 1, .Hq = 8, .Hkv = 1, .L = 5, .S = 1000, .D = 64}})
      if (!checkDecodeVariant(rng, variant(name), c, kDevice, how)) return;
  // The cluster merge: one cluster a group (4 splits), and clusters of 8 folded by the ticket (16).
  ScopedSetenv cluster("FLEXTILE_DECODE_CLUSTER_MERGE", "1");
  const DecodeCheck clustered{.splits = {4, 16}, .blocks = {128, 128}, .prefillConfig = {64, 64, 4, 2}, .sinks = true};
  if (!checkDecodeVariant(rng, variant("causal"), AttentionCase{.B = 2, .Hq = 32, .Hkv = 8, .L = 1, .S = 4097, .D = 128},
                          kDevice, clustered))
    return;
}

TEST(SinksGpu, PagedPrefillAndDecode) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  for (int64_t L : {200, 1}) {
    PagedCase c{.B = 3, .Hq = 8, .Hkv = 2, .L = L, .D = 128, .pageSize = 128, .lengths = {3000, 1500, 0}};
    c.sharedPrefixPages = 2;
    c.context = "L " + std::to_string(L);
    const BlockMask mask = createBlockMask(causal_mask(), c.B, 1, L, c.logicalLength(), {128, 128}, kDevice);
    FlexAttentionOptions o;
    o.sinks = randomSinks(rng, c.Hq, kDevice, 1500);
    if (!checkPaged(rng, c, kDevice, noop_score(), mask, nullptr, refCausal(), o)) return;
  }
}

// The backward's default kernels (on sm_90a the specialized dkdv and dq) of four variants (no mod,
// a mask's partial blocks, a mod with its adjoint), dQ summed both ways, against the float64
// reference, dsinks included.
TEST(SinksGpu, BackwardWithItsDefaultKernels) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  int i = 0;
  for (const char* name : {"causal", "document", "alibi", "softcap"}) {
    const Variant var = variant(name);
    AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 300, .S = 400, .D = 128, .context = var.name};
    VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kDevice, BlockSizes{}, rng()});
    BackwardCheck check{.refScore = inst.refScore, .refScoreGrad = inst.refScoreGrad, .refMask = inst.refMask,
                        .withDlse = i % 3 == 0, .sinks = true};
    if (i++ % 2) check.options.dq_accumulation = DqAccumulation::Atomic;
    if (!checkBackward(rng, c, kDevice, inst.score, inst.mask, check)) return;
  }
}
