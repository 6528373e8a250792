// The decode template through the IR interpreter (host tensors) against the float64 reference and
// against the prefill template: every registered variant, 1 to 16 queries per head, GQA 1:1, 4:1,
// 8:1 and MQA, KV lengths around the blocks, queries addressed inside a pre-built mask, one split
// and several, per-head masks, fully masked rows, and the errors of bad offsets.
#include <gtest/gtest.h>

#include "FlexAttentionDecodeCheck.h"
#include "PagedKVCheck.h"
#include "MaskTestUtil.h"
#include "codegen/Ptxas.h"
#include "gpu/GpuTest.h"

#include <chrono>
#include <cstdio>

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

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

TEST(FlexDecode, EveryVariantMatchesTheReferenceAndThePrefillTemplate) {
  SeededRandom rng;
  const std::vector<AttentionCase> cases = {
      {.B = 1, .Hq = 2, .Hkv = 2, .L = 1, .S = 1, .D = 64, .dtype = DType::BF16},
      {.B = 2, .Hq = 4, .Hkv = 1, .L = 2, .S = 127, .D = 64, .dtype = DType::F16},
      {.B = 1, .Hq = 8, .Hkv = 2, .L = 5, .S = 129, .D = 64, .dtype = DType::BF16},
      {.B = 1, .Hq = 4, .Hkv = 4, .L = 1, .S = 200, .D = 96, .dtype = DType::BF16},
      // A head dimension padded to its power of two, in a group of five heads (15 of 16 rows).
      {.B = 1, .Hq = 10, .Hkv = 2, .L = 3, .S = 150, .D = 80, .dtype = DType::F16},
  };
  size_t index = 0;
  for (const Variant& v : variants())
    for (const AttentionCase& c : cases)
      if (runsInThisBuild(rng.seed(), index++, 2) && !checkDecodeVariant(rng, v, c, kHost)) return;  // sanitizers: half
}

TEST(FlexDecode, SixteenQueriesOfAnEightHeadGroupFillOneProgram) {
  SeededRandom rng;
  AttentionCase c{.B = 1, .Hq = 8, .Hkv = 1, .L = 16, .S = 70, .D = 64, .dtype = DType::F32};
  for (const char* name : {"causal", "sliding_window", "alibi"})
    if (!checkDecodeVariant(rng, variant(name), c, kHost, {.splits = {0, 2}})) return;
  // 8 heads x 16 queries = 128 rows in one program.
  Tensor q = Tensor::empty(DType::F32, {1, 8, 16, 64}, kHost), k = Tensor::empty(DType::F32, {1, 1, 70, 64}, kHost);
  FlexDecodePlan plan = plan_flex_decode(q, k, k, noop_score(), std::nullopt, {});
  EXPECT_EQ(plan.headsPerProgram, 8);
  EXPECT_EQ(plan.rowsPerProgram, 128);
}

TEST(FlexDecode, PerHeadMasksWalkEachHeadsOwnList) {
  SeededRandom rng;
  const std::vector<int64_t> windows = {3, 20, 45, 300};
  const int64_t S = 150, L = 3, pos = 140;
  BlockMask mask = slidingWindowBlockMask(1, 4, S + L, S, windows, kBlocks, kHost);
  AttentionCase c{.B = 2, .Hq = 4, .Hkv = 2, .L = L, .S = S, .D = 64, .dtype = DType::BF16};
  Tensor q = randomTensor(rng, c.dtype, {2, 4, L, 64}, kHost);
  Tensor k = randomTensor(rng, c.dtype, {2, 2, S, 64}, kHost), v = randomTensor(rng, c.dtype, {2, 2, S, 64}, kHost);
  const ReferenceResult ref = referenceAttention(q, k, v, nullptr, refWindow(windows), 0.125, pos);
  for (int64_t splits : {0, 1, 4}) {
    Tensor out = Tensor::empty(c.dtype, q.shape(), kHost), lse = Tensor::empty(DType::F32, {2, 4, L}, kHost);
    poison(out);
    poison(lse);
    flex_attention_into(q, k, v, noop_score(), mask, out, &lse,
                        {.decode_config = FlexDecodeConfig{.splits = splits}, .query_offset = pos});
    if (!compareWithReference(out, lse, ref, 64, c.dtype)) return;
  }
  Tensor q1 = Tensor::empty(DType::BF16, {1, 4, 1, 64}, kHost), k1 = Tensor::empty(DType::BF16, {1, 2, S, 64}, kHost);
  EXPECT_EQ(plan_flex_decode(q1, k1, k1, noop_score(), mask, {.query_offset = 10}).headsPerProgram, 1);
}

// FlexAttentionOptions::decode_timeline (checkDecodeTimeline) through the interpreter.
TEST(FlexDecode, TimelinesRecordEveryProgramsPhasesInOrder) {
  SeededRandom rng;
  checkDecodeTimeline(rng, kHost);
}

TEST(FlexDecode, FullyMaskedQueriesGiveZeroAndMinusInfinity) {
  SeededRandom rng;
  MaskMod oddQueriesBlind("odd_queries_blind",
                          [](const Tile&, const Tile&, const Tile& q, const Tile& kv) { return (q % 2 == 0) & (kv <= q); });
  RefMaskFn ref = [](int64_t, int64_t, int64_t q, int64_t kv) { return q % 2 == 0 && kv <= q; };
  const int64_t S = 90, L = 4;
  BlockMask mask = createBlockMask(oddQueriesBlind, 1, 1, S + L, S, kBlocks, kHost);
  BlockMask none = createBlockMask(or_masks(std::vector<MaskMod>{}), 1, 1, S + L, S, kBlocks, kHost);
  Tensor q = randomTensor(rng, DType::F16, {1, 4, L, 64}, kHost);
  Tensor k = randomTensor(rng, DType::F16, {1, 2, S, 64}, kHost), v = randomTensor(rng, DType::F16, {1, 2, S, 64}, kHost);
  for (auto [m, r] : {std::pair{&mask, ref}, std::pair{&none, RefMaskFn([](int64_t, int64_t, int64_t, int64_t) {
                                                    return false;
                                                  })}})
    for (int64_t pos : {int64_t(0), int64_t(43), S})
      for (int64_t splits : {1, 3}) {
        SCOPED_TRACE(m->maskMod().name() + " at " + std::to_string(pos) + " splits " + std::to_string(splits));
        const ReferenceResult want = referenceAttention(q, k, v, nullptr, r, 0.125, pos);
        Tensor out = Tensor::empty(DType::F16, q.shape(), kHost), lse = Tensor::empty(DType::F32, {1, 4, L}, kHost);
        poison(out);
        poison(lse);
        flex_attention_into(q, k, v, noop_score(), *m, out, &lse,
                            {.decode_config = FlexDecodeConfig{.splits = splits}, .query_offset = pos});
        if (!compareWithReference(out, lse, want, 64, DType::F16)) return;
      }
}

