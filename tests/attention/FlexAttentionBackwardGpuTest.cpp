// flex_attention_backward on the GPU (label gpu; every test skips without one): every variant
// with captures and lists on the device, GQA and MQA, lengths around the blocks up to 1000,
// fully masked rows, trainable captures, the configs of the bench, and bitwise determinism.
// Budget (gpu/TestBudget.h, docs/testing.md): every shape and variant runs each time, with a
// random sample of the configs (all of them with FLEXTILE_GPU_TESTS_FULL=1).
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstring>

#include "FlexAttentionBackwardCheck.h"
#include "ListTensorMaskCheck.h"
#include "MaskTestUtil.h"
#include "attention_templates/Variants.h"
#include "gpu/GpuTest.h"
#include "runtime/Device.h"

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

constexpr MemorySpace kDevice = MemorySpace::Device;

const std::vector<std::optional<FlexAttentionBackwardConfig>> kConfigs = {
    std::nullopt, FlexAttentionBackwardConfig{{32, 128, 8, 2}, {128, 64, 8, 2}},
    FlexAttentionBackwardConfig{{16, 64, 4, 3}, {64, 32, 4, 3}}};

BackwardCheck withConfig(const std::optional<FlexAttentionBackwardConfig>& c, const VariantInstance& inst) {
  BackwardCheck b;
  b.refScore = inst.refScore;
  b.refScoreGrad = inst.refScoreGrad;
  b.refMask = inst.refMask;
  b.options.config = c;
  return b;
}

}  // namespace

TEST(FlexAttentionBackwardGpu, LengthsGqaAndMqa) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const int64_t lengths[] = {1, 3, 127, 128, 129, 1000};
  int i = 0;
  for (int64_t L : lengths)
    for (int64_t S : {int64_t(3), int64_t(129), int64_t(1000)}) {
      const bool mqa = i % 2;
      AttentionCase c{.B = 1, .Hq = 8, .Hkv = mqa ? 1 : 2, .L = L, .S = S, .D = i % 3 ? 128 : 64,
                      .dtype = i % 2 ? DType::BF16 : DType::F16, .context = mqa ? "softcap MQA" : "softcap GQA 4:1"};
      ++i;
      if (!inScope(c.work())) continue;
      VariantInstance inst = variant("softcap").make({c.B, c.Hq, L, S, kDevice, BlockSizes{}, rng()});
      if (!checkBackward(rng, c, kDevice, inst.score, inst.mask, withConfig(std::nullopt, inst))) return;
    }
}

namespace {
// `var`, the `index`-th of variants(), with dQ summed as `dq`, at each (L, S) of `lengths` and each
// of `configs`: the cases alternate GQA 4:1 and MQA, f16 and bf16, and take D = 64 every third,
// counted over the variants in order. False once a check failed. The caller holds the Variant: variants() returns a copy, and a reference into
// that temporary dangled here once (every backward EveryVariant test failed with bad_alloc on
// the GPU, 2026-12-06).
bool checkVariant(SeededRandom& rng, const std::string& what, const Variant& var, size_t index,
                  const std::vector<std::pair<int64_t, int64_t>>& lengths,
                  const std::vector<std::optional<FlexAttentionBackwardConfig>>& configs, DqAccumulation dq) {
  int i = int(index * lengths.size());
  for (auto [L, S] : lengths) {
    const bool mqa = i % 2;
    AttentionCase c{.B = 2, .Hq = 8, .Hkv = mqa ? 1 : 2, .L = L, .S = S, .D = i % 3 ? 128 : 64,
                    .dtype = i % 2 ? DType::BF16 : DType::F16,
                    .context = what + " " + var.name + (mqa ? " MQA" : " GQA 4:1")};
    ++i;
    if (!inScope(c.work())) continue;
    VariantInstance inst = var.make({c.B, c.Hq, L, S, kDevice, BlockSizes{}, rng()});
    for (const auto& config : configs) {
      BackwardCheck check = withConfig(config, inst);
      check.options.dq_accumulation = dq;
      if (!checkBackward(rng, c, kDevice, inst.score, inst.mask, check)) return false;
    }
  }
  return true;
}
}  // namespace

