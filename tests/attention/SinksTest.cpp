// FlexAttentionOptions::sinks through the interpreter: a learned logit per head that joins every
// row's softmax as a key of value zero, in the prefill template (and its split last round), the
// decode template (one split, its ticket merge, its cluster merge) and the paged cache, against the
// float64 reference; rows without keys (out 0, lse = the sink); the backward's dQ, dK, dV and
// dsinks; the errors of a bad sinks tensor; and kernels without sinks unchanged.
#include <gtest/gtest.h>

#include <cmath>

#include "FlexAttentionBackwardCheck.h"
#include "FlexAttentionDecodeCheck.h"
#include "MaskTestUtil.h"
#include "PagedKVCheck.h"
#include "TextCount.h"
#include "ThrownMessage.h"
#include "gpu/GpuTest.h"
#include "attention_templates/Variants.h"
#include "codegen/Ptxas.h"
#include "codegen/Target.h"
#include "ir/Printer.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::testing;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;
using dsl::Tile;

namespace {
constexpr MemorySpace kHost = MemorySpace::Host;
constexpr BlockSizes kBlocks{32, 32};
}  // namespace

// Every variant, GQA, lengths off the blocks, the three dtypes, with the max scores (over the keys
// alone) beside; a negative scale takes the path that scales before the max.
TEST(Sinks, EveryVariantThroughThePrefillTemplate) {
  SeededRandom rng;
  const DType dtypes[] = {DType::BF16, DType::F16, DType::F32};
  int i = 0;
  for (const Variant& var : variants())
    for (double scale : {0.125, -0.2}) {
      AttentionCase c{.B = 2, .Hq = 4, .Hkv = 2, .L = 77, .S = 129, .D = 64, .dtype = dtypes[i++ % 3]};
      c.context = "variant " + var.name + " scale " + std::to_string(scale);
      VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kHost, kBlocks, rng()});
      FlexAttentionOptions o{.scale = scale, .return_max_scores = true, .config = FlexAttentionConfig{32, 16, 4, 2}};
      o.sinks = randomSinks(rng, c.Hq, kHost, c.S);
      if (!checkFlexAttention(rng, c, kHost, inst.score, inst.mask, inst.refScore, inst.refMask, o)) return;
    }
}

TEST(Sinks, EveryVariantThroughTheDecodeTemplateAndItsSplits) {
  SeededRandom rng;
  const std::vector<AttentionCase> cases = {
      {.B = 2, .Hq = 4, .Hkv = 1, .L = 1, .S = 127, .D = 64, .dtype = DType::BF16},
      {.B = 1, .Hq = 8, .Hkv = 2, .L = 5, .S = 129, .D = 64, .dtype = DType::F16},
  };
  for (const Variant& var : variants())
    for (const AttentionCase& c : cases)
      if (!checkDecodeVariant(rng, var, c, kHost, {.splits = {1, 3}, .maxScores = true, .sinks = true})) return;
}

// The decode's cluster merge: one cluster a group (4, 8 splits) folds the sink where it stores the
// rows; several (16 splits) hand their folds to the ticket merge, which folds it once.
TEST(Sinks, TheDecodesClusterMerge) {
  ScopedSetenv cluster("FLEXTILE_DECODE_CLUSTER_MERGE", "1");
  SeededRandom rng;
  AttentionCase c{.B = 1, .Hq = 8, .Hkv = 2, .L = 2, .S = 300, .D = 64, .dtype = DType::BF16,
                  .context = "cluster merge"};
  for (const char* name : {"causal", "sliding_window", "softcap"})
    if (!checkDecodeVariant(rng, variant(name), c, kHost, {.splits = {4, 8, 16}, .sinks = true})) return;
}