// The mask row [96, 128) lists the window's block 2 (keys 64-95) as partial, but query 127 sees
// keys 108-127 only: the template must not load block 2. Its values are NaN, which any load would
// spread into the output (0 * NaN), while the reference never reads them.
TEST(FlexDecode, APartialBlockWithoutAnAllowedPairForTheQueriesIsNeverLoaded) {
  SeededRandom rng;
  const int64_t S = 160, W = 20;
  BlockMask mask = slidingWindowBlockMask(1, 1, S, S, {W}, kBlocks, kHost);
  ASSERT_EQ(mask.partialKvBlocks(0, 0, 3).size(), 2u);
  Tensor q = randomTensor(rng, DType::BF16, {1, 2, 1, 64}, kHost);
  Tensor k = randomTensor(rng, DType::BF16, {1, 1, S, 64}, kHost);
  std::vector<float> vHost = randomTensor(rng, DType::F32, {1, 1, S, 64}, kHost).toHost<float>();
  for (int64_t j = 64 * 64; j < 96 * 64; ++j) vHost[size_t(j)] = NAN;
  Tensor v = Tensor::fromHost(vHost, DType::BF16, {1, 1, S, 64}, kHost);
  const ReferenceResult ref = referenceAttention(q, k, v, nullptr, refWindow({W}), 0.125, 127);
  for (BlockMask m : {mask, mask.sliceRows(3, 1, 127, 1)}) {
    Tensor out = Tensor::empty(DType::BF16, q.shape(), kHost), lse = Tensor::empty(DType::F32, {1, 2, 1}, kHost);
    poison(out);
    poison(lse);
    FlexAttentionOptions o{.kernel = AttentionTemplate::Decode};
    if (m.qLen() != 1) o.query_offset = 127;
    flex_attention_into(q, k, v, noop_score(), m, out, &lse, o);
    if (!compareWithReference(out, lse, ref, 64, DType::BF16)) return;
  }
}

TEST(FlexDecode, SmallQueryCountsPickTheDecodeTemplateByThemselves) {
  SeededRandom rng;
  MaskMod fresh("fresh_causal", [](const Tile&, const Tile&, const Tile& q, const Tile& kv) { return kv <= q; });
  const int64_t S = 64;
  BlockMask mask = createBlockMask(fresh, 1, 1, S, S, kBlocks, kHost);
  BlockMask decodeRow = mask.sliceRows(1, 1, 40, 1);
  Tensor q = randomTensor(rng, DType::BF16, {1, 2, 1, 64}, kHost);
  Tensor k = randomTensor(rng, DType::BF16, {1, 2, S, 64}, kHost), v = randomTensor(rng, DType::BF16, {1, 2, S, 64}, kHost);
  FlexAttentionResult r = flex_attention(q, k, v, noop_score(), decodeRow, {.return_lse = true});
  EXPECT_EQ(cachedForwardKernel(fresh, noop_score(), DType::BF16), nullptr) << "L = 1 ran the prefill template";
  compareWithReference(r.out, r.lse, referenceAttention(q, k, v, nullptr, refCausal(), 0.125, 40), 64, DType::BF16);
  // An explicit prefill config, or kernel = Prefill, runs the prefill template.
  flex_attention(q, k, v, noop_score(), decodeRow, {.config = FlexAttentionConfig{32, 32, 4, 2}});
  EXPECT_NE(cachedForwardKernel(fresh, noop_score(), DType::BF16), nullptr);
}

TEST(FlexDecode, QueriesOutsideThePrebuiltMaskAreAnError) {
  const int64_t S = 100;
  BlockMask mask = causalBlockMask(1, 1, S, S, kBlocks, kHost);
  Tensor q = Tensor::zeros(DType::BF16, {1, 2, 3, 64}, kHost), k = Tensor::zeros(DType::BF16, {1, 2, S, 64}, kHost);
  Tensor q1 = Tensor::zeros(DType::BF16, {1, 2, 1, 64}, kHost);
  expectError([&] { flex_attention(q, k, k, noop_score(), mask, {.query_offset = 98}); },
              {"queries [98, 101)", "outside the BlockMask's queries [0, 100)"});
  expectError([&] { flex_attention(q, k, k, noop_score(), mask, {.query_offset = -1}); }, {"queries [-1, 2)"});
  // Without an offset the mask must have q's length: never a silent crop.
  expectError([&] { flex_attention(q1, k, k, noop_score(), mask); }, {"Q_LEN=100", "build a mask for these lengths"});
  // A mask for fewer keys than the cache holds.
  Tensor k2 = Tensor::zeros(DType::BF16, {1, 2, S + 1, 64}, kHost);
  expectError([&] { flex_attention(q1, k2, k2, noop_score(), mask, {.query_offset = 5}); }, {"KV_LEN=101"});
  expectError([&] { flex_attention(q, k, k, noop_score(), mask, {.kernel = AttentionTemplate::Prefill, .query_offset = 5}); },
              {"is taken by the decode template only"});
  expectError([&] {
    flex_attention(q1, k, k, noop_score(), mask, {.decode_config = FlexDecodeConfig{.block_n = 24}, .query_offset = 5});
  }, {"BLOCK_M and BLOCK_N must be powers of two"});
  Tensor q200 = Tensor::zeros(DType::BF16, {1, 2, 200, 64}, kHost), k200 = Tensor::zeros(DType::BF16, {1, 2, 200, 64}, kHost);
  expectError([&] { flex_attention(q200, k200, k200, noop_score(), std::nullopt, {.kernel = AttentionTemplate::Decode}); },
              {"at most 128 queries per head, got L = 200"});
}

// The fused merge through the interpreter (whose programs run on several host threads, so the
// ticket and the fences are exercised for real): many splits, the split count changing from call
// to call on one scratch (the counters must be back at 0 after every call), fully masked rows
// beside live ones, GQA 4:1 and MQA, L > 1, empty splits, and 128 rows a program (4 merge rounds).
// Each way of ordering the merge: fences around a relaxed ticket, and the ticket as its own release
// and acquire (the default).
TEST(FlexDecode, FusedMergeOverManySplitsCallAfterCall) {
  for (const char* acqRel : {"0", "1"}) {
    SCOPED_TRACE(std::string("FLEXTILE_DECODE_ACQREL_TICKET=") + acqRel);
    ScopedSetenv ticket("FLEXTILE_DECODE_ACQREL_TICKET", acqRel);
    SeededRandom rng;
    const std::vector<FusedMergeCase> cases = {
        {.B = 2, .Hq = 8, .Hkv = 2, .L = 3, .S = 300, .D = 64, .blindOddQueries = true, .splits = {7, 16, 5, 40, 7}},
        {.B = 3, .Hq = 4, .Hkv = 1, .L = 1, .S = 257, .D = 32, .dtype = DType::F16, .window = 90, .splits = {3, 9, 2, 9}},
        {.B = 1, .Hq = 8, .Hkv = 1, .L = 16, .S = 70, .D = 32, .dtype = DType::F32, .blindOddQueries = true,
         .splits = {4, 11, 2}},
    };
    for (const FusedMergeCase& c : cases)
      if (!checkFusedMergeCalls(rng, c, kHost)) return;
  }
}