// The backward's schedules over every variant, one test a variant
// (EveryVariant/FlexAttentionBackwardGpuSchedule.<schedule>/<variant>), so that the GPU suite's
// dealing evens them out (as one test each they took 28-46 s); each variant keeps the case mix it
// had in the whole sweep (checkVariant counts the cases over the variants in order).
class FlexAttentionBackwardGpuSchedule : public ::testing::TestWithParam<std::string> {
 protected:
  void check(const std::string& what, const std::vector<std::pair<int64_t, int64_t>>& lengths,
             const std::vector<std::optional<FlexAttentionBackwardConfig>>& configs, DqAccumulation dq) {
    SeededRandom rng;
    const std::vector<std::string> names = variantNames();
    const size_t index = size_t(std::find(names.begin(), names.end(), GetParam()) - names.begin());
    checkVariant(rng, what, variant(GetParam()), index, lengths, configs, dq);
  }
};
INSTANTIATE_TEST_SUITE_P(EveryVariant, FlexAttentionBackwardGpuSchedule, ::testing::ValuesIn(variantNames()),
                         variantParamName);

// Every variant at shapes off the block (GQA, MQA, f16, bf16, f32, D 64 to 256), each shape at one
// of the configs sampled in turn (f32 and D > 128 at their defaults).
TEST_P(FlexAttentionBackwardGpuSchedule, ShapesAndConfigs) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const Variant& var = variant(GetParam());
  const AttentionCase shapes[] = {
      {.B = 1, .Hq = 4, .Hkv = 1, .L = 129, .S = 127, .D = 64, .dtype = DType::BF16},
      {.B = 2, .Hq = 4, .Hkv = 2, .L = 300, .S = 300, .D = 128, .dtype = DType::BF16},
      {.B = 1, .Hq = 2, .Hkv = 2, .L = 200, .S = 77, .D = 96, .dtype = DType::F16},
      {.B = 1, .Hq = 2, .Hkv = 1, .L = 100, .S = 130, .D = 64, .dtype = DType::F32},
      {.B = 1, .Hq = 2, .Hkv = 1, .L = 150, .S = 140, .D = 256, .dtype = DType::F16},
  };
  ConfigSample configs(kConfigs, 1, rng);
  const std::vector<std::optional<FlexAttentionBackwardConfig>> defaultOnly{std::nullopt};
  for (AttentionCase c : shapes) {
    if (!inScope(c.work())) continue;
    // f32 and D > 128 run their defaults only.
    for (const auto& config : c.dtype == DType::F32 || c.D > 128 ? defaultOnly : configs.next()) {
      c.context = "variant " + var.name;
      VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kDevice, BlockSizes{}, rng()});
      if (!checkBackward(rng, c, kDevice, inst.score, inst.mask, withConfig(config, inst))) return;
    }
  }
}

// dq_accumulation = Atomic on the GPU: f32 atomics from the dkdv programs, then the cast; GQA 4:1
// and MQA, lengths around the blocks, the default and a wide dkdv tile.
TEST_P(FlexAttentionBackwardGpuSchedule, AtomicDq) {
  FLEXTILE_REQUIRE_GPU();
  check("atomic dQ", {{129, 1000}, {1000, 129}}, {std::nullopt, kConfigs[1]}, DqAccumulation::Atomic);
}

// Atomic dQ from the specialized dkdv (64 queries x 128 keys, a producer warpgroup), opt-in with
// FLEXTILE_TMA_IN_STAGING_LOOPS=1: dQᵀ = Kᵀ dSᵀ on wgmma with Kᵀ read M-major and dSᵀ staged in
// shared memory every step, beside the TMA rings (TilePassesInterpreted.BackwardAtomicDqSpecialized
// runs the same IR in the interpreter). D 128 (wgmma) and 64 (mma.sync for dQᵀ).
TEST_P(FlexAttentionBackwardGpuSchedule, SpecializedAtomicDq) {
  FLEXTILE_REQUIRE_GPU();
  ScopedSetenv staging("FLEXTILE_TMA_IN_STAGING_LOOPS", "1");
  check("specialized atomic dQ", {{129, 1000}, {1000, 333}},
        {FlexAttentionBackwardConfig{{64, 128, 8, 2, WarpSpecialization::On}, {64, 64, 4, 2}}}, DqAccumulation::Atomic);
}

