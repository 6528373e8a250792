// The compiler's tile passes keep what the templates compute: with FLEXTILE_INTERPRET_AFTER_PASSES
// the interpreter runs each kernel's IR after codegen::tilePassPipeline for a target — layouts,
// the pipeline pass's rings (local_alloc, async_copy, async_wait, barriers, local_load), and on
// sm_90a the wgmma pass's async dots, wgmma_waits and resident A buffers — and the forward,
// backward and decode templates are checked against float64 there. Configs of 64-row tiles on 4
// warps, so that sm_90a puts their products on wgmma; two stages, so that the loops pipeline.
#include <gtest/gtest.h>

#include <cstdlib>
#include <tuple>
#include <vector>

#include "FlexAttentionBackwardCheck.h"
#include "FlexAttentionCheck.h"
#include "FlexAttentionDecodeCheck.h"
#include "ListTensorMaskCheck.h"
#include "PagedKVCheck.h"
#include "MaskTestUtil.h"
#include "attention_templates/Variants.h"
#include "gpu/GpuTest.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"  // designated initializers leave members default

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::testing;
using dsl::DType;
using dsl::Tensor;
using dsl::Tile;
using dsl::MemorySpace;

namespace {

constexpr MemorySpace kHost = MemorySpace::Host;
const FlexAttentionConfig kWgmmaTiles{64, 64, 4, 2};

// The backward of `c` (forward at kWgmmaTiles, backward at `config`) against float64, without a
// mask ("full") or with a causal BlockMask of `blocks` x `blocks` ("causal").
bool checkFullOrCausalBackward(SeededRandom& rng, const AttentionCase& c, const std::string& name,
                               const FlexAttentionBackwardConfig& config, int64_t blocks) {
  BackwardCheck check;
  check.forwardConfig = kWgmmaTiles;
  check.options.config = config;
  std::optional<BlockMask> mask;
  if (name == "causal") {
    check.refMask = refCausal();
    mask = causalBlockMask(1, 1, c.L, c.S, {blocks, blocks});
  }
  return checkBackward(rng, c, kHost, noop_score(), mask, check);
}

// The forward of the two-walk variants (and more) at mask blocks of 128 — two steps a block at
// BLOCK_N 64, so a walk's stage is not its block — on each config, through the passes as set up
// by the caller; `label` names the setting in the failure's context.
// `keys`: S (300, off the block, unless the caller asks for a length the blocks divide).
bool checkWalkVariants(SeededRandom& rng, const std::string& label, const std::vector<FlexAttentionConfig>& configs,
                       const std::vector<const char*>& names, int64_t keys = 300) {
  for (const FlexAttentionConfig& config : configs)
    for (const char* name : names) {
      AttentionCase c{.B = 2, .Hq = 4, .Hkv = 2, .L = 200, .S = keys, .D = 64, .dtype = DType::BF16};
      c.context = std::string(name) + " " + label + " " + config.describe();
      VariantInstance inst = variant(name).make({c.B, c.Hq, c.L, c.S, kHost, BlockSizes{128, 128}, rng()});
      if (!checkFlexAttention(rng, c, kHost, inst.score, inst.mask, inst.refScore, inst.refMask, {.config = config}))
        return false;
    }
  return true;
}

// The causal backward's two walks (dkdv's and dq's) with and without a producer warpgroup, and at
// the default config with MQA.
void checkBackwardWalks(SeededRandom& rng, const std::string& label) {
  for (const char* specialize : {"0", "1"}) {
    ScopedSetenv specialized("FLEXTILE_WARP_SPECIALIZE", specialize);
    AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 200, .S = 130, .D = 64, .dtype = DType::BF16,
                    .context = label + ", backward, warp-specialized " + specialize};
    if (!checkFullOrCausalBackward(rng, c, "causal", {kWgmmaTiles, kWgmmaTiles}, 64)) return;
  }
  const FlexAttentionBackwardConfig config = defaultFlexAttentionBackwardConfig(DType::BF16, 64, codegen::Target::sm90a());
  AttentionCase c{.B = 1, .Hq = 4, .Hkv = 1, .L = 300, .S = 260, .D = 64, .dtype = DType::BF16,
                  .context = label + ", backward at the default config, MQA"};
  checkFullOrCausalBackward(rng, c, "causal", config, 128);
}

}  // namespace

TEST(TilePassesInterpreted, ForwardVariants) {
  SeededRandom rng;
  for (const char* target : {"sm_90a", "sm_80"}) {
    InterpretAfterPasses scope(target);
    for (const char* name : {"causal", "document", "alibi"}) {
      AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 127, .S = 129, .D = 64, .dtype = DType::BF16};
      c.context = std::string(target) + " " + name;
      VariantInstance inst = variant(name).make({c.B, c.Hq, c.L, c.S, kHost, BlockSizes{64, 64}, rng()});
      if (!checkFlexAttention(rng, c, kHost, inst.score, inst.mask, inst.refScore, inst.refMask, {.config = kWgmmaTiles}))
        return;
    }
  }
}

// The forward with its loops rotated by defer-accumulation (opt-in): the prologue's and the
// epilogue's products, the carried P and alpha, and walks with no blocks (causal's first row has
// no full block, the sliding window's rows few) against float64, on one and on two warpgroups.
TEST(TilePassesInterpreted, ForwardVariantsWithDeferredAccumulation) {
  SeededRandom rng;
  InterpretAfterPasses scope("sm_90a");
  ::setenv("FLEXTILE_DEFER_ACCUMULATION", "1", 1);
  struct Unset {
    ~Unset() { ::unsetenv("FLEXTILE_DEFER_ACCUMULATION"); }
  } unset;
  for (const FlexAttentionConfig& config : {kWgmmaTiles, FlexAttentionConfig{128, 64, 8, 2}})
    for (const char* name : {"full", "causal", "sliding_window", "prefix_lm", "document", "alibi", "softcap"}) {
      AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 130, .S = 257, .D = 64, .dtype = DType::BF16};
      c.context = std::string(name) + " " + config.describe() + " deferred";
      VariantInstance inst = variant(name).make({c.B, c.Hq, c.L, c.S, kHost, BlockSizes{128, 128}, rng()});
      if (!checkFlexAttention(rng, c, kHost, inst.score, inst.mask, inst.refScore, inst.refMask, {.config = config}))
        return;
    }
}

// The rings synchronized through barriers in shared memory (FLEXTILE_RING_BARRIERS=1: a full and
// an empty mbarrier per slot instead of one CTA barrier per iteration). The interpreter counts
// each barrier's phases, so a wait on a phase the schedule never completes fails the check.
TEST(TilePassesInterpreted, RingBarriersForwardBackwardDecode) {
  SeededRandom rng;
  ::setenv("FLEXTILE_RING_BARRIERS", "1", 1);
  struct Unset {
    ~Unset() { ::unsetenv("FLEXTILE_RING_BARRIERS"); }
  } unset;
  for (const char* target : {"sm_90a", "sm_80"}) {
    InterpretAfterPasses scope(target);
    for (const FlexAttentionConfig& config : {kWgmmaTiles, FlexAttentionConfig{64, 64, 4, 3}})
      for (const char* name : {"full", "causal", "document", "softcap"}) {
        AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 127, .S = 300, .D = 64, .dtype = DType::BF16};
        c.context = std::string(target) + " " + name + " " + config.describe() + " ring barriers";
        VariantInstance inst = variant(name).make({c.B, c.Hq, c.L, c.S, kHost, BlockSizes{64, 64}, rng()});
        if (!checkFlexAttention(rng, c, kHost, inst.score, inst.mask, inst.refScore, inst.refMask, {.config = config}))
          return;
      }
    AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 70, .S = 70, .D = 64, .dtype = DType::BF16,
                    .context = std::string(target) + " backward, ring barriers"};
    BackwardCheck check;
    check.refMask = refCausal();
    check.forwardConfig = kWgmmaTiles;
    check.options.config = FlexAttentionBackwardConfig{kWgmmaTiles, kWgmmaTiles};
    if (!checkBackward(rng, c, kHost, noop_score(), causalBlockMask(1, 1, c.L, c.S, {64, 64}), check)) return;
    AttentionCase d{.B = 1, .Hq = 8, .Hkv = 2, .L = 1, .S = 300, .D = 64, .dtype = DType::BF16,
                    .context = std::string(target) + " decode, ring barriers"};
    if (!checkDecodeVariant(rng, variant("sliding_window"), d, kHost,
                            {.splits = {0, 3}, .blocks = {64, 64}, .prefillConfig = kWgmmaTiles}))
      return;
  }
}