// A row without an allowed key attends to its sink alone: out exactly 0 and lse the sink, beside
// live rows of the same tile and decode program; a head whose sink is -inf keeps lse -inf.
TEST(Sinks, RowsWithoutAnAllowedKeyGetTheSinkAsLse) {
  SeededRandom rng;
  MaskMod oddQueriesBlind("odd_queries_blind", [](const Tile&, const Tile&, const Tile& q, const Tile& kv) {
    return (q % 2 == 0) & (kv <= q);
  });
  const RefMaskFn ref = [](int64_t, int64_t, int64_t q, int64_t kv) { return q % 2 == 0 && kv <= q; };
  const int64_t S = 70;
  const std::vector<float> sinkValues{1.5f, -INFINITY, -0.75f, 3.0f};
  const Tensor sinks = Tensor::fromHost(sinkValues, {4});
  Tensor q = randomTensor(rng, DType::F16, {1, 4, 4, 64}, kHost);
  Tensor k = randomTensor(rng, DType::F16, {1, 2, S, 64}, kHost);
  Tensor v = randomTensor(rng, DType::F16, {1, 2, S, 64}, kHost);
  // The prefill over rows [S, S + 4) of a mask built past the keys (a slice of one row), and the
  // decode over the same queries with one split and three.
  const BlockMask past = createBlockMask(oddQueriesBlind, 1, 1, S + 4, S, kBlocks, kHost);
  const BlockMask slice = past.sliceRows(S / kBlocks.q, 1, S, 4);
  for (int64_t splits : {0, 1, 3}) {
    SCOPED_TRACE(splits ? "decode splits " + std::to_string(splits) : std::string("prefill"));
    Tensor out = Tensor::empty(DType::F16, q.shape(), kHost), lse = Tensor::empty(DType::F32, {1, 4, 4}, kHost);
    poison(out);
    poison(lse);
    FlexAttentionOptions o{.config = FlexAttentionConfig{32, 16, 4, 2}, .kernel = AttentionTemplate::Prefill};
    if (splits) o = {.kernel = AttentionTemplate::Decode, .decode_config = FlexDecodeConfig{.splits = splits},
                     .query_offset = S};
    o.sinks = sinks;
    flex_attention_into(q, k, v, noop_score(), splits ? past : slice, out, &lse, o);
    const std::vector<float> got = lse.toHost<float>();
    const std::vector<double> values = toDoubles(out);
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t i = 0; i < 4; ++i) {
        const size_t row = size_t(h * 4 + i);
        if (i % 2 == 0) {  // query S + i is even: it sees keys
          EXPECT_TRUE(std::isfinite(got[row])) << "head " << h << " row " << i << ": " << got[row];
          continue;
        }
        const float sink = sinkValues[size_t(h)];  // (via the exp2 domain: the last bit may differ)
        if (std::isinf(sink))
          EXPECT_EQ(got[row], sink) << "head " << h << " row " << i;
        else
          EXPECT_NEAR(got[row], sink, 1e-6 * std::abs(sink)) << "head " << h << " row " << i;
        for (int64_t d = 0; d < 64; ++d) ASSERT_EQ(values[row * 64 + size_t(d)], 0.0) << "head " << h << " row " << i;
      }
  }
}

// A persistent forward that splits its last round: the pieces' partials hold their keys alone and
// the merge kernel folds the sink once, before the passes and through sm_90a's.
TEST(Sinks, PersistentForwardSplittingItsLastRound) {
  SeededRandom rng;
  ScopedSetenv persistent("FLEXTILE_FORWARD_PERSISTENT", "1");
  ScopedSetenv split("FLEXTILE_SPLIT_LAST_ROUND", "1");
  for (const char* target : {"", "sm_90a"}) {
    std::optional<InterpretAfterPasses> scope;
    if (*target) scope.emplace(target);
    AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 1000, .S = 1000, .D = 64,
                    .context = std::string("split ") + target};
    FlexAttentionOptions o{.config = FlexAttentionConfig{128, 64, 8, 2}};
    o.sinks = randomSinks(rng, c.Hq, kHost, c.S);
    Tensor q = Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.D}, kHost);
    Tensor k = Tensor::empty(c.dtype, {c.B, c.Hkv, c.S, c.D}, kHost);
    ASSERT_TRUE(plan_flex_attention(q, k, k, noop_score(), std::nullopt, o).lastRoundSplit);
    if (!checkFlexAttention(rng, c, kHost, noop_score(), std::nullopt, nullptr, nullptr, o)) return;
  }
}

