// flex_attention_backward through the IR interpreter (host tensors) against the float64
// reference written from the formulas: every registered variant, GQA and MQA, lengths around the
// blocks, fully masked rows, mask algebra, sliced masks with a query offset, dlse, trainable
// captures (a bias table, learnable ALiBi slopes, a tensor read twice) and the errors.
//
// Sizes stay small: the backward runs about 2.5x the forward's multiply-adds on the interpreter.
#include <gtest/gtest.h>

#include <cmath>

#include "FlexAttentionBackwardCheck.h"
#include "HeadDimCheck.h"
#include "codegen/Ptxas.h"
#include "MaskTestUtil.h"
#include "tests/TextCount.h"
#include "attention_templates/Variants.h"
#include "gpu/GpuTest.h"

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
const FlexAttentionConfig kFwdSmall{32, 16, 4, 2};
const FlexAttentionBackwardConfig kBwdSmall{{16, 32, 4, 2}, {32, 16, 4, 2}};

BackwardCheck small(RefMaskFn mask = nullptr) {
  BackwardCheck c;
  c.refMask = std::move(mask);
  c.forwardConfig = kFwdSmall;
  c.options.config = kBwdSmall;
  return c;
}

}  // namespace

TEST(FlexAttentionBackward, DenseMatchesReference) {
  SeededRandom rng;
  for (int64_t L : {1, 3, 40}) {
    AttentionCase c{.B = 1, .Hq = 2, .Hkv = 2, .L = L, .S = L + 5, .D = 32, .dtype = DType::F32, .context = "dense"};
    if (!checkBackward(rng, c, kHost, noop_score(), std::nullopt, small())) return;
  }
}

TEST(FlexAttentionBackward, CausalGqaAndMqa) {
  SeededRandom rng;
  for (auto [Hq, Hkv, L, dt] : {std::tuple{4, 1, 77, DType::BF16}, std::tuple{8, 2, 50, DType::F16},
                                std::tuple{2, 2, 33, DType::F32}}) {
    AttentionCase c{.B = 2, .Hq = Hq, .Hkv = Hkv, .L = L, .S = L, .D = 64, .dtype = dt, .context = "causal"};
    BlockMask m = causalBlockMask(1, 1, L, L, kMaskBlocks);
    if (!checkBackward(rng, c, kHost, noop_score(), m, small(refCausal()))) return;
  }
}

namespace {
// Every registered variant, mask and score mod, on shapes that cross the blocks, with `dq`.
void checkEveryVariant(std::mt19937_64& rng, DqAccumulation dq, const std::string& what) {
  const AttentionCase shapes[] = {
      {.B = 1, .Hq = 4, .Hkv = 1, .L = 70, .S = 65, .D = 64, .dtype = DType::BF16},
      {.B = 2, .Hq = 2, .Hkv = 2, .L = 33, .S = 48, .D = 32, .dtype = DType::F16},
      {.B = 1, .Hq = 2, .Hkv = 1, .L = 17, .S = 40, .D = 48, .dtype = DType::F32},
  };
  int i = 0;
  for (const Variant& var : variants()) {
    AttentionCase c = shapes[i++ % 3];
    c.context = what + "variant " + var.name;
    VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kHost, kMaskBlocks, rng()});
    BackwardCheck check = small(inst.refMask);
    check.refScore = inst.refScore;
    check.refScoreGrad = inst.refScoreGrad;
    check.options.dq_accumulation = dq;
    if (!checkBackward(rng, c, kHost, inst.score, inst.mask, check)) return;
  }
}
}  // namespace

TEST(FlexAttentionBackward, EveryVariant) {
  SeededRandom rng;
  checkEveryVariant(rng, DqAccumulation::Separate, "");
}

// The tiles handed out heaviest first (FLEXTILE_TILE_ORDER=1): dkdv's key tiles by their columns'
// live blocks over the group's query heads, dq's query tiles by their rows' (the forward's order);
// every variant on shapes with B and H above 1, GQA and MQA. (Fails with dkdv's head and batch
// decoded in the other nesting, and with dq's order taken for dkdv: each checked by hand.)
TEST(FlexAttentionBackward, TilesHeaviestFirst) {
  SeededRandom rng;
  ScopedSetenv ordered("FLEXTILE_TILE_ORDER", "1");
  checkEveryVariant(rng, DqAccumulation::Separate, "tiles heaviest first, ");
  // (B differs from Hkv: a program that swapped them would still cover every tile where they agree.)
  AttentionCase c{.B = 3, .Hq = 4, .Hkv = 2, .L = 150, .S = 200, .D = 32, .dtype = DType::BF16,
                  .context = "causal, tiles heaviest first, blocks of 32"};
  BlockMask m = causalBlockMask(1, 1, c.L, c.S, {32, 32});
  checkBackward(rng, c, kHost, noop_score(), m, small(refCausal()));
}