// A list entry past its row's length is read (the block index loads are masked by the row's
// capacity, so that they need not wait for the length) but never followed: the step it would
// name never runs, its copies are predicated off, and its index is zeroed before anything (a paged
// K/V's page-table read) follows it. A sliding-window mask whose lists hold a huge index past
// every length, through sm_90a's passes (TMA rings) and sm_80's (cp.async), for the forward, the
// backward (dq walks these lists; the transposed ones are derived) and a paged forward.
TEST(TilePassesInterpreted, ListEntriesPastTheirLengthAreNeverFollowed) {
  SeededRandom rng;
  const int64_t L = 200, S = 190, W = 70;
  BlockMask window = slidingWindowBlockMask(1, 1, L, S, {W}, {64, 64}, kHost);
  BlockMaskTensors lists = copiedLists(window, kHost);
  auto poisonPastLength = [](const Tensor& num, Tensor& indices) {
    std::vector<int32_t> n = num.toHost<int32_t>(), idx = indices.toHost<int32_t>();
    const size_t width = idx.size() / n.size();
    for (size_t row = 0; row < n.size(); ++row)
      for (size_t j = size_t(n[row]); j < width; ++j) idx[row * width + j] = j % 2 ? 1 << 20 : -7;
    indices = Tensor::fromHost(idx, indices.shape(), kHost);
  };
  poisonPastLength(lists.kvNum, lists.kvIndices);
  poisonPastLength(lists.fullKvNum, lists.fullKvIndices);
  BlockMask m = BlockMask::fromListTensors(window.maskMod(), 1, 1, L, S, {64, 64}, lists);
  for (const char* target : {"sm_90a", "sm_80"}) {
    InterpretAfterPasses scope(target);
    AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = L, .S = S, .D = 64, .dtype = DType::BF16,
                    .context = std::string(target) + " window, poisoned list tails"};
    if (!checkFlexAttention(rng, c, kHost, noop_score(), m, nullptr, refWindow({W}), {.config = kWgmmaTiles})) return;
    BackwardCheck check;
    check.refMask = refWindow({W});
    check.forwardConfig = kWgmmaTiles;
    check.options.config = FlexAttentionBackwardConfig{kWgmmaTiles, kWgmmaTiles};
    if (!checkBackward(rng, c, kHost, noop_score(), m, check)) return;
    // Paged: the look-ahead turns a step's block index into a page-table read, which must never
    // follow a stale entry.
    PagedCase paged{.B = 1, .Hq = 4, .Hkv = 2, .L = L, .D = 64, .pageSize = 64, .lengths = {S},
                    .context = std::string(target) + " paged window, poisoned list tails"};
    if (!checkPaged(rng, paged, kHost, noop_score(), m, nullptr, refWindow({W}), {.config = kWgmmaTiles})) return;
  }
}

// K and V as tensor boxes (the default). Before the passes the interpreter checks each box
// against its load's pointers and mask; after them, on sm_90a, it runs the rings' tma_copy (zero
// fill past the keys and past D) on one-arrival full barriers, counting their phases; on sm_80 the
// boxes are ordinary loads. Lengths off the block, a padded head dim, 2 and 3 stages, GQA.
TEST(TilePassesInterpreted, ForwardWithTmaCopies) {
  SeededRandom rng;
  for (const char* target : {"sm_90a", "sm_80"}) {
    InterpretAfterPasses scope(target);
    for (const FlexAttentionConfig& config : {kWgmmaTiles, FlexAttentionConfig{64, 64, 4, 3}, FlexAttentionConfig{128, 64, 8, 2}})
      for (const char* name : {"full", "causal", "document", "softcap"}) {
        const int64_t D = std::string(name) == "causal" ? 80 : 64;
        AttentionCase c{.B = 2, .Hq = 4, .Hkv = 2, .L = 127, .S = 300, .D = D, .dtype = DType::BF16};
        c.context = std::string(target) + " " + name + " " + config.describe() + " TMA";
        VariantInstance inst = variant(name).make({c.B, c.Hq, c.L, c.S, kHost, BlockSizes{128, 128}, rng()});
        if (!checkFlexAttention(rng, c, kHost, inst.score, inst.mask, inst.refScore, inst.refMask, {.config = config}))
          return;
      }
  }
}

// Persistent forward (FLEXTILE_FORWARD_PERSISTENT=1) with a ring per walk (FLEXTILE_SHARE_RINGS=0;
// SharedRings below runs it with the shared rings it takes by default): three programs here (no
// GPU is known), each walking the query tiles program_id, + 3, ... through the sm_90a passes, whose
// pipeline then also prefetches the next tile's Q into a ring of its own. Every tile of every
// (batch, head) must be written once: lengths off the block, GQA, masked rows, with the
// specialized 8-warp tile. (Fails with a tile skipped or taken twice.)
TEST(TilePassesInterpreted, PersistentForward) {
  SeededRandom rng;
  ScopedSetenv persistent("FLEXTILE_FORWARD_PERSISTENT", "1");
  ScopedSetenv unshared("FLEXTILE_SHARE_RINGS", "0");
  InterpretAfterPasses scope("sm_90a");
  checkWalkVariants(rng, "persistent, a ring per walk", {kWgmmaTiles, FlexAttentionConfig{128, 64, 8, 2}},
                    {"full", "causal", "sliding_window", "document"});
}

// A persistent forward whose Q stays a plain load at each tile's start (FLEXTILE_FORWARD_Q_RING=0;
// by default where Q's ring would not fit beside the walks' rings, as at D = 256 on sm_90a): the
// tile loop reads Q as written, the walks keep their shared TMA rings, and every tile is right, the
// split last round's pieces too. (Fails with a stale Q: a tile computed with the previous tile's
// rows.)
TEST(TilePassesInterpreted, PersistentForwardWithQUnpipelined) {
  SeededRandom rng;
  ScopedSetenv persistent("FLEXTILE_FORWARD_PERSISTENT", "1");
  ScopedSetenv plainQ("FLEXTILE_FORWARD_Q_RING", "0");
  ScopedSetenv split("FLEXTILE_SPLIT_LAST_ROUND", "1");
  InterpretAfterPasses scope("sm_90a");
  checkWalkVariants(rng, "persistent, Q unpipelined",
                    {FlexAttentionConfig{128, 64, 8, 2}, FlexAttentionConfig{64, 64, 4, 3}},
                    {"full", "causal", "sliding_window"});
}

