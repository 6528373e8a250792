// v's head dim differing from q's and k's (DV != D, as PyTorch's FlexAttention allows: out is
// [B, Hq, L, DV]). The forward, decode and backward templates against float64 — before the
// passes, and after sm_90a's (TMA rings of two widths, the producer warpgroup, persistent programs
// with a split last round, the fused decode merge, the specialized dkdv and dq) — and what is
// refused, by name.
#include <gtest/gtest.h>

#include <cstdlib>

#include "FlexAttentionBackwardCheck.h"
#include "FlexAttentionCheck.h"
#include "FlexAttentionDecodeCheck.h"
#include "HeadDimCheck.h"
#include "MaskTestUtil.h"
#include "PagedKVCheck.h"
#include "attention_templates/PagedKVCache.h"
#include "attention_templates/Variants.h"
#include "gpu/GpuTest.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"  // designated initializers leave members default

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::testing;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;
using dsl::Tile;

namespace {

constexpr MemorySpace kHost = MemorySpace::Host;

// (D, DV) pairs: V wider and narrower than Q·K's dim, a DV that pads (48 -> 64 columns), a D that
// pads beside a DV that does not, and DeepSeek's MLA prefill (192 / 128).
using Dims = HeadDims;
const Dims kDims[] = {{64, 128}, {128, 64}, {64, 48}, {80, 64}, {192, 128}};

// Causal, with every third query blind (no allowed key: out 0, lse -inf) beside live rows.
MaskMod blindThirdsMask() {
  return MaskMod("causal_blind_thirds", [](const Tile&, const Tile&, const Tile& q, const Tile& kv) {
    return (kv <= q) & (q % 3 != 0);
  });
}
RefMaskFn refBlindThirds() {
  return [](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q && q % 3 != 0; };
}

// Under the sanitizers a test takes one of its (D, DV) pairs in `share`, the choice drawn from the
// run's seed (gpu/TestBudget.h), so that successive runs cover them all: ASan made these tests 72 s.
bool pairRuns(const SeededRandom& rng, size_t& index, size_t share) { return runsInThisBuild(rng.seed(), index++, share); }

}  // namespace

// Every (D, DV) pair on the interpreter, without a mask, masked (rows with no key among them) and
// with a score_mod, GQA 2:1, lengths off every block.
TEST(ValueHeadDim, ForwardMatchesTheReference) {
  SeededRandom rng;
  size_t pair = 0;
  for (Dims dims : kDims) {
    if (!pairRuns(rng, pair, 3)) continue;
    const std::string label = "D=" + std::to_string(dims.D) + " DV=" + std::to_string(dims.DV);
    if (!checkVariantsAt(rng, label, {"full", "causal", "softcap"}, dims,
                         {.config = FlexAttentionConfig{32, 32, 4, 2}}))
      return;
    AttentionCase c{.B = 1, .Hq = 4, .Hkv = 1, .L = 100, .S = 100, .D = dims.D, .dtype = DType::F16,
                    .context = "blind thirds, MQA, " + label,
                    .DV = dims.DV};
    const BlockMask mask = createBlockMask(blindThirdsMask(), 1, 1, c.L, c.S, {32, 32}, kHost);
    if (!checkFlexAttention(rng, c, kHost, noop_score(), mask, nullptr, refBlindThirds(),
                            {.config = FlexAttentionConfig{32, 32, 4, 2}}))
      return;
  }
}

// After sm_90a's passes on one and two warpgroups (wgmma, TMA rings of K and V of their own widths,
// the producer warpgroup and the turns where the mods allow), and persistent with the last round split (V's
// width in the partials and the merge kernel).
TEST(ValueHeadDim, ForwardAfterTheSm90aPasses) {
  SeededRandom rng;
  InterpretAfterPasses scope("sm_90a");
  size_t pair = 0;
  for (Dims dims : {Dims{64, 128}, Dims{128, 64}, Dims{64, 48}}) {
    if (!pairRuns(rng, pair, 3)) continue;
    const std::string label = "sm_90a D=" + std::to_string(dims.D) + " DV=" + std::to_string(dims.DV);
    for (const FlexAttentionConfig& config : {FlexAttentionConfig{64, 64, 4, 2}, FlexAttentionConfig{128, 64, 8, 2}})
      if (!checkVariantsAt(rng, label + " " + config.describe(), {"full", "sliding_window", "document", "alibi"}, dims,
                           {.config = config}))
        return;
    if (!checkPersistentSplitLastRound(rng, label, dims)) return;
  }
}

