// Masks whose lists exist only as tensors (BlockMask::fromListTensors), through the interpreter:
// decode, slices and prefill against the host-list mask and the float64 reference
// (ListTensorMaskCheck.h, which the GPU tests run on the device too); the transposed lists derived
// where the lists are, and the backward on them; everything that needs host lists refuses, naming
// toHost(); toHost() gives back the same lists; bad tensors and bounds are errors that name them.
#include <gtest/gtest.h>

#include "ListTensorMaskCheck.h"
#include "gpu/GpuTest.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::testing;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

namespace {
constexpr MemorySpace kHost = MemorySpace::Host;
constexpr BlockSizes kBlocks{32, 32};
}  // namespace

TEST(ListTensorMask, DecodeSlicesAndPrefillMatchTheHostListMask) {
  SeededRandom rng;
  checkListTensorMask(rng, kHost);
}

TEST(ListTensorMask, WhatNeedsHostListsRefusesAndNamesToHost) {
  BlockMask causal = causalBlockMask(2, 1, 100, 100, kBlocks, kHost);
  BlockMask m = BlockMask::fromListTensors(causal.maskMod(), 2, 1, 100, 100, kBlocks, copiedLists(causal, kHost));
  EXPECT_FALSE(m.hasHostLists());
  EXPECT_NE(m.describe().find("lists as tensors only (at most 4 live blocks a row)"), std::string::npos) << m.describe();
  for (auto [name, call] : std::vector<std::pair<const char*, std::function<void()>>>{
           {"picture", [&] { (void)m.picture(); }},
           {"stats", [&] { (void)m.stats(); }},
           {"check", [&] { m.check(); }},
           {"numFullBlocks", [&] { (void)m.numFullBlocks(); }},
           {"partialKvBlocks", [&] { (void)m.partialKvBlocks(0, 0, 0); }},
           {"partialQ", [&] { (void)m.partialQ(); }},
           {"toDense", [&] { (void)m.toDense(); }}})
    expectError(call, {std::string("BlockMask::") + name, "toHost()", "fromListTensors"});
  // The lists live on the host here: the device has no copy to make, and there is nothing to upload from.
  expectError([&] { (void)m.kvTensors(MemorySpace::Device); }, {"BlockMask::kvTensors", "only as host tensors"});
  // Bounds are reported without the lists: the default says nothing.
  EXPECT_EQ(m.maxLiveBlocksPerRow(), 4);
  EXPECT_TRUE(m.mayHaveFullBlocks());
  EXPECT_TRUE(m.mayHavePartialBlocks());
}

TEST(ListTensorMask, ToHostReadsTheSameListsBack) {
  BlockMask window = slidingWindowBlockMask(1, 3, 300, 290, {20, 64, 1000}, kBlocks, kHost);
  BlockMask m = BlockMask::fromListTensors(window.maskMod(), 1, 3, 300, 290, kBlocks, copiedLists(window, kHost),
                                           {.maxLiveBlocksPerRow = window.maxLiveBlocksPerRow()});
  BlockMask back = m.toHost();
  ASSERT_TRUE(back.hasHostLists());
  back.check();
  expectSameLists(back, window, "toHost");
  EXPECT_EQ(m.maxLiveBlocksPerRow(), window.maxLiveBlocksPerRow());
  // A slice's tensors are strided views of the parent's: read through them, its lists are the
  // host-list slice's, a one-row slice starting mid-row included.
  expectSameLists(m.sliceRows(3, 4).toHost(), window.sliceRows(3, 4), "toHost of a slice");
  expectSameLists(m.sliceRows(5, 1, 170, 3).toHost(), window.sliceRows(5, 1, 170, 3), "toHost of a one-row slice");
  EXPECT_EQ(window.toHost().numFullBlocks(), window.numFullBlocks()) << "a host-list mask is its own host copy";
}