// The kernels a Hopper GPU runs by default (the forward's 128 x 128 warpgroup turns, the decode's
// producer warpgroup, the backward's specialized dkdv and dq), interpreted after sm_90a's passes;
// and the sinks' kernels assembled by ptxas with no more spills than the same kernels without.
TEST(Sinks, TheSm90aKernelsAfterThePassesAndPtxas) {
  SeededRandom rng;
  {
    InterpretAfterPasses scope("sm_90a");
    for (const char* name : {"causal", "softcap"}) {
      AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 300, .S = 400, .D = 64, .context = name};
      VariantInstance inst = variant(name).make({c.B, c.Hq, c.L, c.S, kHost, BlockSizes{128, 128}, rng()});
      FlexAttentionOptions o{.config = FlexAttentionConfig{128, 128, 8, 2}};
      o.sinks = randomSinks(rng, c.Hq, kHost, c.S);
      if (!checkFlexAttention(rng, c, kHost, inst.score, inst.mask, inst.refScore, inst.refMask, o)) return;
      BackwardCheck check{.refScore = inst.refScore, .refScoreGrad = inst.refScoreGrad, .refMask = inst.refMask,
                          .sinks = true};
      check.options.config = defaultFlexAttentionBackwardConfig(c.dtype, c.D, codegen::Target::sm90a());
      if (!checkBackward(rng, c, kHost, inst.score, inst.mask, check)) return;
    }
    const DecodeCheck how{.splits = {1, 3}, .blocks = {128, 128}, .sinks = true};
    ScopedSetenv producer("FLEXTILE_DECODE_WARP_SPECIALIZE", "1");
    if (!checkDecodeVariant(rng, variant("sliding_window"),
                            AttentionCase{.B = 1, .Hq = 8, .Hkv = 2, .L = 1, .S = 700, .D = 64}, kHost, how))
      return;
  }
  if (!assemblesInThisBuild()) GTEST_SKIP() << "ptxas not found or a sanitized build: not assembling";
  const codegen::Target sm90a = codegen::Target::sm90a();
  const Tensor q = Tensor::zeros(DType::BF16, {2, 16, 8192, 128}, kHost);
  const BlockMask mask = causalBlockMask(1, 1, 8192, 8192);
  FlexAttentionOptions with;
  with.sinks = Tensor::zeros(DType::F32, {16}, kHost);
  const codegen::PtxasReport plain =
      codegen::runPtxas(plan_flex_attention(q, q, q, noop_score(), mask, {}, true, sm90a).compiled->ptx, sm90a);
  const codegen::PtxasReport asked =
      codegen::runPtxas(plan_flex_attention(q, q, q, noop_score(), mask, with, true, sm90a).compiled->ptx, sm90a);
  std::printf("causal forward at D = 128: spills %d bytes with sinks, %d without\n", asked.spillStoreBytes,
              plain.spillStoreBytes);
  EXPECT_LE(asked.spillStoreBytes, plain.spillStoreBytes + 16);
  const Tensor one = Tensor::zeros(DType::BF16, {8, 32, 1, 128}, kHost);
  const Tensor kv = Tensor::zeros(DType::BF16, {8, 8, 32768, 128}, kHost);
  FlexAttentionOptions decode{.kernel = AttentionTemplate::Decode};
  decode.sinks = Tensor::zeros(DType::F32, {32}, kHost);
  const FlexDecodePlan decodePlan = plan_flex_decode(one, kv, kv, noop_score(), std::nullopt, decode, sm90a);
  ASSERT_FALSE(decodePlan.compiled.empty());
  for (const codegen::CompiledKernel* k : decodePlan.compiled) (void)codegen::runPtxas(k->ptx, sm90a);
  // The backward with sinks: its kernels and the sinks' gradient after the preprocess.
  const Tensor rows = Tensor::zeros(DType::F32, {2, 16, 8192}, kHost);
  FlexAttentionBackwardOptions backward;
  backward.sinks = with.sinks;
  const FlexAttentionBackwardPlan plan =
      plan_flex_attention_backward(q, q, q, q, rows, q, noop_score(), mask, backward, sm90a);
  ASSERT_GE(plan.kernelNames.size(), 2u);
  EXPECT_EQ(plan.kernelNames[1], "flex_bwd_sink_grad");
  for (const codegen::CompiledKernel* k : plan.compiled) (void)codegen::runPtxas(k->ptx, sm90a);
}