// The decode template (one split, several, and its own choice) and the prefill template on the same
// queries, against float64 and each other: L in {1, 5}, GQA 4:1 and MQA, a window and documents
// with query offsets; then after sm_90a's passes, with the producer warpgroup's TMA boxes.
TEST(ValueHeadDim, DecodeMatchesTheReferenceAndThePrefillTemplate) {
  SeededRandom rng;
  size_t pair = 0;
  for (Dims dims : {Dims{64, 128}, Dims{128, 64}, Dims{64, 48}}) {
    if (!pairRuns(rng, pair, 3)) continue;
    for (int64_t L : {1, 5})
      for (const char* name : {"full", "sliding_window", "document"}) {
        AttentionCase c{.B = 2, .Hq = L == 1 ? 8 : 4, .Hkv = L == 1 ? 2 : 1, .L = L, .S = 300, .D = dims.D,
                        .dtype = DType::BF16, .DV = dims.DV};
        if (!checkDecodeVariant(rng, variant(name), c, kHost)) return;
      }
  }
  InterpretAfterPasses scope("sm_90a");
  for (const char* specialize : {"0", "1"}) {
    ScopedSetenv specialized("FLEXTILE_DECODE_WARP_SPECIALIZE", specialize);
    for (Dims dims : {Dims{64, 128}, Dims{128, 64}}) {
      if (!pairRuns(rng, pair, 2)) continue;
      for (const char* name : {"full", "sliding_window"}) {
        AttentionCase c{.B = 2, .Hq = 8, .Hkv = 2, .L = 1, .S = 300, .D = dims.D, .dtype = DType::BF16,
                        .context = std::string("sm_90a, warp-specialized ") + specialize,
                        .DV = dims.DV};
        if (!checkDecodeVariant(rng, variant(name), c, kHost,
                                {.splits = {0, 3}, .blocks = {64, 64}, .prefillConfig = {64, 64, 4, 2}}))
          return;
      }
    }
  }
}

