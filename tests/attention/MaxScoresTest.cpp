// FlexAttentionOptions::return_max_scores through the interpreter: each query row's largest score
// after score_mod, from the prefill and decode templates (contiguous and paged), against the
// float64 reference; -inf for rows without an allowed key; the errors of a bad output.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "FlexAttentionDecodeCheck.h"
#include "MaskTestUtil.h"
#include "PagedKVCheck.h"
#include "TextCount.h"
#include "ThrownMessage.h"
#include "gpu/GpuTest.h"
#include "attention_templates/Variants.h"
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

// Every variant (the score_mods in the exp2 domain, the plain scores with the scale applied after
// the max), GQA, lengths off the blocks, the three dtypes; a negative scale takes the path that
// scales before the max.
TEST(MaxScores, EveryVariantThroughThePrefillTemplate) {
  SeededRandom rng;
  const DType dtypes[] = {DType::BF16, DType::F16, DType::F32};
  int i = 0;
  for (const Variant& var : variants())
    for (double scale : {0.125, -0.2}) {
      AttentionCase c{.B = 2, .Hq = 4, .Hkv = 2, .L = 77, .S = 129, .D = 64, .dtype = dtypes[i++ % 3]};
      c.context = "variant " + var.name + " scale " + std::to_string(scale);
      VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kHost, kBlocks, rng()});
      const FlexAttentionOptions o{.scale = scale, .return_max_scores = true,
                                   .config = FlexAttentionConfig{32, 16, 4, 2}};
      if (!checkFlexAttention(rng, c, kHost, inst.score, inst.mask, inst.refScore, inst.refMask, o)) return;
    }
}

TEST(MaxScores, EveryVariantThroughTheDecodeTemplateAndItsSplits) {
  SeededRandom rng;
  const std::vector<AttentionCase> cases = {
      {.B = 2, .Hq = 4, .Hkv = 1, .L = 1, .S = 127, .D = 64, .dtype = DType::BF16},
      {.B = 1, .Hq = 8, .Hkv = 2, .L = 5, .S = 129, .D = 64, .dtype = DType::F16},
  };
  for (const Variant& var : variants())
    for (const AttentionCase& c : cases)
      if (!checkDecodeVariant(rng, var, c, kHost, {.splits = {1, 3}, .maxScores = true})) return;
}

// The decode's cluster merge (FLEXTILE_DECODE_CLUSTER_MERGE=1): each cluster's fold takes its
// programs' maxima with their partials; one cluster a group (4, 8 splits) stores them, several (16
// splits: clusters of 8) pass their folds' maxima to the ticket merge.
TEST(MaxScores, TheDecodesClusterMerge) {
  ScopedSetenv cluster("FLEXTILE_DECODE_CLUSTER_MERGE", "1");
  SeededRandom rng;
  AttentionCase c{.B = 1, .Hq = 8, .Hkv = 2, .L = 2, .S = 300, .D = 64, .dtype = DType::BF16,
                  .context = "cluster merge"};
  for (const char* name : {"causal", "sliding_window", "softcap"})
    if (!checkDecodeVariant(rng, variant(name), c, kHost, {.splits = {4, 8, 16}, .maxScores = true})) return;
}

// Rows that see no key (odd queries, and a mask that allows nothing) end at -inf, beside live rows
// of the same tile and of the same decode program.
TEST(MaxScores, RowsWithoutAnAllowedKeyAreMinusInfinity) {
  SeededRandom rng;
  MaskMod oddQueriesBlind("odd_queries_blind", [](const Tile&, const Tile&, const Tile& q, const Tile& kv) {
    return (q % 2 == 0) & (kv <= q);
  });
  RefMaskFn ref = [](int64_t, int64_t, int64_t q, int64_t kv) { return q % 2 == 0 && kv <= q; };
  const int64_t L = 70, S = 70;
  const BlockMask mask = createBlockMask(oddQueriesBlind, 1, 1, L, S, kBlocks, kHost);
  const AttentionCase c{.B = 1, .Hq = 2, .Hkv = 1, .L = L, .S = S, .D = 32, .dtype = DType::BF16,
                        .context = "odd blind"};
  if (!checkFlexAttention(rng, c, kHost, noop_score(), mask, nullptr, ref,
                          {.return_max_scores = true, .config = FlexAttentionConfig{32, 16, 4, 2}}))
    return;
  const BlockMask none = createBlockMask(or_masks(std::vector<MaskMod>{}), 1, 1, L, S, kBlocks, kHost);
  const RefMaskFn nothing = [](int64_t, int64_t, int64_t, int64_t) { return false; };
  checkFlexAttention(rng, c, kHost, noop_score(), none, nullptr, nothing,
                     {.return_max_scores = true, .config = FlexAttentionConfig{32, 16, 4, 2}});
  // The decode's splits: the odd queries at the end of a mask built past the keys.
  const BlockMask past = createBlockMask(oddQueriesBlind, 1, 1, S + 4, S, kBlocks, kHost);
  Tensor q = randomTensor(rng, DType::F16, {1, 4, 4, 64}, kHost);
  Tensor k = randomTensor(rng, DType::F16, {1, 2, S, 64}, kHost);
  Tensor v = randomTensor(rng, DType::F16, {1, 2, S, 64}, kHost);
  const ReferenceResult want = referenceAttention(q, k, v, nullptr, ref, 0.125, S);
  for (int64_t splits : {1, 3}) {
    SCOPED_TRACE("decode splits " + std::to_string(splits));
    Tensor out = Tensor::empty(DType::F16, q.shape(), kHost), best = Tensor::empty(DType::F32, {1, 4, 4}, kHost);
    poison(best);
    flex_attention_into(q, k, v, noop_score(), past, out, nullptr,
                        {.max_scores = best, .decode_config = FlexDecodeConfig{.splits = splits}, .query_offset = S});
    const std::string mismatch = maxScoresMismatch(best, want);
    EXPECT_EQ(mismatch, "");
    const std::vector<float> got = best.toHost<float>();
    EXPECT_TRUE(std::isinf(got[1]) && got[1] < 0) << got[1];  // query S + 1: odd
    EXPECT_TRUE(std::isfinite(got[0])) << got[0];
  }
}

