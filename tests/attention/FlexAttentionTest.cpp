// flex_attention through the IR interpreter (host tensors) against the
// float64 reference: every registered variant, GQA and MQA, lengths that are
// not multiples of the blocks, fully masked rows, captured tensors and their
// rebinding, mask algebra, row slices (decode), strided views, configs.
//
// Sizes stay small: the interpreter runs about 2.5e8 multiply-adds a second.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <functional>
#include <optional>
#include <cstring>

#include <cmath>
#include <cstdio>

#include "FlexAttentionCheck.h"
#include "MaskTestUtil.h"
#include "attention_templates/FlexAttentionCommon.h"
#include "attention_templates/Variants.h"
#include "codegen/Ptxas.h"
#include "gpu/GpuTest.h"
#include "ir/Printer.h"

// GCC 12 warns about members left to their defaults in designated
// initializers, which is how the cases below are written on purpose.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

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
constexpr BlockSizes kMaskBlocks{32, 32};
const FlexAttentionConfig kSmallConfig{32, 16, 4, 2};
const FlexAttentionOptions kSmall{.config = kSmallConfig};

// The shapes every variant runs at: single query, tiny, around one block
// (127 / 128 / 129), L != S both ways, GQA 4:1, MQA, three dtypes, D 64 / 128
// and 96 (padded to 128 inside the template), S a multiple of BLOCK_N but
// not of KV_BLOCK_SIZE (48: the last mask block is half past the keys).
const std::vector<AttentionCase> kVariantCases = {
    {.B = 1, .Hq = 2, .Hkv = 2, .L = 1, .S = 1, .D = 64, .dtype = DType::BF16},
    {.B = 2, .Hq = 4, .Hkv = 1, .L = 3, .S = 5, .D = 64, .dtype = DType::F16},
    {.B = 1, .Hq = 4, .Hkv = 1, .L = 127, .S = 129, .D = 64, .dtype = DType::F32},
    {.B = 1, .Hq = 8, .Hkv = 2, .L = 129, .S = 127, .D = 64, .dtype = DType::BF16},
    {.B = 2, .Hq = 2, .Hkv = 2, .L = 128, .S = 128, .D = 128, .dtype = DType::F16},
    {.B = 1, .Hq = 4, .Hkv = 1, .L = 100, .S = 48, .D = 96, .dtype = DType::BF16},
    {.B = 1, .Hq = 2, .Hkv = 1, .L = 40, .S = 129, .D = 128, .dtype = DType::F32},
};


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

// Every registered variant on every shape, with small blocks (mask 32 x 32,
// config 32 x 16) so the shapes cross block boundaries.
TEST(FlexAttention, EveryVariantEveryShape) {
  SeededRandom rng;
  for (const Variant& var : variants())
    for (AttentionCase c : kVariantCases) {
      c.context = "variant " + var.name;
      VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kHost, kMaskBlocks, rng()});
      if (!checkFlexAttention(rng, c, kHost, inst.score, inst.mask, inst.refScore, inst.refMask, kSmall)) return;
    }
}

// Every pair of lengths around a block boundary, for a masked variant with a
// score mod and one with captured ids, heads, D and dtype rotating, two
// configs (BLOCK_M below and equal to the mask's 32-row blocks).
TEST(FlexAttention, LengthPairs) {
  SeededRandom rng;
  const int64_t lengths[] = {1, 3, 127, 128, 129};
  const AttentionCase shapes[] = {
      {.B = 1, .Hq = 4, .Hkv = 1, .D = 64, .dtype = DType::BF16},
      {.B = 2, .Hq = 4, .Hkv = 4, .D = 128, .dtype = DType::F16},
      {.B = 1, .Hq = 8, .Hkv = 2, .D = 64, .dtype = DType::F32},
  };
  const FlexAttentionConfig configs[] = {{16, 16, 2, 1}, {32, 32, 4, 2}};
  int i = 0;
  for (const char* name : {"softcap", "document"})
    for (int64_t L : lengths)
      for (int64_t S : lengths) {
        AttentionCase c = shapes[i % 3];
        c.L = L, c.S = S, c.context = name;
        VariantInstance inst = variant(name).make({c.B, c.Hq, L, S, kHost, kMaskBlocks, rng()});
        if (!checkFlexAttention(rng, c, kHost, inst.score, inst.mask, inst.refScore, inst.refMask,
                                {.config = configs[i++ % 2]}))
          return;
      }
}

// The same variants with the default 128 x 128 mask blocks and the default
// config of each dtype (no config given).
TEST(FlexAttention, EveryVariantDefaultBlocksAndConfig) {
  SeededRandom rng;
  const DType dtypes[] = {DType::BF16, DType::F16, DType::F32};
  int i = 0;
  for (const Variant& var : variants()) {
    AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 129, .S = 200, .D = 64, .dtype = dtypes[i++ % 3]};
    c.context = "variant " + var.name + " default blocks";
    VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kHost, BlockSizes{}, rng()});
    if (!checkFlexAttention(rng, c, kHost, inst.score, inst.mask, inst.refScore, inst.refMask)) return;
  }
}

// Without a mask the template builds a dense one of 128-key blocks; a key
// count that BLOCK_N divides but 128 does not leaves whole inner steps past
// the keys, which must be masked, not read.
TEST(FlexAttention, NoMaskKeysPastTheLastInnerStep) {
  SeededRandom rng;
  for (int64_t S : {64, 192, 200}) {
    AttentionCase c{.B = 1, .Hq = 2, .Hkv = 2, .L = 65, .S = S, .D = 64, .dtype = DType::F32, .context = "no mask"};
    if (!checkFlexAttention(rng, c, kHost, noop_score(), std::nullopt, nullptr, nullptr)) return;
    c.dtype = DType::BF16;
    if (!checkFlexAttention(rng, c, kHost, noop_score(), std::nullopt, nullptr, nullptr,
                            {.config = FlexAttentionConfig{64, 32, 4, 2}}))
      return;
  }
}

// One long case per standard mask kind (the interpreter's budget allows few).
TEST(FlexAttention, Length1000) {
  SeededRandom rng;
  AttentionCase c{.B = 1, .Hq = 2, .Hkv = 1, .L = 1000, .S = 1000, .D = 64, .dtype = DType::BF16, .context = "causal"};
  const FlexAttentionOptions opts{.config = FlexAttentionConfig{64, 32, 4, 2}};
  checkFlexAttention(rng, c, kHost, noop_score(), causalBlockMask(1, 1, 1000, 1000, {64, 64}), nullptr, refCausal(),
                     opts);
  c.context = "window 100";
  checkFlexAttention(rng, c, kHost, noop_score(), slidingWindowBlockMask(1, 1, 1000, 1000, {100}, {64, 64}, kHost),
                     nullptr, refWindow({100}), opts);
}

