// Packed variable-length sequences (attention_templates/Varlen.h) on the GPU: the default kernels
// (wgmma, TMA rings, the producer warpgroup the wrappers keep) for the forward, the decode and the
// backward, against the float64 reference of the sequences' own positions; outputs poisoned first.
#include <gtest/gtest.h>

#include "FlexAttentionBackwardCheck.h"
#include "VarlenCheck.h"
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

// At the sequence's own positions: kv <= q, and the score less 0.01 a position of distance.
const RefMaskFn kCausal = [](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q; };
RefScoreFn distance(double slope) {
  return [slope](double score, int64_t, int64_t, int64_t q, int64_t kv) { return score - slope * double(q - kv); };
}

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
    const PackedLayout p(qLens, kLens, QueryPositions::AtEnd);
    AttentionCase c{.B = 1, .Hq = 8, .Hkv = 2, .L = seqs.totalQueries(), .S = seqs.totalKeys(), .D = D, .dtype = dtype,
                    .context = "queries " + std::to_string(seqs.totalQueries())};
    if (!checkFlexAttention(rng, c, kDevice, seqs.score(distanceScore(0.01)), seqs.blockMask(causal_mask()),
                            packedScore(p, distance(0.01)), packedMask(p, kCausal), {.return_lse = true}))
      return;
  }
}

TEST(VarlenGpu, BackwardWithTheDefaultKernels) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const std::vector<int64_t> qLens = {300, 37, 0, 700, 129}, kLens = {300, 50, 9, 700, 200};
  PackedSequences seqs = PackedSequences::fromLengths(qLens, kLens, {.queryPositions = QueryPositions::AtEnd,
                                                                     .space = kDevice});
  const PackedLayout p(qLens, kLens, QueryPositions::AtEnd);
  AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = seqs.totalQueries(), .S = seqs.totalKeys(), .D = 128,
                  .dtype = DType::BF16, .context = "varlen backward"};
  BackwardCheck check;
  check.refMask = packedMask(p, kCausal);
  check.refScore = packedScore(p, distance(0.01));
  if (!checkBackward(rng, c, kDevice, seqs.score(distanceScore(0.01)), seqs.blockMask(causal_mask()), check)) return;
}