// dkdv on two warpgroups of 64 keys that split N (Layout::wgmmaAccumulator): each warpgroup's
// wgmma reads its share of B at an offset into the ring slot (K-major Qᵀ and dOᵀ by rows, N-major Q
// and dO by panels) and writes its columns of dK and dV; Pᵀ and dSᵀ staged in shared memory as A.
// D = V = 256, 256 / 128, 128 and MLA's 192 / 128 (whose 64-column chunk of dK both warpgroups
// compute); GQA, lengths off the blocks; unspecialized and with the producer warpgroup.
TEST_P(FlexAttentionBackwardGpuSchedule, WarpgroupsSplittingN) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const Variant& var = variant(GetParam());
  const auto ws = WarpSpecialization::On;
  // One config a shape, dealt in turn (all of them with FLEXTILE_GPU_TESTS_FULL=1); dq on 8 warps
  // splits N too at D = 256.
  ConfigSample<FlexAttentionBackwardConfig> configs({{{64, 64, 8, 2}, {64, 64, 8, 2}},
                                                     {{64, 64, 8, 2, ws}, {64, 64, 4, 2}},
                                                     {{32, 64, 8, 2, ws}, {128, 64, 8, 2, ws}}},
                                                    1, rng);
  const AttentionCase shapes[] = {
      {.B = 1, .Hq = 4, .Hkv = 2, .L = 150, .S = 300, .D = 256, .dtype = DType::BF16},
      {.B = 1, .Hq = 4, .Hkv = 1, .L = 333, .S = 129, .D = 256, .dtype = DType::F16, .DV = 128},
      {.B = 2, .Hq = 4, .Hkv = 2, .L = 200, .S = 259, .D = 128, .dtype = DType::BF16},
      {.B = 1, .Hq = 4, .Hkv = 2, .L = 260, .S = 200, .D = 192, .dtype = DType::BF16, .DV = 128},
  };
  for (AttentionCase c : shapes)
    for (const FlexAttentionBackwardConfig& config : configs.next()) {
      c.context = "variant " + var.name + " " + config.describe();
      VariantInstance inst = var.make({c.B, c.Hq, c.L, c.S, kDevice, BlockSizes{}, rng()});
      if (!checkBackward(rng, c, kDevice, inst.score, inst.mask, withConfig(config, inst))) return;
    }
}

// The tiles handed out heaviest first (FLEXTILE_TILE_ORDER=1): dkdv's key tiles and dq's query
// tiles read from orders made on the host, the default config and the specialized one. A tile
// computed twice and another never shows as poisoned gradients.
TEST_P(FlexAttentionBackwardGpuSchedule, TilesHeaviestFirst) {
  FLEXTILE_REQUIRE_GPU();
  flextile::testing::ScopedSetenv ordered("FLEXTILE_TILE_ORDER", "1");
  FlexAttentionConfig dkdv{64, 128, 8, 2, WarpSpecialization::On}, dq{128, 64, 8, 2, WarpSpecialization::On};
  check("backward, tiles heaviest first", {{129, 1000}, {1000, 333}}, {std::nullopt, FlexAttentionBackwardConfig{dkdv, dq}},
        DqAccumulation::Separate);
}

// The backward's walks on a ring each (FLEXTILE_SHARE_RINGS=0; the default shares one set between
// them, which every other backward test runs): dkdv's and dq's full and partial walks, at the
// specialized config.
TEST_P(FlexAttentionBackwardGpuSchedule, RingsThatOutliveTheirLoop) {
  FLEXTILE_REQUIRE_GPU();
  if (runtime::Device::current().capabilityMajor() < 9) GTEST_SKIP() << "TMA rings need sm_90a";
  flextile::testing::ScopedSetenv on("FLEXTILE_SHARE_RINGS", "0");
  FlexAttentionConfig dkdv{64, 128, 8, 2, WarpSpecialization::On}, dq{128, 64, 8, 2, WarpSpecialization::On};
  check("backward, FLEXTILE_SHARE_RINGS=0", {{129, 1000}, {1000, 333}}, {FlexAttentionBackwardConfig{dkdv, dq}},
        DqAccumulation::Separate);
}

// Warpgroup turns (config `turns`, pass "pingpong") in the specialized dkdv and dq: the two
// consumer warpgroups take turns issuing each step's first products. One test a variant
// (EveryVariant/FlexAttentionBackwardGpuTurns.EachVariant/<variant>), lengths off the blocks, GQA
// and MQA, D 128 and 64 — as one test it stalled three times under the parallel suite, each time in
// the document variant (dkdv's turns closed and reopened once a head: the close's handshake since,
// confirmed on an H100 2026-12-06), and one variant alone is what scripts/gpu_stress_turns.sh repeats.
class FlexAttentionBackwardGpuTurns : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(EveryVariant, FlexAttentionBackwardGpuTurns, ::testing::ValuesIn(variantNames()), variantParamName);