// The yardstick's window (1024) and prefix (2048) cover small inputs whole:
// these windows and prefixes are small enough to cut them.
TEST(FlexAttention, SmallWindowsAndPrefixes) {
  SeededRandom rng;
  for (int64_t W : {1, 7, 40, 100}) {
    AttentionCase c{.B = 1, .Hq = 2, .Hkv = 1, .L = 129, .S = 129, .D = 64, .dtype = DType::BF16};
    c.context = "window " + std::to_string(W);
    BlockMask m = slidingWindowBlockMask(1, 1, c.L, c.S, {W}, kMaskBlocks, kHost);
    if (!checkFlexAttention(rng, c, kHost, noop_score(), m, nullptr, refWindow({W}), kSmall)) return;
  }
  {
    // One window per query head (captured), under GQA: the mod sees the query head.
    const std::vector<int64_t> windows{3, 17, 64, 100};
    AttentionCase c{.B = 2, .Hq = 4, .Hkv = 2, .L = 127, .S = 100, .D = 64, .dtype = DType::F16};
    c.context = "per-head windows";
    BlockMask m = slidingWindowBlockMask(1, 4, c.L, c.S, windows, kMaskBlocks, kHost);
    if (!checkFlexAttention(rng, c, kHost, noop_score(), m, nullptr, refWindow(windows), kSmall)) return;
  }
  for (int64_t P : {1, 20, 50, 300}) {
    AttentionCase c{.B = 1, .Hq = 4, .Hkv = 1, .L = 100, .S = 129, .D = 64, .dtype = DType::BF16};
    c.context = "prefix " + std::to_string(P);
    BlockMask m = prefixLmBlockMask(1, 1, c.L, c.S, P, kMaskBlocks);
    if (!checkFlexAttention(rng, c, kHost, noop_score(), m, nullptr, refPrefix(P), kSmall)) return;
  }
}

TEST(FlexAttention, HeadDims) {
  SeededRandom rng;
  for (int64_t D : {16, 48, 80, 96, 128, 256}) {
    AttentionCase c{.B = 1, .Hq = 2, .Hkv = 1, .L = 33, .S = 70, .D = D, .dtype = DType::BF16};
    c.context = "causal D " + std::to_string(D);
    if (!checkFlexAttention(rng, c, kHost, noop_score(), causalBlockMask(1, 1, c.L, c.S, kMaskBlocks), nullptr,
                            refCausal(), kSmall))
      return;
  }
}

// A row with no allowed key gives out 0 (exactly) and lse -inf, never NaN:
// rows masked one by one inside partial blocks, a whole query block with no
// block listed, everything masked, and rows whose scores score_mod sets to -inf.
TEST(FlexAttention, FullyMaskedRows) {
  SeededRandom rng;
  MaskMod everyThirdRowBlind("every_third_row_blind",
                             [](const Tile&, const Tile&, const Tile& q, const Tile& kv) {
                               return (q % 3 != 0) & (kv <= q);
                             });
  RefMaskFn refEveryThird = [](int64_t, int64_t, int64_t q, int64_t kv) { return q % 3 != 0 && kv <= q; };
  MaskMod firstRowsBlind("first_40_rows_blind",
                         [](const Tile&, const Tile&, const Tile& q, const Tile& kv) { return (q >= 40) & (kv <= q); });
  RefMaskFn refFirstRows = [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= 40 && kv <= q; };
  for (AttentionCase c : {AttentionCase{.B = 2, .Hq = 4, .Hkv = 1, .L = 100, .S = 100, .D = 64, .dtype = DType::BF16},
                          AttentionCase{.B = 1, .Hq = 2, .Hkv = 2, .L = 1, .S = 7, .D = 128, .dtype = DType::F16},
                          AttentionCase{.B = 1, .Hq = 2, .Hkv = 1, .L = 129, .S = 60, .D = 64, .dtype = DType::F32}}) {
    c.context = "every third row blind";
    BlockMask m = createBlockMask(everyThirdRowBlind, 1, 1, c.L, c.S, kMaskBlocks, kHost);
    if (!checkFlexAttention(rng, c, kHost, noop_score(), m, nullptr, refEveryThird, kSmall)) return;
    c.context = "first 40 rows blind";
    BlockMask m2 = createBlockMask(firstRowsBlind, 1, 1, c.L, c.S, kMaskBlocks, kHost);
    if (!checkFlexAttention(rng, c, kHost, noop_score(), m2, nullptr, refFirstRows, kSmall)) return;
    c.context = "nothing allowed";
    BlockMask none = createBlockMask(or_masks(std::vector<MaskMod>{}), 1, 1, c.L, c.S, kMaskBlocks, kHost);
    EXPECT_EQ(none.numFullBlocks() + none.numPartialBlocks(), 0);
    if (!checkFlexAttention(rng, c, kHost, noop_score(), none, nullptr,
                            [](int64_t, int64_t, int64_t, int64_t) { return false; }, kSmall))
      return;
    // score_mod -inf on every key of every third row, with and without a mask.
    ScoreMod killRows("kill_every_third_row", [](const Tile& s, const Tile&, const Tile&, const Tile& q, const Tile&) {
      return where(q % 3 == 0, -INFINITY, s);
    });
    RefScoreFn refKill = [](double s, int64_t, int64_t, int64_t q, int64_t) { return q % 3 == 0 ? -INFINITY : s; };
    c.context = "score_mod -inf rows";
    if (!checkFlexAttention(rng, c, kHost, killRows, std::nullopt, refKill, nullptr, kSmall)) return;
    if (!checkFlexAttention(rng, c, kHost, killRows, causalBlockMask(1, 1, c.L, c.S, kMaskBlocks), refKill,
                            refCausal(), kSmall))
      return;
  }
}

// A ScoreMod is identified by its state, not its name: a user mod called
// "noop" that changes the scores must still run.
TEST(FlexAttention, ScoreModNamedNoopStillRuns) {
  SeededRandom rng;
  ScoreMod doubled("noop", [](const Tile& s, const Tile&, const Tile&, const Tile&, const Tile&) { return s * 2.0; });
  AttentionCase c{.B = 1, .Hq = 2, .Hkv = 2, .L = 50, .S = 50, .D = 64, .dtype = DType::F32, .context = "noop-named"};
  checkFlexAttention(rng, c, kHost, doubled, causalBlockMask(1, 1, 50, 50, kMaskBlocks),
                     [](double s, int64_t, int64_t, int64_t, int64_t) { return 2 * s; }, refCausal(), kSmall);
}

// ALiBi slopes, both written in place and rebound to a new tensor: the
// results follow the values and the kernel is traced once.
TEST(FlexAttention, CapturedSlopesFollowNewValuesWithoutRetracing) {
  SeededRandom rng;
  AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 70, .S = 70, .D = 64, .dtype = DType::BF16, .context = "alibi"};
  std::uniform_real_distribution<float> u(0.01f, 1.0f);
  auto randomSlopes = [&] {
    std::vector<float> s(size_t(c.Hq));
    for (auto& x : s) x = u(rng);
    return s;
  };
  std::vector<float> slopes = randomSlopes();
  CapturedTensor captured = dsl::capture(Tensor::fromHost(slopes, {c.Hq}, kHost), "slopes");
  ScoreMod mod = alibi(captured);
  BlockMask mask = causalBlockMask(1, 1, c.L, c.S, kMaskBlocks);
  auto refScore = [&slopes](double s, int64_t, int64_t h, int64_t q, int64_t kv) {
    return s + double(slopes[size_t(h)]) * double(kv - q);
  };
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    if (round == 1) {
      slopes = randomSlopes();
      captured.tensor().copyFromHost(slopes);
    } else if (round == 2) {
      slopes = randomSlopes();
      captured.rebind(Tensor::fromHost(slopes, {c.Hq}, kHost));
    }
    if (!checkFlexAttention(rng, c, kHost, mod, mask, refScore, refCausal(), kSmall)) return;
  }
  const dsl::Kernel* k = forwardKernel(mask.maskMod(), mod, c.dtype);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->numTraces(), 1u);
}

