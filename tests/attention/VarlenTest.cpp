// Packed variable-length sequences (attention_templates/Varlen.h) through the interpreter: the
// BlockMasks against the element-wise definition and against the generic builder, the forward
// (prefill and decode templates) against each sequence run alone and against the packed float64
// reference, the backward with a trainable capture read per sequence, new lengths without a
// retrace, and the errors. rowIntervalBlockMask on its own, with rows in no order.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <numeric>

#include "FlexAttentionBackwardCheck.h"
#include "MaskTestUtil.h"
#include "VarlenCheck.h"
#include "gpu/GpuTest.h"
#include "attention_templates/FlexAttentionCommon.h"
#include "attention_templates/Varlen.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::testing;
using dsl::CapturedTensor;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;
using dsl::Tile;

namespace {

constexpr MemorySpace kHost = MemorySpace::Host;
constexpr BlockSizes kBlocks{32, 32};
const FlexAttentionConfig kFwdSmall{32, 16, 4, 2};
const FlexAttentionBackwardConfig kBwdSmall{{16, 32, 4, 2}, {32, 16, 4, 2}};

// Sequence lengths of random sizes: empty ones, single tokens, some past a block, some not.
std::vector<int64_t> randomLengths(std::mt19937_64& rng, int count, int64_t longest) {
  std::vector<int64_t> lengths;
  std::uniform_int_distribution<int64_t> len(0, longest);
  std::uniform_int_distribution<int> kind(0, 5);
  for (int s = 0; s < count; ++s) {
    const int k = kind(rng);
    lengths.push_back(k == 0 ? 0 : k == 1 ? 1 : len(rng));
  }
  if (std::accumulate(lengths.begin(), lengths.end(), int64_t(0)) == 0) lengths.back() = 1 + len(rng);
  return lengths;
}

// A mod of one sequence, as the library gets it and as the reference evaluates it.
struct InnerMask {
  std::string name;
  MaskMod mod;
  RefMask ref;  // (sequence, h, q position, kv position)
  PackedSequences::SequenceRowKeys keys = nullptr;  // its row's keys as one interval
};
struct InnerScore {
  std::string name;
  ScoreMod mod;
  RefScoreFn ref;
};

// Inner masks: the two the structural builder knows, a window, a prefix, and one that reads a
// captured tensor by sequence (a window of each sequence's own).
std::vector<InnerMask> innerMasks(std::mt19937_64& rng, int64_t sequences) {
  std::vector<int32_t> windows(static_cast<size_t>(sequences));
  for (int32_t& w : windows) w = int32_t(1 + rng() % 40);
  CapturedTensor perSequence = dsl::capture(Tensor::fromHost(windows, {sequences}, kHost), "window_of_sequence");
  MaskMod ownWindow("own_window", [perSequence](const Tile& b, const Tile&, const Tile& q, const Tile& kv) {
    return (kv <= q) & (q - kv < perSequence(b));
  });
  auto upTo = [](int64_t window) {  // the keys of a window ending at the query
    return [window](int64_t, int64_t, int64_t pos, int64_t) { return std::pair{pos - window + 1, pos}; };
  };
  return {
      {"all pairs", noop_mask(), [](int64_t, int64_t, int64_t, int64_t) { return true; },
       [](int64_t, int64_t, int64_t, int64_t keys) { return std::pair{int64_t(0), keys - 1}; }},
      {"causal", causal_mask(), [](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q; }, upTo(INT32_MAX)},
      {"window 19", sliding_window_mask(19),
       [](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q && q - kv < 19; }, upTo(19)},
      {"prefix 7", prefix_lm_mask(7), [](int64_t, int64_t, int64_t q, int64_t kv) { return kv < 7 || kv <= q; },
       [](int64_t, int64_t, int64_t pos, int64_t) { return std::pair{int64_t(0), std::max<int64_t>(6, pos)}; }},
      {"a window per sequence", ownWindow,
       [windows](int64_t s, int64_t, int64_t q, int64_t kv) { return kv <= q && q - kv < windows[size_t(s)]; },
       [windows](int64_t s, int64_t, int64_t pos, int64_t) {
         return std::pair{pos - windows[size_t(s)] + 1, pos};
       }},
  };
}

}  // namespace