TEST(ListTensorMask, BadTensorsAndBoundsNameWhatIsWrong) {
  BlockMask causal = causalBlockMask(1, 2, 64, 96, kBlocks, kHost);  // nQ = 2, nKv = 3
  auto lists = [&] { return copiedLists(causal, kHost); };
  expectError([&] { (void)BlockMask::fromListTensors(causal.maskMod(), 1, 2, 64, 128, kBlocks, lists()); },
              {"BlockMask::fromListTensors kvIndices (partial blocks)", "[1, 2, 2, 4]"});
  BlockMaskTensors wrongType = lists();
  wrongType.fullKvNum = Tensor::empty(DType::I64, {1, 2, 2}, kHost);
  expectError([&] { (void)BlockMask::fromListTensors(causal.maskMod(), 1, 2, 64, 96, kBlocks, wrongType); },
              {"fullKvNum (full counts)", "i32"});
  BlockMaskTensors missing = lists();
  missing.kvNum = Tensor();
  expectError([&] { (void)BlockMask::fromListTensors(causal.maskMod(), 1, 2, 64, 96, kBlocks, missing); },
              {"kvNum (partial counts) is empty"});
  BlockMaskTensors strided = lists();
  strided.kvIndices = Tensor::viewOf(Tensor::empty(DType::I32, {1, 2, 2, 6}, kHost), 0, {1, 2, 2, 3}, {24, 12, 6, 1});
  expectError([&] { (void)BlockMask::fromListTensors(causal.maskMod(), 1, 2, 64, 96, kBlocks, strided); },
              {"kvIndices (partial blocks) must be contiguous"});
  expectError([&] { (void)BlockMask::fromListTensors(causal.maskMod(), 1, 2, 64, 96, kBlocks, lists(), {.maxLiveBlocksPerRow = 4}); },
              {"maxLiveBlocksPerRow is 4", "only 3 kv blocks"});
  expectError([&] { (void)BlockMask::fromListTensors(MaskMod(), 1, 2, 64, 96, kBlocks, lists()); }, {"the mask_mod is empty"});
}

// Queries that straddle two mask rows take lists that decodeBlockLists merges on the device; on a
// list-tensor mask its host bounds (the split count and which walks) come from ListBounds instead
// of the rows' counts. Against the reference, with and without a bound, chosen and 3 splits.
TEST(ListTensorMask, QueriesThatStraddleTwoRows) {
  SeededRandom rng;
  const int64_t B = 1, Hq = 4, Hkv = 1, S = 200, L = 5, D = 64, window = 45;
  BlockMask window45 = slidingWindowBlockMask(B, 1, S + L, S, {window}, kBlocks, kHost);
  Tensor k = randomTensor(rng, DType::BF16, {B, Hkv, S, D}, kHost), v = randomTensor(rng, DType::BF16, {B, Hkv, S, D}, kHost);
  for (const ListBounds& bounds : {ListBounds{}, ListBounds{.maxLiveBlocksPerRow = window45.maxLiveBlocksPerRow()}}) {
    BlockMask m = BlockMask::fromListTensors(window45.maskMod(), B, 1, S + L, S, kBlocks, copiedLists(window45, kHost), bounds);
    for (int64_t pos : {int64_t(30), int64_t(94), S - 3}) {  // rows 0|1, 2|3, 6|7 of 32 queries
      for (int64_t splits : {0, 3}) {
        SCOPED_TRACE("position " + std::to_string(pos) + " splits " + std::to_string(splits));
        Tensor q = randomTensor(rng, DType::BF16, {B, Hq, L, D}, kHost);
        const ReferenceResult ref = referenceAttention(q, k, v, nullptr, refWindow({window}), 0.125, pos);
        Tensor out = Tensor::empty(DType::BF16, q.shape(), kHost), lse = Tensor::empty(DType::F32, {B, Hq, L}, kHost);
        poison(out);
        poison(lse);
        flex_attention_into(q, k, v, noop_score(), m, out, &lse,
                            {.kernel = AttentionTemplate::Decode, .decode_config = FlexDecodeConfig{.block_n = 16, .splits = splits},
                             .query_offset = pos});
        if (!compareWithReference(out, lse, ref, D, DType::BF16)) return;
      }
    }
  }
}