// A persistent forward that splits its last round (where the tiles walk the same steps: no mask;
// FLEXTILE_SPLIT_LAST_ROUND=1 here so that the test holds whatever the rule). Three programs here: 16
// tiles of 128 rows over 800 keys are five whole rounds and one tile's 14 steps cut into pieces (over
// 300 keys, as until 2026-12-07, its 6 steps were too few to cut: that case walked whole tiles);
// 32 tiles of 128 rows over 1000 keys are ten rounds and two tiles cut, a program's run spanning
// both. Every case is asserted to split. Each piece writes its
// partial and the merge kernel folds them. Before the passes and through sm_90a's (shared TMA rings,
// turns, producer warpgroup), lse checked too, with BLOCK_N 64 under 128-key mask blocks (pieces
// start mid-block), on 8 warps and on 4 with 3 stages; a masked variant asked to split keeps whole
// tiles. (Fails with a piece walked twice or skipped, or a merge by the wrong rule: a piece's weight
// halved failed it, and a merge that skips a tile's third piece, both checked by hand.)
TEST(TilePassesInterpreted, PersistentForwardSplitsItsLastRound) {
  SeededRandom rng;
  ScopedSetenv persistent("FLEXTILE_FORWARD_PERSISTENT", "1");
  ScopedSetenv split("FLEXTILE_SPLIT_LAST_ROUND", "1");
  const std::vector<FlexAttentionConfig> configs = {FlexAttentionConfig{128, 64, 8, 2}, FlexAttentionConfig{64, 64, 4, 3}};
  size_t sweepCase = 0;
  for (const char* target : {"", "sm_90a"}) {
    std::optional<InterpretAfterPasses> scope;
    if (*target) scope.emplace(target);
    for (const FlexAttentionConfig& config : configs)
      for (const AttentionCase& shape : {AttentionCase{.B = 2, .Hq = 4, .Hkv = 2, .L = 200, .S = 800, .D = 64},
                                         AttentionCase{.B = 1, .Hq = 4, .Hkv = 2, .L = 1000, .S = 1000, .D = 80}})
        for (int call = 0; call < 2; ++call) {
          // Under the sanitizers the small shape always, the L = S = 1000 one (nearly all the
          // time) for one (target, config) of the four, with its two calls.
          if (shape.L == 1000 && !runsInThisBuild(rng.seed(), sweepCase++ / 2, 4)) continue;
          AttentionCase c = shape;
          c.dtype = DType::BF16;
          {  // (Each case splits: a shape or config whose run is too short would walk whole tiles.)
            Tensor q0 = Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.D}, kHost);
            Tensor k0 = Tensor::empty(c.dtype, {c.B, c.Hkv, c.S, c.D}, kHost);
            ASSERT_TRUE(plan_flex_attention(q0, k0, k0, noop_score(), std::nullopt, {.config = config}).lastRoundSplit)
                << c.describe() << " " << config.describe();
          }
          c.context = std::string("split last round, ") + (*target ? target : "interpreted") + " " +
                      config.describe() + " call " + std::to_string(call);
          if (!checkFlexAttention(rng, c, kHost, noop_score(), std::nullopt, nullptr, nullptr, {.config = config}))
            return;
        }
  }
  InterpretAfterPasses scope("sm_90a");
  checkWalkVariants(rng, "split last round asked for, masked", {FlexAttentionConfig{128, 64, 8, 2}}, {"causal"});
  // A score_mod's pieces (split only when asked for: the rule leaves score_mods out until timed).
  AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 1000, .S = 1000, .D = 64, .dtype = DType::BF16,
                  .context = "split last round, soft-cap"};
  VariantInstance inst = variant("softcap").make({c.B, c.Hq, c.L, c.S, kHost, BlockSizes{}, rng()});
  const FlexAttentionOptions options{.config = FlexAttentionConfig{128, 64, 8, 2}};
  Tensor q = Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.D}, kHost);
  ASSERT_TRUE(plan_flex_attention(q, q, q, inst.score, std::nullopt, options).lastRoundSplit);
  checkFlexAttention(rng, c, kHost, inst.score, std::nullopt, inst.refScore, nullptr, options);
}

// A user's mask whose rows are full blocks of one length walks alike too, so the persistent forward
// splits its last round as it does without a mask (by the default rule, no switch): an explicit
// all-full mask gives the no-mask output bit for bit — examples/attention/full.cpp says so, and
// failed on an H100 (2026-12-06) while only the call without a mask split — and block-sparse rows
// of four full blocks each match float64. A causal mask (partial blocks) keeps whole tiles. Three
// programs: 32 tiles of 128 rows are ten whole rounds and two tiles cut.
TEST(TilePassesInterpreted, MasksOfEqualFullRowsSplitTheLastRoundAsNoMaskDoes) {
  SeededRandom rng;
  ScopedSetenv persistent("FLEXTILE_FORWARD_PERSISTENT", "1");
  const int64_t B = 1, Hq = 4, Hkv = 2, N = 1000, D = 64;
  const FlexAttentionOptions options{.config = FlexAttentionConfig{128, 64, 8, 2}};
  Tensor q = randomTensor(rng, DType::BF16, {B, Hq, N, D}, kHost);
  Tensor k = randomTensor(rng, DType::BF16, {B, Hkv, N, D}, kHost);
  Tensor v = randomTensor(rng, DType::BF16, {B, Hkv, N, D}, kHost);
  const BlockMask everything = createBlockMask(noop_mask(), 1, 1, N, N, {128, 128}, kHost);
  ASSERT_EQ(everything.uniformFullRowLength(), 8);
  ASSERT_TRUE(plan_flex_attention(q, k, v, noop_score(), std::nullopt, options).lastRoundSplit);
  ASSERT_TRUE(plan_flex_attention(q, k, v, noop_score(), everything, options).lastRoundSplit);
  const Tensor unmasked = flex_attention(q, k, v, noop_score(), std::nullopt, options).out;
  const Tensor explicitFull = flex_attention(q, k, v, noop_score(), everything, options).out;
  EXPECT_EQ(toDoubles(explicitFull), toDoubles(unmasked));

  auto alternate = [](int64_t, int64_t, int64_t qi, int64_t kv) { return (qi / 128 + kv / 128) % 2 == 0; };
  const MaskMod alternateBlocks("alternate_blocks", [](const Tile&, const Tile&, const Tile& qi, const Tile& kv) {
    return (qi / 128 + kv / 128) % 2 == 0;
  });
  const BlockMask sparse = createBlockMask(alternateBlocks, 1, 1, N, N, {128, 128}, kHost);
  ASSERT_EQ(sparse.uniformFullRowLength(), 4);
  ASSERT_TRUE(plan_flex_attention(q, k, v, noop_score(), sparse, options).lastRoundSplit);
  AttentionCase c{.B = B, .Hq = Hq, .Hkv = Hkv, .L = N, .S = N, .D = D, .dtype = DType::BF16,
                  .context = "split last round, block-sparse rows of equal length"};
  EXPECT_TRUE(checkFlexAttention(rng, c, kHost, noop_score(), sparse, nullptr, alternate, options));

  const BlockMask causal = causalBlockMask(1, 1, N, N, {128, 128}, kHost);
  EXPECT_EQ(causal.uniformFullRowLength(), -1);
  EXPECT_FALSE(plan_flex_attention(q, k, v, noop_score(), causal, options).lastRoundSplit);
}

// The split last round's merge kernel writes the tiles it folds through the output's strides, as
// the forward writes the others: q and out as [B, L, H, D] buffers viewed as [B, H, L, D], out's
// rows padded past D with a sentinel that must stay, lse too; the merge launched as a programmatic
// dependent (its wait). 32 tiles on the interpreter's three programs: ten whole rounds and two tiles
// cut. (Fails with the merge writing out contiguously.)
TEST(TilePassesInterpreted, SplitLastRoundWritesThroughTheOutputsStrides) {
  SeededRandom rng;
  ScopedSetenv persistent("FLEXTILE_FORWARD_PERSISTENT", "1");
  ScopedSetenv split("FLEXTILE_SPLIT_LAST_ROUND", "1");
  ScopedSetenv pdl("FLEXTILE_PROGRAMMATIC_LAUNCH", "1");  // the merge's wait: nothing to wait for here
  const int64_t B = 1, Hq = 4, Hkv = 2, L = 1000, S = 700, D = 64;
  const DType dt = DType::BF16;
  const int64_t eb = ir::byteWidth(dt), rowPitch = D + 16;
  std::vector<uint8_t> qBuf(size_t(B * L * Hq * D * eb)), outBuf(size_t(B * L * Hq * rowPitch * eb), 0x5a);
  Tensor q = Tensor::hostView(qBuf.data(), dt, {B, Hq, L, D}, {L * Hq * D, D, Hq * D, 1});
  Tensor out = Tensor::hostView(outBuf.data(), dt, {B, Hq, L, D}, {L * Hq * rowPitch, rowPitch, Hq * rowPitch, 1});
  Tensor k = Tensor::empty(dt, {B, Hkv, S, D}, kHost), v = Tensor::empty(dt, {B, Hkv, S, D}, kHost);
  fillRandom(rng, q);
  fillRandom(rng, k);
  fillRandom(rng, v);
  const FlexAttentionOptions options{.config = FlexAttentionConfig{128, 64, 8, 2}};
  ASSERT_TRUE(plan_flex_attention(q, k, v, noop_score(), std::nullopt, options).lastRoundSplit);
  ASSERT_TRUE(checkFlexAttentionOn(q, k, v, out, "split last round, strided q and out", noop_score(), std::nullopt,
                                   nullptr, nullptr, options));
  for (int64_t r = 0; r < B * L * Hq; ++r)
    for (int64_t byte = D * eb; byte < rowPitch * eb; ++byte)
      ASSERT_EQ(outBuf[size_t(r * rowPitch * eb + byte)], 0x5a) << "out row " << r << " written past D (byte " << byte << ")";
}