// A user's score mod and the per-head window BlockMask share one captured tensor: the output
// follows the reference for both reading the same values (GQA, a broadcast batch in the mask,
// lengths not multiples of the blocks), and both mods hold the caller's capture itself.
TEST(FlexAttention, ScoreModAndWindowMaskShareOneCapture) {
  SeededRandom rng;
  AttentionCase c{.B = 2, .Hq = 4, .Hkv = 2, .L = 77, .S = 90, .D = 32, .dtype = DType::F32, .context = "shared"};
  std::vector<int32_t> windows(size_t(c.Hq));
  for (auto& w : windows) w = int32_t(1 + rng() % 60);
  CapturedTensor captured = dsl::capture(Tensor::fromHost(windows, {c.Hq}, kHost), "windows");
  // Scores fade with the distance, relative to the head's window.
  ScoreMod fade("fade_in_window", [captured](const Tile& s, const Tile&, const Tile& h, const Tile& q, const Tile& kv) {
    return s - (q - kv).to(s.dtype()) / captured(h).to(s.dtype());
  });
  BlockMask mask = slidingWindowBlockMask(1, c.Hq, c.L, c.S, captured, kMaskBlocks);
  auto refScore = [&windows](double s, int64_t, int64_t h, int64_t q, int64_t kv) {
    return s - double(q - kv) / double(windows[size_t(h)]);
  };
  std::vector<int64_t> perHead(windows.begin(), windows.end());
  if (!checkFlexAttention(rng, c, kHost, fade, mask, refScore, refWindow(perHead), kSmall)) return;
  ASSERT_EQ(mask.maskMod().captures().size(), 1u);
  EXPECT_EQ(mask.maskMod().captures()[0].slot(), captured.slot());
  EXPECT_EQ(fade.captures()[0].slot(), captured.slot());
}

// Document ids captured in the mask mod: each round new ids (a new BlockMask
// from the same mod), one forward trace for all rounds.
TEST(FlexAttention, CapturedDocumentIdsFollowNewValuesWithoutRetracing) {
  SeededRandom rng;
  const int64_t L = 150;
  AttentionCase c{.B = 1, .Hq = 2, .Hkv = 1, .L = L, .S = L, .D = 64, .dtype = DType::F16, .context = "documents"};
  CapturedTensor ids = dsl::capture(Tensor::zeros(DType::I32, {L}, kHost), "document_ids");
  MaskMod mod = and_masks(causal_mask(), document_mask(ids));
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    // The first document always spans [0, 100): the mask keeps full and
    // partial blocks in every round, so the kernel's constants stay the same.
    std::vector<int64_t> offsets{0, 100};
    for (int64_t o = 100 + 1 + int64_t(rng() % 20); o < L; o += 1 + int64_t(rng() % 30)) offsets.push_back(o);
    offsets.push_back(L);
    std::vector<int32_t> row = idsFromOffsets(offsets, L);
    ids.tensor().copyFromHost(row);
    BlockMask mask = createBlockMask(mod, 1, 1, L, L, kMaskBlocks, kHost);
    if (!checkFlexAttention(rng, c, kHost, noop_score(), mask, nullptr, refAnd(refCausal(), refDocuments({row})),
                            kSmall))
      return;
  }
  const dsl::Kernel* k = forwardKernel(mod, noop_score(), c.dtype);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->numTraces(), 1u);
}

// Bias tables of rank 2, 3 and 4 (broadcast over b and h, per head, per
// batch and head), a rank-3 one rebound to new values.
TEST(FlexAttention, CapturedBiasTables) {
  SeededRandom rng;
  AttentionCase c{.B = 2, .Hq = 4, .Hkv = 1, .L = 37, .S = 70, .D = 64, .dtype = DType::BF16, .context = "bias"};
  std::uniform_real_distribution<float> u(-3, 3);
  auto table = [&](int64_t n) {
    std::vector<float> values(static_cast<size_t>(n));
    for (auto& x : values) x = u(rng);
    return values;
  };
  const int64_t L = c.L, S = c.S, H = c.Hq, B = c.B;
  {
    std::vector<float> t2 = table(L * S);
    ScoreMod mod = bias_table(dsl::capture(Tensor::fromHost(t2, {L, S}, kHost), "bias2"));
    if (!checkFlexAttention(rng, c, kHost, mod, std::nullopt,
                            [&](double s, int64_t, int64_t, int64_t q, int64_t kv) { return s + t2[size_t(q * S + kv)]; },
                            nullptr, kSmall))
      return;
  }
  {
    std::vector<float> t4 = table(B * H * L * S);
    ScoreMod mod = bias_table(dsl::capture(Tensor::fromHost(t4, {B, H, L, S}, kHost), "bias4"));
    if (!checkFlexAttention(rng, c, kHost, mod, causalBlockMask(1, 1, L, S, kMaskBlocks),
                            [&](double s, int64_t b, int64_t h, int64_t q, int64_t kv) {
                              return s + t4[size_t(((b * H + h) * L + q) * S + kv)];
                            },
                            refCausal(), kSmall))
      return;
  }
  std::vector<float> t3 = table(H * L * S);
  CapturedTensor captured = dsl::capture(Tensor::fromHost(t3, {H, L, S}, kHost), "bias3");
  ScoreMod mod = bias_table(captured);
  BlockMask mask = causalBlockMask(1, 1, L, S, kMaskBlocks);
  auto ref = [&](double s, int64_t, int64_t h, int64_t q, int64_t kv) { return s + t3[size_t((h * L + q) * S + kv)]; };
  for (int round = 0; round < 2; ++round) {
    if (round == 1) {
      t3 = table(H * L * S);
      captured.rebind(Tensor::fromHost(t3, {H, L, S}, kHost));
    }
    if (!checkFlexAttention(rng, c, kHost, mod, mask, ref, refCausal(), kSmall)) return;
  }
  EXPECT_EQ(forwardKernel(mask.maskMod(), mod, c.dtype)->numTraces(), 1u);
}

// and_masks / or_masks / not_mask of standard and captured masks, built by
// the generic createBlockMask, per batch and per head (mask B, H > 1).
TEST(FlexAttention, MaskAlgebra) {
  SeededRandom rng;
  const int64_t B = 2, Hq = 4, Hkv = 2, L = 100, S = 129;
  const std::vector<MaskCombo> combos = maskAlgebraCombos(rng, B, Hq, S, 5, kHost, 1);
  const DType dtypes[] = {DType::BF16, DType::F16, DType::F32};
  int i = 0;
  for (const MaskCombo& combo : combos) {
    AttentionCase c{.B = B, .Hq = Hq, .Hkv = Hkv, .L = L, .S = S, .D = 64, .dtype = dtypes[i++ % 3]};
    c.context = combo.name;
    BlockMask m = createBlockMask(combo.mod, combo.maskB, combo.maskH, L, S, kMaskBlocks, kHost);
    if (!checkFlexAttention(rng, c, kHost, noop_score(), m, nullptr, combo.ref, kSmall)) return;
  }
}