// Lengths 1, 3, 127, 128, 129 both ways with the default mask blocks and the default config.
TEST(FlexAttentionBackward, LengthsAroundTheBlocks) {
  SeededRandom rng;
  const int64_t lengths[] = {1, 3, 127, 128, 129};
  int i = 0;
  for (int64_t L : lengths)
    for (int64_t S : {int64_t(1), int64_t(129)}) {
      AttentionCase c{.B = 1, .Hq = 2, .Hkv = 1, .L = L, .S = S, .D = 32,
                      .dtype = i++ % 2 ? DType::BF16 : DType::F16, .context = "causal default blocks"};
      BlockMask m = causalBlockMask(1, 1, L, S);
      BackwardCheck check;
      check.refMask = refCausal();
      if (!checkBackward(rng, c, kHost, noop_score(), m, check)) return;
    }
}

// Rows with no allowed key get exactly 0 gradients (and so do keys nobody sees), never NaN.
TEST(FlexAttentionBackward, FullyMaskedRowsGiveZeroGradients) {
  SeededRandom rng;
  const BlindRowMasks blind = blindRowMasks();
  const MaskMod &everyThirdRowBlind = blind.everyThird, &firstRowsBlind = blind.first40;
  const RefMaskFn refEveryThird = blind.refEveryThird, refFirstRows = blind.refFirst40;
  AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 70, .S = 70, .D = 64, .dtype = DType::BF16};
  c.context = "every third row blind";
  if (!checkBackward(rng, c, kHost, noop_score(), createBlockMask(everyThirdRowBlind, 1, 1, 70, 70, kMaskBlocks, kHost),
                     small(refEveryThird)))
    return;
  c.context = "first 40 rows blind, last 30 keys unseen";
  if (!checkBackward(rng, c, kHost, noop_score(), createBlockMask(firstRowsBlind, 1, 1, 70, 70, kMaskBlocks, kHost),
                     small(refFirstRows)))
    return;
  c.context = "nothing allowed";
  BlockMask none = createBlockMask(or_masks(std::vector<MaskMod>{}), 1, 1, 70, 70, kMaskBlocks, kHost);
  checkBackward(rng, c, kHost, noop_score(), none, small([](int64_t, int64_t, int64_t, int64_t) { return false; }));
}

// and/or/not of structural masks, captured document ids and per-(b, h) masks.
TEST(FlexAttentionBackward, MaskAlgebra) {
  SeededRandom rng;
  const int64_t B = 2, Hq = 2, len = 60;
  for (const MaskCombo& combo : maskAlgebraCombos(rng, B, Hq, len, 3, kHost, 1)) {
    AttentionCase c{.B = B, .Hq = Hq, .Hkv = 1, .L = len, .S = len, .D = 32, .dtype = DType::F16, .context = combo.name};
    BlockMask m = createBlockMask(combo.mod, combo.maskB, combo.maskH, len, len, kMaskBlocks, kHost);
    if (!checkBackward(rng, c, kHost, noop_score(), m, small(combo.ref))) return;
  }
}

// A slice of a longer mask: the mods see global query positions, one-row slices may start mid-block.
TEST(FlexAttentionBackward, SlicedMaskWithQueryOffset) {
  SeededRandom rng;
  const int64_t S = 150;
  BlockMask causal = causalBlockMask(1, 1, S, S, kMaskBlocks);
  struct Slice {
    int64_t start, count;
    std::optional<int64_t> offset, length;
  };
  for (Slice s : {Slice{2, 1, {}, {}}, Slice{1, 2, {}, {}}, Slice{3, 1, 100, 1}, Slice{4, 1, 130, 7}}) {
    BlockMask slice = causal.sliceRows(s.start, s.count, s.offset, s.length);
    AttentionCase c{.B = 1, .Hq = 2, .Hkv = 1, .L = slice.qLen(), .S = S, .D = 32, .dtype = DType::F32};
    c.context = "causal slice offset " + std::to_string(slice.qOffset());
    if (!checkBackward(rng, c, kHost, noop_score(), slice, small(refCausal()))) return;
  }
  // A slice of a mask with rows per batch and per head: its forward lists are views of the
  // parent's with the parent's strides (the dq kernel reads them), its transposes its own (dk, dv).
  BlockMask windows = slidingWindowBlockMask(2, 2, S, S, {9, 60}, kMaskBlocks, kHost);
  for (Slice s : {Slice{2, 2, {}, {}}, Slice{3, 1, 100, 5}}) {
    BlockMask slice = windows.sliceRows(s.start, s.count, s.offset, s.length);
    AttentionCase c{.B = 2, .Hq = 2, .Hkv = 1, .L = slice.qLen(), .S = S, .D = 32, .dtype = DType::F32};
    c.context = "per-head window slice offset " + std::to_string(slice.qOffset());
    if (!checkBackward(rng, c, kHost, noop_score(), slice, small(refWindow({9, 60})))) return;
  }
}

// The gradient flowing into the LSE output.
TEST(FlexAttentionBackward, LseGradient) {
  SeededRandom rng;
  AttentionCase c{.B = 1, .Hq = 2, .Hkv = 1, .L = 45, .S = 45, .D = 32, .dtype = DType::F32, .context = "dlse"};
  BackwardCheck check = small(refCausal());
  check.withDlse = true;
  checkBackward(rng, c, kHost, noop_score(), causalBlockMask(1, 1, 45, 45, kMaskBlocks), check);
}