TEST_P(FlexAttentionBackwardGpuTurns, EachVariant) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  FlexAttentionConfig dkdv{64, 128, 8, 2, WarpSpecialization::On}, dq{128, 64, 8, 2, WarpSpecialization::On};
  dkdv.turns = dq.turns = LoopSchedule::On;
  const std::vector<std::string> names = variantNames();
  const size_t index = size_t(std::find(names.begin(), names.end(), GetParam()) - names.begin());
  checkVariant(rng, "backward turns", variant(GetParam()), index, {{129, 1000}, {1000, 333}}, {FlexAttentionBackwardConfig{dkdv, dq}},
               DqAccumulation::Separate);
}

TEST(FlexAttentionBackwardGpu, FullyMaskedRowsAndMaskAlgebra) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  MaskMod blind("every_third_row_blind", [](const Tile&, const Tile&, const Tile& q, const Tile& kv) {
    return (q % 3 != 0) & (kv <= q - 40);
  });
  AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 333, .S = 333, .D = 128, .dtype = DType::BF16, .context = "blind rows"};
  BackwardCheck check;
  check.refMask = [](int64_t, int64_t, int64_t q, int64_t kv) { return q % 3 != 0 && kv <= q - 40; };
  if (!checkBackward(rng, c, kDevice, noop_score(), createBlockMask(blind, 1, 1, 333, 333, {128, 128}, kDevice), check))
    return;
  for (const MaskCombo& combo : maskAlgebraCombos(rng, 2, 2, 400, 4, kDevice, 8)) {
    AttentionCase mc{.B = 2, .Hq = 2, .Hkv = 1, .L = 400, .S = 400, .D = 64, .dtype = DType::F16, .context = combo.name};
    BackwardCheck mcheck;
    mcheck.refMask = combo.ref;
    if (!checkBackward(rng, mc, kDevice, noop_score(),
                       createBlockMask(combo.mod, combo.maskB, combo.maskH, 400, 400, {128, 128}, kDevice), mcheck))
      return;
  }
}

TEST(FlexAttentionBackwardGpu, TrainableBiasAndSlopes) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const int64_t B = 2, H = 4, L = 257, S = 300;
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> table(static_cast<size_t>(H * L * S)), slopes(static_cast<size_t>(H));
  for (auto& x : table) x = u(rng);
  for (int64_t h = 0; h < H; ++h) slopes[size_t(h)] = std::exp2(-float(h + 1));
  CapturedTensor tableT = dsl::capture(Tensor::fromHost(table, {H, L, S}, kDevice), "bias", {.requires_grad = true});
  CapturedTensor slopesT = dsl::capture(Tensor::fromHost(slopes, {H}, kDevice), "slopes", {.requires_grad = true});
  for (bool deterministic : {false, true}) {
    {
      std::vector<std::vector<double>> expected{std::vector<double>(table.size(), 0.0)};
      AttentionCase c{.B = B, .Hq = H, .Hkv = 2, .L = L, .S = S, .D = 64, .dtype = DType::BF16, .context = "bias table"};
      BackwardCheck check;
      check.refMask = refCausal();
      check.refScore = [&](double s, int64_t, int64_t h, int64_t q, int64_t kv) { return s + table[size_t((h * L + q) * S + kv)]; };
      check.sink = [&](double g, double, int64_t, int64_t h, int64_t q, int64_t kv) { expected[0][size_t((h * L + q) * S + kv)] += g; };
      check.expectedCaptureGrads = &expected;
      check.options.deterministic = deterministic;
      if (!checkBackward(rng, c, kDevice, bias_table(tableT), causalBlockMask(1, 1, L, S), check)) return;
    }
    {
      std::vector<std::vector<double>> expected{std::vector<double>(slopes.size(), 0.0)};
      AttentionCase c{.B = B, .Hq = H, .Hkv = 1, .L = L, .S = S, .D = 128, .dtype = DType::F16, .context = "alibi slopes"};
      BackwardCheck check;
      check.refMask = refCausal();
      check.refScore = [&](double s, int64_t, int64_t h, int64_t q, int64_t kv) { return s + slopes[size_t(h)] * double(kv - q); };
      check.sink = [&](double g, double, int64_t, int64_t h, int64_t q, int64_t kv) { expected[0][size_t(h)] += g * double(kv - q); };
      check.expectedCaptureGrads = &expected;
      check.options.deterministic = deterministic;
      if (!checkBackward(rng, c, kDevice, alibi(slopesT), causalBlockMask(1, 1, L, S), check)) return;
    }
  }
}