// The sinks' parameter comes after every other trailing group: with the tiles handed out heaviest
// first (FLEXTILE_TILE_ORDER=1: the tile order's parameter before it) the forward still reads the
// right tensors, and the backward (which takes the order too) gives the right dsinks.
TEST(Sinks, AfterTheTileOrdersParameter) {
  SeededRandom rng;
  ScopedSetenv ordered("FLEXTILE_TILE_ORDER", "1");
  AttentionCase c{.B = 2, .Hq = 4, .Hkv = 2, .L = 150, .S = 150, .D = 32, .context = "tile order"};
  VariantInstance inst = variant("document").make({c.B, c.Hq, c.L, c.S, kHost, kBlocks, rng()});
  FlexAttentionOptions o{.config = FlexAttentionConfig{32, 32, 4, 2}};
  o.sinks = randomSinks(rng, c.Hq, kHost, c.S);
  const Tensor q = Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.D}, kHost);
  const FlexAttentionPlan plan = plan_flex_attention(q, q, q, inst.score, inst.mask, o);
  EXPECT_GT(count(ir::printFunction(*plan.traced), "%tile_order"), 1) << "the order must be in use";
  if (!checkFlexAttention(rng, c, kHost, inst.score, inst.mask, inst.refScore, inst.refMask, o)) return;
  BackwardCheck check{.refScore = inst.refScore, .refScoreGrad = inst.refScoreGrad, .refMask = inst.refMask,
                      .sinks = true};
  check.forwardConfig = FlexAttentionConfig{32, 32, 4, 2};
  check.options.config = FlexAttentionBackwardConfig{{32, 32, 4, 2}, {32, 32, 4, 2}};
  checkBackward(rng, c, kHost, inst.score, inst.mask, check);
}

// Head dims the templates cut into chunks (192 = 128 + 64, v's 192 too: the accumulator a chunk,
// each rescaled by the fold) and v's own head dim (MLA's 192 / 128), prefill and decode.
TEST(Sinks, SplitAndValueHeadDims) {
  SeededRandom rng;
  for (int64_t DV : {int64_t(192), int64_t(128)}) {
    AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 100, .S = 150, .D = 192, .context = "head dims", .DV = DV};
    VariantInstance inst = variant("causal").make({c.B, c.Hq, c.L, c.S, kHost, kBlocks, rng()});
    FlexAttentionOptions o{.config = FlexAttentionConfig{32, 32, 4, 2}};
    o.sinks = randomSinks(rng, c.Hq, kHost, c.S);
    if (!checkFlexAttention(rng, c, kHost, inst.score, inst.mask, inst.refScore, inst.refMask, o)) return;
    AttentionCase d{.B = 1, .Hq = 8, .Hkv = 2, .L = 2, .S = 150, .D = 192, .context = "decode head dims", .DV = DV};
    if (!checkDecodeVariant(rng, variant("sliding_window"), d, kHost, {.splits = {1, 3}, .sinks = true})) return;
  }
}

// The paged cache's prefill (L = 40) and decode (L = 3): fragmented tables, a shared prefix, a
// batch cut short, a batch erased (length 0: every row is its sink's).
TEST(Sinks, PagedPrefillAndDecode) {
  SeededRandom rng;
  for (int64_t L : {40, 3}) {
    PagedCase c{.B = 3, .Hq = 4, .Hkv = 2, .L = L, .D = 32, .pageSize = 16, .lengths = {70, 33, 0}};
    c.sharedPrefixPages = 2;
    c.context = "L " + std::to_string(L);
    const MaskMod causal = causal_mask();
    const BlockMask mask = createBlockMask(causal, c.B, 1, L, c.logicalLength(), {16, 16}, kHost);
    FlexAttentionOptions o;
    o.sinks = randomSinks(rng, c.Hq, kHost, 70);
    if (!checkPaged(rng, c, kHost, noop_score(), mask, nullptr, refCausal(), o)) return;
  }
}