// Every inner mask, both query placements, random lengths with empty sequences: the lists are exact
// against the packed definition, and the structural ones (the standard two, and every inner mask
// from its row intervals) equal the generic builder's.
TEST(Varlen, BlockMasksAreExactForEveryInnerMask) {
  SeededRandom rng;
  for (QueryPositions positions : {QueryPositions::FromStart, QueryPositions::AtEnd})
    for (int round = 0; round < 3; ++round) {
      const std::vector<int64_t> qLens = randomLengths(rng, 5, 70);
      const std::vector<int64_t> kLens = round == 0 ? qLens : randomLengths(rng, 5, 90);
      if (std::accumulate(kLens.begin(), kLens.end(), int64_t(0)) == 0) continue;
      PackedSequences seqs = PackedSequences::fromLengths(qLens, kLens, {.queryPositions = positions, .space = kHost});
      const PackedLayout layout(qLens, kLens, positions);
      for (const InnerMask& inner : innerMasks(rng, seqs.count())) {
        const std::string context = inner.name + (positions == QueryPositions::AtEnd ? ", at end" : ", from start") +
                                    ", round " + std::to_string(round);
        BlockMask m = seqs.blockMask(inner.mod, 1, kBlocks);
        if (!expectExact(m, packedMask(layout, inner.ref), context)) return;
        BlockMask generic = createBlockMask(seqs.mask(inner.mod), 1, 1, seqs.totalQueries(), seqs.totalKeys(), kBlocks,
                                            kHost);
        if (!expectSameLists(m, generic, context)) return;
        if (!expectSameLists(seqs.blockMask(inner.mod, inner.keys, 1, kBlocks), generic, context + ", intervals"))
          return;
      }
    }
}

// rowIntervalBlockMask with intervals in no order (they jump back, rows without keys sit anywhere,
// some reach past the keys): exact, and equal to the generic builder of a mod reading the intervals.
TEST(Varlen, RowIntervalBlockMaskTakesRowsInAnyOrder) {
  SeededRandom rng;
  for (auto [qLen, kvLen, BQ, BKV] :
       {std::tuple{100, 150, 32, 16}, std::tuple{33, 7, 16, 32}, std::tuple{128, 128, 64, 64}}) {
    std::vector<int32_t> lo(static_cast<size_t>(qLen)), hi(static_cast<size_t>(qLen));
    for (int64_t i = 0; i < qLen; ++i) {
      lo[size_t(i)] = int32_t(rng() % (kvLen + 10)) - 5;
      hi[size_t(i)] = rng() % 4 == 0 ? lo[size_t(i)] - 1 : lo[size_t(i)] + int32_t(rng() % (kvLen + 10));
    }
    CapturedTensor loT = dsl::capture(Tensor::fromHost(lo, {qLen}, kHost), "lo");
    CapturedTensor hiT = dsl::capture(Tensor::fromHost(hi, {qLen}, kHost), "hi");
    MaskMod intervals("intervals", [loT, hiT](const Tile&, const Tile&, const Tile& q, const Tile& kv) {
      return (kv >= loT(q)) & (kv <= hiT(q));
    });
    const std::string context = "qLen " + std::to_string(qLen) + " kvLen " + std::to_string(kvLen);
    BlockMask m = rowIntervalBlockMask(
        intervals, 1, 2, qLen, kvLen,
        [&](int64_t, int64_t, int64_t i) { return std::pair<int64_t, int64_t>{lo[size_t(i)], hi[size_t(i)]}; },
        {BQ, BKV}, kHost);
    auto inInterval = [&](int64_t, int64_t, int64_t q, int64_t kv) {
      return kv >= lo[size_t(q)] && kv <= hi[size_t(q)];
    };
    if (!expectExact(m, inInterval, context))
      return;
    if (!expectSameLists(m, createBlockMask(intervals, 1, 2, qLen, kvLen, {BQ, BKV}, kHost), context)) return;
  }
}