// A run of steps may hold partial and full steps: the template walks the partial list's first
// (FLEXTILE_DECODE_PARTIAL_FIRST=0: the full list's). Both orders against the reference, with runs
// that straddle the two lists and a window whose left-edge block must be skipped (its V is NaN).
TEST(FlexDecode, EitherOrderOfTheListsGivesTheReference) {
  for (const char* partialFirst : {"1", "0"}) {
    SCOPED_TRACE(std::string("FLEXTILE_DECODE_PARTIAL_FIRST=") + partialFirst);
    ScopedSetenv order("FLEXTILE_DECODE_PARTIAL_FIRST", partialFirst);
    SeededRandom rng;
    const FusedMergeCase window{.B = 2, .Hq = 8, .Hkv = 2, .L = 1, .S = 611, .D = 64, .window = 200,
                                .splits = {2, 3, 5, 9}};
    if (!checkFusedMergeCalls(rng, window, kHost)) return;
    const int64_t S = 300, W = 100, pos = S - 1;
    BlockMask mask = slidingWindowBlockMask(1, 1, S, S, {W}, kBlocks, kHost);
    Tensor q = randomTensor(rng, DType::BF16, {1, 4, 1, 64}, kHost);
    Tensor k = randomTensor(rng, DType::BF16, {1, 1, S, 64}, kHost);
    std::vector<float> vHost = randomTensor(rng, DType::F32, {1, 1, S, 64}, kHost).toHost<float>();
    // Keys 160-191: a partial block of the row, none of whose keys the last query sees (pos - W = 199).
    for (int64_t j = 160 * 64; j < 192 * 64; ++j) vHost[size_t(j)] = NAN;
    Tensor v = Tensor::fromHost(vHost, DType::BF16, {1, 1, S, 64}, kHost);
    const ReferenceResult ref = referenceAttention(q, k, v, nullptr, refWindow({W}), 0.125, pos);
    for (int64_t splits : {1, 2, 3, 5}) {
      Tensor out = Tensor::empty(DType::BF16, q.shape(), kHost), lse = Tensor::empty(DType::F32, {1, 4, 1}, kHost);
      poison(out);
      poison(lse);
      FlexAttentionOptions o{.kernel = AttentionTemplate::Decode, .decode_config = FlexDecodeConfig{32, 4, 2, splits},
                             .query_offset = pos};
      flex_attention_into(q, k, v, noop_score(), mask, out, &lse, o);
      SCOPED_TRACE("splits " + std::to_string(splits));
      if (!compareWithReference(out, lse, ref, 64, DType::BF16)) return;
    }
  }
}

TEST(FlexDecode, SplitCountFollowsLiveBlocksNotTheKvLength) {
  const int64_t ring = 1;  // one program per SM (a 128 KB ring)
  // 64 programs on 132 SMs over 256 steps: two splits fill one wave.
  EXPECT_EQ(decodeSplitCount(64, 256, 132, ring), 2);
  // A sliding window of 33 live blocks in a KV of 256: the split follows the 33.
  EXPECT_EQ(decodeSplitCount(64, 33, 132, ring), 2);
  EXPECT_EQ(decodeSplitCount(64, 7, 132, ring), 1);  // too short to split
  EXPECT_EQ(decodeSplitCount(8, 256, 132, ring), 16);  // B = 1: 8 groups x 16 splits
  EXPECT_EQ(decodeSplitCount(64, 0, 132, ring), 1);
  EXPECT_EQ(decodeSplitCount(64, 512, 0, ring), 1);  // the interpreter: one split
  EXPECT_GE(decodeSplitCount(1, 1 << 20, 132, ring), 120);  // one long row: about one program per SM
  EXPECT_LE(decodeSplitCount(1, 1 << 20, 132, ring), 128);
  // Two programs per SM: more slots, more splits; three resident are still aimed at two (the
  // window decode: 64 groups over 64 steps take 4 splits, B = 1 over 512 steps 32, not 47).
  EXPECT_EQ(decodeSplitCount(64, 256, 132, 2), 4);
  EXPECT_EQ(decodeSplitCount(64, 256, 132, 3), 4);
  EXPECT_EQ(decodeSplitCount(64, 64, 132, 3), 4);
  EXPECT_EQ(decodeSplitCount(8, 512, 132, 3), 32);
  // Aiming at every slot (FLEXTILE_DECODE_FILL_SLOTS=1): the counts of before 2026-12-05.
  EXPECT_EQ(decodeSplitCount(64, 256, 132, 3, 3), 6);
  EXPECT_EQ(decodeSplitCount(64, 64, 132, 3, 3), 6);
  EXPECT_EQ(decodeSplitCount(8, 512, 132, 3, 3), 47);
}

// A plan for the H100/H200 (sm_90a, 132 SMs) takes the split count aimed at two programs an SM;
// FLEXTILE_DECODE_FILL_SLOTS=1 aims at the three the default ring allows (the counts before
// 2026-12-05), for the A/B on another GPU. B = 8 groups of GQA 4:1 over 4096 keys: 64 steps.
TEST(FlexDecode, PlannedSplitsAimAtTwoProgramsAnSm) {
  const int64_t B = 8, Hq = 32, Hkv = 8, S = 4096, D = 128;
  Tensor q = Tensor::zeros(DType::BF16, {B, Hq, 1, D}, kHost), kv = Tensor::zeros(DType::BF16, {B, Hkv, S, D}, kHost);
  const FlexAttentionOptions o{.kernel = AttentionTemplate::Decode};
  auto splits = [&] { return plan_flex_decode(q, kv, kv, noop_score(), std::nullopt, o, codegen::Target::sm90a()).config.splits; };
  EXPECT_EQ(splits(), 4);
  // The config's aim (what `flextile autotune --kernel decode` tunes): one an SM halves the count,
  // three is every slot of the default ring, more than the ring lets reside is what it lets.
  auto aimed = [&](int perSm) {
    FlexAttentionOptions a = o;
    a.decode_config = defaultFlexDecodeConfig(DType::BF16, D);
    a.decode_config->programs_per_sm = perSm;
    return plan_flex_decode(q, kv, kv, noop_score(), std::nullopt, a, codegen::Target::sm90a()).config.splits;
  };
  EXPECT_EQ(aimed(1), 2);
  EXPECT_EQ(aimed(2), 4);
  EXPECT_EQ(aimed(3), 6);
  EXPECT_EQ(aimed(8), 6);
  ScopedSetenv fill("FLEXTILE_DECODE_FILL_SLOTS", "1");
  EXPECT_EQ(splits(), 6);
  EXPECT_EQ(aimed(1), 2) << "the config's aim wins over the switch";
}