// The backward: dQ, dK and dV from the forward's lse (which holds the sinks) and dsinks from the
// preprocess's rows, against the float64 reference; every variant with a score_mod's gradient too
// (captures trainable or not), GQA, lengths off the blocks, with and without dlse.
TEST(Sinks, BackwardGradientsAndDsinks) {
  SeededRandom rng;
  int i = 0;
  for (const Variant& var : variants()) {
    AttentionCase c{.B = 2, .Hq = 4, .Hkv = 2, .L = 77, .S = 100, .D = 32,
                    .dtype = i % 2 ? DType::F32 : DType::BF16, .context = var.name};
    VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kHost, kBlocks, rng()});
    BackwardCheck check{.refScore = inst.refScore, .refScoreGrad = inst.refScoreGrad, .refMask = inst.refMask,
                        .withDlse = i++ % 3 == 0, .sinks = true};
    check.forwardConfig = FlexAttentionConfig{32, 32, 4, 2};
    check.options.config = FlexAttentionBackwardConfig{{32, 32, 4, 2}, {32, 32, 4, 2}};
    if (!checkBackward(rng, c, kHost, inst.score, inst.mask, check)) return;
  }
}

// dsinks is a fixed-order sum: two backward calls give the same bits; and with atomic dQ too.
TEST(Sinks, DsinksIsBitwiseReproducible) {
  SeededRandom rng;
  Tensor q = randomTensor(rng, DType::BF16, {2, 4, 90, 32}, kHost);
  Tensor k = randomTensor(rng, DType::BF16, {2, 2, 90, 32}, kHost);
  Tensor dout = randomTensor(rng, DType::BF16, {2, 4, 90, 32}, kHost);
  FlexAttentionOptions fo{.return_lse = true};
  fo.sinks = randomSinks(rng, 4, kHost, 90);
  const FlexAttentionResult fwd = flex_attention(q, k, k, noop_score(), std::nullopt, fo);
  std::vector<float> first;
  for (DqAccumulation dq : {DqAccumulation::Separate, DqAccumulation::Separate, DqAccumulation::Atomic}) {
    FlexAttentionBackwardOptions bo{.dq_accumulation = dq};
    bo.sinks = fo.sinks;
    const FlexAttentionGrads g =
        flex_attention_backward(q, k, k, fwd.out, fwd.lse, dout, noop_score(), std::nullopt, bo);
    ASSERT_TRUE(g.dsinks.defined());
    const std::vector<float> got = g.dsinks.toHost<float>();
    EXPECT_EQ(got[1], 0.0f) << "a sink of -inf weighs nothing";
    if (first.empty()) first = got;
    for (size_t h = 0; h < got.size(); ++h) EXPECT_EQ(got[h], first[h]) << "head " << h;
  }
  FlexAttentionBackwardOptions without;
  EXPECT_FALSE(flex_attention_backward(q, k, k, fwd.out, fwd.lse, dout, noop_score(), std::nullopt, without)
                   .dsinks.defined());
  // The _into form writes the dsinks it is given again (a training loop allocates nothing), and
  // replaces one of another kind.
  FlexAttentionBackwardOptions bo;
  bo.sinks = fo.sinks;
  FlexAttentionGrads g = flex_attention_backward(q, k, k, fwd.out, fwd.lse, dout, noop_score(), std::nullopt, bo);
  const void* storage = g.dsinks.hostData();
  poison(g.dsinks);
  flex_attention_backward_into(q, k, k, fwd.out, fwd.lse, dout, noop_score(), std::nullopt, g, bo);
  EXPECT_EQ(g.dsinks.hostData(), storage);
  EXPECT_EQ(g.dsinks.toHost<float>(), first);
  g.dsinks = Tensor::zeros(DType::F32, {5}, kHost);
  flex_attention_backward_into(q, k, k, fwd.out, fwd.lse, dout, noop_score(), std::nullopt, g, bo);
  EXPECT_EQ(g.dsinks.shape(), (dsl::Shape{4}));
  EXPECT_EQ(g.dsinks.toHost<float>(), first);
}