// Rows of a mask as a mask of their own, q holding only the slice's queries:
// whole rows (first, middle, a last row cut short, two rows) and one query
// in the middle of a row (decode), with a captured-id mask and per-head masks.
TEST(FlexAttention, SlicedRows) {
  SeededRandom rng;
  const int64_t L = 200, S = 200;
  std::vector<int32_t> row = idsFromOffsets(randomDocumentOffsets(S, 4, rng()), S);
  CapturedTensor ids = dsl::capture(Tensor::fromHost(row, {S}, kHost), "document_ids");
  const BlockMask causal = causalBlockMask(1, 1, L, S, kMaskBlocks);
  const BlockMask docs = createBlockMask(and_masks(causal_mask(), document_mask(ids)), 1, 1, L, S, kMaskBlocks, kHost);
  const BlockMask windows = slidingWindowBlockMask(1, 4, L, S, {5, 40, 70, 300}, kMaskBlocks, kHost);
  struct Full {
    std::string name;
    const BlockMask* mask;
    RefMaskFn ref;
  };
  const std::vector<Full> masks = {{"causal", &causal, refCausal()},
                                   {"documents", &docs, refAnd(refCausal(), refDocuments({row}))},
                                   {"per-head windows", &windows, refWindow({5, 40, 70, 300})}};
  struct Slice {
    int64_t start, count;
    std::optional<int64_t> offset, length;
  };
  const std::vector<Slice> slices = {{0, 1, {}, {}}, {2, 1, {}, {}}, {6, 1, {}, {}}, {3, 2, {}, {}},
                                     {3, 1, 100, 1},  {3, 1, 127, 1}, {6, 1, 199, 1}, {4, 1, 130, 7}};
  for (const Full& full : masks)
    for (const Slice& s : slices) {
      BlockMask slice = full.mask->sliceRows(s.start, s.count, s.offset, s.length);
      AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = slice.qLen(), .S = S, .D = 64, .dtype = DType::BF16};
      c.context = full.name + " rows " + std::to_string(s.start) + "+" + std::to_string(s.count) + " offset " +
                  std::to_string(slice.qOffset());
      if (!checkFlexAttention(rng, c, kHost, noop_score(), slice, nullptr, full.ref, kSmall)) return;
    }
  // Documents per batch and windows per head: B = 2 and H = 2 rows, so a slice's list views step
  // by the parent's strides in both.
  {
    const int64_t docsLen = 300;
    std::vector<std::vector<int64_t>> offsets{{0, 70, 300}, {0, 150, 180, 300}};
    const BlockMask perBatch = documentBlockMask(2, 1, docsLen, docsLen, offsets, true, kMaskBlocks, kHost);
    RefMaskFn ref = refAnd(refCausal(), refDocuments({idsFromOffsets(offsets[0], docsLen),
                                                       idsFromOffsets(offsets[1], docsLen)}));
    for (const Slice& s : std::vector<Slice>{{4, 3, {}, {}}, {5, 1, 170, 1}, {9, 1, 290, 10}}) {
      BlockMask slice = perBatch.sliceRows(s.start, s.count, s.offset, s.length);
      AttentionCase c{.B = 2, .Hq = 2, .Hkv = 1, .L = slice.qLen(), .S = docsLen, .D = 32, .dtype = DType::F32};
      c.context = "documents per batch, offset " + std::to_string(slice.qOffset());
      if (!checkFlexAttention(rng, c, kHost, noop_score(), slice, nullptr, ref, kSmall)) return;
    }
    const BlockMask perHead = slidingWindowBlockMask(2, 2, docsLen, docsLen, {20, 90}, kMaskBlocks, kHost);
    BlockMask slice = perHead.sliceRows(3, 2);
    AttentionCase c{.B = 2, .Hq = 2, .Hkv = 2, .L = slice.qLen(), .S = docsLen, .D = 32, .dtype = DType::F32,
                    .context = "windows per head, B = 2"};
    if (!checkFlexAttention(rng, c, kHost, noop_score(), slice, nullptr, refWindow({20, 90}), kSmall)) return;
  }
  // A score mod sees global query positions in a slice too.
  std::vector<float> slopes{0.5f, 0.25f, 0.125f, 0.0625f};
  ScoreMod mod = alibi(dsl::capture(Tensor::fromHost(slopes, {4}, kHost), "slopes"));
  BlockMask decode = causal.sliceRows(5, 1, 170, 1);
  AttentionCase c{.B = 2, .Hq = 4, .Hkv = 1, .L = 1, .S = S, .D = 128, .dtype = DType::F16, .context = "alibi decode"};
  checkFlexAttention(rng, c, kHost, mod, decode,
                     [&](double x, int64_t, int64_t h, int64_t q, int64_t kv) { return x + slopes[size_t(h)] * (kv - q); },
                     refCausal(), kSmall);
}

// q, k, v and out as views of other layouts: [B, L, H, D] buffers viewed as
// [B, H, L, D], k and v interleaved in one packed buffer, rows padded past D.
// Memory outside the out view stays untouched.
TEST(FlexAttention, StridedViews) {
  SeededRandom rng;
  const int64_t B = 2, Hq = 4, Hkv = 2, L = 70, S = 90, D = 64;
  for (DType dt : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(std::string(ir::dtypeName(dt)));
    const int64_t eb = ir::byteWidth(dt);
    // q: [B, L, Hq, D] buffer.
    std::vector<uint8_t> qBuf(size_t(B * L * Hq * D * eb));
    Tensor q = Tensor::hostView(qBuf.data(), dt, {B, Hq, L, D}, {L * Hq * D, D, Hq * D, 1});
    // k and v: one [B, S, 2, Hkv, D] buffer.
    std::vector<uint8_t> kvBuf(size_t(B * S * 2 * Hkv * D * eb));
    const std::vector<int64_t> kvStrides{S * 2 * Hkv * D, D, 2 * Hkv * D, 1};
    Tensor k = Tensor::hostView(kvBuf.data(), dt, {B, Hkv, S, D}, kvStrides);
    Tensor v = Tensor::hostView(kvBuf.data() + Hkv * D * eb, dt, {B, Hkv, S, D}, kvStrides);
    fillRandom(rng, q);
    fillRandom(rng, k);
    fillRandom(rng, v);
    // out: [B, L, Hq, D + 16], the padding filled with a sentinel.
    const int64_t rowPitch = D + 16;
    std::vector<uint8_t> outBuf(size_t(B * L * Hq * rowPitch * eb), 0x5a);
    Tensor out = Tensor::hostView(outBuf.data(), dt, {B, Hq, L, D}, {L * Hq * rowPitch, rowPitch, Hq * rowPitch, 1});
    ASSERT_FALSE(q.isContiguous());
    ASSERT_FALSE(out.isContiguous());
    for (const auto& [name, mask, ref] :
         {std::tuple{std::string("causal"), causalBlockMask(1, 1, L, S, kMaskBlocks), refCausal()},
          std::tuple{std::string("window 20"), slidingWindowBlockMask(1, 1, L, S, {20}, kMaskBlocks, kHost),
                     refWindow({20})}}) {
      if (!checkFlexAttentionOn(q, k, v, out, name + " strided", noop_score(), mask, nullptr, ref, kSmall)) return;
    }
    for (int64_t r = 0; r < B * L * Hq; ++r)
      for (int64_t byte = D * eb; byte < rowPitch * eb; ++byte)
        if (outBuf[size_t(r * rowPitch * eb + byte)] != 0x5a) {
          ADD_FAILURE() << "out row " << r << " was written past D (byte " << byte << ")";
          return;
        }
  }
}

// Every config that tiles the mask blocks gives the reference's answer.
TEST(FlexAttention, ConfigsAgree) {
  SeededRandom rng;
  const std::vector<FlexAttentionConfig> configs = {{16, 16, 1, 1},  {32, 16, 4, 2},  {32, 32, 4, 3}, {64, 32, 4, 2},
                                                    {64, 64, 4, 2},  {128, 64, 8, 2}, {16, 128, 4, 1}, {128, 32, 8, 3},
                                                    {128, 128, 8, 2}};
  const int64_t L = 150, S = 140;
  ScoreMod cap = soft_cap(5.0);
  RefScoreFn refCap = [](double s, int64_t, int64_t, int64_t, int64_t) { return 5.0 * std::tanh(s / 5.0); };
  BlockMask window = slidingWindowBlockMask(1, 1, L, S, {60}, {128, 128}, kHost);
  for (const FlexAttentionConfig& config : configs) {
    AttentionCase c{.B = 1, .Hq = 2, .Hkv = 1, .L = L, .S = S, .D = 64, .dtype = DType::BF16, .context = "window 60"};
    if (!checkFlexAttention(rng, c, kHost, cap, window, refCap, refWindow({60}), {.config = config})) return;
  }
}