// The packed forward equals each sequence run alone with the inner mods at its own positions (each
// sequence's rows of q, k and v copied into tensors of their own), GQA, a score_mod reading positions.
TEST(Varlen, ForwardEqualsEachSequenceAlone) {
  SeededRandom rng;
  const int64_t Hq = 4, Hkv = 2, D = 32;
  const std::vector<int64_t> lengths = {45, 0, 1, 70, 33};
  PackedSequences seqs = PackedSequences::fromLengths(lengths, {}, {.space = kHost});
  const int64_t total = seqs.totalQueries();
  Tensor slopes = Tensor::fromHost(std::vector<float>{0.5f, 0.25f, 0.125f, 0.0625f}, {Hq}, kHost);
  ScoreMod inner = alibi(dsl::capture(slopes, "slopes"));
  Tensor q = randomTensor(rng, DType::F32, {1, Hq, total, D}, kHost);
  Tensor k = randomTensor(rng, DType::F32, {1, Hkv, total, D}, kHost);
  Tensor v = randomTensor(rng, DType::F32, {1, Hkv, total, D}, kHost);
  FlexAttentionOptions options{.return_lse = true, .config = kFwdSmall};
  FlexAttentionResult packed =
      flex_attention(q, k, v, seqs.score(inner), seqs.blockMask(causal_mask(), 1, kBlocks), options);
  const std::vector<float> out = packed.out.toHost<float>(), lse = packed.lse.toHost<float>();

  auto rowsOf = [](const Tensor& t, int64_t start, int64_t n) {  // rows [start, start + n) of [1, H, total, D]
    const int64_t H = t.size(1), T = t.size(2), d = t.size(3);
    const std::vector<float> all = t.toHost<float>();
    std::vector<float> part;
    for (int64_t h = 0; h < H; ++h)
      part.insert(part.end(), all.begin() + (h * T + start) * d, all.begin() + (h * T + start + n) * d);
    return Tensor::fromHost(part, {1, H, n, d}, kHost);
  };
  for (int64_t s = 0; s < seqs.count(); ++s) {
    const int64_t start = seqs.queryStarts()[size_t(s)], n = lengths[size_t(s)];
    if (n == 0) continue;
    FlexAttentionResult alone =
        flex_attention(rowsOf(q, start, n), rowsOf(k, start, n), rowsOf(v, start, n), inner,
                       causalBlockMask(1, 1, n, n, kBlocks, kHost), options);
    const std::vector<float> o = alone.out.toHost<float>(), l = alone.lse.toHost<float>();
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(l[size_t(h * n + i)], lse[size_t(h * total + start + i)], 1e-4)
            << "sequence " << s << " h " << h << " row " << i;
        for (int64_t d = 0; d < D; ++d)
          ASSERT_NEAR(o[size_t((h * n + i) * D + d)], out[size_t(((h * total) + start + i) * D + d)], 1e-4)
              << "sequence " << s << " h " << h << " row " << i << " dim " << d;
      }
  }
}