// A padded head dim (80 in 128 columns) where the keys fill whole blocks (S a multiple of the KV
// block: the kernels' kvExact), and the queries too: every K, V, Q and dO row must still be read
// only up to D. dkdv read K and V unmasked there, 48 columns past each row, and past the end of
// the last one.
TEST(FlexAttentionBackward, PaddedHeadDimOverWholeBlocks) {
  SeededRandom rng;
  for (DqAccumulation dq : {DqAccumulation::Separate, DqAccumulation::Atomic}) {
    AttentionCase c{.B = 1, .Hq = 2, .Hkv = 1, .L = 64, .S = 64, .D = 80, .dtype = DType::BF16,
                    .context = dq == DqAccumulation::Atomic ? "atomic dQ" : "separate dQ"};
    BackwardCheck check = small(refCausal());
    check.options.dq_accumulation = dq;
    if (!checkBackward(rng, c, kHost, noop_score(), causalBlockMask(1, 1, c.L, c.S, kMaskBlocks), check)) return;
  }
}

// A non-default scale and D not a power of two (padded inside the template).
TEST(FlexAttentionBackward, ScaleAndPaddedHeadDim) {
  SeededRandom rng;
  AttentionCase c{.B = 1, .Hq = 2, .Hkv = 2, .L = 40, .S = 37, .D = 80, .dtype = DType::BF16, .context = "scale 0.3"};
  BackwardCheck check = small(refCausal());
  check.options.scale = 0.3;
  if (!checkBackward(rng, c, kHost, noop_score(), causalBlockMask(1, 1, 40, 37, kMaskBlocks), check)) return;
  // The largest head dim, with the default config for it.
  AttentionCase wide{.B = 1, .Hq = 2, .Hkv = 1, .L = 35, .S = 33, .D = 256, .dtype = DType::F16, .context = "D 256"};
  BackwardCheck dflt;
  dflt.refMask = refCausal();
  checkBackward(rng, wide, kHost, soft_cap(20), causalBlockMask(1, 1, 35, 33), [&] {
    dflt.refScore = [](double x, int64_t, int64_t, int64_t, int64_t) { return 20 * std::tanh(x / 20); };
    dflt.refScoreGrad = [](double x, int64_t, int64_t, int64_t, int64_t) {
      const double t = std::tanh(x / 20);
      return 1 - t * t;
    };
    return dflt;
  }());
}