// flex_attention (allocating) with and without LSE, and a given scale.
TEST(FlexAttention, AllocatingCallAndScale) {
  SeededRandom rng;
  const int64_t B = 1, H = 2, L = 45, S = 45, D = 64;
  Tensor q = randomTensor(rng, DType::F32, {B, H, L, D}, kHost);
  Tensor k = randomTensor(rng, DType::F32, {B, H, S, D}, kHost);
  Tensor v = randomTensor(rng, DType::F32, {B, H, S, D}, kHost);
  BlockMask mask = causalBlockMask(1, 1, L, S, kMaskBlocks);
  FlexAttentionResult noLse = flex_attention(q, k, v, noop_score(), mask, {.scale = 0.3, .config = kSmallConfig});
  EXPECT_FALSE(noLse.lse.defined());
  ASSERT_EQ(noLse.out.shape(), (dsl::Shape{B, H, L, D}));
  FlexAttentionResult withLse =
      flex_attention(q, k, v, noop_score(), mask, {.scale = 0.3, .return_lse = true, .config = kSmallConfig});
  ASSERT_EQ(withLse.lse.shape(), (dsl::Shape{B, H, L}));
  ReferenceResult ref = referenceAttention(q, k, v, nullptr, refCausal(), 0.3);
  EXPECT_TRUE(compareWithReference(noLse.out, withLse.lse, ref, D, DType::F32));
  EXPECT_EQ(noLse.out.toHost<float>(), withLse.out.toHost<float>());
}

// The row max is taken over the unscaled products only when the scale is positive
// (ForwardConstants::positiveScale): a negative scale flips which key is the row's largest, so it
// must get the kernel that scales first. Both signs against the reference, no score_mod, a
// partial causal walk and keys off the block.
TEST(FlexAttention, NegativeAndPositiveScale) {
  SeededRandom rng;
  const int64_t B = 1, H = 2, L = 45, S = 45, D = 64;
  Tensor q = randomTensor(rng, DType::F32, {B, H, L, D}, kHost);
  Tensor k = randomTensor(rng, DType::F32, {B, H, S, D}, kHost);
  Tensor v = randomTensor(rng, DType::F32, {B, H, S, D}, kHost);
  BlockMask mask = causalBlockMask(1, 1, L, S, kMaskBlocks);
  for (double scale : {-0.7, 0.7}) {
    SCOPED_TRACE("scale " + std::to_string(scale));
    FlexAttentionResult got =
        flex_attention(q, k, v, noop_score(), mask, {.scale = scale, .return_lse = true, .config = kSmallConfig});
    ReferenceResult ref = referenceAttention(q, k, v, nullptr, refCausal(), scale);
    EXPECT_TRUE(compareWithReference(got.out, got.lse, ref, D, DType::F32));
  }
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

// The GPU path of every variant, compiled to PTX for sm_90a and assembled by
// ptxas here (no GPU needed), at the default bf16 D128 config the yardstick
// runs: it assembles and fits in shared memory (spills are printed). (Each
// compile takes about a second, so the other configs are left to the GPU tests.)
TEST(FlexAttention, EveryVariantAssemblesForSm90a) {
  if (!codegen::findPtxas()) GTEST_SKIP() << "ptxas not found (PATH or /usr/local/cuda/bin): not assembling";
  SeededRandom rng;
  const codegen::Target target = codegen::Target::sm90a();
  const int64_t B = 1, H = 2, L = 300, S = 257, D = 128;
  for (const Variant& var : variants()) {
    VariantInstance inst = var.make({B, H, L, S, kHost, BlockSizes{}, rng()});
    Tensor q = Tensor::zeros(DType::BF16, {B, H, L, D}, kHost);
    Tensor kv = Tensor::zeros(DType::BF16, {B, H, S, D}, kHost);
    FlexAttentionPlan plan;
    ASSERT_NO_THROW(plan = plan_flex_attention(q, kv, kv, inst.score, inst.mask, {.return_lse = true}, true, target))
        << var.name;
    ASSERT_NE(plan.compiled, nullptr) << var.name;
    EXPECT_EQ(plan.config, untunedFlexAttentionConfig(q, inst.score, inst.mask, target));
    EXPECT_LE(plan.compiled->sharedBytes, 227 * 1024) << var.name;
    codegen::PtxasReport report;
    ASSERT_NO_THROW(report = codegen::runPtxas(plan.compiled->ptx, target)) << var.name;
    // Spills cost speed, not correctness: reported for the bench, not failed on.
    std::printf("%s: %d registers, %d bytes spilled, %d bytes of shared memory\n", var.name.c_str(), report.registers,
                report.spillStoreBytes, plan.compiled->sharedBytes);
  }
}

// The forward kernel's parameters are its ABI, and their names and order are in the traced IR and
// so in its structural hash and every compile cache key: a change to ForwardParams shows here, not
// as a silent recompile. (Captured tensors' parameters follow these; none here.)
TEST(FlexAttention, ForwardParametersKeepTheirNamesAndOrder) {
  const Tensor q = Tensor::zeros(DType::BF16, {1, 2, 128, 64}, kHost);
  const FlexAttentionPlan plan = plan_flex_attention(q, q, q, noop_score(), causalBlockMask(1, 1, 128, 128));
  ASSERT_NE(plan.traced, nullptr);
  const std::string text = ir::printFunction(*plan.traced);
  EXPECT_EQ(text.substr(0, text.find(')') + 1),
            "func @flex_fwd_noop_causal(%q: ptr<bf16>, %k: ptr<bf16>, %v: ptr<bf16>, %out: ptr<bf16>, "
            "%lse: ptr<f32>, %kv_num: ptr<i32>, %kv_indices: ptr<i32>, %full_kv_num: ptr<i32>, "
            "%full_kv_indices: ptr<i32>, %q_len: i32, %kv_len: i32, %q_offset: i32, %q_phase: i32, "
            "%mask_q_blocks: i32, %mask_kv_blocks: i32, %mask_b_stride: i32, %mask_h_stride: i32, "
            "%q_stride_b: i32, %q_stride_h: i32, %q_stride_m: i32, %k_stride_b: i32, %k_stride_h: i32, "
            "%k_stride_n: i32, %v_stride_b: i32, %v_stride_h: i32, %v_stride_n: i32, %out_stride_b: i32, "
            "%out_stride_h: i32, %out_stride_m: i32, %q_heads: i32, %scale: f32, %tiles: i32, %part_out: ptr<f32>, "
            "%part_lse: ptr<f32>, %tile_steps: i32, %max_scores: ptr<f32>, %part_max: ptr<f32>)");
}

// Regression: planning allocated (and cleared) a whole output tensor to describe the launch —
// 64 MB and 250 ms at the yardstick shape, and every autotune config paid it. Planning a shape
// whose output would be 2^37 bytes must now compile without touching memory for it.
TEST(FlexAttention, PlanningAllocatesNoOutput) {
  alignas(1024) static std::byte block[1024];
  const int64_t B = 64, H = 64, N = 131072, D = 128;  // bf16 [B, H, N, D]: 128 GiB
  const Tensor q = Tensor::hostView(block, DType::BF16, {B, H, N, D});
  const BlockMask mask = causalBlockMask(1, 1, N, N);
  FlexAttentionPlan plan;
  ASSERT_NO_THROW(plan = plan_flex_attention(q, q, q, noop_score(), mask, {}, true, codegen::Target::sm90a()));
  ASSERT_NE(plan.compiled, nullptr);
  EXPECT_NE(plan.compiled->ptx.find(".entry"), std::string::npos);
}

// Regression (a retrace and recompile, 0.5 s on the H200, for every new mask):
// two structural window or prefix masks with the same parameter share their
// mask_mod, so the second flex_attention call finds the kernel of the first.
TEST(FlexAttention, NewMasksWithTheSameParameterReuseTheKernel) {
  SeededRandom rng;
  AttentionCase c{.B = 1, .Hq = 2, .Hkv = 2, .L = 70, .S = 70, .D = 32, .context = "window 9, twice"};
  const dsl::Kernel* first[2] = {nullptr, nullptr};
  for (int round = 0; round < 2; ++round) {
    BlockMask window = slidingWindowBlockMask(1, 1, 70, 70, {9}, {32, 32}, kHost);
    BlockMask prefix = prefixLmBlockMask(1, 1, 70, 70, 5, {32, 32});
    checkFlexAttention(rng, c, kHost, noop_score(), window, nullptr, refWindow({9}), kSmall);
    checkFlexAttention(rng, c, kHost, noop_score(), prefix, nullptr, refPrefix(5), kSmall);
    int i = 0;
    for (const BlockMask* m : {&window, &prefix}) {
      const dsl::Kernel* k = forwardKernel(m->maskMod(), noop_score(), DType::BF16);
      ASSERT_NE(k, nullptr);
      EXPECT_EQ(k->numTraces(), 1u) << m->maskMod().name() << ", round " << round;
      if (round == 0) first[i] = k;
      EXPECT_EQ(k, first[i]) << m->maskMod().name() << ": the second mask got a kernel of its own";
      ++i;
    }
  }
  EXPECT_EQ(&slidingWindowBlockMask(1, 1, 8, 8, {9}).maskMod().state(), &sliding_window_mask(9).state());
  EXPECT_NE(&sliding_window_mask(9).state(), &sliding_window_mask(10).state());
}

TEST(FlexAttentionDefaults, WgmmaTargetsPickTheTileByHeadDimAndGridElsewhereThePortableOne) {
  using C = FlexAttentionConfig;
  const codegen::Target hopper = codegen::Target::sm90a();
  for (DType d : {DType::BF16, DType::F16}) {
    EXPECT_EQ(defaultFlexAttentionConfig(d, 64, hopper, 0), (C{64, 128, 4, 2}));
    EXPECT_EQ(defaultFlexAttentionConfig(d, 32, hopper, 4096), (C{64, 128, 4, 2}));
    EXPECT_EQ(defaultFlexAttentionConfig(d, 128, hopper, kManyQueryTiles), (C{128, 128, 8, 2}));
    EXPECT_EQ(defaultFlexAttentionConfig(d, 128, hopper, kManyQueryTiles - 1), (C{64, 64, 4, 2}));
    EXPECT_EQ(defaultFlexAttentionConfig(d, 96, hopper, 4096), (C{128, 128, 8, 2}));
    // No target, or one whose products run on mma.sync (sm_90 without the "a" has no wgmma).
    for (std::optional<codegen::Target> other : {std::optional<codegen::Target>(), std::optional(codegen::Target::sm80()),
                                                 std::optional(codegen::Target{86, false}),
                                                 std::optional(codegen::Target{89, false}),
                                                 std::optional(codegen::Target{90, false})}) {
      const std::string name = other ? other->smName() : "none";
      EXPECT_EQ(defaultFlexAttentionConfig(d, 64, other, 4096), (C{64, 64, 4, 2})) << name;
      EXPECT_EQ(defaultFlexAttentionConfig(d, 128, other, 4096), (C{64, 64, 4, 2})) << name;
    }
    // Past 128, on two warpgroups where the grid is large; elsewhere, on small grids and with a mod
    // that reads a captured tensor per score, the 64 x 32 point.
    EXPECT_EQ(defaultFlexAttentionConfig(d, 256, hopper, kManyQueryTiles), (C{128, 64, 8, 2}));
    EXPECT_EQ(defaultFlexAttentionConfig(d, 192, hopper, 4096), (C{128, 64, 8, 2}));
    EXPECT_EQ(defaultFlexAttentionConfig(d, 192, hopper, kManyQueryTiles - 1), (C{64, 32, 4, 2}));
    EXPECT_EQ(defaultFlexAttentionConfig(d, 192, hopper, 4096, /*gathersPerElement=*/true), (C{64, 32, 4, 2}));
    EXPECT_EQ(defaultFlexAttentionConfig(d, 256, codegen::Target::sm80(), 4096), (C{64, 32, 4, 2}));
  }
  EXPECT_EQ(defaultFlexAttentionConfig(DType::F32, 128, hopper, 4096), (C{64, 32, 4, 2}));
  EXPECT_EQ(defaultFlexAttentionConfig(DType::F32, 64, hopper, 4096), (C{64, 32, 4, 2}));
  // A target FlexTile has no description of is an error naming it, not the portable default.
  try {
    defaultFlexAttentionConfig(DType::BF16, 128, codegen::Target{120, false}, 4096);
    ADD_FAILURE() << "sm_120 gave a default config";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sm_120"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sm_90a"), std::string::npos) << e.what();
  }
}