// Every inner mask with a position-reading score_mod against the packed float64 reference: both
// placements (queries of a sequence fewer or more than its keys), GQA 4:1, the three dtypes.
TEST(Varlen, ForwardMatchesTheReference) {
  SeededRandom rng;
  const DType dtypes[] = {DType::BF16, DType::F16, DType::F32};
  int n = 0;
  for (QueryPositions positions : {QueryPositions::FromStart, QueryPositions::AtEnd}) {
    const std::vector<int64_t> qLens = randomLengths(rng, 4, 60), kLens = randomLengths(rng, 4, 80);
    if (std::accumulate(kLens.begin(), kLens.end(), int64_t(0)) == 0) continue;
    PackedSequences seqs = PackedSequences::fromLengths(qLens, kLens, {.queryPositions = positions, .space = kHost});
    const PackedLayout layout(qLens, kLens, positions);
    const double slope = 0.1;
    InnerScore distance{"distance", ScoreMod("distance", [slope](const Tile& s, const Tile&, const Tile&, const Tile& q,
                                                                  const Tile& kv) {
                          return s - slope * (q - kv).to(s.dtype());
                        }),
                        [slope](double s, int64_t, int64_t, int64_t q, int64_t kv) {
                          return s - slope * double(q - kv);
                        }};
    for (const InnerMask& inner : innerMasks(rng, seqs.count())) {
      AttentionCase c{.B = 1, .Hq = 4, .Hkv = 1, .L = seqs.totalQueries(), .S = seqs.totalKeys(), .D = 32,
                      .dtype = dtypes[n++ % 3]};
      c.context = inner.name + (positions == QueryPositions::AtEnd ? ", at end" : ", from start");
      if (!checkFlexAttention(rng, c, kHost, seqs.score(distance.mod), seqs.blockMask(inner.mod, 1, kBlocks),
                              packedScore(layout, distance.ref), packedMask(layout, inner.ref),
                              {.return_lse = true, .config = kFwdSmall}))
        return;
    }
  }
}

// A decode step of a ragged batch: one or a few new queries per sequence at the end of its keys,
// packed (so flex_attention takes the decode template, L <= 16), with splits.
TEST(Varlen, DecodeOfPackedQueries) {
  SeededRandom rng;
  for (auto [qLens, kLens] : {std::pair<std::vector<int64_t>, std::vector<int64_t>>{{1, 1, 1, 1}, {300, 1, 0, 129}},
                              {{2, 0, 3}, {100, 60, 257}}}) {
    PackedSequences seqs =
        PackedSequences::fromLengths(qLens, kLens, {.queryPositions = QueryPositions::AtEnd, .space = kHost});
    const PackedLayout layout(qLens, kLens, QueryPositions::AtEnd);
    for (const InnerMask& inner : innerMasks(rng, seqs.count())) {
      AttentionCase c{.B = 1, .Hq = 8, .Hkv = 2, .L = seqs.totalQueries(), .S = seqs.totalKeys(), .D = 64,
                      .dtype = DType::BF16, .context = "decode, " + inner.name};
      for (int splits : {1, 3}) {
        FlexAttentionOptions o{.return_lse = true, .decode_config = FlexDecodeConfig{.splits = splits}};
        if (!checkFlexAttention(rng, c, kHost, noop_score(), seqs.blockMask(inner.mod, 1, {128, 128}), nullptr,
                                packedMask(layout, inner.ref), o))
          return;
      }
    }
  }
}