// A persistent forward that splits its last round (three programs on the host: 32 tiles of 128 rows
// are ten whole rounds and two tiles cut, a program's run spanning both): the pieces leave
// their maxima beside their lses and the merge kernel takes the largest, before the passes and
// through sm_90a's.
TEST(MaxScores, PersistentForwardSplittingItsLastRound) {
  SeededRandom rng;
  ScopedSetenv persistent("FLEXTILE_FORWARD_PERSISTENT", "1");
  ScopedSetenv split("FLEXTILE_SPLIT_LAST_ROUND", "1");
  for (const char* target : {"", "sm_90a"}) {
    std::optional<InterpretAfterPasses> scope;
    if (*target) scope.emplace(target);
    AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 1000, .S = 1000, .D = 64,
                    .context = std::string("split ") + target};
    const FlexAttentionOptions o{.return_max_scores = true, .config = FlexAttentionConfig{128, 64, 8, 2}};
    Tensor q = Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.D}, kHost);
    Tensor k = Tensor::empty(c.dtype, {c.B, c.Hkv, c.S, c.D}, kHost);
    FlexAttentionOptions planned = o;
    planned.max_scores = Tensor::empty(DType::F32, {c.B, c.Hq, c.L}, kHost);
    ASSERT_TRUE(plan_flex_attention(q, k, k, noop_score(), std::nullopt, planned).lastRoundSplit);
    if (!checkFlexAttention(rng, c, kHost, noop_score(), std::nullopt, nullptr, nullptr, o)) return;
  }
}

// The paged cache's prefill (L = 40) and decode (L = 3): fragmented tables, a shared prefix, a
// batch cut short.
TEST(MaxScores, PagedPrefillAndDecode) {
  SeededRandom rng;
  for (int64_t L : {40, 3}) {
    PagedCase c{.B = 3, .Hq = 4, .Hkv = 2, .L = L, .D = 32, .pageSize = 16, .lengths = {70, 33, 0}};
    c.sharedPrefixPages = 2;
    c.context = "L " + std::to_string(L);
    const MaskMod causal = causal_mask();
    const BlockMask mask = createBlockMask(causal, c.B, 1, L, c.logicalLength(), {16, 16}, kHost);
    if (!checkPaged(rng, c, kHost, noop_score(), mask, nullptr, refCausal(), {.return_max_scores = true})) return;
  }
}

TEST(MaxScores, TheAllocatingCallReturnsThem) {
  SeededRandom rng;
  Tensor q = randomTensor(rng, DType::BF16, {1, 2, 20, 32}, kHost);
  Tensor k = randomTensor(rng, DType::BF16, {1, 2, 50, 32}, kHost);
  const FlexAttentionResult r = flex_attention(q, k, k, noop_score(), std::nullopt, {.return_max_scores = true});
  ASSERT_TRUE(r.max_scores.defined());
  EXPECT_EQ(r.max_scores.shape(), (dsl::Shape{1, 2, 20}));
  EXPECT_FALSE(r.lse.defined());
  const ReferenceResult want = referenceAttention(q, k, k, nullptr, nullptr, 1.0 / std::sqrt(32.0));
  EXPECT_EQ(maxScoresMismatch(r.max_scores, want), "");
  EXPECT_FALSE(flex_attention(q, k, k).max_scores.defined());
}