TEST(Sinks, BadSinksAreNamed) {
  SeededRandom rng;
  Tensor q = randomTensor(rng, DType::BF16, {1, 4, 20, 32}, kHost);
  Tensor k = randomTensor(rng, DType::BF16, {1, 2, 50, 32}, kHost);
  Tensor out = Tensor::empty(DType::BF16, {1, 4, 20, 32}, kHost);
  const Tensor strided = Tensor::viewOf(Tensor::zeros(DType::F32, {8}, kHost), 0, {4}, {2});
  const std::vector<std::pair<Tensor, std::string>> bad = {
      {Tensor::zeros(DType::F32, {2}, kHost), "sinks must be f32[4] (a logit per query head), got"},
      {Tensor::zeros(DType::F32, {1, 4}, kHost), "sinks must be f32[4]"},
      {Tensor::zeros(DType::BF16, {4}, kHost), "sinks must be f32[4]"},
      {strided, "sinks must be contiguous and in q's memory space"},
      {Tensor(), "sinks is an empty tensor"},
  };
  for (const auto& [sinks, text] : bad)
    for (AttentionTemplate t : {AttentionTemplate::Prefill, AttentionTemplate::Decode}) {
      SCOPED_TRACE(text);
      FlexAttentionOptions o{.kernel = t};
      o.sinks = sinks;
      expectErrorNaming([&] { flex_attention_into(q, k, k, noop_score(), std::nullopt, out, nullptr, o); }, text);
    }
  const FlexAttentionResult fwd = flex_attention(q, k, k, noop_score(), std::nullopt, {.return_lse = true});
  FlexAttentionBackwardOptions bo;
  bo.sinks = Tensor::zeros(DType::F32, {2}, kHost);
  expectErrorNaming([&] { flex_attention_backward(q, k, k, fwd.out, fwd.lse, out, noop_score(), std::nullopt, bo); },
              "flex_attention_backward: sinks must be f32[4]");
}

// Sinks are a kernel of their own: without them the traced forward, merge and decode declare no
// `sinks` parameter (their signatures are the ones before sinks existed), with them they do and
// read it.
TEST(Sinks, OnlyAKernelWithSinksDeclaresThem) {
  const codegen::Target sm90a = codegen::Target::sm90a();
  const Tensor q = Tensor::zeros(DType::BF16, {1, 4, 1000, 64}, kHost);
  const Tensor kv = Tensor::zeros(DType::BF16, {1, 2, 1000, 64}, kHost);
  const BlockMask mask = causalBlockMask(1, 1, 1000, 1000);
  FlexAttentionOptions with{.config = FlexAttentionConfig{128, 64, 8, 2}};
  with.sinks = Tensor::zeros(DType::F32, {4}, kHost);
  const FlexAttentionOptions without{.config = with.config};
  const FlexAttentionPlan plain = plan_flex_attention(q, kv, kv, noop_score(), mask, without, true, sm90a);
  const FlexAttentionPlan asked = plan_flex_attention(q, kv, kv, noop_score(), mask, with, true, sm90a);
  EXPECT_EQ(count(ir::printFunction(*plain.traced), "%sinks"), 0);
  EXPECT_GT(count(ir::printFunction(*asked.traced), "%sinks"), 1);
  EXPECT_EQ(count(asked.compiled->ptx, "\\.param \\."), count(plain.compiled->ptx, "\\.param \\.") + 1);

  const Tensor one = Tensor::zeros(DType::BF16, {1, 4, 1, 64}, kHost);
  FlexAttentionOptions decode{.kernel = AttentionTemplate::Decode, .decode_config = FlexDecodeConfig{.splits = 3}};
  const FlexDecodePlan plainDecode = plan_flex_decode(one, kv, kv, noop_score(), std::nullopt, decode, sm90a);
  decode.sinks = Tensor::zeros(DType::F32, {4}, kHost);
  const FlexDecodePlan askedDecode = plan_flex_decode(one, kv, kv, noop_score(), std::nullopt, decode, sm90a);
  EXPECT_EQ(count(ir::printFunction(*plainDecode.traced), "%sinks"), 0);
  EXPECT_GT(count(ir::printFunction(*askedDecode.traced), "%sinks"), 1);
}
