// Packed variable-length sequences (attention_templates/Varlen.h) on the GPU: the default kernels
// (wgmma, TMA rings, the producer warpgroup the wrappers keep) for the forward, the decode and the
// backward, against the float64 reference of the sequences' own positions; outputs poisoned first.
#include <gtest/gtest.h>

#include "FlexAttentionBackwardCheck.h"
#include "gpu/GpuTest.h"
#include "attention_templates/Varlen.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::testing;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;
using dsl::Tile;

namespace {
constexpr MemorySpace kDevice = MemorySpace::Device;

// The packed definition from the lengths: the key is in the query's sequence and, at the
// sequence's own positions (queries at the end of their keys), kv <= q, plus the score's distance.
struct Packed {
  std::vector<int64_t> qStarts{0}, kStarts{0};
  Packed(const std::vector<int64_t>& qLens, const std::vector<int64_t>& kLens) {
    for (size_t s = 0; s < qLens.size(); ++s) {
      qStarts.push_back(qStarts.back() + qLens[s]);
      kStarts.push_back(kStarts.back() + kLens[s]);
    }
  }
  // (sequence, position of q, position of kv in the sequence)
  std::tuple<size_t, int64_t, int64_t> at(int64_t q, int64_t kv) const {
    size_t s = 0;
    while (qStarts[s + 1] <= q) ++s;
    const int64_t shift = (kStarts[s + 1] - kStarts[s]) - (qStarts[s + 1] - qStarts[s]);
    return {s, q - qStarts[s] + shift, kv - kStarts[s]};
  }
  RefMaskFn causal() const {
    return [p = *this](int64_t, int64_t, int64_t q, int64_t kv) {
      auto [s, i, j] = p.at(q, kv);
      return j >= 0 && kv < p.kStarts[s + 1] && j <= i;
    };
  }
  RefScoreFn distance(double slope) const {
    return [p = *this, slope](double score, int64_t, int64_t, int64_t q, int64_t kv) {
      auto [s, i, j] = p.at(q, kv);
      return score - slope * double(i - j);
    };
  }
};

ScoreMod distanceScore(double slope) {
  return ScoreMod("distance", [slope](const Tile& s, const Tile&, const Tile&, const Tile& q, const Tile& kv) {
    return s - slope * (q - kv).to(s.dtype());
  });
}
}  // namespace

// Prefill of a ragged batch (sequences past several blocks, a single token, an empty one, queries
// fewer than keys) and a decode step of the same batch, GQA 4:1, D = 128 bf16 and D = 64 f16.
TEST(VarlenGpu, PrefillAndDecodeWithTheDefaultKernels) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const std::vector<int64_t> kLens = {1000, 37, 0, 4097, 513, 1};
  for (auto [qLens, dtype, D] : {std::tuple{std::vector<int64_t>{1000, 37, 0, 2000, 513, 1}, DType::BF16, int64_t(128)},
                                 std::tuple{std::vector<int64_t>{700, 1, 0, 129, 512, 1}, DType::F16, int64_t(64)},
                                 std::tuple{std::vector<int64_t>{1, 1, 0, 1, 2, 1}, DType::BF16, int64_t(128)}}) {
    PackedSequences seqs =
        PackedSequences::fromLengths(qLens, kLens, {.queryPositions = QueryPositions::AtEnd, .space = kDevice});
    const Packed p(qLens, kLens);
    AttentionCase c{.B = 1, .Hq = 8, .Hkv = 2, .L = seqs.totalQueries(), .S = seqs.totalKeys(), .D = D, .dtype = dtype,
                    .context = "queries " + std::to_string(seqs.totalQueries())};
    if (!checkFlexAttention(rng, c, kDevice, seqs.score(distanceScore(0.01)), seqs.blockMask(causal_mask()),
                            p.distance(0.01), p.causal(), {.return_lse = true}))
      return;
  }
}

TEST(VarlenGpu, BackwardWithTheDefaultKernels) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const std::vector<int64_t> qLens = {300, 37, 0, 700, 129}, kLens = {300, 50, 9, 700, 200};
  PackedSequences seqs = PackedSequences::fromLengths(qLens, kLens, {.queryPositions = QueryPositions::AtEnd,
                                                                     .space = kDevice});
  const Packed p(qLens, kLens);
  AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = seqs.totalQueries(), .S = seqs.totalKeys(), .D = 128,
                  .dtype = DType::BF16, .context = "varlen backward"};
  BackwardCheck check;
  check.refMask = p.causal();
  check.refScore = p.distance(0.01);
  if (!checkBackward(rng, c, kDevice, seqs.score(distanceScore(0.01)), seqs.blockMask(causal_mask()), check)) return;
}