TEST(FlexAttentionBackward, BadInputsAreErrors) {
  SeededRandom rng;
  const int64_t B = 1, H = 2, L = 20, S = 20, D = 32;
  Tensor q = randomTensor(rng, DType::F32, {B, H, L, D}, kHost), k = randomTensor(rng, DType::F32, {B, H, S, D}, kHost);
  Tensor v = randomTensor(rng, DType::F32, {B, H, S, D}, kHost), dout = randomTensor(rng, DType::F32, {B, H, L, D}, kHost);
  FlexAttentionResult fwd = flex_attention(q, k, v, noop_score(), std::nullopt, {.return_lse = true, .config = kFwdSmall});
  auto expectError = [&](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expectError([&] { flex_attention_backward(q, k, v, fwd.out, fwd.lse, Tensor::empty(DType::F32, {B, H, L, 16}, kHost)); },
              "dout must be f32[1, 2, 20, 32]");
  expectError([&] { flex_attention_backward(q, k, v, fwd.out, fwd.lse, Tensor::empty(DType::BF16, {B, H, L, D}, kHost)); },
              "dout must be f32");
  expectError([&] { flex_attention_backward(q, k, v, fwd.out, Tensor(), dout); }, "return_lse");
  expectError([&] { flex_attention_backward(q, k, v, fwd.out, Tensor::empty(DType::F32, {B, H, L + 1}, kHost), dout); },
              "lse must be f32[1, 2, 20]");
  expectError([&] { flex_attention_backward(q, k, v, fwd.out, fwd.lse, dout, noop_score(), causalBlockMask(1, 1, 30, 30)); },
              "30");
  expectError([&] { flex_attention_backward(q, k, v, fwd.out, fwd.lse, dout, noop_score(), std::nullopt, {.scale = NAN}); },
              "scale must be finite");
  expectError([&] { dsl::capture(Tensor::fromHost(std::vector<int32_t>{1, 2}, {2}), "ids", {.requires_grad = true}); },
              "requires_grad needs a float tensor");
  expectError(
      [&] {
        flex_attention_backward(q, k, v, fwd.out, fwd.lse, dout, noop_score(), std::nullopt,
                                {.config = FlexAttentionBackwardConfig{{24, 32, 4, 2}, {32, 32, 4, 2}}});
      },
      "powers of two");
  FlexAttentionGrads g = flex_attention_backward(q, k, v, fwd.out, fwd.lse, dout, noop_score(), std::nullopt,
                                                 {.config = kBwdSmall});
  expectError([&] { g.grad(dsl::capture(Tensor::fromHost(std::vector<float>{1}, {1}), "x")); }, "not a trainable capture");
}

// ---- trainable captures ------------------------------------------------------

namespace {

struct TrainableCase {
  std::string name;
  ScoreMod mod;
  RefScoreFn ref;
  RefScoreGradFn refGrad;
  // Adds dloss/dscore = g at (b, h, q, kv) into the expected gradients.
  std::function<void(std::vector<std::vector<double>>&, double g, int64_t b, int64_t h, int64_t q, int64_t kv)> sink;
  std::vector<size_t> sizes;  // elements of each trainable capture
};

// A bias table [H, L, S], learnable ALiBi slopes [H], and one tensor read twice in one mod.
std::vector<TrainableCase> trainableCases(std::mt19937_64& rng, int64_t H, int64_t L, int64_t S, MemorySpace space) {
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> table(static_cast<size_t>(H * L * S)), slopes(static_cast<size_t>(H)), w(8);
  for (auto& x : table) x = u(rng);
  for (int64_t h = 0; h < H; ++h) slopes[size_t(h)] = std::exp2(-float(h + 1));
  for (auto& x : w) x = u(rng);
  CapturedTensor tableT = dsl::capture(Tensor::fromHost(table, {H, L, S}, space), "bias", {.requires_grad = true});
  CapturedTensor slopesT = dsl::capture(Tensor::fromHost(slopes, {H}, space), "slopes", {.requires_grad = true});
  CapturedTensor wT = dsl::capture(Tensor::fromHost(w, {8}, space), "w", {.requires_grad = true});
  ScoreMod twice("w_q_times_w_kv",
                 [wT](const Tile& s, const Tile&, const Tile&, const Tile& q, const Tile& kv) {
                   return s + wT(q % 8) * wT(kv % 8);
                 },
                 {wT});
  // Read by the mod but not listed with it: the mod finds it by tracing (a capture is declared once).
  CapturedTensor unlistedT = dsl::capture(Tensor::fromHost(w, {8}, space), "w_unlisted", {.requires_grad = true});
  // (A bias by key: one by query would be a row constant, whose gradient the softmax makes 0.)
  ScoreMod unlisted("unlisted_w_kv", [unlistedT](const Tile& s, const Tile&, const Tile&, const Tile&, const Tile& kv) {
    return s + unlistedT(kv % 8);
  });
  return {
      {"a trainable capture the mod does not list", unlisted,
       [w](double s, int64_t, int64_t, int64_t, int64_t kv) { return s + w[size_t(kv % 8)]; },
       nullptr,
       [](std::vector<std::vector<double>>& g, double d, int64_t, int64_t, int64_t, int64_t kv) { g[0][size_t(kv % 8)] += d; },
       {8}},
      {"bias table", bias_table(tableT),
       [table, L, S](double s, int64_t, int64_t h, int64_t q, int64_t kv) {
         return s + table[size_t((h * L + q) * S + kv)];
       },
       nullptr,
       [L, S](std::vector<std::vector<double>>& g, double d, int64_t, int64_t h, int64_t q, int64_t kv) {
         g[0][size_t((h * L + q) * S + kv)] += d;
       },
       {size_t(H * L * S)}},
      {"learnable alibi", alibi(slopesT),
       [slopes](double s, int64_t, int64_t h, int64_t q, int64_t kv) { return s + slopes[size_t(h)] * double(kv - q); },
       nullptr,
       [](std::vector<std::vector<double>>& g, double d, int64_t, int64_t h, int64_t q, int64_t kv) {
         g[0][size_t(h)] += d * double(kv - q);
       },
       {size_t(H)}},
      {"one tensor read twice", twice,
       [w](double s, int64_t, int64_t, int64_t q, int64_t kv) { return s + w[size_t(q % 8)] * w[size_t(kv % 8)]; },
       nullptr,
       [w](std::vector<std::vector<double>>& g, double d, int64_t, int64_t, int64_t q, int64_t kv) {
         g[0][size_t(q % 8)] += d * w[size_t(kv % 8)];
         g[0][size_t(kv % 8)] += d * w[size_t(q % 8)];
       },
       {8}},
  };
}

}  // namespace

TEST(FlexAttentionBackward, TrainableCapturesGetTheirGradients) {
  SeededRandom rng;
  for (bool deterministic : {false, true})
    for (auto [B, Hq, Hkv, L, S, dt] : {std::tuple{2, 4, 1, 45, 50, DType::F32}, std::tuple{1, 2, 2, 70, 33, DType::BF16}}) {
      for (TrainableCase& tc : trainableCases(rng, Hq, L, S, kHost)) {
        AttentionCase c{.B = B, .Hq = Hq, .Hkv = Hkv, .L = L, .S = S, .D = 32, .dtype = dt,
                        .context = tc.name + (deterministic ? " deterministic" : "")};
        std::vector<std::vector<double>> expected;
        for (size_t n : tc.sizes) expected.emplace_back(n, 0.0);
        BackwardCheck check = small(refCausal());
        check.refScore = tc.ref;
        check.refScoreGrad = tc.refGrad;
        check.options.deterministic = deterministic;
        check.sink = [&](double g, double, int64_t b, int64_t h, int64_t q, int64_t kv) { tc.sink(expected, g, b, h, q, kv); };
        check.expectedCaptureGrads = &expected;
        if (!checkBackward(rng, c, kHost, tc.mod, causalBlockMask(1, 1, L, S, kMaskBlocks), check)) return;
      }
    }
}

// dq_accumulation = Atomic: dQ summed by the dkdv programs (dS·K, atomic adds into f32, then a
// cast) against the same float64 reference: every variant, GQA 4:1 and MQA, ragged lengths, fully
// masked rows, keys past the length, a trainable capture, the default config and a small one.
TEST(FlexAttentionBackward, AtomicDqMatchesTheReference) {
  SeededRandom rng;
  checkEveryVariant(rng, DqAccumulation::Atomic, "atomic dQ, ");
  if (::testing::Test::HasFailure()) return;
  MaskMod firstRowsBlind("first_40_rows_blind",
                         [](const Tile&, const Tile&, const Tile& q, const Tile& kv) { return (q >= 40) & (kv <= q - 40); });
  AttentionCase c{.B = 1, .Hq = 8, .Hkv = 2, .L = 70, .S = 70, .D = 64, .dtype = DType::BF16,
                  .context = "atomic dQ, first 40 rows blind"};
  BackwardCheck blind = small([](int64_t, int64_t, int64_t q, int64_t kv) { return q >= 40 && kv <= q - 40; });
  blind.options.dq_accumulation = DqAccumulation::Atomic;
  if (!checkBackward(rng, c, kHost, noop_score(), createBlockMask(firstRowsBlind, 1, 1, 70, 70, kMaskBlocks, kHost),
                     blind))
    return;
  for (int64_t L : {1, 129}) {
    AttentionCase d{.B = 1, .Hq = 2, .Hkv = 1, .L = L, .S = 129, .D = 32, .dtype = DType::BF16,
                    .context = "atomic dQ, causal, default config"};
    BackwardCheck check;
    check.refMask = refCausal();
    check.options.dq_accumulation = DqAccumulation::Atomic;
    if (!checkBackward(rng, d, kHost, noop_score(), causalBlockMask(1, 1, L, 129), check)) return;
  }
  for (TrainableCase& tc : trainableCases(rng, 2, 45, 50, kHost)) {
    AttentionCase t{.B = 2, .Hq = 2, .Hkv = 1, .L = 45, .S = 50, .D = 32, .dtype = DType::F32,
                    .context = "atomic dQ, " + tc.name};
    std::vector<std::vector<double>> expected;
    for (size_t n : tc.sizes) expected.emplace_back(n, 0.0);
    BackwardCheck check = small(refCausal());
    check.refScore = tc.ref;
    check.refScoreGrad = tc.refGrad;
    check.options.dq_accumulation = DqAccumulation::Atomic;
    check.sink = [&](double g, double, int64_t b, int64_t h, int64_t q, int64_t kv) { tc.sink(expected, g, b, h, q, kv); };
    check.expectedCaptureGrads = &expected;
    if (!checkBackward(rng, t, kHost, tc.mod, causalBlockMask(1, 1, 45, 50, kMaskBlocks), check)) return;
  }
}

// Atomic dQ runs dkdv and a cast, no dq kernel; it refuses `deterministic`.
TEST(FlexAttentionBackward, AtomicDqLaunchesNoDqKernelAndIsNotDeterministic) {
  Tensor q = Tensor::empty(DType::BF16, {1, 2, 64, 64}, kHost), k = Tensor::empty(DType::BF16, {1, 1, 64, 64}, kHost);
  Tensor lse = Tensor::empty(DType::F32, {1, 2, 64}, kHost);
  FlexAttentionBackwardOptions o{.dq_accumulation = DqAccumulation::Atomic};
  FlexAttentionBackwardPlan plan = plan_flex_attention_backward(q, k, k, q, lse, q, noop_score(), std::nullopt, o,
                                                                codegen::Target::sm90a());
  ASSERT_EQ(plan.kernelNames.size(), 3u);
  EXPECT_NE(plan.kernelNames[1].find("dkdv"), std::string::npos) << plan.kernelNames[1];
  EXPECT_NE(plan.kernelNames[2].find("cast_dq"), std::string::npos) << plan.kernelNames[2];
  // sm_90a: a step's dQ tile is TMA reductions of its panels (the bulk-reduce pass: the template
  // names the tile as a box of the sums), one thread issuing them; with
  // FLEXTILE_BULK_TENSOR=0 each row is one bulk reduction; sm_80: one atomic per element.
  const std::string& ptx = plan.compiled[1]->ptx;
  EXPECT_EQ(count(ptx, "cp\\.reduce\\.async\\.bulk\\.tensor\\.3d\\.global\\.shared::cta\\.add\\.tile\\.bulk_group"), 8)
      << "64 columns of the mma accumulator: eight 32-byte panels (codegen::bulkTensorStaging)";
  EXPECT_EQ(ptx.find("cp.reduce.async.bulk.global"), std::string::npos);
  EXPECT_EQ(ptx.find("atom.global.add.f32"), std::string::npos);
  {
    ScopedSetenv rows("FLEXTILE_BULK_TENSOR", "0");
    const std::string byRows =
        plan_flex_attention_backward(q, k, k, q, lse, q, noop_score(), std::nullopt, o, codegen::Target::sm90a())
            .compiled[1]
            ->ptx;
    EXPECT_NE(byRows.find("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"), std::string::npos);
    EXPECT_EQ(byRows.find("cp.reduce.async.bulk.tensor"), std::string::npos);
  }
  EXPECT_NE(plan_flex_attention_backward(q, k, k, q, lse, q, noop_score(), std::nullopt, o, codegen::Target::sm80())
                .compiled[1]
                ->ptx.find("atom.global.add.f32"),
            std::string::npos);
  // The sums are the template's own buffer (private_params), so the atomics leave the loop's
  // loads pipelined and its ring products on wgmma.
  EXPECT_NE(plan.compiled[1]->ir.find("local_alloc"), std::string::npos) << "the dkdv loop is not pipelined";
  EXPECT_NE(plan.compiled[1]->ptx.find("wgmma.mma_async"), std::string::npos);
  // dS·K too: K is read from a resident one-slot buffer as B (wgmmaResidentB), so nothing in
  // the kernel is left on mma.sync.
  EXPECT_EQ(plan.compiled[1]->ptx.find("mma.sync"), std::string::npos);
  if (codegen::findPtxas()) {
    codegen::PtxasReport r = codegen::runPtxas(plan.compiled[1]->ptx, codegen::Target::sm90a());
    EXPECT_LE(r.spillStoreBytes, 64) << r.log;
  }
  o.deterministic = true;
  try {
    plan_flex_attention_backward(q, k, k, q, lse, q, noop_score(), std::nullopt, o, codegen::Target::sm90a());
    FAIL() << "deterministic atomic dQ was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dq_accumulation = Atomic"), std::string::npos) << e.what();
  }
}