// The decode's config hook (setFlexDecodeConfigResolver; autotune/ installs its per-GPU cache of
// tuned decode configs there): a call without a decode config runs the resolver's when it can take
// it, and the result is the reference's; a config given in the options wins; one the call cannot
// take (BLOCK_N not dividing the KV blocks, an odd warp count, an aim out of range) is ignored.
TEST(FlexDecode, TheResolversConfigRunsWhenTheCallCanTakeIt) {
  SeededRandom rng;
  const int64_t S = 150, L = 1, pos = 140, B = 2, Hq = 4, Hkv = 2, D = 64;
  const BlockMask mask = slidingWindowBlockMask(1, 1, S + L, S, {40}, kBlocks, kHost);
  Tensor q = randomTensor(rng, DType::BF16, {B, Hq, L, D}, kHost);
  Tensor k = randomTensor(rng, DType::BF16, {B, Hkv, S, D}, kHost), v = randomTensor(rng, DType::BF16, {B, Hkv, S, D}, kHost);
  FlexAttentionProblem seen{};
  FlexDecodeConfig answer{.block_n = 16, .num_warps = 4, .num_stages = 3, .splits = 3, .programs_per_sm = 1};
  setFlexDecodeConfigResolver([&](const FlexAttentionProblem& p) -> std::optional<FlexDecodeConfig> {
    seen = p;
    return answer;
  });
  const FlexAttentionOptions o{.kernel = AttentionTemplate::Decode, .query_offset = pos};
  EXPECT_EQ(plan_flex_decode(q, k, v, noop_score(), mask, o).config, answer);
  EXPECT_EQ(seen.L, L);
  EXPECT_EQ(seen.Hkv, Hkv);
  EXPECT_EQ(seen.S, S);
  EXPECT_EQ(seen.maskMod, mask.maskMod().name());
  const ReferenceResult ref = referenceAttention(q, k, v, nullptr, refWindow({40}), 0.125, pos);
  Tensor out = Tensor::empty(DType::BF16, q.shape(), kHost), lse = Tensor::empty(DType::F32, {B, Hq, L}, kHost);
  poison(out);
  poison(lse);
  flex_attention_into(q, k, v, noop_score(), mask, out, &lse, o);
  EXPECT_TRUE(compareWithReference(out, lse, ref, D, DType::BF16));

  FlexAttentionOptions given = o;
  given.decode_config = FlexDecodeConfig{.block_n = 32, .num_warps = 4, .num_stages = 2, .splits = 2};
  EXPECT_EQ(plan_flex_decode(q, k, v, noop_score(), mask, given).config, *given.decode_config);
  setFlexDecodeConfigResolver({});
  const FlexDecodeConfig fallback = plan_flex_decode(q, k, v, noop_score(), mask, o).config;
  setFlexDecodeConfigResolver([&](const FlexAttentionProblem& p) -> std::optional<FlexDecodeConfig> {
    seen = p;
    return answer;
  });
  for (const FlexDecodeConfig& unusable : {FlexDecodeConfig{.block_n = 24}, FlexDecodeConfig{.num_warps = 3},
                                           FlexDecodeConfig{.programs_per_sm = 9}, FlexDecodeConfig{.splits = -1}}) {
    answer = unusable;
    EXPECT_EQ(plan_flex_decode(q, k, v, noop_score(), mask, o).config, fallback) << unusable.describe();
  }
  // A paged call takes a resolved config too, its BLOCK_N narrowed to pages of 16 keys as the
  // default's is (the pages in random order, a shared prefix, an empty sequence).
  answer = FlexDecodeConfig{.block_n = 32, .num_warps = 4, .num_stages = 2, .splits = 2, .programs_per_sm = 1};
  seen = {};
  PagedCase c{.B = 3, .Hq = 8, .Hkv = 2, .L = 1, .D = 32, .pageSize = 16, .lengths = {70, 0, 129},
              .sharedPrefixPages = 1, .dtype = DType::BF16, .context = "resolved config"};
  EXPECT_TRUE(checkPaged(rng, c, kHost, noop_score(), std::nullopt, nullptr, nullptr,
                         {.kernel = AttentionTemplate::Decode}));
  EXPECT_EQ(seen.S, c.logicalLength()) << "the resolver was asked";
  // While the resolver says it cannot answer (autotune/'s: nothing tuned), no problem is built and
  // the resolver is not asked: the default runs.
  int asked = 0;
  setFlexDecodeConfigResolver(
      [&](const FlexAttentionProblem&) -> std::optional<FlexDecodeConfig> {
        ++asked;
        return answer;
      },
      [] { return false; });
  EXPECT_EQ(plan_flex_decode(q, k, v, noop_score(), mask, o).config, fallback);
  EXPECT_EQ(asked, 0);
  setFlexDecodeConfigResolver({});
}

// Residency: what the ring's shared memory allows, capped where a thread would keep fewer than 128
// registers (the default BN64 w4 s2 ring at D = 128 is 64 KB: three programs per SM).
TEST(FlexDecode, ProgramsPerSmFollowTheRingAndKeepRegisters) {
  const codegen::TargetDescription& h200 = codegen::Target::sm90a().description();
  EXPECT_EQ(decodeProgramsPerSm(2 * 2 * 64 * 128 * 2, 4, h200), 3);
  EXPECT_EQ(decodeProgramsPerSm(2 * 2 * 128 * 128 * 2, 8, h200), 1);
  EXPECT_EQ(decodeProgramsPerSm(2 * 2 * 64 * 64 * 2, 4, h200), 4);   // the shared memory would allow 6
  EXPECT_EQ(decodeProgramsPerSm(2 * 2 * 64 * 64 * 2, 1, h200), 6);   // 228 KB / (32 KB + 1 KB reserved)
  EXPECT_EQ(decodeProgramsPerSm(2 * 2 * 64 * 128 * 2, 8, h200), 2);  // 256 threads
  EXPECT_EQ(decodeProgramsPerSm(1 << 20, 4, h200), 1);
  // An A100 holds 164 KB per SM: two 64 KB rings, not three; an sm_86 part's 100 KB one.
  EXPECT_EQ(decodeProgramsPerSm(2 * 2 * 64 * 128 * 2, 4, codegen::Target::sm80().description()), 2);
  EXPECT_EQ(decodeProgramsPerSm(2 * 2 * 64 * 128 * 2, 4, codegen::Target{86, false}.description()), 1);
}