// dq, dk, dv are deterministic in every mode; captured gradients with `deterministic`.
TEST(FlexAttentionBackwardGpu, DeterministicIsBitwiseIdentical) {
  FLEXTILE_REQUIRE_GPU();
  FLEXTILE_SKIP_WHEN_SMALL("only L=1000 with 8 heads");
  SeededRandom rng;
  const int64_t B = 2, H = 8, L = 1000, D = 128;
  std::vector<float> table(size_t(H * L * L));
  for (auto& x : table) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  CapturedTensor tableT = dsl::capture(Tensor::fromHost(table, {H, L, L}, kDevice), "bias", {.requires_grad = true});
  Tensor q = randomTensor(rng, DType::BF16, {B, H, L, D}, kDevice), k = randomTensor(rng, DType::BF16, {B, 2, L, D}, kDevice);
  Tensor v = randomTensor(rng, DType::BF16, {B, 2, L, D}, kDevice), dout = randomTensor(rng, DType::BF16, {B, H, L, D}, kDevice);
  BlockMask mask = causalBlockMask(1, 1, L, L);
  ScoreMod mod = bias_table(tableT);
  FlexAttentionResult fwd = flex_attention(q, k, v, mod, mask, {.return_lse = true});
  auto bytes = [](const Tensor& t) {
    std::vector<float> f = t.dtype() == DType::F32 ? t.toHost<float>() : std::vector<float>();
    if (t.dtype() == DType::F32) return std::vector<uint8_t>((uint8_t*)f.data(), (uint8_t*)(f.data() + f.size()));
    auto h = t.toHost<Eigen::bfloat16>();
    return std::vector<uint8_t>((uint8_t*)h.data(), (uint8_t*)(h.data() + h.size()));
  };
  for (bool deterministic : {false, true}) {
    SCOPED_TRACE(deterministic ? "deterministic" : "default");
    FlexAttentionGrads a = flex_attention_backward(q, k, v, fwd.out, fwd.lse, dout, mod, mask, {.deterministic = deterministic});
    FlexAttentionGrads b = flex_attention_backward(q, k, v, fwd.out, fwd.lse, dout, mod, mask, {.deterministic = deterministic});
    EXPECT_TRUE(bytes(a.dq) == bytes(b.dq));
    EXPECT_TRUE(bytes(a.dk) == bytes(b.dk));
    EXPECT_TRUE(bytes(a.dv) == bytes(b.dv));
    if (deterministic) {
      EXPECT_TRUE(bytes(a.grad(tableT)) == bytes(b.grad(tableT)));
    }
  }
}

// A slice of a longer mask (decode-style row blocks and a one-row slice starting mid-block): the
// mods see global query positions in both gradient kernels.
TEST(FlexAttentionBackwardGpu, SlicedMaskWithQueryOffset) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const int64_t S = 700;
  BlockMask causal = causalBlockMask(1, 1, S, S);
  struct Slice {
    int64_t start, count;
    std::optional<int64_t> offset, length;
  };
  for (Slice s : {Slice{2, 1, {}, {}}, Slice{1, 3, {}, {}}, Slice{3, 1, 400, 1}, Slice{4, 1, 530, 17}}) {
    BlockMask slice = causal.sliceRows(s.start, s.count, s.offset, s.length);
    AttentionCase c{.B = 2, .Hq = 4, .Hkv = 2, .L = slice.qLen(), .S = S, .D = 128, .dtype = DType::BF16};
    c.context = "causal slice offset " + std::to_string(slice.qOffset());
    VariantInstance inst = variant("softcap").make({c.B, c.Hq, c.L, S, kDevice, BlockSizes{}, rng()});
    BackwardCheck check = withConfig(std::nullopt, inst);
    check.refMask = refCausal();
    if (!checkBackward(rng, c, kDevice, inst.score, slice, check)) return;
  }
}

// Training on a mask built on the device without host lists (createBlockMask with hostLists =
// false): the transposed lists are derived on the device too, and the gradients equal those on the
// host-list mask bit for bit (same kernels, same lists).
TEST(FlexAttentionBackwardGpu, MaskWithoutHostLists) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const int64_t B = 2, Hq = 8, Hkv = 2, L = 1000, D = 64;
  BlockMaskPlacement where{kDevice};
  where.hostLists = false;
  for (const MaskMod& mod : {causal_mask(), sliding_window_mask(200)}) {
    SCOPED_TRACE(mod.name());
    BlockMask hostMask = createBlockMask(mod, B, 1, L, L, {128, 128}, kDevice);
    BlockMask deviceMask = createBlockMask(mod, B, 1, L, L, {128, 128}, where);
    ASSERT_FALSE(deviceMask.hasHostLists());
    expectSameGradients(rng, hostMask, deviceMask, B, Hq, Hkv, L, L, D, kDevice);
  }
}
