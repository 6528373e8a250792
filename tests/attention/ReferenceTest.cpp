// The float64 reference on a subset of rows (referenceAttentionRows) and the rows a sampled check
// reads (sampleQueryRows): what `flextile run --check` relies on to check a large problem in
// seconds without missing the rows where attention kernels go wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "FlexAttentionCheck.h"
#include "attention_templates/BlockMask.h"
#include "attention_templates/Reference.h"

namespace flextile::attention {
namespace {

using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

const RefMaskFn kCausal = [](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q; };

bool contains(const std::vector<QueryRow>& rows, QueryRow r) { return std::binary_search(rows.begin(), rows.end(), r); }

// Any rows, in any order, on any number of threads: the same values as the whole reference (GQA,
// a score mod that reads every index, a query offset, a strided q view).
TEST(ReferenceRows, AgreeWithTheWholeReference) {
  std::mt19937_64 rng(3);
  const int64_t B = 2, Hq = 4, Hkv = 2, L = 150, S = 170, D = 32;
  const Tensor qBig = testing::randomTensor(rng, DType::BF16, {B, Hq, L, 2 * D}, MemorySpace::Host);
  const Tensor q = Tensor::viewOf(qBig, 0, {B, Hq, L, D}, {Hq * L * 2 * D, L * 2 * D, 2 * D, 1});
  const Tensor k = testing::randomTensor(rng, DType::BF16, {B, Hkv, S, D}, MemorySpace::Host);
  const Tensor v = testing::randomTensor(rng, DType::F32, {B, Hkv, S, D}, MemorySpace::Host);
  const RefScoreFn score = [](double s, int64_t b, int64_t h, int64_t q, int64_t kv) {
    return s + 0.01 * double(b + h) - 0.002 * double(q - kv);
  };
  const int64_t offset = 20;
  const ReferenceResult whole = referenceAttention(q, k, v, score, kCausal, 0.2, offset);

  std::vector<QueryRow> rows{{1, 3, 149}, {0, 0, 0}, {1, 0, 77}, {0, 2, 5}, {0, 2, 5}, {1, 1, 64}};
  for (int i = 0; i < 200; ++i) rows.push_back({int64_t(rng() % B), int64_t(rng() % Hq), int64_t(rng() % L)});
  for (int threads : {1, 3}) {
    const ReferenceRows some = referenceAttentionRows(q, k, v, score, kCausal, 0.2, rows, offset, threads);
    ASSERT_EQ(some.out.size(), rows.size() * size_t(D));
    ASSERT_EQ(some.lse.size(), rows.size());
    int64_t pairs = 0;
    for (size_t n = 0; n < rows.size(); ++n) {
      const QueryRow& r = rows[n];
      const size_t flat = size_t((r.b * Hq + r.h) * L + r.i);
      EXPECT_NEAR(some.lse[n], whole.lse[flat], 1e-12) << r.b << " " << r.h << " " << r.i;
      for (int64_t d = 0; d < D; ++d)
        EXPECT_NEAR(some.out[n * size_t(D) + size_t(d)], whole.out[flat * size_t(D) + size_t(d)], 1e-12);
      pairs += std::min(S, r.i + offset + 1);
    }
    EXPECT_EQ(some.allowedPairs, pairs);
  }
}

// The backward at some rows and keys, from the forward's out and lse, equals the whole reference
// backward: GQA, a score mod and its gradient, a query offset, rows without keys, and attention sinks
// (only through the lse, which holds them); any order, any number of threads.
TEST(ReferenceBackwardRows, AgreeWithTheWholeReference) {
  std::mt19937_64 rng(4);
  const int64_t B = 2, Hq = 4, Hkv = 2, L = 90, S = 110, D = 16, DV = 24;
  const Tensor q = testing::randomTensor(rng, DType::BF16, {B, Hq, L, D}, MemorySpace::Host);
  const Tensor k = testing::randomTensor(rng, DType::BF16, {B, Hkv, S, D}, MemorySpace::Host);
  const Tensor v = testing::randomTensor(rng, DType::F32, {B, Hkv, S, DV}, MemorySpace::Host);
  const Tensor dout = testing::randomTensor(rng, DType::F32, {B, Hq, L, DV}, MemorySpace::Host);
  const RefScoreFn score = [](double s, int64_t, int64_t h, int64_t q, int64_t kv) {
    return 2.0 * std::tanh(s / 2.0) - 0.01 * double(h) * double(q - kv);
  };
  const RefScoreGradFn grad = [](double s, int64_t, int64_t, int64_t, int64_t) {
    const double t = std::tanh(s / 2.0);
    return 1.0 - t * t;
  };
  const RefMaskFn mask = [](int64_t, int64_t, int64_t q, int64_t kv) { return q % 7 != 2 && kv <= q; };
  const int64_t offset = 20;
  for (bool withSinks : {false, true}) {
    SCOPED_TRACE(withSinks ? "sinks" : "no sinks");
    const std::vector<double> sinks{1.0, -INFINITY, 3.0, 0.5};
    const std::vector<double>* s = withSinks ? &sinks : nullptr;
    const ReferenceResult fwd = referenceAttention(q, k, v, score, mask, 0.3, offset, s);
    std::vector<float> outValues(fwd.out.begin(), fwd.out.end()), lseValues(fwd.lse.begin(), fwd.lse.end());
    const Tensor out = Tensor::fromHost(outValues, {B, Hq, L, DV}), lse = Tensor::fromHost(lseValues, {B, Hq, L});
    const ReferenceGrads whole =
        referenceAttentionBackward(q, k, v, dout, score, grad, mask, 0.3, offset, nullptr, nullptr, &out, s);
    std::vector<QueryRow> rows{{1, 3, 89}, {0, 0, 0}, {0, 1, 2}, {1, 2, 45}};
    std::vector<KeyRow> keys{{1, 1, 109}, {0, 0, 0}, {0, 1, 57}, {1, 0, 108}, {0, 0, 70}};
    for (int i = 0; i < 40; ++i) {
      rows.push_back({int64_t(rng() % B), int64_t(rng() % Hq), int64_t(rng() % L)});
      keys.push_back({int64_t(rng() % B), int64_t(rng() % Hkv), int64_t(rng() % S)});
    }
    for (int threads : {1, 3}) {
      const ReferenceGradRows some =
          referenceAttentionBackwardRows(q, k, v, out, lse, dout, score, grad, mask, 0.3, rows, keys, offset, threads);
      for (size_t n = 0; n < rows.size(); ++n)
        for (int64_t d = 0; d < D; ++d)
          EXPECT_NEAR(some.dq[n * size_t(D) + size_t(d)],
                      whole.dq[size_t(((rows[n].b * Hq + rows[n].h) * L + rows[n].i) * D + d)], 1e-6)
              << "dq row " << n;
      for (size_t n = 0; n < keys.size(); ++n) {
        const size_t key = size_t((keys[n].b * Hkv + keys[n].h) * S + keys[n].j);
        for (int64_t d = 0; d < D; ++d)
          EXPECT_NEAR(some.dk[n * size_t(D) + size_t(d)], whole.dk[key * size_t(D) + size_t(d)], 1e-6) << "dk " << n;
        for (int64_t d = 0; d < DV; ++d)
          EXPECT_NEAR(some.dv[n * size_t(DV) + size_t(d)], whole.dv[key * size_t(DV) + size_t(d)], 1e-6) << "dv " << n;
      }
    }
  }
}

TEST(ReferenceRows, ARowOutsideQIsAnError) {
  std::mt19937_64 rng(1);
  const Tensor q = testing::randomTensor(rng, DType::F32, {1, 2, 10, 16}, MemorySpace::Host);
  const std::vector<QueryRow> rows{{0, 2, 0}};
  try {
    (void)referenceAttentionRows(q, q, q, nullptr, nullptr, 1.0, rows);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row (0, 2, 0) is outside q"), std::string::npos) << e.what();
  }
}

// A sink is one more key, of score sinks[h] and value zero: the reference with sinks equals the
// reference without them over keys extended by such a key (allowed to every row, its score the
// sink whatever q·k is), the forward's out and lse and the backward's dq, dk, dv, and dsinks as
// that key's score gradients summed per head. Rows the mask leaves without keys see the sink alone.
TEST(ReferenceSinks, AreOneMoreKeyOfValueZero) {
  std::mt19937_64 rng(5);
  const int64_t B = 2, Hq = 4, Hkv = 2, L = 40, S = 50, D = 16;
  const Tensor q = testing::randomTensor(rng, DType::F32, {B, Hq, L, D}, MemorySpace::Host);
  const Tensor k = testing::randomTensor(rng, DType::F32, {B, Hkv, S, D}, MemorySpace::Host);
  const Tensor v = testing::randomTensor(rng, DType::F32, {B, Hkv, S, D}, MemorySpace::Host);
  const Tensor dout = testing::randomTensor(rng, DType::F32, {B, Hq, L, D}, MemorySpace::Host);
  const std::vector<double> sinks{2.5, -INFINITY, -1.0, 4.0};
  const RefMaskFn mask = [](int64_t, int64_t, int64_t q, int64_t kv) { return q % 5 != 3 && kv <= q; };
  // The extended keys: k's rows and one more (any values), v's rows and a zero row.
  auto extended = [&](const Tensor& t, bool zero) {
    const std::vector<float> in = t.toHost<float>();
    std::vector<float> out;
    for (int64_t bh = 0; bh < B * Hkv; ++bh) {
      out.insert(out.end(), in.begin() + bh * S * D, in.begin() + (bh + 1) * S * D);
      for (int64_t d = 0; d < D; ++d) out.push_back(zero ? 0.0f : float(d) - 3.0f);
    }
    return Tensor::fromHost(out, {B, Hkv, S + 1, D});
  };
  const Tensor kx = extended(k, false), vx = extended(v, true);
  const RefScoreFn sinkScore = [&](double s, int64_t, int64_t h, int64_t, int64_t kv) {
    return kv == S ? sinks[size_t(h)] : s;
  };
  const RefScoreGradFn sinkScoreGrad = [&](double, int64_t, int64_t, int64_t, int64_t kv) {
    return kv == S ? 0.0 : 1.0;
  };
  const RefMaskFn maskx = [&](int64_t b, int64_t h, int64_t q, int64_t kv) { return kv == S || mask(b, h, q, kv); };
  const double scale = 0.3;
  const ReferenceResult want = referenceAttention(q, kx, vx, sinkScore, maskx, scale);
  const ReferenceResult got = referenceAttention(q, k, v, nullptr, mask, scale, 0, &sinks);
  for (size_t i = 0; i < got.lse.size(); ++i) {
    if (std::isinf(want.lse[i])) EXPECT_EQ(got.lse[i], want.lse[i]) << i;
    else EXPECT_NEAR(got.lse[i], want.lse[i], 1e-12) << i;
    for (int64_t d = 0; d < D; ++d)
      EXPECT_NEAR(got.out[i * size_t(D) + size_t(d)], want.out[i * size_t(D) + size_t(d)], 1e-12) << i;
  }
  std::vector<double> dsinks(size_t(Hq), 0.0);
  const RefScoreGradSink sinkKey = [&](double g, double, int64_t, int64_t h, int64_t, int64_t kv) {
    if (kv == S) dsinks[size_t(h)] += g;
  };
  const ReferenceGrads gx = referenceAttentionBackward(q, kx, vx, dout, sinkScore, sinkScoreGrad, maskx, scale, 0,
                                                       nullptr, sinkKey);
  const ReferenceGrads gs =
      referenceAttentionBackward(q, k, v, dout, nullptr, nullptr, mask, scale, 0, nullptr, nullptr, nullptr, &sinks);
  for (size_t i = 0; i < gs.dq.size(); ++i) EXPECT_NEAR(gs.dq[i], gx.dq[i], 1e-10) << "dq " << i;
  for (int64_t bh = 0; bh < B * Hkv; ++bh)
    for (int64_t j = 0; j < S * D; ++j) {
      EXPECT_NEAR(gs.dk[size_t(bh * S * D + j)], gx.dk[size_t(bh * (S + 1) * D + j)], 1e-10) << "dk " << bh << " " << j;
      EXPECT_NEAR(gs.dv[size_t(bh * S * D + j)], gx.dv[size_t(bh * (S + 1) * D + j)], 1e-10) << "dv " << bh << " " << j;
    }
  ASSERT_EQ(gs.dsinks.size(), size_t(Hq));
  for (int64_t h = 0; h < Hq; ++h) EXPECT_NEAR(gs.dsinks[size_t(h)], dsinks[size_t(h)], 1e-10) << "dsinks " << h;
  EXPECT_EQ(gs.dsinks[1], 0.0);
  EXPECT_NE(gs.dsinks[0], 0.0);
}

// Every (b, h) has its first and last row; every block boundary (of the kernel's BLOCK_M and of the
// mask's blocks) is checked on both sides in some (b, h), and every (b, h) gets a boundary.
TEST(SampleQueryRows, CoverEveryHeadEveryBoundaryAndBothEnds) {
  const int64_t B = 2, H = 3, L = 1000;
  const BlockMask mask = causalBlockMask(1, 1, L, L, {128, 128}, MemorySpace::Host);
  const std::vector<QueryRow> rows = sampleQueryRows(B, H, L, &mask, kCausal, {.boundaryBlock = 64, .seed = 5});
  ASSERT_TRUE(std::is_sorted(rows.begin(), rows.end()));
  EXPECT_EQ(std::adjacent_find(rows.begin(), rows.end()), rows.end()) << "no duplicates";
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      EXPECT_TRUE(contains(rows, {b, h, 0}));
      EXPECT_TRUE(contains(rows, {b, h, L - 1}));
      int64_t boundaryPairs = 0;
      for (int64_t x = 64; x < L; x += 64) boundaryPairs += contains(rows, {b, h, x - 1}) && contains(rows, {b, h, x});
      EXPECT_GE(boundaryPairs, 1) << b << " " << h;
    }
  for (int64_t x = 64; x < L; x += 64) {
    bool seen = false;
    for (int64_t bh = 0; bh < B * H; ++bh)
      seen = seen || (contains(rows, {bh / H, bh % H, x - 1}) && contains(rows, {bh / H, bh % H, x}));
    EXPECT_TRUE(seen) << "boundary " << x;
  }
  // A sample, not the problem: per (b, h) 2 ends + 16 random rows, and 2 rows per boundary.
  EXPECT_LE(rows.size(), size_t(B * H * 18 + 2 * 15));
}

// Rows that see no key (out 0, lse -inf) are where a kernel writes NaN or garbage: the first and
// last row of each run are in the sample, whether the run fills whole row blocks (no block listed)
// or sits inside row blocks of partial blocks, for every (b, h) the mask broadcasts to.
TEST(SampleQueryRows, IncludeTheEndsOfEveryRunOfRowsWithoutKeys) {
  const int64_t B = 2, H = 2, L = 1000;
  auto blind = [](const dsl::Tile& q) { return (q >= 40) & ((q < 500) | (q >= 510)) & ((q < 700) | (q >= 900)); };
  const MaskMod mod("blind_runs", [blind](const dsl::Tile&, const dsl::Tile&, const dsl::Tile& q, const dsl::Tile& kv) {
    return blind(q) & (kv <= q);
  });
  const RefMaskFn ref = [](int64_t, int64_t, int64_t q, int64_t kv) {
    return q >= 40 && (q < 500 || q >= 510) && (q < 700 || q >= 900) && kv <= q;
  };
  const BlockMask mask = createBlockMask(mod, 1, 1, L, L, {128, 128}, MemorySpace::Host);
  const std::vector<QueryRow> rows =
      sampleQueryRows(B, H, L, &mask, ref, {.randomPerHead = 0, .boundaryBlock = 128, .seed = 1});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i : {0, 39, 500, 509, 700, 899}) EXPECT_TRUE(contains(rows, {b, h, i})) << b << " " << h << " " << i;

