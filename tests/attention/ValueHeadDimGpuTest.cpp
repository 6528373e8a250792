// v's head dim differing from q's and k's on the GPU (tests/attention/ValueHeadDimTest.cpp checks
// the same through the interpreter): the forward at its sm_90a defaults (wgmma, TMA rings of two
// widths, the producer warpgroup, persistent programs and the split last round where they apply),
// the decode template (its fused merge over many splits) and the backward at its sm_90a defaults
// (the specialized dkdv and dq), against float64.
#include <gtest/gtest.h>

#include <iterator>
#include <vector>

#include "FlexAttentionBackwardCheck.h"
#include "FlexAttentionCheck.h"
#include "FlexAttentionDecodeCheck.h"
#include "MaskTestUtil.h"
#include "PagedKVCheck.h"
#include "attention_templates/PagedKVCache.h"
#include "attention_templates/Variants.h"
#include "gpu/GpuTest.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::testing;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

namespace {
constexpr MemorySpace kDevice = MemorySpace::Device;
struct Dims {
  int64_t D, DV;
};
// DeepSeek's MLA prefill (192 / 128), V wider and narrower than Q·K's dim, a DV that pads.
const Dims kDims[] = {{192, 128}, {64, 128}, {128, 64}, {128, 48}};
}  // namespace

TEST(ValueHeadDimGpu, ForwardEveryVariantAtTheDefaults) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  for (Dims dims : kDims)
    for (const Variant& var : variants()) {
      AttentionCase c{.B = 2, .Hq = 8, .Hkv = 2, .L = 1000, .S = 1030, .D = dims.D, .dtype = DType::BF16,
                      .context = var.name, .DV = dims.DV};
      VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kDevice, BlockSizes{}, rng()});
      if (!checkFlexAttention(rng, c, kDevice, inst.score, inst.mask, inst.refScore, inst.refMask)) return;
    }
  // Persistent programs with the last round cut into pieces (no mask, more tiles than SMs).
  for (Dims dims : kDims) {
    AttentionCase c{.B = 2, .Hq = 16, .Hkv = 4, .L = 4000, .S = 4000, .D = dims.D, .dtype = DType::BF16,
                    .context = "no mask, persistent", .DV = dims.DV};
    if (!checkFlexAttention(rng, c, kDevice, noop_score(), std::nullopt, nullptr, nullptr)) return;
  }
}

// D = 256 on 128 × 64 tiles asked persistent: Q's ring of two 64 KB slots does not fit beside the
// walks' rings, so the persistent forward reads Q with a plain load at each tile's start
// (dsl::unpipelined). Every persistent variant, GQA, lengths off the block; then more tiles than
// SMs, the last round cut. (Fails with a stale Q: a tile computed on the previous tile's rows.)
TEST(ValueHeadDimGpu, PersistentForwardWithQUnpipelinedAtD256) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  FlexAttentionConfig config{128, 64, 8, 2};
  config.persistent = LoopSchedule::On;
  for (const char* name : {"full", "causal", "sliding_window", "prefix_lm", "softcap"}) {
    AttentionCase c{.B = 2, .Hq = 8, .Hkv = 2, .L = 1000, .S = 1030, .D = 256, .dtype = DType::BF16,
                    .context = std::string(name) + ", D = 256, Q unpipelined"};
    VariantInstance inst = variant(name).make({c.B, c.Hq, c.L, c.S, kDevice, BlockSizes{}, rng()});
    const Tensor q = Tensor::empty(DType::BF16, {c.B, c.Hq, c.L, c.D}, kDevice);
    const Tensor kv = Tensor::empty(DType::BF16, {c.B, c.Hkv, c.S, c.D}, kDevice);
    EXPECT_GT(plan_flex_attention(q, kv, kv, inst.score, inst.mask, {.config = config}).persistentPrograms, 0) << name;
    if (!checkFlexAttention(rng, c, kDevice, inst.score, inst.mask, inst.refScore, inst.refMask, {.config = config}))
      return;
  }
  AttentionCase c{.B = 2, .Hq = 16, .Hkv = 4, .L = 4000, .S = 4000, .D = 256, .dtype = DType::BF16,
                  .context = "no mask, D = 256, persistent, the last round cut"};
  checkFlexAttention(rng, c, kDevice, noop_score(), std::nullopt, nullptr, nullptr, {.config = config});
}