// createBlockMask with hostLists = false compacts the states with a second kernel where they are
// (here the interpreter; FlexDecodeGpu.ListsOnlyOnTheDevice-style on the GPU) and keeps no host lists:
// read back, the lists equal the host compaction's, for rows of more than one 64-block chunk,
// ragged lengths, masks with empty rows, and B/H broadcast or not.
TEST(ListTensorMask, CreateBlockMaskCompactsWithoutTheHost) {
  struct Case {
    MaskMod mod;
    int64_t B, H, qLen, kvLen;
    BlockSizes sizes;
  };
  const std::vector<Case> cases = {
      {causal_mask(), 1, 1, 100, 100, kBlocks},
      {sliding_window_mask(300), 2, 1, 70, 9000, {32, 64}},   // 141 kv blocks: three chunks
      {causal_mask(), 1, 2, 300, 5000, {64, 32}},              // 157 kv blocks, H = 2
      {prefix_lm_mask(37), 1, 1, 129, 4097, {128, 32}},        // ragged tails
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.mod.name() + " " + std::to_string(c.qLen) + " x " + std::to_string(c.kvLen));
    BlockMask want = createBlockMask(c.mod, c.B, c.H, c.qLen, c.kvLen, c.sizes, kHost);
    BlockMaskPlacement where{kHost};
    where.hostLists = false;
    BlockMask got = createBlockMask(c.mod, c.B, c.H, c.qLen, c.kvLen, c.sizes, where);
    ASSERT_FALSE(got.hasHostLists());
    BlockMask back = got.toHost();
    back.check();
    expectSameLists(back, want, "device compaction");
  }
  // A mask that allows nothing in some rows: their counts are 0 and their padding stays 0.
  MaskMod none("none_before_40", [](Tile, Tile, Tile q, Tile kv) { return (q >= 40) & (kv <= q); });
  BlockMaskPlacement where{kHost};
  where.hostLists = false;
  BlockMask back = createBlockMask(none, 1, 1, 100, 100, kBlocks, where).toHost();
  expectSameLists(back, createBlockMask(none, 1, 1, 100, 100, kBlocks, kHost), "rows without a live block");
}

// The transposed lists of a list-tensor mask, derived where its lists are (block states, then a
// compaction along the other axis), equal the host's transposes, for whole masks and for row
// slices (whose lists are strided views); the backward on such a mask gives the same gradients as
// on the host-list mask, bit for bit.
TEST(ListTensorMask, TransposesAndTheBackwardWithoutHostLists) {
  SeededRandom rng;
  const BlockSizes sizes{32, 64};
  BlockMask window = slidingWindowBlockMask(2, 1, 300, 290, {70}, sizes, kHost);  // nQ 10, nKv 5
  BlockMask m = BlockMask::fromListTensors(window.maskMod(), 2, 1, 300, 290, sizes, copiedLists(window, kHost));
  auto same = [](const Tensor& got, const std::vector<int32_t>& want, const char* what) {
    EXPECT_EQ(got.toHost<int32_t>(), want) << what;
  };
  const BlockMaskTensors& t = m.tensors(kHost);
  same(t.qNum, window.partialQ().num, "partial q counts");
  same(t.qIndices, window.partialQ().indices, "partial q indices");
  same(t.fullQNum, window.fullQ().num, "full q counts");
  same(t.fullQIndices, window.fullQ().indices, "full q indices");
  BlockMask slice = m.sliceRows(3, 4), hostSlice = window.sliceRows(3, 4);
  const BlockMaskTensors& st = slice.tensors(kHost);
  same(st.qNum, hostSlice.partialQ().num, "a slice's partial q counts");
  same(st.qIndices, hostSlice.partialQ().indices, "a slice's partial q indices");
  same(st.fullQNum, hostSlice.fullQ().num, "a slice's full q counts");
  same(st.fullQIndices, hostSlice.fullQ().indices, "a slice's full q indices");

  expectSameGradients(rng, window, m, 2, 4, 2, 300, 290, 64, kHost);
}