// Independent of the analytic reference: central differences in float64 of
// loss = sum(dout * out) through the forward, for soft-cap (d/dq) and a captured bias (d/dbias).
TEST(FlexAttentionBackward, FiniteDifferences) {
  SeededRandom rng;
  const int64_t B = 1, H = 1, L = 9, S = 11, D = 16;
  Tensor q = randomTensor(rng, DType::F32, {B, H, L, D}, kHost), k = randomTensor(rng, DType::F32, {B, H, S, D}, kHost);
  Tensor v = randomTensor(rng, DType::F32, {B, H, S, D}, kHost), dout = randomTensor(rng, DType::F32, {B, H, L, D}, kHost);
  std::vector<float> table(size_t(L * S));
  for (auto& x : table) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  CapturedTensor bias = dsl::capture(Tensor::fromHost(table, {L, S}, kHost), "bias", {.requires_grad = true});
  const double cap = 0.7;  // small, so tanh bends
  BlockMask mask = causalBlockMask(1, 1, L, S, {16, 16});
  const FlexAttentionConfig fc{16, 16, 1, 1};
  const FlexAttentionBackwardConfig bc{fc, fc};
  const std::vector<double> dO = toDoubles(dout);
  // loss(q, table) in float64 through the reference forward, the mods written in C++.
  auto loss = [&](const Tensor& qq, const std::vector<float>& t, bool softcap) {
    RefScoreFn score = softcap ? RefScoreFn([cap](double s, int64_t, int64_t, int64_t, int64_t) { return cap * std::tanh(s / cap); })
                               : RefScoreFn([&t](double s, int64_t, int64_t, int64_t q, int64_t kv) { return s + t[size_t(q * S + kv)]; });
    ReferenceResult r = referenceAttention(qq, k, v, score, refCausal(), 1.0 / std::sqrt(double(D)));
    double sum = 0;
    for (size_t i = 0; i < r.out.size(); ++i) sum += r.out[i] * dO[i];
    return sum;
  };
  for (bool softcap : {true, false}) {
    SCOPED_TRACE(softcap ? "soft-cap, d/dq" : "bias, d/dbias");
    ScoreMod mod = softcap ? soft_cap(cap) : bias_table(bias);
    FlexAttentionResult fwd = flex_attention(q, k, v, mod, mask, {.return_lse = true, .config = fc});
    FlexAttentionGrads g = flex_attention_backward(q, k, v, fwd.out, fwd.lse, dout, mod, mask, {.config = bc});
    const double h = 1e-3;
    if (softcap) {
      const std::vector<float> q0 = q.toHost<float>();
      const std::vector<float> dq = g.dq.toHost<float>();
      for (size_t i = 0; i < q0.size(); i += 7) {
        std::vector<float> qp = q0, qm = q0;
        qp[i] += float(h), qm[i] -= float(h);
        const double fd = (loss(Tensor::fromHost(qp, q.shape()), table, true) -
                           loss(Tensor::fromHost(qm, q.shape()), table, true)) / (double(qp[i]) - double(qm[i]));
        EXPECT_NEAR(dq[i], fd, 2e-3 + 2e-3 * std::abs(fd)) << "dq[" << i << "]";
      }
    } else {
      const std::vector<float> db = g.grad(bias).toHost<float>();
      for (size_t i = 0; i < table.size(); i += 3) {
        std::vector<float> tp = table, tm = table;
        tp[i] += float(h), tm[i] -= float(h);
        const double fd = (loss(q, tp, false) - loss(q, tm, false)) / (double(tp[i]) - double(tm[i]));
        EXPECT_NEAR(db[i], fd, 2e-3 + 2e-3 * std::abs(fd)) << "dbias[" << i << "]";
      }
    }
  }
}