// The split last round's partials live in one grow-only scratch, outputs then lses: a call whose
// outputs fit the scratch a smaller head dim left but whose lses do not must grow it before taking
// the outputs' view. D = 64 (768 rows of 64: the scratch holds 98304 floats) then D = 128 (the
// outputs need exactly 98304, the lses 768 more). Failed (the forward wrote its partials into the
// freed scratch and the merge read the new one) when the outputs' view was taken first.
TEST(TilePassesInterpreted, SplitLastRoundScratchGrowsBeforeItsViews) {
  SeededRandom rng;
  ScopedSetenv persistent("FLEXTILE_FORWARD_PERSISTENT", "1");
  ScopedSetenv split("FLEXTILE_SPLIT_LAST_ROUND", "1");
  for (int64_t D : {64, 128}) {
    AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 1000, .S = 700, .D = D, .dtype = DType::BF16};
    c.context = "split last round, D " + std::to_string(D) + " after a smaller one";
    if (!checkFlexAttention(rng, c, kHost, noop_score(), std::nullopt, nullptr, nullptr,
                            {.config = FlexAttentionConfig{128, 64, 8, 2}}))
      return;
  }
}

// Shared rings (FLEXTILE_SHARE_RINGS=1): the walks of a program share one set of ring buffers and
// barriers, each walk issuing its first stages into the slots after the previous walk's, after
// their release; in the persistent forward the tile loop carries the rings on to the next tile.
// The interpreter counts every barrier's phases, so a stage in the wrong slot or a wait on a phase
// that never completes fails here, as do wrong results; forward variants (empty walks, masked
// rows, GQA, lengths off the block) on 2 and 3 stages, specialized or not, persistent or not, and
// the backward's dkdv and dq, specialized or not, at the default config too.
TEST(TilePassesInterpreted, SharedRings) {
  SeededRandom rng;
  ScopedSetenv shared("FLEXTILE_SHARE_RINGS", "1");
  InterpretAfterPasses scope("sm_90a");
  for (const char* persistent : {"0", "1"}) {
    // Under the sanitizers one of the two schedules a run, drawn from the seed.
    if (!runsInThisBuild(rng.seed(), *persistent == '1', 2)) continue;
    ScopedSetenv tiles("FLEXTILE_FORWARD_PERSISTENT", persistent);
    if (!checkWalkVariants(rng, std::string("shared rings, persistent ") + persistent,
                           {kWgmmaTiles, FlexAttentionConfig{64, 64, 4, 3}, FlexAttentionConfig{128, 64, 8, 2}},
                           {"causal", "sliding_window", "document", "prefix_lm"}))
      return;
  }
  checkBackwardWalks(rng, "shared rings");
}

// Warpgroup turns (FLEXTILE_PINGPONG=1) on the TMA forward: the passes' IR verifies and computes
// the same (turns order nothing in the interpreter, which runs one thread).
TEST(TilePassesInterpreted, ForwardWithWarpgroupTurns) {
  SeededRandom rng;
  ::setenv("FLEXTILE_PINGPONG", "1", 1);
  struct Unset {
    ~Unset() { ::unsetenv("FLEXTILE_PINGPONG"); }
  } unset;
  InterpretAfterPasses scope("sm_90a");
  for (const char* name : {"full", "causal", "softcap"}) {
    AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 130, .S = 257, .D = 64, .dtype = DType::BF16};
    c.context = std::string(name) + " warpgroup turns";
    VariantInstance inst = variant(name).make({c.B, c.Hq, c.L, c.S, kHost, BlockSizes{128, 128}, rng()});
    if (!checkFlexAttention(rng, c, kHost, inst.score, inst.mask, inst.refScore, inst.refMask,
                            {.config = FlexAttentionConfig{128, 64, 8, 2}}))
      return;
  }
}

// The loop schedules a config asks for, together, on the warp-specialized 8-warp tile: turns and
// deferred accumulation (FlexAttentionConfig::turns, ::defer), D 128, every variant.
TEST(TilePassesInterpreted, ForwardWithConfigSchedules) {
  SeededRandom rng;
  InterpretAfterPasses scope("sm_90a");
  const FlexAttentionConfig config{128, 128, 8, 2, WarpSpecialization::On, LoopSchedule::On, LoopSchedule::On};
  for (const char* name : {"full", "causal", "sliding_window", "document", "alibi", "softcap"}) {
    AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 130, .S = 257, .D = 128, .dtype = DType::BF16};
    c.context = std::string(name) + " " + config.describe();
    VariantInstance inst = variant(name).make({c.B, c.Hq, c.L, c.S, kHost, BlockSizes{128, 128}, rng()});
    if (!checkFlexAttention(rng, c, kHost, inst.score, inst.mask, inst.refScore, inst.refMask, {.config = config}))
      return;
  }
}

// A producer warpgroup of its own (FLEXTILE_WARP_SPECIALIZE=1): the marked IR verifies and
// computes the same (the interpreter runs every op, whatever warps the GPU runs it on).
TEST(TilePassesInterpreted, ForwardWarpSpecialized) {
  SeededRandom rng;
  ScopedSetenv specialized("FLEXTILE_WARP_SPECIALIZE", "1");
  InterpretAfterPasses scope("sm_90a");
  for (const FlexAttentionConfig& config : {kWgmmaTiles, FlexAttentionConfig{64, 64, 4, 3}})
    for (const char* name : {"full", "causal", "document"}) {
      AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 130, .S = 257, .D = 64, .dtype = DType::BF16};
      c.context = std::string(name) + " warp-specialized " + config.describe();
      VariantInstance inst = variant(name).make({c.B, c.Hq, c.L, c.S, kHost, BlockSizes{128, 128}, rng()});
      if (!checkFlexAttention(rng, c, kHost, inst.score, inst.mask, inst.refScore, inst.refMask, {.config = config}))
        return;
    }
}

// 64 query rows on 8 warps: the warpgroups split N (Layout::wgmmaAccumulator), so the softmax's row
// reductions cross warpgroups and P reaches P·V through a staged shared tile (wgmmaStagedA); at
// D = 64 V's halves are not whole panels, so both warpgroups compute all of P·V (replicas).
// Unspecialized, with the producer warpgroup, deferred accumulation and skewed walks.
TEST(TilePassesInterpreted, ForwardWarpgroupsSplittingN) {
  SeededRandom rng;
  InterpretAfterPasses scope("sm_90a");
  FlexAttentionConfig deferred{64, 64, 8, 2}, skewed{64, 64, 8, 2};
  deferred.defer = LoopSchedule::On;  // the prologue's and epilogue's products outside the loop
  skewed.skew = LoopSchedule::On;
  size_t index = 0;
  for (const FlexAttentionConfig& config :
       {FlexAttentionConfig{64, 64, 8, 2}, FlexAttentionConfig{64, 64, 8, 2, WarpSpecialization::On}, deferred, skewed})
    for (int64_t D : {128, 64}) {
      if (!runsInThisBuild(rng.seed(), index++, 3)) continue;
      for (const char* name : {"full", "causal", "softcap"}) {
        AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 130, .S = 257, .D = D, .dtype = DType::BF16};
        c.context = std::string(name) + " " + config.describe();
        VariantInstance inst = variant(name).make({c.B, c.Hq, c.L, c.S, kHost, BlockSizes{128, 128}, rng()});
        if (!checkFlexAttention(rng, c, kHost, inst.score, inst.mask, inst.refScore, inst.refMask, {.config = config}))
          return;
      }
    }
}