// The backward: dQ, dK, dV against float64, and the gradient of a trainable slope read by sequence
// and head (the sequence a [BM, 1] tile: its gradient scatters by row) times the key's position in
// its sequence. (A bias constant along a row would have gradient 0: the softmax ignores it.)
TEST(Varlen, BackwardWithATrainableSlopePerSequence) {
  SeededRandom rng;
  for (QueryPositions positions : {QueryPositions::FromStart, QueryPositions::AtEnd}) {
    const std::vector<int64_t> qLens = {20, 0, 37, 1, 50}, kLens = {30, 9, 37, 0, 41};
    PackedSequences seqs = PackedSequences::fromLengths(qLens, kLens, {.queryPositions = positions, .space = kHost});
    const PackedLayout layout(qLens, kLens, positions);
    const int64_t S = seqs.count(), Hq = 2;
    std::vector<float> slope(static_cast<size_t>(S * Hq));
    for (float& x : slope) x = float(int(rng() % 200) - 100) / 2000.0f;
    CapturedTensor slopeT = dsl::capture(Tensor::fromHost(slope, {S, Hq}, kHost), "slope", {.requires_grad = true});
    ScoreMod inner("slope_per_sequence",
                   [slopeT](const Tile& s, const Tile& b, const Tile& h, const Tile&, const Tile& kv) {
                     return s + slopeT(b, h).to(s.dtype()) * kv.to(s.dtype());
                   });
    for (const InnerMask& mask : innerMasks(rng, S)) {
      AttentionCase c{.B = 1, .Hq = Hq, .Hkv = 1, .L = seqs.totalQueries(), .S = seqs.totalKeys(), .D = 32,
                      .dtype = DType::F32,
                      .context = mask.name + (positions == QueryPositions::AtEnd ? ", at end" : "")};
      std::vector<std::vector<double>> expected{std::vector<double>(slope.size(), 0.0)};
      BackwardCheck check;
      check.refMask = packedMask(layout, mask.ref);
      check.refScore = packedScore(layout, [&](double s, int64_t seq, int64_t h, int64_t, int64_t kv) {
        return s + slope[size_t(seq * Hq + h)] * double(kv);
      });
      check.refScoreGrad = [](double, int64_t, int64_t, int64_t, int64_t) { return 1.0; };
      check.sink = [&](double g, double, int64_t, int64_t h, int64_t q, int64_t kv) {
        const int64_t seq = layout.sequence(q);
        expected[0][size_t(seq * Hq + h)] += g * double(kv - layout.kStarts[size_t(seq)]);
      };
      check.expectedCaptureGrads = &expected;
      check.forwardConfig = kFwdSmall;
      check.options.config = kBwdSmall;
      if (!checkBackward(rng, c, kHost, seqs.score(inner), seqs.blockMask(mask.mod, 1, kBlocks), check)) return;
    }
  }
}

// New lengths rebind the tables: the same mods, their kernels found again (not retraced), and the
// results those of the new lengths.
TEST(Varlen, NewLengthsKeepTheKernels) {
  SeededRandom rng;
  PackedSequences seqs = PackedSequences::fromLengths({40, 25}, {}, {.space = kHost});
  const MaskMod mask = seqs.mask(causal_mask());
  EXPECT_EQ(&mask.state(), &seqs.mask(causal_mask()).state()) << "the same inner mod gives the same wrapper";
  const InnerMask causal{"causal", causal_mask(), [](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q; }};
  const dsl::Kernel* first = nullptr;
  for (const std::vector<int64_t>& lengths : {std::vector<int64_t>{40, 25}, {3, 90, 0, 17}, {64}}) {
    seqs.assignLengths(lengths);
    const PackedLayout layout(lengths, {}, QueryPositions::FromStart);
    AttentionCase c{.B = 1, .Hq = 2, .Hkv = 2, .L = seqs.totalQueries(), .S = seqs.totalKeys(), .D = 32,
                    .dtype = DType::BF16, .context = "lengths of " + std::to_string(lengths.size())};
    ASSERT_TRUE(checkFlexAttention(rng, c, kHost, noop_score(), seqs.blockMask(causal_mask(), 1, kBlocks), nullptr,
                                   packedMask(layout, causal.ref), {.config = kFwdSmall}));
    const dsl::Kernel* kernel = forwardKernel(seqs.mask(causal_mask()), noop_score(), DType::BF16);
    ASSERT_NE(kernel, nullptr);
    if (first) {
      EXPECT_EQ(kernel, first) << "new lengths retraced the forward";
    }
    first = kernel;
  }
}