// flex_attention allocates out with v's head dim; both templates' kernels for DV != D assemble for
// sm_90a, the decode's without spilling (its residency is planned as for the wider of the two dims:
// planned for the narrower ring, it asked for four programs an SM and spilled 36 bytes at D = 128,
// DV = 64).
TEST(ValueHeadDim, OutputTakesVsHeadDimAndTheKernelsAssemble) {
  SeededRandom rng;
  Tensor q = randomTensor(rng, DType::BF16, {1, 2, 40, 64}, kHost);
  Tensor k = randomTensor(rng, DType::BF16, {1, 2, 70, 64}, kHost);
  Tensor v = randomTensor(rng, DType::BF16, {1, 2, 70, 128}, kHost);
  for (AttentionTemplate t : {AttentionTemplate::Prefill, AttentionTemplate::Decode}) {
    const FlexAttentionResult r =
        flex_attention(q, k, v, noop_score(), std::nullopt, {.return_lse = true, .kernel = t});
    EXPECT_EQ(r.out.shape(), (dsl::Shape{1, 2, 40, 128}));
    EXPECT_EQ(r.lse.shape(), (dsl::Shape{1, 2, 40}));
  }
  if (!assemblesInThisBuild()) GTEST_SKIP() << "ptxas not found or a sanitized build: not assembling";
  const codegen::Target target = codegen::Target::sm90a();
  for (Dims dims : {Dims{128, 64}, Dims{64, 128}}) {
    const int64_t B = 2, Hq = 16, Hkv = 4, N = 4096;
    Tensor qd = Tensor::zeros(DType::BF16, {B, Hq, N, dims.D}, kHost);
    Tensor kd = Tensor::zeros(DType::BF16, {B, Hkv, N, dims.D}, kHost);
    Tensor vd = Tensor::zeros(DType::BF16, {B, Hkv, N, dims.DV}, kHost);
    const VariantInstance causal = variant("causal").make({B, Hq, N, N, kHost, BlockSizes{}, rng()});
    const FlexAttentionPlan plan = plan_flex_attention(qd, kd, vd, noop_score(), causal.mask, {}, true, target);
    const codegen::PtxasReport report = codegen::runPtxas(plan.compiled->ptx, target);
    std::printf("forward D=%ld DV=%ld: %s, %d registers, %d bytes spilled\n", long(dims.D), long(dims.DV),
                plan.config.describe().c_str(), report.registers, report.spillStoreBytes);
    EXPECT_LE(report.spillStoreBytes, 64) << "D=" << dims.D << " DV=" << dims.DV << "\n" << report.log;
    Tensor q1 = Tensor::zeros(DType::BF16, {B, Hq, 1, dims.D}, kHost);
    const FlexDecodePlan decode = plan_flex_decode(q1, kd, vd, noop_score(), causal.mask,
                                                   {.kernel = AttentionTemplate::Decode, .query_offset = N - 1},
                                                   target);
    for (const codegen::CompiledKernel* c : decode.compiled) {
      const codegen::PtxasReport r = codegen::runPtxas(c->ptx, target);
      std::printf("decode D=%ld DV=%ld: %s, %d registers, %d bytes spilled\n", long(dims.D), long(dims.DV),
                  decode.config.describe().c_str(), r.registers, r.spillStoreBytes);
      EXPECT_EQ(r.spillStoreBytes, 0) << "D=" << dims.D << " DV=" << dims.DV << "\n" << r.log;
    }
    // The backward's kernels at the sm_90a default (the specialized dkdv and dq): they spill as much
    // as the equal dims' kernel of the wider dim does, or less (printed for the record).
    Tensor od = Tensor::zeros(DType::BF16, {B, Hq, N, dims.DV}, kHost);
    Tensor lse = Tensor::zeros(DType::F32, {B, Hq, N}, kHost);
    const FlexAttentionBackwardPlan backward =
        plan_flex_attention_backward(qd, kd, vd, od, lse, od, noop_score(), causal.mask, {}, target);
    const int64_t wide = std::max(dims.D, dims.DV);
    Tensor qw = Tensor::zeros(DType::BF16, {B, Hq, N, wide}, kHost);
    Tensor kw = Tensor::zeros(DType::BF16, {B, Hkv, N, wide}, kHost);
    const FlexAttentionBackwardPlan equal =
        plan_flex_attention_backward(qw, kw, kw, qw, lse, qw, noop_score(), causal.mask, {}, target);
    ASSERT_EQ(backward.compiled.size(), equal.compiled.size());
    for (size_t i = 0; i < backward.compiled.size(); ++i) {
      const codegen::PtxasReport r = codegen::runPtxas(backward.compiled[i]->ptx, target);
      const codegen::PtxasReport e = codegen::runPtxas(equal.compiled[i]->ptx, target);
      std::printf("backward D=%ld DV=%ld %s: %d registers, %d bytes spilled (D=DV=%ld: %d)\n", long(dims.D),
                  long(dims.DV), backward.kernelNames[i].c_str(), r.registers, r.spillStoreBytes, long(wide),
                  e.spillStoreBytes);
      EXPECT_LE(r.spillStoreBytes, e.spillStoreBytes) << backward.kernelNames[i] << "\n" << r.log;
    }
  }
}