// Loop-invariant loads hoisted (FLEXTILE_HOIST_INVARIANT_LOADS=1): the document mask's per-row ids
// leave the walks, and every variant still computes the same (fully masked rows included, GQA,
// lengths off the block), with and without warp specialization.
TEST(TilePassesInterpreted, ForwardWithHoistedInvariantLoads) {
  SeededRandom rng;
  ScopedSetenv hoisted("FLEXTILE_HOIST_INVARIANT_LOADS", "1");
  InterpretAfterPasses scope("sm_90a");
  for (const char* specialize : {"0", "1"})
    for (const char* name : {"document", "alibi", "causal", "bias"}) {
      ScopedSetenv specialized("FLEXTILE_WARP_SPECIALIZE", specialize);
      AttentionCase c{.B = 2, .Hq = 4, .Hkv = 2, .L = 130, .S = 257, .D = 64, .dtype = DType::BF16};
      c.context = std::string(name) + " hoisted loads, warp-specialized " + specialize;
      VariantInstance inst = variant(name).make({c.B, c.Hq, c.L, c.S, kHost, BlockSizes{128, 128}, rng()});
      if (!checkFlexAttention(rng, c, kHost, inst.score, inst.mask, inst.refScore, inst.refMask, {.config = kWgmmaTiles}))
        return;
    }
}

// Prefetched loads (FLEXTILE_PREFETCH_LOADS=1): the document mask's per-key ids (and each step's
// block index) are read one step early and carried; forward (with and without a producer),
// backward (dkdv's per-query ids, dq's per-key ids) and decode still compute the same, fully
// masked rows, GQA and lengths off the block included.
TEST(TilePassesInterpreted, ForwardBackwardAndDecodeWithPrefetchedLoads) {
  SeededRandom rng;
  ScopedSetenv prefetched("FLEXTILE_PREFETCH_LOADS", "1");
  for (const char* target : {"sm_90a", "sm_80"}) {
    InterpretAfterPasses scope(target);
    for (const char* specialize : {"0", "1"})
      for (const char* name : {"document", "sliding_window", "alibi"}) {
        ScopedSetenv specialized("FLEXTILE_WARP_SPECIALIZE", specialize);
        AttentionCase c{.B = 2, .Hq = 4, .Hkv = 2, .L = 130, .S = 257, .D = 64, .dtype = DType::BF16};
        c.context = std::string(target) + " " + name + " prefetched loads, warp-specialized " + specialize;
        VariantInstance inst = variant(name).make({c.B, c.Hq, c.L, c.S, kHost, BlockSizes{64, 64}, rng()});
        if (!checkFlexAttention(rng, c, kHost, inst.score, inst.mask, inst.refScore, inst.refMask,
                                {.config = kWgmmaTiles}))
          return;
      }
    {
      AttentionCase c{.B = 2, .Hq = 4, .Hkv = 2, .L = 70, .S = 130, .D = 64, .dtype = DType::BF16,
                      .context = std::string(target) + " document backward, prefetched loads"};
      VariantInstance inst = variant("document").make({c.B, c.Hq, c.L, c.S, kHost, BlockSizes{64, 64}, rng()});
      BackwardCheck check;
      check.refMask = inst.refMask;
      check.forwardConfig = kWgmmaTiles;
      check.options.config = FlexAttentionBackwardConfig{kWgmmaTiles, kWgmmaTiles};
      if (!checkBackward(rng, c, kHost, inst.score, inst.mask, check)) return;
    }
    AttentionCase c{.B = 1, .Hq = 8, .Hkv = 2, .L = 1, .S = 300, .D = 64, .dtype = DType::BF16,
                    .context = std::string(target) + " decode, prefetched loads"};
    if (!checkDecodeVariant(rng, variant("document"), c, kHost,
                            {.splits = {0, 3}, .blocks = {64, 64}, .prefillConfig = kWgmmaTiles}))
      return;
  }
}

// The backward's walks with tensor boxes (opt-in there: FLEXTILE_TMA=1): dkdv's Q and dO, dq's K
// and V through TMA rings on sm_90a, checked against float64; lengths off the block, GQA.
// With FLEXTILE_WARP_SPECIALIZE=1 too, the dkdv and dq kernels' TMA rings get a producer warpgroup
// (the marked IR verifies and computes the same; not yet run on the GPU).
TEST(TilePassesInterpreted, BackwardWithTmaCopies) {
  SeededRandom rng;
  ScopedSetenv tma("FLEXTILE_TMA", "1");
  InterpretAfterPasses scope("sm_90a");
  // L = 72: a multiple of 4, so the specialized dkdv also copies its LSE and delta rows by TMA
  // (row rings), with rows past L zero-filled; L = 70 keeps them global loads.
  for (const char* specialize : {"0", "1"})
    for (const char* name : {"causal", "full"})
      for (int64_t L : {70, 72}) {
        ScopedSetenv specialized("FLEXTILE_WARP_SPECIALIZE", specialize);
        AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = L, .S = 130, .D = 64, .dtype = DType::BF16,
                        .context = std::string("sm_90a backward, TMA, warp-specialized ") + specialize + ", " + name +
                                   ", L " + std::to_string(L)};
        if (!checkFullOrCausalBackward(rng, c, name, {kWgmmaTiles, kWgmmaTiles}, 64)) return;
      }
}

// The config an H200 picks by default (dq: 128 queries on two consumer warpgroups and a producer
// warpgroup), run through sm_90a's passes, the TMA rings and the specialization included.
TEST(TilePassesInterpreted, BackwardSm90aDefaultConfig) {
  SeededRandom rng;
  InterpretAfterPasses scope("sm_90a");
  const FlexAttentionBackwardConfig config =
      defaultFlexAttentionBackwardConfig(DType::BF16, 96, codegen::Target::sm90a());
  ASSERT_EQ(config.dq.warp_specialize, WarpSpecialization::On) << config.describe();
  {  // what runs below is the specialized dq: the plan of the same call has its producer warpgroup
    Tensor q = Tensor::empty(DType::BF16, {1, 4, 200, 96}, MemorySpace::Host);
    Tensor kv = Tensor::empty(DType::BF16, {1, 2, 130, 96}, MemorySpace::Host);
    Tensor lse = Tensor::empty(DType::F32, {1, 4, 200}, MemorySpace::Host);
    FlexAttentionBackwardPlan plan = plan_flex_attention_backward(q, kv, kv, q, lse, q, noop_score(), std::nullopt,
                                                                  {.config = config}, codegen::Target::sm90a());
    ASSERT_EQ(plan.compiled.size(), 3u);
    EXPECT_NE(plan.compiled[2]->ir.find("producer_warps = 4"), std::string::npos) << plan.kernelNames[2];
    // dkdv is specialized too where the offline ptxas assembles it (defaultFlexAttentionBackwardConfig).
    EXPECT_EQ(plan.compiled[1]->ir.find("producer_warps = 4") != std::string::npos,
              config.dkdv.warp_specialize == WarpSpecialization::On)
        << plan.kernelNames[1];
  }
  for (const char* name : {"causal", "full"}) {
    AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 200, .S = 130, .D = 96, .dtype = DType::BF16,
                    .context = std::string("sm_90a default backward config, ") + name};
    if (!checkFullOrCausalBackward(rng, c, name, config, 128)) return;
  }
}