// A score_mod that ignores the score (here: computes from it, then drops it) has a zero
// derivative: dq and dk are exactly 0, dv is the softmax of the positions times dout.
TEST(FlexAttentionBackward, AModThatIgnoresTheScore) {
  SeededRandom rng;
  ScoreMod positional("positional", [](const Tile& s, const Tile&, const Tile&, const Tile& q, const Tile& kv) {
    Tile unused = tanh(s) * 3.0;  // traced, then dead: the result does not depend on s
    (void)unused;
    return (kv - q).to(DType::F32) * 0.1;
  });
  AttentionCase c{.B = 1, .Hq = 2, .Hkv = 1, .L = 40, .S = 45, .D = 32, .dtype = DType::F32, .context = "ignores s"};
  BackwardCheck check = small(refCausal());
  check.refScore = [](double, int64_t, int64_t, int64_t q, int64_t kv) { return 0.1 * double(kv - q); };
  check.refScoreGrad = [](double, int64_t, int64_t, int64_t, int64_t) { return 0.0; };
  if (!checkBackward(rng, c, kHost, positional, causalBlockMask(1, 1, 40, 45, kMaskBlocks), check)) return;
  Tensor q = randomTensor(rng, DType::F32, {1, 2, 40, 32}, kHost), k = randomTensor(rng, DType::F32, {1, 1, 45, 32}, kHost);
  Tensor v = randomTensor(rng, DType::F32, {1, 1, 45, 32}, kHost), dout = randomTensor(rng, DType::F32, {1, 2, 40, 32}, kHost);
  BlockMask mask = causalBlockMask(1, 1, 40, 45, kMaskBlocks);
  FlexAttentionResult fwd = flex_attention(q, k, v, positional, mask, {.return_lse = true, .config = kFwdSmall});
  FlexAttentionGrads g = flex_attention_backward(q, k, v, fwd.out, fwd.lse, dout, positional, mask, {.config = kBwdSmall});
  for (float x : g.dq.toHost<float>()) ASSERT_EQ(x, 0.0f);
  for (float x : g.dk.toHost<float>()) ASSERT_EQ(x, 0.0f);
}