// Every variant's decode kernel (the merge fused into it) compiles for sm_90a and ptxas accepts them
// at the residency the template asks for, without spilling; the compile time of each is printed (a
// GPU test compiles dozens).
TEST(FlexDecode, EveryVariantAssemblesForSm90a) {
  if (!codegen::findPtxas()) GTEST_SKIP() << "ptxas not found (PATH or /usr/local/cuda/bin): not assembling";
  SeededRandom rng;
  const codegen::Target target = codegen::Target::sm90a();
  for (int64_t D : {64, 128, 256})
    for (const Variant& var : variants()) {
      const int64_t B = 2, Hq = 8, Hkv = 2, S = 4097;
      VariantInstance inst = var.make({B, Hq, S, S, kHost, BlockSizes{}, rng()});
      const DType dt = D == 256 ? DType::F32 : DType::BF16;
      Tensor q = Tensor::zeros(dt, {B, Hq, 1, D}, kHost), kv = Tensor::zeros(dt, {B, Hkv, S, D}, kHost);
      FlexAttentionOptions o{.kernel = AttentionTemplate::Decode};
      if (inst.mask) o.query_offset = S - 1;
      const auto start = std::chrono::steady_clock::now();
      FlexDecodePlan plan;
      ASSERT_NO_THROW(plan = plan_flex_decode(q, kv, kv, inst.score, inst.mask, o, target)) << var.name;
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      ASSERT_EQ(plan.compiled.size(), plan.kernelNames.size());
      for (const codegen::CompiledKernel* c : plan.compiled) {
        codegen::PtxasReport report;
        ASSERT_NO_THROW(report = codegen::runPtxas(c->ptx, target)) << var.name;
        std::printf("D=%ld %s %s: %s, %d registers, %d bytes spilled, %d bytes of shared memory (compiled in %.0f ms)\n",
                    long(D), var.name.c_str(), c->name.c_str(), plan.config.describe().c_str(), report.registers,
                    report.spillStoreBytes, c->sharedBytes, ms);
        // The residency the ring allows is asked of ptxas, and it fits without spilling.
        const int64_t programs = decodeProgramsPerSm(
            2 * plan.config.num_stages * plan.config.block_n * (D == 256 ? 256 : D) * ir::byteWidth(dt), plan.config.num_warps,
            target.description());
        EXPECT_NE(c->ptx.find(".minnctapersm " + std::to_string(programs)), std::string::npos) << var.name << " D=" << D;
        EXPECT_LE(report.registers * 32 * plan.config.num_warps * programs, 65536) << var.name << " D=" << D;
        // (f32 at D = 256 runs on FMAs at ptxas's 255-register ceiling and spills, with or without it.)
        if (dt != DType::F32) {
          EXPECT_EQ(report.spillStoreBytes, 0) << var.name << " D=" << D;
        }
      }
    }
}

// The residency request (min_programs_per_sm) is made for programs of 16 rows, and a kernel that
// carries it never spills: at first it was made for every program, and the 32- to 128-row ones
// (L = 4..16 queries of a GQA 8:1 group) spilled up to 4 KB at the 168 registers it leaves.
TEST(FlexDecode, AResidencyRequestNeverMakesPtxasSpill) {
  if (!kSanitizedBuild && !codegen::findPtxas()) GTEST_SKIP() << "ptxas not found (PATH or /usr/local/cuda/bin): not assembling";
  const codegen::Target target = codegen::Target::sm90a();
  for (int64_t L : {1, 4, 16})
    for (int64_t G : {4, 8})
      for (int64_t D : {64, 128}) {
        const int64_t B = 2, Hq = 32, S = 4096;
        Tensor q = Tensor::zeros(DType::BF16, {B, Hq, L, D}, kHost), kv = Tensor::zeros(DType::BF16, {B, Hq / G, S, D}, kHost);
        FlexAttentionOptions o{.kernel = AttentionTemplate::Decode, .query_offset = S - L};
        FlexDecodePlan plan;
        ASSERT_NO_THROW(plan = plan_flex_decode(q, kv, kv, noop_score(), causalBlockMask(1, 1, S, S, {128, 128}, kHost), o,
                                                target));
        for (const codegen::CompiledKernel* c : plan.compiled) {
          SCOPED_TRACE("L=" + std::to_string(L) + " G=" + std::to_string(G) + " D=" + std::to_string(D) + " rows " +
                       std::to_string(plan.rowsPerProgram));
          const bool requested = c->ptx.find(".minnctapersm") != std::string::npos;
          EXPECT_EQ(requested, plan.rowsPerProgram <= 16);
          if (!requested || !assemblesInThisBuild()) continue;  // (the sanitizer build plans only)
          codegen::PtxasReport report;
          ASSERT_NO_THROW(report = codegen::runPtxas(c->ptx, target));
          EXPECT_EQ(report.spillStoreBytes, 0);
        }
      }
}

// ---- paged K/V ---------------------------------------------------------------

namespace {
FlexAttentionOptions decodeWithSplits(int64_t splits) {
  return {.kernel = AttentionTemplate::Decode, .decode_config = FlexDecodeConfig{.block_n = 16, .splits = splits}};
}
}  // namespace

// Fragmented pools (pages in random physical order), ragged lengths with an empty batch, a shared
// prefix, page sizes below, at and above BLOCK_N: the decode template reads K/V through the page
// table and agrees with the reference over the logical K/V.
TEST(FlexDecode, PagedKvMatchesTheReference) {
  SeededRandom rng;
  for (int64_t page : {16, 32, 64})
    for (int64_t L : {1, 3})
      for (int64_t splits : {0, 1, 3}) {
        PagedCase c{.B = 3, .Hq = 8, .Hkv = 2, .L = L, .D = 32, .pageSize = page, .lengths = {70, 0, 129},
                    .sharedPrefixPages = 1, .dtype = DType::BF16,
                    .context = "splits " + std::to_string(splits)};
        if (!checkPaged(rng, c, kHost, noop_score(), std::nullopt, nullptr, nullptr, decodeWithSplits(splits))) return;
        // A causal row slice: the queries at the end of a mask pre-built past the keys.
        const int64_t S = c.logicalLength(), pos = S + 5;
        const BlockMask row = causalBlockMask(1, 1, S + 40, S, kBlocks).sliceRows(pos / 32, 1, pos, L);
        c.context += " causal row";
        if (!checkPaged(rng, c, kHost, noop_score(), row, nullptr, refCausal(), decodeWithSplits(splits))) return;
      }
}

// A serving loop on a PagedKVCache: a ragged prefill through the write kernel, then decode steps
// that append one token per sequence and attend from the newest position (the mask pre-built at
// the maximum length, addressed with query_offset), each step against the reference.
TEST(FlexDecode, PagedCacheServingLoop) {
  SeededRandom rng;
  const int64_t B = 3, Hq = 4, Hkv = 1, D = 32, T = 40, maxLength = 96;
  const DType dt = DType::F16;
  PagedKVCache cache(dt, Hkv, D, /*numPages*/ 24, /*pageSize*/ 16, /*maxBatch*/ 3, /*maxPagesPerSequence*/ 6, kHost);
  LogicalHistory hist(B, Hkv, D);
  const std::vector<int64_t> order{0, 1, 2}, prompt{40, 17, 33};
  NewTokens p = randomTokens(rng, dt, B, Hkv, T, D, kHost);
  cache.write(order, p.k, p.v, prompt);
  for (int64_t i = 0; i < B; ++i) hist.append(i, p.kHost, p.vHost, i, T, prompt[size_t(i)]);
  // Every sequence decodes at its own position: the mod sees it through a captured table.
  const BlockMask window = slidingWindowBlockMask(1, 1, maxLength, maxLength, {24}, kBlocks, kHost);
  for (int step = 0; step < 8; ++step) {
    SCOPED_TRACE("decode step " + std::to_string(step));
    NewTokens n = randomTokens(rng, dt, B, Hkv, 1, D, kHost);
    cache.append(n.k, n.v);
    for (int64_t b = 0; b < B; ++b) hist.append(b, n.kHost, n.vHost, b, 1, 1);
    const std::vector<int64_t> lengths = hist.lengths(B);
    // One query per sequence at the longest sequence's newest position; shorter sequences see
    // their own keys only (lengths), through the same window.
    const int64_t pos = *std::max_element(lengths.begin(), lengths.end()) - 1;
    const PagedKV kv = cache.view({.batches = B, .length = maxLength});
    auto [k, v] = hist.tensors(B, maxLength, dt);
    const Tensor q = randomTensor(rng, dt, {B, Hq, 1, D}, kHost);
    const ReferenceResult ref =
        referenceAttention(q, k, v, nullptr, withLengths(refWindow({24}), lengths), 1.0 / std::sqrt(double(D)), pos);
    for (int64_t splits : {0, 2}) {
      FlexAttentionOptions o = decodeWithSplits(splits);
      o.query_offset = pos;
      Tensor out = Tensor::empty(dt, q.shape(), kHost), lse = Tensor::empty(DType::F32, {B, Hq, 1}, kHost);
      poison(out);
      poison(lse);
      flex_attention_into(q, kv, noop_score(), window, out, &lse, o);
      if (!compareWithReference(out, lse, ref, D, dt)) return;
    }
  }
}