// With both dQ modes: the atomic one's dS·K reads K from a resident one-slot B buffer
// (wgmmaResidentB) and dSᵀ through a shared conversion, while the dkdv rings feed wgmma.
TEST(TilePassesInterpreted, BackwardCausalGqa) {
  SeededRandom rng;
  for (DqAccumulation dq : {DqAccumulation::Separate, DqAccumulation::Atomic})
    for (const char* target : {"sm_90a", "sm_80"}) {
      InterpretAfterPasses scope(target);
      AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 70, .S = 70, .D = 64, .dtype = DType::BF16,
                      .context = std::string(target) + (dq == DqAccumulation::Atomic ? " atomic dQ" : "")};
      BackwardCheck check;
      check.refMask = refCausal();
      check.forwardConfig = kWgmmaTiles;
      check.options.config = FlexAttentionBackwardConfig{kWgmmaTiles, kWgmmaTiles};
      check.options.dq_accumulation = dq;
      if (!checkBackward(rng, c, kHost, noop_score(), causalBlockMask(1, 1, c.L, c.S, {64, 64}), check)) return;
    }
}

// Atomic dQ in the specialized dkdv (FLEXTILE_TMA_IN_STAGING_LOOPS=1, its TMA rings beside the
// staging of dSᵀ): dQᵀ = Kᵀ dSᵀ on wgmma, Kᵀ read M-major from the buffer that K·Qᵀ reads K-major,
// dSᵀ stored into a one-slot buffer every step, the rows added by bulk reductions. D = 128 gives
// dQᵀ the 128 rows of two warpgroups; lengths off the block, GQA, a causal mask's two walks.
TEST(TilePassesInterpreted, BackwardAtomicDqSpecialized) {
  SeededRandom rng;
  ScopedSetenv staging("FLEXTILE_TMA_IN_STAGING_LOOPS", "1");
  InterpretAfterPasses scope("sm_90a");
  for (const char* name : {"causal", "full"}) {
    AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 200, .S = 190, .D = 128, .dtype = DType::BF16,
                    .context = std::string("sm_90a atomic dQ, specialized dkdv, ") + name};
    BackwardCheck check;
    check.forwardConfig = kWgmmaTiles;
    check.options.config = FlexAttentionBackwardConfig{{64, 128, 8, 2, WarpSpecialization::On}, kWgmmaTiles};
    check.options.dq_accumulation = DqAccumulation::Atomic;
    std::optional<BlockMask> mask;
    if (std::string(name) == "causal") {
      check.refMask = refCausal();
      mask = causalBlockMask(1, 1, c.L, c.S, {128, 128});
    }
    if (!checkBackward(rng, c, kHost, noop_score(), mask, check)) return;
  }
}

namespace {
// The backward of each named variant at B=1 Hq=4 Hkv=2 L=200 S=190 D=128 (lengths off the block,
// GQA) with the given specialized dkdv and dq tiles, against float64 after the sm_90a passes.
// The backward of variant `name` on case c with the given dkdv and dq tiles, against float64 (the
// caller sets the passes' target).
bool checkBackwardVariant(std::mt19937_64& rng, const char* name, const AttentionCase& c, const FlexAttentionConfig& dkdv,
                          const FlexAttentionConfig& dq) {
  VariantInstance inst = variant(name).make({c.B, c.Hq, c.L, c.S, kHost, BlockSizes{128, 128}, rng()});
  BackwardCheck check;
  check.refScore = inst.refScore;
  check.refScoreGrad = inst.refScoreGrad;
  check.refMask = inst.refMask;
  check.forwardConfig = kWgmmaTiles;
  check.options.config = FlexAttentionBackwardConfig{dkdv, dq};
  return checkBackward(rng, c, kHost, inst.score, inst.mask, check);
}

void backwardVariantsAfterPasses(std::initializer_list<const char*> names, const FlexAttentionConfig& dkdv,
                                 const FlexAttentionConfig& dq, const std::string& context) {
  SeededRandom rng;
  InterpretAfterPasses scope("sm_90a");
  for (const char* name : names) {
    AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 200, .S = 190, .D = 128, .dtype = DType::BF16,
                    .context = "sm_90a backward, " + context + ", " + name};
    if (!checkBackwardVariant(rng, name, c, dkdv, dq)) return;
  }
}
}  // namespace

// Warpgroup turns in the backward's specialized dkdv and dq (config `turns`): ALiBi's score_mod
// (a captured slope per head) and a causal mask's two walks.
TEST(TilePassesInterpreted, BackwardWithWarpgroupTurns) {
  FlexAttentionConfig dkdv{64, 128, 8, 2, WarpSpecialization::On}, dq{128, 64, 8, 2, WarpSpecialization::On};
  dkdv.turns = dq.turns = LoopSchedule::On;
  backwardVariantsAfterPasses({"alibi", "causal"}, dkdv, dq, "with turns");
}

// The turns on the document variant at the two shapes where FlexAttentionBackwardGpu.
// WarpgroupTurnsEveryVariant stalled under the parallel GPU suite (2026-12-05, 2026-12-06): GQA 4:1
// with more keys than queries (key tiles no query reaches: empty walks between open and close) and
// MQA with more queries than keys. The interpreter counts every mbarrier's phases, so a wait on a
// phase that no arrival completes — a hang on the GPU — is an error here. (It runs one thread, so
// it cannot see the named barriers of the turns lap each other, the stall's likely cause:
// FlexAttentionBackwardCodegen.TurnsClosedInsideTheHeadLoopHandTheEndBack checks that fix.)
TEST(TilePassesInterpreted, BackwardWithWarpgroupTurnsOnDocumentsAtTheStalledShapes) {
  SeededRandom rng;
  InterpretAfterPasses scope("sm_90a");
  FlexAttentionConfig dkdv{64, 128, 8, 2, WarpSpecialization::On}, dq{128, 64, 8, 2, WarpSpecialization::On};
  dkdv.turns = dq.turns = LoopSchedule::On;
  size_t shape = 0;
  for (AttentionCase c : {AttentionCase{.B = 2, .Hq = 8, .Hkv = 2, .L = 129, .S = 1000, .D = 64, .dtype = DType::F16},
                          AttentionCase{.B = 2, .Hq = 8, .Hkv = 1, .L = 1000, .S = 333, .D = 128, .dtype = DType::BF16}}) {
    if (!runsInThisBuild(rng.seed(), shape++, 2)) continue;  // under the sanitizers one shape a run
    c.context = "sm_90a backward with turns, document, " + c.describe();
    if (!checkBackwardVariant(rng, "document", c, dkdv, dq)) return;
  }
}

// The backward's orders switched back (FLEXTILE_BWD_EXPONENT_FIRST=0: mask, then subtract lse2;
// FLEXTILE_BWD_MASKED_DP_EARLY=0: dPᵀ after pᵀ in the masked walk; FLEXTILE_BWD_SEED_FREE_ADJOINT=0:
// the mod's adjoint through dS): masked, empty and off-the-block rows, a score_mod.
TEST(TilePassesInterpreted, BackwardWithTheOtherOrders) {
  flextile::testing::ScopedSetenv exponentLast("FLEXTILE_BWD_EXPONENT_FIRST", "0");
  flextile::testing::ScopedSetenv dpLate("FLEXTILE_BWD_MASKED_DP_EARLY", "0");
  flextile::testing::ScopedSetenv throughTheSeed("FLEXTILE_BWD_SEED_FREE_ADJOINT", "0");
  backwardVariantsAfterPasses({"document", "causal", "softcap"}, {64, 128, 8, 2, WarpSpecialization::On},
                              {128, 64, 8, 2, WarpSpecialization::On}, "the other orders");
}

TEST(TilePassesInterpreted, DecodeSplits) {
  SeededRandom rng;
  for (const char* target : {"sm_90a", "sm_80"}) {
    InterpretAfterPasses scope(target);
    for (int64_t L : {1, 4}) {
      AttentionCase c{.B = 1, .Hq = 8, .Hkv = 2, .L = L, .S = 300, .D = 64, .dtype = DType::BF16, .context = target};
      if (!checkDecodeVariant(rng, variant("sliding_window"), c, kHost,
                              {.splits = {0, 3}, .blocks = {64, 64}, .prefillConfig = kWgmmaTiles}))
        return;
    }
  }
}