// The backward (dV and dO at v's head dim, delta summed over it; dQ and dK at D) against float64:
// no mask, causal with blind rows, a score_mod, GQA and MQA, dQ by its own kernel and by atomics,
// lengths off the blocks and on them (padded columns with whole blocks of keys); then after
// sm_90a's passes on wgmma tiles and at the sm_90a default config (the specialized dkdv and dq).
TEST(ValueHeadDim, BackwardMatchesTheReference) {
  SeededRandom rng;
  const FlexAttentionBackwardConfig small{{32, 32, 4, 2}, {32, 32, 4, 2}};
  size_t pair = 0;
  for (Dims dims : kDims) {
    if (!pairRuns(rng, pair, 3)) continue;
    for (DqAccumulation dq : {DqAccumulation::Separate, DqAccumulation::Atomic}) {
      const std::string label = "D=" + std::to_string(dims.D) + " DV=" + std::to_string(dims.DV) +
                                (dq == DqAccumulation::Atomic ? " atomic dQ" : "");
      if (!checkBackwardVariantsAt(rng, label, dims, 70, 64, 32, FlexAttentionConfig{32, 32, 4, 2},
                                   {.dq_accumulation = dq, .config = small}))
        return;
      AttentionCase c{.B = 1, .Hq = 4, .Hkv = 1, .L = 45, .S = 50, .D = dims.D, .dtype = DType::F16,
                      .context = "blind thirds, MQA, " + label, .DV = dims.DV};
      BackwardCheck check;
      check.refMask = refBlindThirds();
      check.forwardConfig = FlexAttentionConfig{32, 32, 4, 2};
      check.options.config = small;
      check.options.dq_accumulation = dq;
      if (!checkBackward(rng, c, kHost, noop_score(),
                         createBlockMask(blindThirdsMask(), 1, 1, c.L, c.S, {32, 32}, kHost), check))
        return;
    }
  }
  InterpretAfterPasses scope("sm_90a");
  for (Dims dims : {Dims{64, 128}, Dims{128, 64}, Dims{64, 48}}) {
    if (!pairRuns(rng, pair, 3)) continue;
    const FlexAttentionBackwardConfig wgmma{{64, 64, 4, 2}, {64, 64, 4, 2}};
    for (const FlexAttentionBackwardConfig& config :
         {wgmma,
          defaultFlexAttentionBackwardConfig(DType::BF16, dims.D, codegen::Target::sm90a(), false,
                                             DqAccumulation::Separate, dims.DV)}) {
      AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 200, .S = 130, .D = dims.D, .dtype = DType::BF16,
                      .context = "sm_90a " + config.describe(), .DV = dims.DV};
      BackwardCheck check;
      check.refMask = refCausal();
      check.forwardConfig = FlexAttentionConfig{64, 64, 4, 2};
      check.options.config = config;
      if (!checkBackward(rng, c, kHost, noop_score(), causalBlockMask(1, 1, c.L, c.S, {128, 128}), check)) return;
    }
  }
}

// A paged K/V whose V pages are DV wide: hand-made pools (fragmented tables, a shared prefix page,
// ragged lengths) through the prefill and the decode templates, and a PagedKVCache (its write kernel
// storing K and V rows of two widths) over a prefill and decode steps with the cache growing.
TEST(ValueHeadDim, PagedKvMatchesTheReference) {
  SeededRandom rng;
  for (Dims dims : {Dims{64, 128}, Dims{128, 64}, Dims{64, 48}}) {
    const std::string label = "D=" + std::to_string(dims.D) + " DV=" + std::to_string(dims.DV);
    PagedCase c{.B = 2, .Hq = 4, .Hkv = 2, .L = 1, .D = dims.D, .pageSize = 16, .lengths = {70, 33},
                .sharedPrefixPages = 1, .context = "decode " + label, .DV = dims.DV};
    if (!checkPaged(rng, c, kHost, noop_score(), std::nullopt, nullptr, nullptr,
                    {.kernel = AttentionTemplate::Decode, .decode_config = FlexDecodeConfig{.splits = 3}}))
      return;
    c.L = 40, c.context = "prefill " + label;
    if (!checkPaged(rng, c, kHost, noop_score(), std::nullopt, nullptr, nullptr,
                    {.config = FlexAttentionConfig{32, 16, 4, 2}, .kernel = AttentionTemplate::Prefill}))
      return;
  }
  const int64_t B = 2, Hq = 4, Hkv = 2, D = 64, DV = 128, T = 40, maxLength = 64;
  const DType dt = DType::BF16;
  PagedKVCache cache(dt, Hkv, D, /*numPages*/ 12, /*pageSize*/ 16, /*maxBatch*/ 2, /*maxPagesPerSequence*/ 4, kHost,
                     DV);
  EXPECT_NE(cache.describe().find("D=64 DV=128"), std::string::npos) << cache.describe();
  LogicalHistory hist(B, Hkv, D, DV);
  NewTokens prompt = randomTokens(rng, dt, B, Hkv, T, D, kHost, DV);
  const std::vector<int64_t> order{0, 1}, counts{40, 23};
  cache.write(order, prompt.k, prompt.v, counts);
  for (int64_t i = 0; i < B; ++i) hist.append(i, prompt.kHost, prompt.vHost, i, T, counts[size_t(i)]);
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE("decode step " + std::to_string(step));
    NewTokens n = randomTokens(rng, dt, B, Hkv, 1, D, kHost, DV);
    cache.append(n.k, n.v);
    for (int64_t b = 0; b < B; ++b) hist.append(b, n.kHost, n.vHost, b, 1, 1);
    const std::vector<int64_t> lengths = hist.lengths(B);
    auto [k, v] = hist.tensors(B, maxLength, dt);
    const Tensor q = randomTensor(rng, dt, {B, Hq, 1, D}, kHost);
    if (!checkPagedOn(q, cache.view({.batches = B, .length = maxLength}), k, v, lengths, "cache", noop_score(),
                      std::nullopt, nullptr, nullptr, {.kernel = AttentionTemplate::Decode}))
      return;
  }
  // One tensor as both kNew and vNew: write() once told the two apart by address, and checked this
  // vNew against K's width (the interpreter then stopped on the kernel's out-of-bounds read).
  const Tensor narrow = randomTensor(rng, dt, {B, Hkv, 1, D}, kHost);
  expectError([&] { cache.append(narrow, narrow); },
              {"vNew must be [B, Hkv = 2, T, DV = 128]"});
}