TEST(FlexAttentionDefaults, UntunedConfigFollowsTheTargetTheGridAndTheMasksBlocks) {
  using C = FlexAttentionConfig;
  alignas(16) static std::byte any[16];
  const Tensor big = Tensor::hostView(any, DType::BF16, {2, 16, 8192, 128});   // 2048 query tiles
  const Tensor small = Tensor::hostView(any, DType::BF16, {1, 8, 1000, 128});  // 64 query tiles
  EXPECT_EQ(untunedFlexAttentionConfig(big, noop_score(), std::nullopt, codegen::Target::sm90a()), (C{128, 128, 8, 2}));
  EXPECT_EQ(untunedFlexAttentionConfig(small, noop_score(), std::nullopt, codegen::Target::sm90a()), (C{64, 64, 4, 2}));
  EXPECT_EQ(untunedFlexAttentionConfig(big, noop_score(), std::nullopt, codegen::Target::sm80()), (C{64, 64, 4, 2}));
  EXPECT_EQ(untunedFlexAttentionConfig(big, noop_score(), std::nullopt), (C{64, 64, 4, 2})) << "host tensors: the portable default";
  // A mask with 32 x 64 blocks narrows the tile and keeps 16 query rows per warp.
  const BlockMask narrow = causalBlockMask(1, 1, 8192, 8192, {32, 64});
  EXPECT_EQ(untunedFlexAttentionConfig(big, noop_score(), narrow, codegen::Target::sm90a()), (C{32, 64, 2, 2}));
  // The planner runs exactly that config.
  EXPECT_EQ(plan_flex_attention(big, big, big, noop_score(), narrow, {}, false, codegen::Target::sm90a()).config,
            (C{32, 64, 2, 2}));
  EXPECT_EQ(plan_flex_attention(big, big, big, noop_score(), std::nullopt, {}, false, codegen::Target::sm90a()).config,
            (C{128, 128, 8, 2}));
}