// The decode's full walk on TMA rings from a producer warpgroup (FLEXTILE_DECODE_WARP_SPECIALIZE=1)
// after sm_90a's passes: boxes at the step's block (keys past the cache's end and, at D = 48,
// columns past D zero-filled), the partial walk still on copies, D = 128's rings in 128-byte
// panels; masked rows, GQA 4:1 and MQA, one split and several.
TEST(TilePassesInterpreted, DecodeWarpSpecialized) {
  SeededRandom rng;
  ScopedSetenv specialized("FLEXTILE_DECODE_WARP_SPECIALIZE", "1");
  InterpretAfterPasses scope("sm_90a");
  const std::vector<AttentionCase> cases = {
      {.B = 2, .Hq = 8, .Hkv = 2, .L = 1, .S = 300, .D = 128, .dtype = DType::BF16},
      {.B = 1, .Hq = 4, .Hkv = 1, .L = 4, .S = 256, .D = 64, .dtype = DType::BF16},
      {.B = 1, .Hq = 2, .Hkv = 1, .L = 2, .S = 200, .D = 48, .dtype = DType::F16},
  };
  size_t index = 0;
  for (AttentionCase c : cases)
    for (const char* name : {"full", "sliding_window", "document", "softcap"}) {
      if (!runsInThisBuild(rng.seed(), index++, 2)) continue;  // under the sanitizers half the pairs a run
      c.context = "sm_90a decode, warp-specialized";
      if (!checkDecodeVariant(rng, variant(name), c, kHost, {.splits = {0, 3}, .blocks = {64, 64},
                                                             .prefillConfig = kWgmmaTiles}))
        return;
    }
  // A paged K/V has no boxes (its keys are read through the page table): the switch leaves it on
  // its copies, ragged lengths and a shared prefix included.
  PagedCase paged{.B = 2, .Hq = 8, .Hkv = 2, .L = 1, .D = 128, .pageSize = 64, .lengths = {300, 130},
                  .sharedPrefixPages = 1, .context = "sm_90a paged decode, warp-specialize asked"};
  const FlexAttentionOptions o{.kernel = AttentionTemplate::Decode, .decode_config = FlexDecodeConfig{.splits = 3}};
  checkPaged(rng, paged, kHost, noop_score(), std::nullopt, nullptr, nullptr, o);
}

TEST(TilePassesInterpreted, AnUnknownTargetIsAnError) {
  InterpretAfterPasses scope("sm_12");
  SeededRandom rng;
  AttentionCase c{.B = 1, .Hq = 1, .Hkv = 1, .L = 3, .S = 5, .D = 16, .dtype = DType::F32};
  try {
    checkFlexAttention(rng, c, kHost, noop_score(), std::nullopt, nullptr, nullptr, {});
    FAIL() << "the hook ignored FLEXTILE_INTERPRET_AFTER_PASSES";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FLEXTILE_INTERPRET_AFTER_PASSES names no known target: 'sm_12'"),
              std::string::npos)
        << e.what();
  }
}

// The loop of FlexAttentionGpu.WgmmaInLoopsWithSharedConversions: ids ^ 1 compared in another
// layout than they are loaded in, so the loop converts through shared memory while its products
// run on async wgmma.
TEST(TilePassesInterpreted, WgmmaLoopWithSharedConversions) {
  SeededRandom rng;
  InterpretAfterPasses scope("sm_90a");
  const int64_t B = 1, S = 129;
  std::vector<int32_t> ids(size_t(B * S));
  int32_t doc = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i % size_t(S) == 0 || rng() % 17 == 0) ++doc;
    ids[i] = doc;
  }
  dsl::CapturedTensor idsT = dsl::capture(Tensor::fromHost(ids, {B, S}), "ids");
  MaskMod docs = and_masks(causal_mask(), MaskMod("shifted_documents",
                                                  [idsT](const Tile& b, const Tile&, const Tile& q, const Tile& kv) {
                                                    return (idsT(b, q) ^ 1) == (idsT(b, kv) ^ 1);
                                                  },
                                                  {idsT}));
  RefMaskFn ref = [ids, stride = S](int64_t b, int64_t, int64_t q, int64_t kv) {
    return kv <= q && ids[size_t(b * stride + q)] == ids[size_t(b * stride + kv)];
  };
  BlockMask mask = createBlockMask(docs, B, 1, 127, S, {128, 128}, kHost);
  // Also on TMA rings with a producer warpgroup (FLEXTILE_TMA_IN_STAGING_LOOPS=1).
  for (const char* staging : {"0", "1"}) {
    ScopedSetenv tma("FLEXTILE_TMA_IN_STAGING_LOOPS", staging);
    AttentionCase c{.B = B, .Hq = 8, .Hkv = 2, .L = 127, .S = S, .D = 64, .dtype = DType::BF16,
                    .context = std::string("shifted documents, TMA in staging loops ") + staging};
    checkFlexAttention(rng, c, kHost, noop_score(), mask, nullptr, ref, {.config = kWgmmaTiles});
  }
}

// The decode's merge through a thread block cluster (FLEXTILE_DECODE_CLUSTER_MERGE=1) after
// sm_90a's tile passes: the gather keeps its operands' layouts through layout assignment and the
// ring's pipeline, the interpreter runs each cluster's programs at once, and only split 0 receives
// the real rows; at 16 splits two clusters a group whose folds take tickets. Against float64, one
// call after another with the split count moving across 8.
TEST(TilePassesInterpreted, DecodeClusterMerge) {
  SeededRandom rng;
  ScopedSetenv cluster("FLEXTILE_DECODE_CLUSTER_MERGE", "1");
  InterpretAfterPasses scope("sm_90a");
  AttentionCase d{.B = 2, .Hq = 8, .Hkv = 2, .L = 1, .S = 300, .D = 64, .dtype = DType::BF16,
                  .context = "sm_90a decode, cluster merge"};
  for (const char* name : {"sliding_window", "document"})
    if (!checkDecodeVariant(rng, variant(name), d, kHost, {.splits = {3, 6}, .blocks = {64, 64}, .prefillConfig = kWgmmaTiles}))
      return;
  const FusedMergeCase c{.B = 2, .Hq = 8, .Hkv = 2, .L = 3, .S = 300, .D = 64, .blindOddQueries = true,
                         .splits = {2, 8, 16, 12, 5}};
  EXPECT_TRUE(checkFusedMergeCalls(rng, c, kHost));
}

// The tiles handed out heaviest first (FLEXTILE_TILE_ORDER=1, BlockMask::heaviestTilesFirst): a
// program per tile reads its tile from the order, persistent programs deal the order in rounds;
// every tile is still computed once (the outputs are poisoned first). Before and after sm_90a's
// passes, B and H above 1, query and key lengths off the block, GQA. (Fails with the order's h
// and b decoded in the other nesting, and with the persistent programs reading the order at the
// round's index plus one: each checked by hand.)
TEST(TilePassesInterpreted, TilesHeaviestFirst) {
  SeededRandom rng;
  ScopedSetenv ordered("FLEXTILE_TILE_ORDER", "1");
  const std::vector<const char*> names = {"document", "causal", "sliding_window", "prefix_lm", "alibi"};
  for (const char* target : {"", "sm_90a"}) {
    std::optional<InterpretAfterPasses> scope;
    if (*target) scope.emplace(target);
    for (const char* persistent : {"0", "1"}) {
      // Under the sanitizers two of the four (target, schedule) pairs a run, each target on one
      // schedule, drawn from the seed.
      if (!runsInThisBuild(rng.seed(), (*target != 0) + (*persistent == '1'), 2)) continue;
      ScopedSetenv dealt("FLEXTILE_FORWARD_PERSISTENT", persistent);
      const std::string label = std::string("tiles heaviest first, persistent ") + persistent + " " + target;
      const std::vector<FlexAttentionConfig> configs =
          *target ? std::vector<FlexAttentionConfig>{kWgmmaTiles, FlexAttentionConfig{128, 64, 8, 2}}
                  : std::vector<FlexAttentionConfig>{kWgmmaTiles};
      if (!checkWalkVariants(rng, label, configs, names)) return;
    }
  }
  InterpretAfterPasses scope("sm_90a");
  checkBackwardWalks(rng, "tiles heaviest first");
}