TEST(MaxScores, BadOutputsAreNamed) {
  SeededRandom rng;
  Tensor q = randomTensor(rng, DType::BF16, {1, 2, 20, 32}, kHost);
  Tensor k = randomTensor(rng, DType::BF16, {1, 2, 50, 32}, kHost);
  Tensor out = Tensor::empty(DType::BF16, {1, 2, 20, 32}, kHost);
  expectErrorNaming(
      [&] { flex_attention_into(q, k, k, noop_score(), std::nullopt, out, nullptr, {.return_max_scores = true}); },
      "return_max_scores needs the output to write: give options.max_scores");
  for (bool decode : {false, true}) {
    SCOPED_TRACE(decode ? "decode" : "prefill");
    const FlexAttentionOptions base{.kernel = decode ? AttentionTemplate::Decode : AttentionTemplate::Prefill};
    FlexAttentionOptions o = base;
    o.max_scores = Tensor::empty(DType::F32, {1, 2, 21}, kHost);
    expectErrorNaming([&] { flex_attention_into(q, k, k, noop_score(), std::nullopt, out, nullptr, o); }, "max_scores");
    o.max_scores = Tensor::empty(DType::BF16, {1, 2, 20}, kHost);
    expectErrorNaming([&] { flex_attention_into(q, k, k, noop_score(), std::nullopt, out, nullptr, o); }, "max_scores");
    o.max_scores = Tensor::viewOf(Tensor::empty(DType::F32, {1, 2, 40}, kHost), 0, {1, 2, 20}, {80, 40, 2});
    expectErrorNaming([&] { flex_attention_into(q, k, k, noop_score(), std::nullopt, out, nullptr, o); },
                "max_scores must be contiguous");
  }
}

// Max scores are a kernel of their own: without them the traced forward and decode only declare the
// two parameters (`max_scores`, `part_max`), and the sm_90a PTX stores nothing more; with them the
// prefill stores one value a row where the lse would be stored, and the split decode also leaves
// each split's maximum.
TEST(MaxScores, OnlyAKernelThatAsksForThemStoresThem) {
  const codegen::Target sm90a = codegen::Target::sm90a();
  const Tensor q = Tensor::zeros(DType::BF16, {1, 4, 1000, 64}, kHost);
  const Tensor kv = Tensor::zeros(DType::BF16, {1, 2, 1000, 64}, kHost);
  const BlockMask mask = causalBlockMask(1, 1, 1000, 1000);
  FlexAttentionOptions with{.config = FlexAttentionConfig{128, 64, 8, 2}};
  with.max_scores = Tensor::zeros(DType::F32, {1, 4, 1000}, kHost);
  const FlexAttentionOptions without{.config = with.config};
  const FlexAttentionPlan plain = plan_flex_attention(q, kv, kv, noop_score(), mask, without, true, sm90a);
  const FlexAttentionPlan asked = plan_flex_attention(q, kv, kv, noop_score(), mask, with, true, sm90a);
  const std::string plainIr = ir::printFunction(*plain.traced), askedIr = ir::printFunction(*asked.traced);
  EXPECT_EQ(count(plainIr, "%max_scores"), 1) << "declared only";
  EXPECT_GT(count(askedIr, "%max_scores"), 1);
  // As many more stores as the lse adds (each a row's value, in every path that ends a tile).
  FlexAttentionOptions lse = without;
  lse.return_lse = true;
  const FlexAttentionPlan withLse = plan_flex_attention(q, kv, kv, noop_score(), mask, lse, true, sm90a);
  const int plainStores = count(plain.compiled->ptx, "st\\.global");
  EXPECT_GT(count(withLse.compiled->ptx, "st\\.global"), plainStores);
  EXPECT_EQ(count(asked.compiled->ptx, "st\\.global") - plainStores,
            count(withLse.compiled->ptx, "st\\.global") - plainStores);

  const Tensor one = Tensor::zeros(DType::BF16, {1, 4, 1, 64}, kHost);
  FlexAttentionOptions decode{.kernel = AttentionTemplate::Decode, .decode_config = FlexDecodeConfig{.splits = 3}};
  const FlexDecodePlan plainDecode = plan_flex_decode(one, kv, kv, noop_score(), std::nullopt, decode, sm90a);
  decode.max_scores = Tensor::zeros(DType::F32, {1, 4, 1}, kHost);
  const FlexDecodePlan askedDecode = plan_flex_decode(one, kv, kv, noop_score(), std::nullopt, decode, sm90a);
  EXPECT_EQ(count(ir::printFunction(*plainDecode.traced), "%part_max"), 1) << "declared only";
  EXPECT_GT(count(ir::printFunction(*askedDecode.traced), "%part_max"), 1);
  EXPECT_GT(count(askedDecode.compiled[0]->ptx, "st\\.global"),
            count(plainDecode.compiled[0]->ptx, "st\\.global"));
}