// Regression (LeakSanitizer): the kernels flex_attention and flex_attention_backward trace are
// kept in the mask mod's state, and their tracers held the mod itself — a cycle that kept every
// fresh mod, its captured tensors and its kernels alive for ever. Now the tracers hold a detached
// copy: when the last handle goes, the captured tensor goes too.
// A long-lived mask used with a fresh score mod per call (one per request in a server): each call's
// kernels (forward and backward, kept in the mask mod's state) go with their score mod, so the mask
// keeps a bounded number, and a gone score mod's captured tensors are freed. Before, every score
// mod and its kernels stayed alive with the mask for the life of the process. The bodies alternate,
// so a kernel found under a reused address would give the other body's result.
TEST(FlexAttentionBackward, FreshScoreModsPerCallKeepTheMasksKernelsBounded) {
  SeededRandom rng;
  const int64_t B = 1, H = 2, L = 37, S = 41, D = 16;
  const BlockMask mask = causalBlockMask(1, 1, L, S, kMaskBlocks, kHost);
  const Tensor q = randomTensor(rng, DType::F32, {B, H, L, D}, kHost), k = randomTensor(rng, DType::F32, {B, H, S, D}, kHost);
  const Tensor v = randomTensor(rng, DType::F32, {B, H, S, D}, kHost);
  std::vector<std::weak_ptr<dsl::CaptureSlot>> slots;
  // The causal mask mod is shared by every causal mask of the process: kernels of earlier callers
  // whose score mods still live (noop_score's, when tests share a process) stay in its state.
  const size_t before = mask.maskMod().state().kernels.size();
  size_t most = 0;
  for (int call = 0; call < 8; ++call) {
    std::vector<float> slopes(static_cast<size_t>(H), 0.0f);
    for (float& x : slopes) x = std::uniform_real_distribution<float>(-0.5f, 0.5f)(rng);
    const double cap = 0.5 + call;
    CapturedTensor captured = dsl::capture(Tensor::fromHost(slopes, {H}, kHost), "slopes");
    slots.push_back(captured.slot());
    const ScoreMod sm = call % 2 ? alibi(captured) : soft_cap(cap);
    const RefScoreFn ref = call % 2 ? RefScoreFn([slopes](double x, int64_t, int64_t h, int64_t qi, int64_t kv) {
                                        return x + double(slopes[size_t(h)]) * double(kv - qi);
                                      })
                                    : RefScoreFn([cap](double x, int64_t, int64_t, int64_t, int64_t) {
                                        return cap * std::tanh(x / cap);
                                      });
    captured = CapturedTensor();
    FlexAttentionResult fwd = flex_attention(q, k, v, sm, mask, {.return_lse = true, .config = kFwdSmall});
    (void)flex_attention_backward(q, k, v, fwd.out, fwd.lse, q, sm, mask, {.config = kBwdSmall});
    const ReferenceResult want = referenceAttention(q, k, v, ref, refCausal(), 1.0 / std::sqrt(double(D)));
    const std::vector<float> got = fwd.out.toHost<float>();
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - want.out[i]));
    EXPECT_LT(worst, 1e-4) << "call " << call << " (" << sm.name() << ")";
    most = std::max(most, mask.maskMod().state().kernels.size());
  }
  // The forward and the two backward kernels of the live score mod, and those of the one before it
  // (dropped at the next insertion).
  EXPECT_LE(most, before + 6u);
  for (size_t i = 1; i + 1 < slots.size(); i += 2)  // the alibi calls: their mods hold the slopes
    EXPECT_TRUE(slots[i].expired()) << "call " << i << "'s captured slopes outlived its score mod";
}