TEST(ValueHeadDimGpu, DecodeMatchesTheReferenceAndThePrefillTemplate) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  // (One query on the window and no mask, four on documents and soft-cap: each a kernel of its own
  // per dims and split count; all sixteen and three split counts took 56 s on an H100.)
  for (Dims dims : kDims)
    for (auto [L, name] :
         {std::pair<int64_t, const char*>{1, "full"}, {1, "sliding_window"}, {4, "document"}, {4, "softcap"}}) {
      AttentionCase c{.B = 2, .Hq = 16, .Hkv = 4, .L = L, .S = 4097, .D = dims.D, .dtype = DType::BF16, .DV = dims.DV};
      if (!checkDecodeVariant(rng, variant(name), c, kDevice,
                              {.splits = {0, 7}, .blocks = {128, 128}, .prefillConfig = {64, 64, 4, 2}}))
        return;
    }
}

TEST(ValueHeadDimGpu, BackwardAtTheDefaults) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  // Past D = 128 the defaults change with the tile columns (defaultFlexAttentionBackwardConfig): dq
  // specialized up to 384 of them (192 / 128, 192 / 192, 256 / 128), on one warpgroup past (256).
  std::vector<Dims> backwardDims(std::begin(kDims), std::end(kDims));
  backwardDims.insert(backwardDims.end(), {Dims{192, 192}, Dims{256, 128}, Dims{256, 256}});
  for (Dims dims : backwardDims)
    for (const char* name : {"full", "causal", "document", "softcap"}) {
      // (The float64 backward reference is whole, not sampled: a small problem, keys in whole blocks.)
      AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 300, .S = 256, .D = dims.D, .dtype = DType::BF16,
                      .context = name, .DV = dims.DV};
      VariantInstance inst = variant(name).make({c.B, c.Hq, c.L, c.S, kDevice, BlockSizes{}, rng()});
      BackwardCheck check;
      check.refScore = inst.refScore;
      check.refScoreGrad = inst.refScoreGrad;
      check.refMask = inst.refMask;
      if (!checkBackward(rng, c, kDevice, inst.score, inst.mask, check)) return;
    }
}

// A PagedKVCache whose V pages are DV wide on the GPU: its write kernel, then decode steps (the
// decode template's default split count) and a prefill on hand-made fragmented pools.
TEST(ValueHeadDimGpu, PagedKv) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  for (Dims dims : {Dims{192, 128}, Dims{64, 128}}) {
    PagedCase c{.B = 3, .Hq = 16, .Hkv = 4, .L = 1, .D = dims.D, .pageSize = 64, .lengths = {1500, 700, 0},
                .sharedPrefixPages = 2, .context = "decode", .DV = dims.DV};
    if (!checkPaged(rng, c, kDevice, noop_score(), std::nullopt, nullptr, nullptr,
                    {.kernel = AttentionTemplate::Decode}))
      return;
    c.L = 300, c.lengths = {300, 200, 0}, c.context = "prefill";
    if (!checkPaged(rng, c, kDevice, noop_score(), std::nullopt, nullptr, nullptr,
                    {.kernel = AttentionTemplate::Prefill}))
      return;
    const int64_t B = 2, Hq = 8, Hkv = 2, T = 200, maxLength = 512;
    PagedKVCache cache(DType::BF16, Hkv, dims.D, 32, 64, B, 8, kDevice, dims.DV);
    LogicalHistory hist(B, Hkv, dims.D, dims.DV);
    NewTokens prompt = randomTokens(rng, DType::BF16, B, Hkv, T, dims.D, kDevice, dims.DV);
    cache.write(std::vector<int64_t>{0, 1}, prompt.k, prompt.v, std::vector<int64_t>{200, 77});
    hist.append(0, prompt.kHost, prompt.vHost, 0, T, 200);
    hist.append(1, prompt.kHost, prompt.vHost, 1, T, 77);
    for (int step = 0; step < 3; ++step) {
      NewTokens n = randomTokens(rng, DType::BF16, B, Hkv, 1, dims.D, kDevice, dims.DV);
      cache.append(n.k, n.v);
      for (int64_t b = 0; b < B; ++b) hist.append(b, n.kHost, n.vHost, b, 1, 1);
      auto [k, v] = hist.tensors(B, maxLength, DType::BF16);
      const dsl::Tensor q = randomTensor(rng, DType::BF16, {B, Hq, 1, dims.D}, kDevice);
      if (!checkPagedOn(q, cache.view({.batches = B, .length = maxLength}), k, v, hist.lengths(B),
                        "cache step " + std::to_string(step), noop_score(), std::nullopt, nullptr, nullptr,
                        {.kernel = AttentionTemplate::Decode}))
        return;
    }
  }
}