// A config resolver (the autotuner's cache) sees v's head dim, so a config tuned for D = 64 with
// DV = 128 is found for such calls, and only for them (the tune key holds DV: AutotuneCache.KeyHoldsVsOwnHeadDim).
TEST(ValueHeadDim, TheResolverSeesVsHeadDim) {
  std::vector<int64_t> seen;
  const FlexAttentionConfig tuned{32, 32, 4, 3};
  setFlexAttentionConfigResolver([&](const FlexAttentionProblem& p) -> std::optional<FlexAttentionConfig> {
    seen.push_back(p.DV);
    return p.valueDim() == 128 ? std::optional(tuned) : std::nullopt;
  });
  struct Reset {
    ~Reset() { setFlexAttentionConfigResolver({}); }
  } reset;
  const Tensor q = Tensor::zeros(DType::BF16, {1, 2, 64, 64}, kHost);
  const Tensor wide = Tensor::zeros(DType::BF16, {1, 2, 64, 128}, kHost);
  EXPECT_EQ(plan_flex_attention(q, q, wide, noop_score(), std::nullopt).config, tuned);
  EXPECT_NE(plan_flex_attention(q, q, q, noop_score(), std::nullopt).config, tuned);
  EXPECT_EQ(seen, (std::vector<int64_t>{128, 0}));
}

// What is refused names the dims: a v head dim the kernels cannot tile, an output of q's head dim
// where v's differs, in the forward and the backward.
TEST(ValueHeadDim, WhatIsRefusedNamesTheDims) {
  auto zeros = [](dsl::Shape s) { return Tensor::zeros(DType::BF16, std::move(s), kHost); };
  const Tensor q = zeros({1, 2, 16, 64}), k = zeros({1, 2, 20, 64});
  expectError([&] { flex_attention(q, k, zeros({1, 2, 20, 40}), noop_score(), std::nullopt); },
              {"v's head dim DV = 40", "a multiple of 16 up to 256"});
  expectError([&] { flex_attention(q, k, zeros({1, 2, 20, 272}), noop_score(), std::nullopt); }, {"DV = 272"});
  for (AttentionTemplate t : {AttentionTemplate::Prefill, AttentionTemplate::Decode}) {
    Tensor out = zeros({1, 2, 16, 64});
    const Tensor wideV = zeros({1, 2, 20, 128});
    expectError([&] { flex_attention_into(q, k, wideV, noop_score(), std::nullopt, out, nullptr, {.kernel = t}); },
                {"out must be [1, 2, 16, 128]"});
  }
  const Tensor v = zeros({1, 2, 20, 128});
  const Tensor out = zeros({1, 2, 16, 128}), lse = Tensor::zeros(DType::F32, {1, 2, 16}, kHost);
  expectError([&] { flex_attention_backward(q, k, v, out, lse, zeros({1, 2, 16, 64}), noop_score(), std::nullopt); },
              {"dout must be bf16[1, 2, 16, 128] (q's B, Hq and L; v's head dim)", "[1, 2, 16, 64]"});
  expectError([&] { flex_attention_backward(q, k, zeros({1, 2, 20, 40}), out, lse, out, noop_score(), std::nullopt); },
              {"v's head dim DV = 40"});
  FlexAttentionGrads grads{.dq = zeros({1, 2, 16, 64}), .dk = zeros({1, 2, 20, 64}), .dv = zeros({1, 2, 20, 64})};
  expectError([&] { flex_attention_backward_into(q, k, v, out, lse, out, noop_score(), std::nullopt, grads); },
              {"dv must be a contiguous bf16[1, 2, 20, 128]"});
}