// Regression (H200, 2026-12-01): a row slice of a per-head, per-batch mask is a view of its
// parent's lists with the parent's row strides; the decode template once recomputed the strides
// from the slice's own shape and read other heads' rows (zero outputs).
TEST(FlexDecode, RowSlicesOfPerHeadMasksKeepTheirParentsStrides) {
  SeededRandom rng;
  const int64_t S = 200, pos = 150;
  const std::vector<int64_t> windows = {3, 40, 90, 300};
  BlockMask windowsMask = slidingWindowBlockMask(2, 4, S, S, windows, kBlocks, kHost);
  BlockMask slice = windowsMask.sliceRows(pos / 32, 1, pos, 1);
  Tensor q = randomTensor(rng, DType::BF16, {2, 4, 1, 64}, kHost);
  Tensor k = randomTensor(rng, DType::BF16, {2, 2, S, 64}, kHost), v = randomTensor(rng, DType::BF16, {2, 2, S, 64}, kHost);
  const ReferenceResult ref = referenceAttention(q, k, v, nullptr, refWindow(windows), 0.125, pos);
  for (int64_t splits : {0, 3}) {
    Tensor out = Tensor::empty(DType::BF16, q.shape(), kHost), lse = Tensor::empty(DType::F32, {2, 4, 1}, kHost);
    poison(out);
    poison(lse);
    flex_attention_into(q, k, v, noop_score(), slice, out, &lse, decodeWithSplits(splits));
    if (!compareWithReference(out, lse, ref, 64, DType::BF16)) return;
  }
}

// A batch of requests at different positions (query_offsets, one per sequence): each sequence's
// query sees its own window, against a reference run per sequence at its own offset. Contiguous
// and paged K/V.
TEST(FlexDecode, EverySequenceAtItsOwnPosition) {
  SeededRandom rng;
  const int64_t B = 3, Hq = 4, Hkv = 2, S = 160, D = 64, W = 37;
  const std::vector<int32_t> positions = {40, 97, 159};
  const BlockMask mask = slidingWindowBlockMask(1, 1, S, S, {W}, kBlocks, kHost);
  Tensor q = randomTensor(rng, DType::BF16, {B, Hq, 1, D}, kHost);
  Tensor k = randomTensor(rng, DType::BF16, {B, Hkv, S, D}, kHost), v = randomTensor(rng, DType::BF16, {B, Hkv, S, D}, kHost);
  // The reference, sequence by sequence, at each one's own position.
  ReferenceResult ref;
  for (int64_t b = 0; b < B; ++b) {
    auto one = [&](const Tensor& t) {
      return Tensor::viewOf(t, b * t.strides()[0], {1, t.size(1), t.size(2), t.size(3)}, t.strides());
    };
    ReferenceResult r = referenceAttention(one(q), one(k), one(v), nullptr, refWindow({W}), 0.125, positions[size_t(b)]);
    ref.out.insert(ref.out.end(), r.out.begin(), r.out.end());
    ref.lse.insert(ref.lse.end(), r.lse.begin(), r.lse.end());
  }
  const Tensor offsets = Tensor::fromHost(positions, {B}, kHost);
  for (int64_t splits : {0, 1, 3}) {
    SCOPED_TRACE("splits " + std::to_string(splits));
    FlexAttentionOptions o = decodeWithSplits(splits);
    o.query_offsets = offsets;
    Tensor out = Tensor::empty(DType::BF16, q.shape(), kHost), lse = Tensor::empty(DType::F32, {B, Hq, 1}, kHost);
    poison(out);
    poison(lse);
    flex_attention_into(q, k, v, noop_score(), mask, out, &lse, o);
    if (!compareWithReference(out, lse, ref, D, DType::BF16)) return;
  }
  // A position outside the mask, and both kinds of offset at once, are errors.
  FlexAttentionOptions bad{.query_offsets = Tensor::fromHost(std::vector<int32_t>{40, 97, 160}, {B}, kHost)};
  expectError([&] { flex_attention(q, k, v, noop_score(), mask, bad); },
              {"sequence 2's queries [160, 161)", "outside the BlockMask's queries [0, 160)"});
  bad.query_offsets = offsets;
  bad.query_offset = 3;
  expectError([&] { flex_attention(q, k, v, noop_score(), mask, bad); }, {"not both"});
  FlexAttentionOptions wrongShape{.query_offsets = Tensor::fromHost(std::vector<int32_t>{1, 2}, {2}, kHost)};
  expectError([&] { flex_attention(q, k, v, noop_score(), mask, wrongShape); }, {"query_offsets"});
}

