// flex_attention through the IR interpreter against the float64 reference.
#include <gtest/gtest.h>

#include "FlexAttentionCheck.h"
#include "MaskTestUtil.h"
#include "gpu/GpuTest.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::testing;
using dsl::DType;
using dsl::MemorySpace;

namespace {
constexpr MemorySpace kHost = MemorySpace::Host;
const FlexAttentionOptions kSmall{.config = FlexAttentionConfig{32, 16, 4, 2}};
}  // namespace

TEST(FlexAttention, DenseMatchesReference) {
  SeededRandom rng;
  for (int64_t L : {1, 3, 77}) {
    AttentionCase c{.B = 1, .Hq = 2, .Hkv = 2, .L = L, .S = L + 5, .D = 32, .context = "dense"};
    checkFlexAttention(rng, c, kHost, noop_score(), std::nullopt, nullptr, nullptr, kSmall);
  }
}

TEST(FlexAttention, CausalMatchesReference) {
  SeededRandom rng;
  for (int64_t L : {1, 3, 77}) {
    AttentionCase c{.B = 1, .Hq = 2, .Hkv = 1, .L = L, .S = L, .D = 32, .context = "causal"};
    BlockMask m = causalBlockMask(1, 1, L, L, {32, 32});
    checkFlexAttention(rng, c, kHost, noop_score(), m, nullptr, refCausal(), kSmall);
  }
}

// Regression: the template skipped any score_mod *named* "noop", so a user's
// mod of that name was silently dropped. Only noop_score() itself may be
// skipped.
TEST(FlexAttention, ScoreModNamedNoopIsApplied) {
  SeededRandom rng;
  ScoreMod halved("noop", [](const Tile& s, const Tile&, const Tile&, const Tile&, const Tile&) { return s * 0.5; });
  AttentionCase c{.B = 1, .Hq = 2, .Hkv = 2, .L = 40, .S = 40, .D = 32, .context = "score_mod named noop"};
  checkFlexAttention(rng, c, kHost, halved, std::nullopt,
                     [](double s, int64_t, int64_t, int64_t, int64_t) { return 0.5 * s; }, nullptr, kSmall);
}

// Regression: with S a multiple of BLOCK_N but not of the mask's KV block
// size, the last mask block's steps past S loaded K and V unmasked (out of
// bounds) and kept those columns in the softmax. The implicit dense mask has
// 128-wide blocks, so a plain call with S = 64 hit it.
TEST(FlexAttention, KvLengthMultipleOfBlockNButNotOfMaskBlock) {
  SeededRandom rng;
  for (int64_t S : {64, 96}) {
    AttentionCase dense{.B = 1, .Hq = 2, .Hkv = 1, .L = 48, .S = S, .D = 32, .context = "dense, S % 128 != 0"};
    checkFlexAttention(rng, dense, kHost, noop_score(), std::nullopt, nullptr, nullptr, kSmall);
    AttentionCase causal{.B = 1, .Hq = 2, .Hkv = 2, .L = S, .S = S, .D = 32, .context = "causal, 128-blocks"};
    checkFlexAttention(rng, causal, kHost, noop_score(), causalBlockMask(1, 1, S, S), nullptr, refCausal(), kSmall);
  }
}