TEST(FlexAttentionDefaults, ModsThatGatherPerScoreKeepTheSmallTile) {
  SeededRandom rng;
  // Every yardstick variant reads at most a value per row, column or head (ALiBi's slopes, the
  // document ids), never one per score; the registry's "bias" variant reads a table per score.
  for (const Variant& var : variants()) {
    VariantInstance inst = var.make({1, 2, 300, 300, kHost, BlockSizes{}, rng()});
    if (inst.score.defined()) {
      EXPECT_EQ(inst.score.gathersPerElement(), var.name == "bias") << var.name;
    }
    if (inst.mask) {
      EXPECT_FALSE(inst.mask->maskMod().gathersPerElement()) << var.name;
    }
  }
  // A relative-position bias table read per score does.
  std::vector<float> table(4 * 9, 0.5f);
  CapturedTensor bias = dsl::capture(Tensor::fromHost(table, {4, 9}, kHost), "bias");
  const ScoreMod relative("relative_bias", [bias](const Tile& s, const Tile&, const Tile& h, const Tile& q,
                                                   const Tile& kv) {
    return s + bias(h, dsl::minimum(dsl::maximum(kv - q, -4), 4) + 4);
  }, {bias});
  EXPECT_TRUE(relative.gathersPerElement());
  alignas(16) static std::byte any[16];
  const Tensor big = Tensor::hostView(any, DType::BF16, {2, 16, 8192, 128});
  EXPECT_EQ(untunedFlexAttentionConfig(big, relative, std::nullopt, codegen::Target::sm90a()),
            (FlexAttentionConfig{64, 64, 4, 2}));
  EXPECT_EQ(untunedFlexAttentionConfig(big, noop_score(), std::nullopt, codegen::Target::sm90a()),
            (FlexAttentionConfig{128, 128, 8, 2}));
}

// The warp-specialized forward is the default unless a mod reads a captured tensor per score, or per
// key when the driver's JIT compiles it (the document ids: 7.5 % slower specialized so, 8 % faster
// assembled by ptxas, on the H200); FLEXTILE_WARP_SPECIALIZE=1/0 decides for every call. The
// consumers take turns (ping-pong) for mods that gather nothing.
TEST(FlexAttentionDefaults, ModsThatGatherAlongKeysKeepTheConsumersIssuing) {
  const bool offline = codegen::offlineAssembly() != codegen::OfflineAssembly::Never;
  SeededRandom rng;
  for (const Variant& var : variants()) {
    VariantInstance inst = var.make({1, 2, 300, 300, kHost, BlockSizes{}, rng()});
    const bool alongKeys = var.name == "document" || var.name == "bias";
    const bool maskAlongKeys = inst.mask && inst.mask->maskMod().gathersAlongKeys();
    const bool scoreAlongKeys = inst.score.defined() && inst.score.gathersAlongKeys();
    EXPECT_EQ(maskAlongKeys || scoreAlongKeys, alongKeys) << var.name;
    const bool perScore = var.name == "bias";
    EXPECT_EQ(flextile::attention::detail::warpSpecializeWanted(inst.score, inst.mask),
              !alongKeys || (offline && !perScore))
        << var.name;
    EXPECT_EQ(flextile::attention::detail::pingpongWanted(inst.score, inst.mask), !alongKeys) << var.name;
    for (const char* forced : {"0", "1"}) {
      ScopedSetenv env("FLEXTILE_WARP_SPECIALIZE", forced);
      EXPECT_EQ(flextile::attention::detail::warpSpecializeWanted(inst.score, inst.mask), forced[0] == '1') << var.name;
    }
  }
}

TEST(FlexAttentionDefaults, AModThatRefusesTheProbeIsTracedOnceAndRunsTheSmallTile) {
  auto traces = std::make_shared<int>(0);
  const ScoreMod picky("picky", [traces](const Tile& s, const Tile&, const Tile&, const Tile& q, const Tile&) {
    ++*traces;
    if (q.shape()[0] < 32) throw Error("picky: wants at least 32 query rows, got " + std::to_string(q.shape()[0]));
    return s;
  });
  EXPECT_THROW(picky.gathersPerElement(), Error);
  EXPECT_THROW(picky.structuralHash(), Error);
  EXPECT_EQ(*traces, 1) << "the failed probe is remembered, not traced again on every call";
  alignas(16) static std::byte any[16];
  const Tensor big = Tensor::hostView(any, DType::BF16, {2, 16, 8192, 128});
  EXPECT_EQ(untunedFlexAttentionConfig(big, picky, std::nullopt, codegen::Target::sm90a()),
            (FlexAttentionConfig{64, 64, 4, 2}));
  EXPECT_EQ(*traces, 1);
}

// FlexAttentionConfig::parse reads what the CLI's --config and the benches take, and names bad text.
TEST(FlexAttention, ConfigParsesTheCliSpelling) {
  EXPECT_EQ(FlexAttentionConfig::parse("128,64,8,2"), (FlexAttentionConfig{128, 64, 8, 2}));
  EXPECT_EQ(FlexAttentionConfig::parse("128,64,8,2,ws"), (FlexAttentionConfig{128, 64, 8, 2, WarpSpecialization::On}));
  EXPECT_EQ(FlexAttentionConfig::parse("64,64,4,3,no-ws"), (FlexAttentionConfig{64, 64, 4, 3, WarpSpecialization::Off}));
  const FlexAttentionConfig scheduled{128, 128, 8, 2, WarpSpecialization::On, LoopSchedule::On, LoopSchedule::Off};
  EXPECT_EQ(FlexAttentionConfig::parse("128,128,8,2,ws,turns,no-defer"), scheduled);
  EXPECT_EQ(FlexAttentionConfig::parse("128,128,8,2,no-defer,turns,ws"), scheduled) << "any order";
  EXPECT_EQ(scheduled.describe(), "BM128 BN128 w8 s2 ws turns no-defer");
  EXPECT_EQ(FlexAttentionConfig::parse("128,128,8,2,defer").defer, LoopSchedule::On);
  EXPECT_EQ(FlexAttentionConfig::parse("128,128,8,2,no-turns").turns, LoopSchedule::Off);
  EXPECT_EQ(FlexAttentionConfig::parse("128,128,8,2,skew").skew, LoopSchedule::On);
  EXPECT_EQ(FlexAttentionConfig::parse("128,128,8,2,no-skew,persistent").describe(), "BM128 BN128 w8 s2 persistent no-skew");
  EXPECT_EQ(FlexAttentionConfig::parse("128,128,8,2,overlap,skew").describe(), "BM128 BN128 w8 s2 skew overlap");
  for (const FlexAttentionConfig& c : {scheduled, FlexAttentionConfig{64, 32, 4, 1},
                                       FlexAttentionConfig{128, 64, 8, 3, WarpSpecialization::Off, LoopSchedule::Off,
                                                           LoopSchedule::On}}) {
    std::string text = c.describe().substr(2);  // "BM128 BN.." -> "128 BN.."; spelled back with commas
    for (const char* drop : {"BN", "w", "s"}) text.replace(text.find(std::string(" ") + drop), 1 + std::strlen(drop), ",");
    std::replace(text.begin(), text.end(), ' ', ',');
    EXPECT_EQ(FlexAttentionConfig::parse(text), c) << text;
  }
  for (const char* bad : {"", "ws", "128,64,8", "128,64,8,2,1", "128,64,8,2,yes", "128,-64,8,2", "128,64,8,2x", "a,b,c,d",
                          "128,64,8,2,ws,ws", "128,64,8,2,turns,no-turns", "128,64,8,2,defer,", "128,64,8,2,,ws",
                          "128,64,8,2,skew,no-skew", "128,64,8,2,overlap,overlap"}) {
    try {
      FlexAttentionConfig::parse(bad);
      ADD_FAILURE() << "'" << bad << "' parsed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("config '" + std::string(bad) + "': expects BM,BN,W,S"), std::string::npos)
          << e.what();
    }
  }
}