// The wrappers read per query row only, so the forward keeps the schedules a per-key gather turns
// off: the producer warpgroup and, with a score_mod, the warpgroups' turns. The library's own
// lookups agree with the lengths.
TEST(Varlen, ModsReadNothingPerKey) {
  PackedSequences seqs = PackedSequences::fromLengths({5, 0, 9}, {7, 3, 9}, {.queryPositions = QueryPositions::AtEnd,
                                                                             .space = kHost});
  const ScoreMod score = seqs.score(alibi(dsl::capture(Tensor::fromHost(std::vector<float>{0.5f}, {1}, kHost), "s")));
  for (const MaskMod& inner : {noop_mask(), causal_mask(), sliding_window_mask(4)}) {
    const MaskMod m = seqs.mask(inner);
    EXPECT_FALSE(m.gathersAlongKeys()) << inner.name();
    EXPECT_FALSE(m.gathersPerElement()) << inner.name();
    const BlockMask mask = seqs.blockMask(inner, 1, kBlocks);
    EXPECT_TRUE(attention::detail::warpSpecializeWanted(score, mask)) << inner.name();
    EXPECT_TRUE(attention::detail::pingpongWanted(score, mask)) << inner.name();
  }
  EXPECT_FALSE(score.gathersAlongKeys());
  const PackedLayout layout({5, 0, 9}, {7, 3, 9}, QueryPositions::AtEnd);
  for (int64_t q = 0; q < seqs.totalQueries(); ++q) {
    EXPECT_EQ(seqs.sequenceOfQuery(q), layout.sequence(q)) << q;
    EXPECT_EQ(seqs.queryPosition(q), layout.position(q)) << q;
  }
}

// cu_seqlens as another framework's tensors (i32 or i64): the same sequences as from vectors.
TEST(Varlen, StartsFromTensors) {
  const std::vector<int64_t> q = {0, 3, 3, 10}, k = {0, 4, 9, 12};
  const Tensor q32 = Tensor::fromHost(std::vector<int32_t>(q.begin(), q.end()), {4}, kHost);
  const Tensor k64 = Tensor::fromHost(k, {4}, kHost);
  for (const PackedSequences& seqs : {PackedSequences::fromStarts(q32, k64, {.space = kHost}),
                                      PackedSequences::fromStarts(q32, Tensor(), {.space = kHost})}) {
    EXPECT_EQ(seqs.queryStarts(), q);
    EXPECT_EQ(seqs.count(), 3);
  }
  EXPECT_EQ(PackedSequences::fromStarts(q32, k64, {.space = kHost}).keyStarts(), k);
  expectError([&] { (void)PackedSequences::fromStarts(Tensor::fromHost(std::vector<float>{0, 1}, {2}, kHost)); },
              {"i32 or i64 tensor [S + 1]", "f32"});
  expectError([&] { (void)PackedSequences::fromStarts(Tensor()); }, {"query starts tensor is empty"});
}

TEST(Varlen, BadSequencesAreNamed) {
  auto packed = [](std::vector<int64_t> q, std::vector<int64_t> k) {
    return [q, k] { (void)PackedSequences::fromLengths(q, k, {.space = kHost}); };
  };
  expectError(packed({}, {}), {"no sequences"});
  expectError(packed({3, -1}, {}), {"query length of sequence 1", "-1"});
  expectError(packed({3, 4}, {3}), {"2 query sequences but 1 key sequences"});
  expectError(packed({0, 0}, {}), {"query total", "[1, 2^31)"});
  expectError(packed({3, 4}, {0, 0}), {"key total"});
  expectError([] { (void)PackedSequences::fromStarts({0, 5, 3}, {}, {.space = kHost}); },
                    {"query starts must not decrease", "5 then 3"});
  expectError([] { (void)PackedSequences::fromStarts({1, 5}, {}, {.space = kHost}); }, {"begin at 0"});
  PackedSequences seqs = PackedSequences::fromLengths({3, 4}, {}, {.space = kHost});
  expectError([&] { (void)seqs.sequenceOfQuery(7); }, {"query 7", "[0, 7)"});
  expectError([&] { (void)seqs.mask(MaskMod()); }, {"inner mask_mod is empty"});
  // A packed mask used with inputs of other lengths is refused by the template's own check.
  Tensor q = Tensor::zeros(DType::BF16, {1, 1, 8, 16}, kHost);
  expectError([&] { (void)flex_attention(q, q, q, noop_score(), seqs.blockMask()); }, {"BlockMask", "7"});
}