// Programmatic dependent launch (the decode's default; FLEXTILE_PROGRAMMATIC_LAUNCH=0 turns it
// off): the decode kernel waits for its prior grids before its first global load and releases the
// next grid after its walk; with the switch off neither appears. The results stay those of the
// reference (the interpreter runs the ops as nothing: one launch at a time).
TEST(FlexDecode, ProgrammaticLaunchWaitsBeforeTheFirstGlobalLoad) {
  const codegen::Target target = codegen::Target::sm90a();
  const int64_t B = 2, Hq = 8, Hkv = 2, S = 1000, D = 128;
  Tensor q = Tensor::zeros(DType::BF16, {B, Hq, 1, D}, kHost), kv = Tensor::zeros(DType::BF16, {B, Hkv, S, D}, kHost);
  const FlexAttentionOptions o{.kernel = AttentionTemplate::Decode};
  {
    ScopedSetenv off("FLEXTILE_PROGRAMMATIC_LAUNCH", "0");
    FlexDecodePlan plain = plan_flex_decode(q, kv, kv, noop_score(), std::nullopt, o, target);
    EXPECT_EQ(plain.compiled[0]->ptx.find("griddepcontrol"), std::string::npos);
  }
  ScopedSetenv byDefault("FLEXTILE_PROGRAMMATIC_LAUNCH", nullptr);
  FlexDecodePlan plan = plan_flex_decode(q, kv, kv, noop_score(), std::nullopt, o, target);
  const std::string& ptx = plan.compiled[0]->ptx;
  const size_t wait = ptx.find("griddepcontrol.wait;"), release = ptx.find("griddepcontrol.launch_dependents;");
  ASSERT_NE(wait, std::string::npos);
  ASSERT_NE(release, std::string::npos);
  EXPECT_LT(wait, ptx.find("ld.global")) << "the wait comes before every global load";
  EXPECT_LT(wait, release);
  if (codegen::findPtxas()) {
    EXPECT_NO_THROW(codegen::runPtxas(ptx, target));
  }
  SeededRandom rng;
  AttentionCase c{.B = 2, .Hq = 8, .Hkv = 2, .L = 1, .S = 300, .D = 64, .dtype = DType::BF16,
                  .context = "programmatic launch"};
  EXPECT_TRUE(checkDecodeVariant(rng, variant("sliding_window"), c, kHost));
}

// The merge through thread block clusters (opt-in, FLEXTILE_DECODE_CLUSTER_MERGE=1): 2 to 8 splits
// are one cluster a group, exchanging partials through distributed shared memory (the interpreter
// runs a cluster's programs at once); more, in multiples of 8, are clusters of 8 whose folds take
// tickets; other counts keep the fused merge. Against the reference, call after call with the
// split count moving across 8 (so the merges share the scratch and counters), fully masked rows,
// GQA and L > 1; for sm_90a the kernel declares its cluster, one cluster takes no ticket, and it
// assembles; sm_80 keeps tickets.
TEST(FlexDecode, ClusterMergeMatchesTheReference) {
  ScopedSetenv cluster("FLEXTILE_DECODE_CLUSTER_MERGE", "1");
  SeededRandom rng;
  const std::vector<FusedMergeCase> cases = {
      {.B = 2, .Hq = 8, .Hkv = 2, .L = 3, .S = 300, .D = 64, .blindOddQueries = true, .splits = {2, 8, 16, 6, 3}},
      {.B = 3, .Hq = 4, .Hkv = 1, .L = 1, .S = 257, .D = 32, .dtype = DType::F16, .window = 90, .splits = {5, 9, 7}},
  };
  for (const FusedMergeCase& c : cases)
    if (!checkFusedMergeCalls(rng, c, kHost)) return;
  AttentionCase c{.B = 1, .Hq = 8, .Hkv = 2, .L = 2, .S = 200, .D = 64, .dtype = DType::BF16, .context = "cluster merge"};
  for (const char* name : {"sliding_window", "document", "alibi"})
    if (!checkDecodeVariant(rng, variant(name), c, kHost, {.splits = {4, 8}})) return;

  const int64_t B = 2, Hq = 8, Hkv = 2, S = 1000, D = 128;
  Tensor q = Tensor::zeros(DType::BF16, {B, Hq, 1, D}, kHost), kv = Tensor::zeros(DType::BF16, {B, Hkv, S, D}, kHost);
  for (int64_t splits : {6, 9, 16}) {
    const FlexAttentionOptions o{.kernel = AttentionTemplate::Decode, .decode_config = FlexDecodeConfig{.splits = splits}};
    FlexDecodePlan plan = plan_flex_decode(q, kv, kv, noop_score(), std::nullopt, o, codegen::Target::sm90a());
    const std::string& ptx = plan.compiled[0]->ptx;
    SCOPED_TRACE("splits " + std::to_string(splits));
    EXPECT_EQ(ptx.find(".reqnctapercluster 6, 1, 1") != std::string::npos, splits == 6);
    EXPECT_EQ(ptx.find(".reqnctapercluster 8, 1, 1") != std::string::npos, splits == 16) << "clusters of 8";
    EXPECT_EQ(plan.clusterSize, splits == 6 ? 6 : splits == 16 ? 8 : 0);
    EXPECT_EQ(ptx.find("barrier.cluster.wait") != std::string::npos, splits != 9) << "9 is no multiple of 8";
    EXPECT_EQ(ptx.find("atom.") == std::string::npos, splits == 6) << "one cluster a group takes no ticket";
    if (codegen::findPtxas()) {
      EXPECT_NO_THROW(codegen::runPtxas(ptx, codegen::Target::sm90a()));
    }
    FlexDecodePlan sm80 = plan_flex_decode(q, kv, kv, noop_score(), std::nullopt, o, codegen::Target::fromName("sm_80").value());
    EXPECT_EQ(sm80.compiled[0]->ptx.find("barrier.cluster"), std::string::npos) << "sm_80 has no clusters";
  }
}

// The cluster merge as a config choice: `cluster_merge` On asks for it without the environment,
// Off refuses it, FLEXTILE_DECODE_CLUSTER_MERGE overrides both; the config's text form (flextile
// compile --kernel decode --config) parses and prints it, and names what is wrong.
TEST(FlexDecode, ClusterMergeIsAConfigChoice) {
  const int64_t B = 2, Hq = 8, Hkv = 2, S = 1000, D = 128;
  Tensor q = Tensor::zeros(DType::BF16, {B, Hq, 1, D}, kHost), kv = Tensor::zeros(DType::BF16, {B, Hkv, S, D}, kHost);
  auto clustered = [&](LoopSchedule choice) {
    const FlexAttentionOptions o{.kernel = AttentionTemplate::Decode,
                                 .decode_config = FlexDecodeConfig{.splits = 6, .cluster_merge = choice}};
    FlexDecodePlan plan = plan_flex_decode(q, kv, kv, noop_score(), std::nullopt, o, codegen::Target::sm90a());
    const bool declared = plan.compiled[0]->ptx.find(".reqnctapercluster 6, 1, 1") != std::string::npos;
    EXPECT_EQ(plan.clusterSize, declared ? 6 : 0);
    return declared;
  };
  EXPECT_FALSE(clustered(LoopSchedule::Auto));
  EXPECT_TRUE(clustered(LoopSchedule::On));
  EXPECT_FALSE(clustered(LoopSchedule::Off));
  {
    ScopedSetenv off("FLEXTILE_DECODE_CLUSTER_MERGE", "0");
    EXPECT_FALSE(clustered(LoopSchedule::On)) << "the environment overrides the config";
  }
  {
    ScopedSetenv on("FLEXTILE_DECODE_CLUSTER_MERGE", "1");
    EXPECT_TRUE(clustered(LoopSchedule::Off));
  }
  const FlexDecodeConfig c = FlexDecodeConfig::parse("64,4,2,6,cluster");
  EXPECT_EQ(c, (FlexDecodeConfig{.block_n = 64, .num_warps = 4, .num_stages = 2, .splits = 6,
                                 .cluster_merge = LoopSchedule::On}));
  EXPECT_EQ(c.describe(), "BN64 w4 s2 splits 6 cluster");
  EXPECT_EQ(FlexDecodeConfig::parse("32,4,3,no-cluster").describe(), "BN32 w4 s3 splits auto no-cluster");
  EXPECT_EQ(FlexDecodeConfig::parse("32,4,3"), (FlexDecodeConfig{.block_n = 32, .num_warps = 4, .num_stages = 3}));
  for (const char* bad : {"64,4", "64,4,2,6,7", "64,4,2,cluster,6", "64,x,2", "64,4,2,-1", "64,4,2,6,clusters",
                          "64,4,2,per-sm=0", "64,4,2,per-sm=9", "64,4,2,per-sm=", "64,4,2,per-sm=1,per-sm=2"})
    expectError([&] { FlexDecodeConfig::parse(bad); }, {"decode config '" + std::string(bad) + "'", "BN,W,S"});
  // The aim at programs an SM, and the text form every config prints back to (the tune cache's).
  const FlexDecodeConfig aimed = FlexDecodeConfig::parse("32,4,3,0,per-sm=1,no-ws");
  EXPECT_EQ(aimed, (FlexDecodeConfig{.block_n = 32, .num_warps = 4, .num_stages = 3, .programs_per_sm = 1,
                                     .warp_specialize = WarpSpecialization::Off}));
  EXPECT_EQ(aimed.describe(), "BN32 w4 s3 splits auto per-sm 1 no-ws");
  for (const FlexDecodeConfig& x : {c, aimed, FlexDecodeConfig{}, FlexDecodeConfig::parse("128,8,2,12,per-sm=3,cluster,ws")})
    EXPECT_EQ(FlexDecodeConfig::parse(x.text()), x) << x.text();
}