// The skewed walks (FLEXTILE_SKEW=1: the full walks; =all: every walk): Q·K_lo alone in a loop of
// at most one iteration, then iteration t issues P·V of step t − 1 and Q·Kᵀ of step t, then P·V_{hi−1}
// alone, the three loops on one set of rings where TMA fills them (a stage of K alone, of K and V,
// of V alone); and overlapped (FLEXTILE_SKEW_OVERLAP=1: Q·Kᵀ of step t first, then P·V of step
// t − 1 with P carried, the softmax of step t while it runs). Every variant (masks whose walks are
// empty for some rows: causal's first full list, the window's) before the passes and through
// sm_90a's (TMA rings, turns covering both products, a skewed and an unskewed walk sharing one
// ring) and sm_80's (cp.async), lengths off the block and divided by it, GQA; then persistent
// programs (shared rings across tiles) and a split last round (a piece's walk skews its own steps
// [from, to)). (Fails with the V of step t read instead of step t − 1, with the epilogue's V read
// at step hi instead of hi − 1, with the prologue's rescale of O dropped (the partial walk after a
// full one), and with the prologue's bound lo + 1 where the walk is empty: each checked by hand.)
static void checkSkewedWalks() {
  SeededRandom rng;
  const std::vector<const char*> all = {"full", "causal", "sliding_window", "prefix_lm", "document", "alibi", "softcap"};
  const std::vector<const char*> modes = {"1", "all", "1+overlap", "all+overlap"};
  for (size_t modeIndex = 0; modeIndex < modes.size(); ++modeIndex) {
    const std::string m(modes[modeIndex]);
    const char* mode = modes[modeIndex];
    ScopedSetenv skew("FLEXTILE_SKEW", m.substr(0, m.find('+')).c_str());
    ScopedSetenv overlap("FLEXTILE_SKEW_OVERLAP", m.find("overlap") != std::string::npos ? "1" : "0");
    const std::array<const char*, 3> targets = {"", "sm_90a", "sm_80"};
    for (size_t targetIndex = 0; targetIndex < targets.size(); ++targetIndex) {
      const char* target = targets[targetIndex];
      // Under the sanitizers two of the twelve (mode, target) pairs a run, six runs covering them
      // all (this test was 88 of the sanitized suite's 1311 CPU-seconds at one pair in three,
      // 2026-12-07).
      if (!runsInThisBuild(rng.seed(), modeIndex * targets.size() + targetIndex, 6)) continue;
      std::optional<InterpretAfterPasses> scope;
      if (*target) scope.emplace(target);
      const std::vector<FlexAttentionConfig> configs =
          std::string(target) == "sm_90a" ? std::vector<FlexAttentionConfig>{kWgmmaTiles, FlexAttentionConfig{128, 64, 8, 2}}
                                          : std::vector<FlexAttentionConfig>{kWgmmaTiles};
      const std::string label = std::string("skewed ") + mode + " " + (*target ? target : "interpreted");
      // Keys off the block and keys the blocks divide (no load masked).
      if (!checkWalkVariants(rng, label, configs, all) || !checkWalkVariants(rng, label + ", S = 256", configs, all, 256))
        return;
    }
  }
  ScopedSetenv skew("FLEXTILE_SKEW", "all");
  InterpretAfterPasses scope("sm_90a");
  ScopedSetenv persistent("FLEXTILE_FORWARD_PERSISTENT", "1");
  for (const char* overlap : {"0", "1"}) {
    if (!runsInThisBuild(rng.seed(), *overlap == '1', 2)) continue;
    ScopedSetenv overlapped("FLEXTILE_SKEW_OVERLAP", overlap);
    const std::string label = std::string("skewed, overlap ") + overlap;
    if (!checkWalkVariants(rng, label + ", persistent", {FlexAttentionConfig{128, 64, 8, 2}},
                           {"full", "causal", "sliding_window", "softcap"}, 512))
      return;
    ScopedSetenv split("FLEXTILE_SPLIT_LAST_ROUND", "1");
    AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 1024, .S = 1024, .D = 64, .dtype = DType::BF16,
                    .context = label + ", split last round"};
    if (!checkFlexAttention(rng, c, kHost, noop_score(), std::nullopt, nullptr, nullptr,
                            {.config = FlexAttentionConfig{128, 64, 8, 2}}))
      return;
  }
}

TEST(TilePassesInterpreted, SkewedWalks) { checkSkewedWalks(); }

// The skewed walks at their edges, plain and overlapped, every walk skewed, before the passes and
// after sm_90a's: rows that see no key (every third row blind; the first 40 rows blind, so whole
// query tiles walk nothing), a mask that allows nothing (every walk empty: no iteration at all),
// one key (a single step: the prologue and the epilogue alone), and GQA 8:1 with the keys a
// multiple of the block.
TEST(TilePassesInterpreted, SkewedWalksAtTheirEdges) {
  SeededRandom rng;
  const BlindRowMasks blind = blindRowMasks();
  const MaskMod &everyThirdRowBlind = blind.everyThird, &firstRowsBlind = blind.first40;
  const RefMaskFn refEveryThird = blind.refEveryThird, refFirstRows = blind.refFirst40;
  RefMaskFn refNone = [](int64_t, int64_t, int64_t, int64_t) { return false; };
  ScopedSetenv skew("FLEXTILE_SKEW", "all");
  for (const char* overlap : {"0", "1"})
    for (const char* target : {"", "sm_90a"}) {
      ScopedSetenv overlapped("FLEXTILE_SKEW_OVERLAP", overlap);
      std::optional<InterpretAfterPasses> scope;
      if (*target) scope.emplace(target);
      const std::string label = std::string("skewed edges, overlap ") + overlap + " " + (*target ? target : "interpreted");
      AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 130, .S = 130, .D = 64, .dtype = DType::BF16};
      c.context = label + ", every third row blind";
      if (!checkFlexAttention(rng, c, kHost, noop_score(), createBlockMask(everyThirdRowBlind, 1, 1, c.L, c.S, {64, 64}, kHost),
                              nullptr, refEveryThird, {.config = kWgmmaTiles}))
        return;
      c.context = label + ", first 40 rows blind";
      if (!checkFlexAttention(rng, c, kHost, noop_score(), createBlockMask(firstRowsBlind, 1, 1, c.L, c.S, {64, 64}, kHost),
                              nullptr, refFirstRows, {.config = kWgmmaTiles}))
        return;
      c.context = label + ", nothing allowed";
      BlockMask none = createBlockMask(or_masks(std::vector<MaskMod>{}), 1, 1, c.L, c.S, {64, 64}, kHost);
      if (!checkFlexAttention(rng, c, kHost, noop_score(), none, nullptr, refNone, {.config = kWgmmaTiles})) return;
      AttentionCase one{.B = 2, .Hq = 2, .Hkv = 1, .L = 3, .S = 1, .D = 64, .dtype = DType::BF16, .context = label + ", one key"};
      if (!checkFlexAttention(rng, one, kHost, noop_score(), std::nullopt, nullptr, nullptr, {.config = kWgmmaTiles}))
        return;
      AttentionCase gqa{.B = 1, .Hq = 8, .Hkv = 1, .L = 64, .S = 256, .D = 64, .dtype = DType::BF16,
                        .context = label + ", GQA 8:1, causal"};
      VariantInstance causal = variant("causal").make({gqa.B, gqa.Hq, gqa.L, gqa.S, kHost, BlockSizes{64, 64}, rng()});
      if (!checkFlexAttention(rng, gqa, kHost, causal.score, causal.mask, causal.refScore, causal.refMask,
                              {.config = kWgmmaTiles}))
        return;
    }
}