  // A whole row block without any listed block (no mask_mod call needed), and many short runs:
  // at most kMaxMaskedRunsPerHead of them.
  const BlockMask late = createBlockMask(
      MaskMod("late", [](const dsl::Tile&, const dsl::Tile&, const dsl::Tile& q, const dsl::Tile& kv) {
        return (q >= 256) & (q % 50 != 7) & (kv <= q);
      }),
      1, 1, L, L, {128, 128}, MemorySpace::Host);
  const RefMaskFn lateRef = [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= 256 && q % 50 != 7 && kv <= q; };
  const std::vector<QueryRow> lateRows = sampleQueryRows(1, 1, L, &late, lateRef, {.randomPerHead = 0, .seed = 1});
  EXPECT_TRUE(contains(lateRows, {0, 0, 0}));
  EXPECT_TRUE(contains(lateRows, {0, 0, 255}));
  int64_t shortRuns = 0;
  for (int64_t i = 257; i < L; i += 50) shortRuns += contains(lateRows, {0, 0, i});
  EXPECT_EQ(shortRuns, kMaxMaskedRunsPerHead - 1) << "the run [0, 255], then the first single rows";
}

// The pair count behind every FLOP figure: brute force over the plane agrees with the count from
// the lists (lengths not multiples of the blocks, per-head windows, a broadcast batch, a slice that
// starts mid-block), and the FLOP formulas apply DESIGN.md's factors to it.
TEST(CountAllowedPairs, AgreesWithTheWholePlane) {
  const int64_t B = 3, H = 2, L = 203, S = 150;
  const std::vector<int64_t> windows{17, 64};
  const RefMaskFn window = [&](int64_t, int64_t h, int64_t q, int64_t kv) {
    return kv <= q && q - kv < windows[size_t(h)];
  };
  auto bruteForce = [&](const RefMaskFn& ref, int64_t q0, int64_t q1) {
    double n = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t q = q0; q < q1; ++q)
          for (int64_t kv = 0; kv < S; ++kv) n += ref(b, h, q, kv) ? 1 : 0;
    return n;
  };
  const BlockMask m = slidingWindowBlockMask(1, H, L, S, windows, {32, 64}, MemorySpace::Host);
  EXPECT_EQ(countAllowedPairs(m, window, B, H), bruteForce(window, 0, L));
  const BlockMask causal = causalBlockMask(1, 1, L, S, {64, 32}, MemorySpace::Host);
  EXPECT_EQ(countAllowedPairs(causal, kCausal, B, H), bruteForce(kCausal, 0, L));
  // Queries 100-119 of row 1 (64-127): the count is of those queries, at global positions; and
  // rows 2-3 whole (queries 128-202).
  const BlockMask slice = causal.sliceRows(1, 1, 100, 20);
  EXPECT_EQ(countAllowedPairs(slice, kCausal, B, H), bruteForce(kCausal, 100, 120));
  const BlockMask rows = causal.sliceRows(2, 2);
  EXPECT_EQ(countAllowedPairs(rows, kCausal, B, H), bruteForce(kCausal, 128, L));
  // Without a reference mask a partial block counts whole: an upper bound.
  EXPECT_GT(countAllowedPairs(causal, nullptr, B, H), bruteForce(kCausal, 0, L));
  EXPECT_THROW(countAllowedPairs(m, window, B, 4), Error);  // 2 heads in the mask, 4 in the inputs

  const double pairsPerHead = bruteForce(window, 0, L) / double(B * H);
  EXPECT_DOUBLE_EQ(flexAttentionFlops(B, H, 64, pairsPerHead), 4.0 * 64 * bruteForce(window, 0, L));
  EXPECT_DOUBLE_EQ(flexAttentionBackwardFlops(B, H, 64, pairsPerHead), 10.0 * 64 * bruteForce(window, 0, L));
  // v's own head dim: Q·Kᵀ at D and P·V at DV, 2 each a pair.
  EXPECT_DOUBLE_EQ(flexAttentionFlops(B, H, 192, pairsPerHead, 128), 2.0 * (192 + 128) * bruteForce(window, 0, L));
  EXPECT_DOUBLE_EQ(flexAttentionFlops(B, H, 64, pairsPerHead, 64), flexAttentionFlops(B, H, 64, pairsPerHead));
  EXPECT_DOUBLE_EQ(flexAttentionBackwardFlops(B, H, 192, pairsPerHead, 128),
                   5.0 * (192 + 128) * bruteForce(window, 0, L));
}