// The producer warpgroup as a config choice: `warp_specialize` On gives the sm_90a decode TMA
// copies of the full walk, a launch of 8 warps and setmaxnreg, at the residency counted with the
// producer's 24 registers (three programs a SM at the default ring, as without), and ptxas spills
// nothing at a length the blocks divide (the consumers' 136 registers; the masks' partial walks,
// on copies, spill 4-32 bytes, offline ptxas 2026-12-05); Auto and Off give the copies, and so does sm_80 with On (a paged K/V: TilePassesInterpreted.DecodeWarpSpecialized);
// FLEXTILE_DECODE_WARP_SPECIALIZE overrides the config, the cluster merge wins over it, and with
// programmatic launch both roles wait for the previous grid; the text form parses and prints it.
TEST(FlexDecode, WarpSpecializationIsAConfigChoice) {
  const int64_t B = 2, Hq = 32, Hkv = 8, S = 4096;
  auto ptxOf = [&](WarpSpecialization choice, int64_t D, const codegen::Target& target) {
    Tensor q = Tensor::zeros(DType::BF16, {B, Hq, 1, D}, kHost), kv = Tensor::zeros(DType::BF16, {B, Hkv, S, D}, kHost);
    const FlexAttentionOptions o{.kernel = AttentionTemplate::Decode,
                                 .decode_config = FlexDecodeConfig{.num_stages = 2, .splits = 6, .warp_specialize = choice}};
    FlexDecodePlan plan = plan_flex_decode(q, kv, kv, noop_score(), std::nullopt, o, target);
    return plan.compiled[0]->ptx;
  };
  auto specialized = [](const std::string& ptx) {
    const bool tma = ptx.find("cp.async.bulk.tensor") != std::string::npos;
    EXPECT_EQ(tma, ptx.find("setmaxnreg.dec.sync.aligned.u32 24") != std::string::npos);
    EXPECT_EQ(tma, ptx.find(".maxntid 256") != std::string::npos);
    return tma;
  };
  const codegen::Target sm90a = codegen::Target::sm90a();
  for (int64_t D : {64, 128}) {
    SCOPED_TRACE("D=" + std::to_string(D));
    EXPECT_FALSE(specialized(ptxOf(WarpSpecialization::Auto, D, sm90a)));
    EXPECT_FALSE(specialized(ptxOf(WarpSpecialization::Off, D, sm90a)));
    const std::string ws = ptxOf(WarpSpecialization::On, D, sm90a);
    EXPECT_TRUE(specialized(ws));
    EXPECT_NE(ws.find(".minnctapersm 3"), std::string::npos);
    if (codegen::findPtxas()) {
      const codegen::PtxasReport report = codegen::runPtxas(ws, sm90a);
      EXPECT_EQ(report.spillStoreBytes, 0);
    }
  }
  EXPECT_FALSE(specialized(ptxOf(WarpSpecialization::On, 128, codegen::Target::fromName("sm_80").value())));
  {
    ScopedSetenv off("FLEXTILE_DECODE_WARP_SPECIALIZE", "0");
    EXPECT_FALSE(specialized(ptxOf(WarpSpecialization::On, 128, sm90a))) << "the environment overrides the config";
  }
  {
    ScopedSetenv on("FLEXTILE_DECODE_WARP_SPECIALIZE", "1");
    EXPECT_TRUE(specialized(ptxOf(WarpSpecialization::Off, 128, sm90a)));
    {
      // With programmatic launch the producer waits for the previous grid too (its copies read
      // what that grid may have written), each role before its first global access.
      ScopedSetenv programmatic("FLEXTILE_PROGRAMMATIC_LAUNCH", "1");
      const std::string ptx = ptxOf(WarpSpecialization::On, 128, sm90a);
      size_t waits = 0;
      for (size_t at = ptx.find("griddepcontrol.wait"); at != std::string::npos; at = ptx.find("griddepcontrol.wait", at + 1))
        ++waits;
      EXPECT_EQ(waits, 2u) << "one wait a role";
      EXPECT_LT(ptx.find("griddepcontrol.wait", ptx.find("setmaxnreg.dec")), ptx.find("cp.async.bulk.tensor", ptx.find("setmaxnreg.dec")))
          << "the producer waits before its first copy";
    }
    ScopedSetenv cluster("FLEXTILE_DECODE_CLUSTER_MERGE", "1");
    EXPECT_FALSE(specialized(ptxOf(WarpSpecialization::On, 128, sm90a))) << "the cluster merge asked for wins";
  }
  const FlexDecodeConfig c = FlexDecodeConfig::parse("64,4,2,6,cluster,ws");
  EXPECT_EQ(c, (FlexDecodeConfig{.block_n = 64, .num_warps = 4, .num_stages = 2, .splits = 6,
                                 .cluster_merge = LoopSchedule::On, .warp_specialize = WarpSpecialization::On}));
  EXPECT_EQ(c.describe(), "BN64 w4 s2 splits 6 cluster ws");
  EXPECT_EQ(FlexDecodeConfig::parse("64,4,2,no-ws,no-cluster").describe(), "BN64 w4 s2 splits auto no-cluster no-ws");
  for (const char* bad : {"64,4,2,ws,ws", "64,4,2,ws,6", "64,4,2,producer"})
    expectError([&] { FlexDecodeConfig::parse(bad); }, {"decode config '" + std::string(bad) + "'", ",ws or ,no-ws"});
}