// forcedBySwitches reads several switches in one walk of the environment: each value as
// forcedBySwitch reads it alone, a name that begins another's (FLEXTILE_TMA and
// FLEXTILE_TMA_IN_STAGING_LOOPS) only its own, and an unset or unparsable one nullopt.
TEST(FlexAttentionSwitches, OneWalkReadsWhatEachGetenvWould) {
  using flextile::attention::detail::forcedBySwitch;
  using flextile::attention::detail::forcedBySwitches;
  const std::array<const char*, 5> names = {"FLEXTILE_TEST_SWITCH_A", "FLEXTILE_TEST_SWITCH", "FLEXTILE_TEST_SWITCH_AB",
                                            "FLEXTILE_TEST_SWITCH_UNSET", "FLEXTILE_TEST_SWITCH_WORD"};
  ASSERT_EQ(setenv("FLEXTILE_TEST_SWITCH_A", "1", 1), 0);
  ASSERT_EQ(setenv("FLEXTILE_TEST_SWITCH", "0", 1), 0);
  ASSERT_EQ(setenv("FLEXTILE_TEST_SWITCH_AB", "0", 1), 0);
  ASSERT_EQ(unsetenv("FLEXTILE_TEST_SWITCH_UNSET"), 0);
  ASSERT_EQ(setenv("FLEXTILE_TEST_SWITCH_WORD", "yes", 1), 0);
  std::array<std::optional<bool>, names.size()> values;
  values.fill(true);  // poisoned: every slot must be written
  forcedBySwitches(names, values);
  EXPECT_EQ(values[0], std::optional<bool>(true));
  EXPECT_EQ(values[1], std::optional<bool>(false));
  EXPECT_EQ(values[2], std::optional<bool>(false));
  EXPECT_EQ(values[3], std::nullopt);
  EXPECT_EQ(values[4], std::nullopt);
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(values[i], forcedBySwitch(names[i])) << names[i];
  // Changed between two walks: the second sees the change (the answers are kept only while the
  // environment stays), and so does forcedBySwitch; removed, both see it gone.
  ASSERT_EQ(setenv("FLEXTILE_TEST_SWITCH_A", "0", 1), 0);
  forcedBySwitches(names, values);
  EXPECT_EQ(values[0], std::optional<bool>(false));
  EXPECT_EQ(forcedBySwitch(names[0]), std::optional<bool>(false));
  ASSERT_EQ(unsetenv("FLEXTILE_TEST_SWITCH_A"), 0);
  forcedBySwitches(names, values);
  EXPECT_EQ(values[0], std::nullopt);
  EXPECT_EQ(forcedBySwitch(names[0]), std::nullopt);
  for (const char* name : names) unsetenv(name);
}

// The three config hooks share one slot (detail::ResolverSlot): a resolver runs without the slot's
// lock held, so it may replace the resolvers (with the lock held this one deadlocked); one that
// throws flextile::Error (a mod its probe tiles do not fit) leaves the call its default; one that
// says it cannot answer is not asked.
TEST(ConfigResolvers, AResolverMayResetTheHooksAndOneThatThrowsLeavesTheDefault) {
  const Tensor q = Tensor::zeros(DType::BF16, {1, 2, 64, 64}, kHost);
  const Tensor lse = Tensor::zeros(DType::F32, {1, 2, 64}, kHost);
  const Tensor one = Tensor::zeros(DType::BF16, {1, 2, 1, 64}, kHost);
  const FlexAttentionConfig forwardDefault = plan_flex_attention(q, q, q, noop_score(), std::nullopt).config;
  // The backward plans compile for a target (host tensors would ask the absent device for one).
  auto backwardPlan = [&] {
    return plan_flex_attention_backward(q, q, q, q, lse, q, noop_score(), std::nullopt, {}, codegen::Target::sm90a())
        .config;
  };
  const FlexAttentionBackwardConfig backwardDefault = backwardPlan();
  const FlexDecodeConfig decodeDefault = plan_flex_decode(one, q, q, noop_score(), std::nullopt).config;
  const FlexAttentionConfig tile{32, 32, 4, 2};
  const FlexDecodeConfig decodeTile{.block_n = 32, .num_warps = 4, .num_stages = 2, .splits = 2};
  using BackwardAnswer = std::optional<FlexAttentionBackwardConfig>;
  int asked = 0;
  auto resetAll = [] {
    setFlexAttentionConfigResolver({});
    setFlexAttentionBackwardConfigResolver({});
    setFlexDecodeConfigResolver({});
  };
  struct Reset {
    std::function<void()> f;
    ~Reset() { f(); }
  } reset{resetAll};

  setFlexAttentionConfigResolver([&](const FlexAttentionProblem&) -> std::optional<FlexAttentionConfig> {
    ++asked;
    resetAll();
    return tile;
  });
  setFlexAttentionBackwardConfigResolver([&](const FlexAttentionProblem&) -> BackwardAnswer {
    ++asked;
    resetAll();
    return FlexAttentionBackwardConfig{tile, tile};
  });
  setFlexDecodeConfigResolver([&](const FlexAttentionProblem&) -> std::optional<FlexDecodeConfig> {
    ++asked;
    resetAll();
    return decodeTile;
  });
  EXPECT_EQ(plan_flex_attention(q, q, q, noop_score(), std::nullopt).config, tile);
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(plan_flex_attention(q, q, q, noop_score(), std::nullopt).config, forwardDefault) << "reset by itself";
  EXPECT_EQ(asked, 1);

  setFlexAttentionBackwardConfigResolver([&](const FlexAttentionProblem&) -> BackwardAnswer {
    ++asked;
    resetAll();
    return FlexAttentionBackwardConfig{tile, tile};
  });
  EXPECT_EQ(backwardPlan(),
            (FlexAttentionBackwardConfig{tile, tile}));
  EXPECT_EQ(backwardPlan(), backwardDefault);
  EXPECT_EQ(asked, 2);

  setFlexDecodeConfigResolver([&](const FlexAttentionProblem&) -> std::optional<FlexDecodeConfig> {
    ++asked;
    resetAll();
    return decodeTile;
  });
  EXPECT_EQ(plan_flex_decode(one, q, q, noop_score(), std::nullopt).config, decodeTile);
  EXPECT_EQ(plan_flex_decode(one, q, q, noop_score(), std::nullopt).config, decodeDefault);
  EXPECT_EQ(asked, 3);

  auto throwing = [&](const FlexAttentionProblem&) {
    ++asked;
    throw Error("a mod the probe tiles do not fit");
  };
  setFlexAttentionConfigResolver([&](const FlexAttentionProblem& p) -> std::optional<FlexAttentionConfig> {
    throwing(p);
    return tile;
  });
  setFlexAttentionBackwardConfigResolver([&](const FlexAttentionProblem& p) -> BackwardAnswer {
    throwing(p);
    return FlexAttentionBackwardConfig{tile, tile};
  });
  setFlexDecodeConfigResolver(
      [&](const FlexAttentionProblem& p) -> std::optional<FlexDecodeConfig> {
        throwing(p);
        return decodeTile;
      },
      [] { return true; });
  EXPECT_EQ(plan_flex_attention(q, q, q, noop_score(), std::nullopt).config, forwardDefault);
  EXPECT_EQ(backwardPlan(), backwardDefault);
  EXPECT_EQ(plan_flex_decode(one, q, q, noop_score(), std::nullopt).config, decodeDefault);
  EXPECT_EQ(asked, 6);
}