TEST(FlexAttentionBackward, AModAndItsKernelsAreFreedWithItsLastHandle) {
  SeededRandom rng;
  std::weak_ptr<dsl::CaptureSlot> slot;
  {
    std::vector<int32_t> ids(40);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i / 13);
    CapturedTensor docs = dsl::capture(Tensor::fromHost(ids, {40}, kHost), "doc_ids");
    slot = docs.slot();
    MaskMod sameDoc("same_doc", [docs](const Tile&, const Tile&, const Tile& q, const Tile& kv) {
      return docs(q) == docs(kv);
    }, {docs});
    BlockMask mask = createBlockMask(sameDoc, 1, 1, 40, 40, kMaskBlocks, kHost);
    Tensor q = randomTensor(rng, DType::F32, {1, 1, 40, 16}, kHost);
    FlexAttentionResult fwd = flex_attention(q, q, q, noop_score(), mask, {.return_lse = true, .config = kFwdSmall});
    flex_attention_backward(q, q, q, fwd.out, fwd.lse, q, noop_score(), mask, {.config = kBwdSmall});
    EXPECT_FALSE(slot.expired());
  }
  EXPECT_TRUE(slot.expired()) << "the mask mod (and the kernels traced with it) outlived its last handle";
}

// dkdv on 8 warps with 64 keys a program: Sᵀ and dPᵀ (64 rows) and dK and dV (64 rows, D columns)
// run as two warpgroups that each take half of N (Layout::wgmmaAccumulator), so dK and dV at D = 256
// fit in registers; Pᵀ and dSᵀ reach the next products' A through a staged shared tile. After
// sm_90a's passes on the interpreter, unspecialized and with the producer warpgroup, beside the
// specialized dq; keys off the block, masked rows, GQA.
TEST(FlexAttentionBackward, WarpgroupsSplittingNAgreeWithTheReference) {
  SeededRandom rng;
  InterpretAfterPasses scope("sm_90a");
  const auto ws = WarpSpecialization::On;
  size_t index = 0;
  // (At 192, split 128 + 64, the 64-column chunk's dK cannot be halved: both warpgroups compute it.)
  for (HeadDims dims : {HeadDims{256, 256}, HeadDims{256, 128}, HeadDims{128, 128}, HeadDims{192, 128}, HeadDims{96, 96}})
    for (const FlexAttentionBackwardConfig& config :
         {FlexAttentionBackwardConfig{{64, 64, 8, 2}, {64, 64, 4, 2}},
          FlexAttentionBackwardConfig{{32, 64, 8, 2, ws}, {128, 64, 8, 2, ws}}}) {
      if (!runsInThisBuild(rng.seed(), index++, 5)) continue;  // under the sanitizers two pairs of ten a run
      if (!checkBackwardVariantsAt(rng, "sm_90a " + dims.describe() + " " + config.describe(), dims, 140, 130, 128,
                                   FlexAttentionConfig{64, 64, 4, 2}, {.config = config}))
        return;
    }
  // The atomic dQ past D = 128: dkdv adds dQ, so the split warpgroups' dQ rows go through it (the
  // default dkdv there, unspecialized with atomic dQ).
  for (HeadDims dims : {HeadDims{192, 128}, HeadDims{256, 256}}) {
    if (!runsInThisBuild(rng.seed(), index++, 2)) continue;
    if (!checkBackwardVariantsAt(rng, "sm_90a atomic dQ " + dims.describe(), dims, 140, 130, 128,
                                 FlexAttentionConfig{64, 64, 4, 2},
                                 {.dq_accumulation = DqAccumulation::Atomic,
                                  .config = FlexAttentionBackwardConfig{{64, 64, 8, 2}, {64, 64, 4, 2}}}))
      return;
  }
}