TEST(SampleQueryRows, TheSeedDecidesTheRandomRows) {
  const BlockMask mask = causalBlockMask(1, 1, 4096, 4096, {128, 128}, MemorySpace::Host);
  auto sample = [&](uint64_t seed) { return sampleQueryRows(2, 4, 4096, &mask, kCausal, {.seed = seed}); };
  EXPECT_EQ(sample(7), sample(7));
  EXPECT_NE(sample(7), sample(8));
  // Without a mask nor a kernel block: ends and random rows only.
  const std::vector<QueryRow> plain = sampleQueryRows(1, 1, 10, nullptr, nullptr, {.randomPerHead = 3});
  EXPECT_TRUE(contains(plain, {0, 0, 0}) && contains(plain, {0, 0, 9}));
  EXPECT_LE(plain.size(), 5u);
}

}  // namespace
}  // namespace flextile::attention

// The gradient comparison's whole-norm check takes the floor too: a dq that is zero in exact
// arithmetic (every live row has one allowed key, so dS = p (dP - delta) = 0) is rounding alone,
// which once failed it as a relative error of 2.7e8 (fuzz regression packed_dq_of_keys_no_row_sees).
// A real error of the floor's size still fails.
TEST(GradMismatch, TheWholeNormTakesTheFloor) {
  const std::vector<double> zero(64, 1e-16);
  std::vector<double> rounding(64), wrong(64);
  for (size_t i = 0; i < 64; ++i) {
    rounding[i] = (i % 2 ? 1 : -1) * 4e-8;
    wrong[i] = (i % 2 ? 1 : -1) * 0.05;
  }
  EXPECT_EQ(flextile::testing::gradMismatch("dq", rounding, zero, flextile::dsl::DType::F32, nullptr, 1, 0.5), "");
  EXPECT_NE(flextile::testing::gradMismatch("dq", wrong, zero, flextile::dsl::DType::F32, nullptr, 1, 0.5), "");
  EXPECT_NE(flextile::testing::gradMismatch("dq", rounding, zero, flextile::dsl::DType::F32), "")
      << "without a floor the bound is 1e-6 relative";
}
