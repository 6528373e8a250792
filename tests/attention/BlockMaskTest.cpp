// BlockMask through the interpreter: for small lengths enumerated exhaustively
// the lists are exact against independent C++ masks (no live block dropped,
// no partial block called full, no empty block listed), the structural
// builders give exactly the generic builder's lists, captured values change
// without retracing, slices keep their queries' global positions, and every
// misuse is a clear error.
#include <gtest/gtest.h>
#include <numeric>

#include <utility>

#include "attention_templates/BlockMask.h"
#include "gpu/GpuTest.h"
#include "MaskTestUtil.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::dsl;
using flextile::testing::expectError;
using flextile::testing::expectExact;
using flextile::testing::expectSameLists;
using flextile::testing::RefMask;
using flextile::testing::SeededRandom;
namespace ft = flextile::testing;

namespace {

const std::vector<int64_t> kLengths{1, 3, 17, 64, 127, 128, 129, 200};

std::vector<int64_t> randomOffsets(std::mt19937_64& rng, int64_t L, int maxDocs) {
  std::vector<int64_t> o{0};
  int docs = 1 + int(rng() % uint64_t(maxDocs));
  for (int d = 1; d < docs; ++d) o.push_back(1 + int64_t(rng() % uint64_t(std::max<int64_t>(L - 1, 1))));
  o.push_back(L + int64_t(rng() % 3));  // the last document may run past both lengths
  std::sort(o.begin(), o.end());
  o.erase(std::unique(o.begin(), o.end()), o.end());
  return o;
}

int64_t pick(std::mt19937_64& rng, std::initializer_list<int64_t> values) {
  return *(values.begin() + rng() % values.size());
}

std::string caseName(const char* mask, int64_t B, int64_t H, int64_t Q, int64_t KV, BlockSizes s) {
  return std::string(mask) + " B=" + std::to_string(B) + " H=" + std::to_string(H) + " Q_LEN=" + std::to_string(Q) +
         " KV_LEN=" + std::to_string(KV) + " blocks " + std::to_string(s.q) + "x" + std::to_string(s.kv);
}

class Exhaustive : public ::testing::TestWithParam<BlockSizes> {};

// Every pair of lengths, every standard mask: the generic builder (mask_mod
// through the interpreter) is exact, and the structural builder lists the
// same blocks. B and H are random in 1..3; masks that do not depend on them
// must give the same rows for every (b, h).
TEST_P(Exhaustive, StandardMasksAreExactAndStructuralEqualsGeneric) {
  SeededRandom rng;
  const BlockSizes sizes = GetParam();
  const MemorySpace host = MemorySpace::Host;
  size_t pair = 0;
  for (int64_t Q : kLengths)
    for (int64_t KV : kLengths) {
      // Under the sanitizers a third of the pairs a run (the five block sizes were 67 CPU-seconds
      // there, the mods interpreted for every block); the normal build runs every pair.
      if (!ft::runsInThisBuild(rng.seed(), pair++, 3)) continue;
      const int64_t B = 1 + int64_t(rng() % 3), H = 1 + int64_t(rng() % 3);
      {
        const std::string c = caseName("causal", B, H, Q, KV, sizes);
        BlockMask s = causalBlockMask(B, H, Q, KV, sizes);
        BlockMask g = createBlockMask(causal_mask(), B, H, Q, KV, sizes, host);
        if (!expectExact(g, ft::refCausal(), c) || !expectSameLists(s, g, c)) return;
      }
      {
        std::vector<int64_t> windows;
        const int64_t numWindows = rng() % 2 ? H : 1;
        for (int64_t h = 0; h < numWindows; ++h) windows.push_back(pick(rng, {1, 2, 7, 16, 33, 64, 130, 1000}));
        const std::string c = caseName(windows.size() > 1 ? "window per head" : "window", B, H, Q, KV, sizes) +
                              " w=" + std::to_string(windows[0]);
        BlockMask s = slidingWindowBlockMask(B, H, Q, KV, windows, sizes, host);
        BlockMask g = createBlockMask(s.maskMod(), B, H, Q, KV, sizes, host);
        if (!expectExact(g, ft::refWindow(windows), c) || !expectSameLists(s, g, c)) return;
      }
      {
        const int64_t P = int64_t(rng() % uint64_t(std::max(Q, KV) + 10));
        const std::string c = caseName("prefix", B, H, Q, KV, sizes) + " P=" + std::to_string(P);
        BlockMask s = prefixLmBlockMask(B, H, Q, KV, P, sizes);
        BlockMask g = createBlockMask(prefix_lm_mask(P), B, H, Q, KV, sizes, host);
        if (!expectExact(g, ft::refPrefix(P), c) || !expectSameLists(s, g, c)) return;
      }
      for (bool causal : {false, true}) {
        const int64_t L = std::max(Q, KV);
        std::vector<std::vector<int64_t>> offsets;
        std::vector<std::vector<int32_t>> ids;
        const int64_t numLists = rng() % 2 ? B : 1;
        for (int64_t b = 0; b < numLists; ++b) {
          offsets.push_back(randomOffsets(rng, L, 7));
          ids.push_back(ft::idsFromOffsets(offsets.back(), L));
        }
        const std::string c = caseName(causal ? "documents+causal" : "documents", B, H, Q, KV, sizes) + " " +
                              std::to_string(offsets.size()) + " offset lists";
        BlockMask s = documentBlockMask(B, H, Q, KV, offsets, causal, sizes, host);
        BlockMask g = createBlockMask(s.maskMod(), B, H, Q, KV, sizes, host);
        RefMask ref = ft::refDocuments(ids);
        if (causal) ref = ft::refAnd(ft::refCausal(), ref);
        if (!expectExact(g, ref, c) || !expectSameLists(s, g, c)) return;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, Exhaustive,
                         ::testing::Values(BlockSizes{16, 16}, BlockSizes{32, 64}, BlockSizes{64, 32},
                                           BlockSizes{128, 128}, BlockSizes{16, 128}),
                         [](const auto& info) {
                           return "q" + std::to_string(info.param.q) + "_kv" + std::to_string(info.param.kv);
                         });

TEST(BlockMask, StructuralBuildersNeverEvaluateTheMod) {
  BlockMask m = slidingWindowBlockMask(2, 4, 1 << 16, 1 << 16, {1024}, {128, 128});
  EXPECT_TRUE(m.maskMod().state().kernels.empty());
  // Row 100 (queries 12800..12927) sees keys 11777..12927: blocks 92..100, of which 93..99 for every query.
  EXPECT_EQ(m.fullKvBlocks(1, 3, 100).size(), 7u);
  EXPECT_EQ(m.partialKvBlocks(1, 3, 100).size(), 2u);  // the diagonal and the window's far edge
  EXPECT_EQ(m.partialKvBlocks(1, 3, 100)[0], 92);
  EXPECT_EQ(m.partialKvBlocks(1, 3, 100)[1], 100);
}

TEST(BlockMask, MaskAlgebraOnRandomCombinations) {
  SeededRandom rng;
  for (int trial = 0; trial < 16; ++trial) {
    const int64_t Q = pick(rng, {1, 3, 17, 64, 127, 129, 200}), KV = pick(rng, {1, 3, 17, 64, 127, 129, 200});
    const BlockSizes sizes{pick(rng, {16, 32, 64}), pick(rng, {16, 32, 128})};
    const int64_t L = std::max(Q, KV);
    std::vector<int32_t> ids = ft::idsFromOffsets(randomOffsets(rng, L, 5), L);
    auto idTensor = capture(Tensor::fromHost(ids, {L}), "ids");
    std::function<std::pair<MaskMod, RefMask>(int)> make = [&](int depth) -> std::pair<MaskMod, RefMask> {
      int choice = int(rng() % (depth >= 2 ? 5 : 8));
      int64_t w = pick(rng, {1, 5, 30, 70}), p = int64_t(rng() % 60);
      switch (choice) {
        case 0: return {causal_mask(), ft::refCausal()};
        case 1: return {sliding_window_mask(w), ft::refWindow({w})};
        case 2: return {prefix_lm_mask(p), ft::refPrefix(p)};
        case 3: return {document_mask(idTensor), ft::refDocuments({ids})};
        case 4: return {noop_mask(), [](auto...) { return true; }};
        case 5: {
          auto [m, r] = make(depth + 1);
          return {not_mask(m), ft::refNot(r)};
        }
        default: {
          auto [a, ra] = make(depth + 1);
          auto [b, rb] = make(depth + 1);
          if (choice == 6) return {and_masks(a, b), ft::refAnd(ra, rb)};
          return {or_masks(a, b), ft::refOr(ra, rb)};
        }
      }
    };
    auto [mod, ref] = make(0);
    const std::string c = caseName(mod.name().c_str(), 1, 2, Q, KV, sizes);
    if (!expectExact(createBlockMask(mod, 1, 2, Q, KV, sizes, MemorySpace::Host), ref, c)) return;
  }
}

TEST(BlockMask, CapturedValuesChangeWithoutRetracing) {
  SeededRandom rng;
  const int64_t L = 200;
  CapturedTensor ids = capture(Tensor::zeros(DType::I32, {2, L}, MemorySpace::Host), "document_ids");
  MaskMod mod = and_masks(causal_mask(), document_mask(ids));
  for (int round = 0; round < 4; ++round) {
    const int64_t Q = pick(rng, {17, 129, 200}), KV = pick(rng, {64, 200});
    std::vector<std::vector<int32_t>> rows;
    std::vector<int32_t> flat;
    for (int b = 0; b < 2; ++b) {
      rows.push_back(ft::idsFromOffsets(randomOffsets(rng, L, 6), L));
      flat.insert(flat.end(), rows.back().begin(), rows.back().end());
    }
    ids.tensor().copyFromHost(flat);
    BlockMask m = createBlockMask(mod, 2, 1, Q, KV, {32, 32}, MemorySpace::Host);
    if (!expectExact(m, ft::refAnd(ft::refCausal(), ft::refDocuments(rows)), "round " + std::to_string(round))) return;
  }
  ASSERT_EQ(mod.state().kernels.count("block_mask_states"), 1u);
  EXPECT_EQ(mod.state().kernels.at("block_mask_states").kernel->numTraces(), 1u);

  // Per-head window sizes, captured: new values, then a rebind to a new tensor.
  std::vector<int32_t> w{3, 40, 100};
  CapturedTensor windows = capture(Tensor::fromHost(w, {3}), "window");
  MaskMod sliding = sliding_window_mask(windows);
  for (int round = 0; round < 3; ++round) {
    for (auto& x : w) x = int32_t(1 + rng() % 150);
    if (round == 2) windows.rebind(Tensor::fromHost(w, {3}));
    else windows.tensor().copyFromHost(w);
    BlockMask m = createBlockMask(sliding, 1, 3, 150, 190, {16, 64}, MemorySpace::Host);
    if (!expectExact(m, ft::refWindow({w[0], w[1], w[2]}), "windows round " + std::to_string(round))) return;
  }
  EXPECT_EQ(sliding.state().kernels.at("block_mask_states").kernel->numTraces(), 1u);
  // Other block sizes are another trace (they are constants of the kernel).
  (void)createBlockMask(sliding, 1, 3, 150, 190, {32, 32}, MemorySpace::Host);
  EXPECT_EQ(sliding.state().kernels.at("block_mask_states").kernel->numTraces(), 2u);
}

TEST(BlockMask, CausalIsTopLeftAlignedForUnequalLengths) {
  // Query i sees keys 0..i whatever the lengths (PyTorch's q_idx >= kv_idx).
  BlockMask shortQ = causalBlockMask(1, 1, 3, 10, {16, 16});
  auto d = shortQ.toDense();
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 10; ++j) EXPECT_EQ(d[size_t(i * 10 + j)], j <= i) << i << "," << j;
  // Rows past KV_LEN see every key: their block is full even though the diagonal lies outside.
  BlockMask longQ = causalBlockMask(1, 1, 40, 10, {16, 16});
  EXPECT_EQ(longQ.state(0, 0, 0, 0), BlockState::Partial);
  EXPECT_EQ(longQ.state(0, 0, 1, 0), BlockState::Full);
  EXPECT_EQ(longQ.state(0, 0, 2, 0), BlockState::Full);
}

TEST(BlockMask, TransposesListTheSameBlocks) {
  SeededRandom rng;
  std::vector<int64_t> windows{pick(rng, {5, 20, 50}), pick(rng, {1, 90})};
  BlockMask m = slidingWindowBlockMask(2, 2, 150, 170, windows, {16, 32}, MemorySpace::Host);
  auto dense = m.toDenseBlocks();
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t c = 0; c < m.numKvBlocks(); ++c) {
        std::vector<int32_t> partial, full;
        for (int64_t r = 0; r < m.numQBlocks(); ++r) {
          auto s = BlockState(dense[size_t(((b * 2 + h) * m.numQBlocks() + r) * m.numKvBlocks() + c)]);
          if (s == BlockState::Partial) partial.push_back(int32_t(r));
          if (s == BlockState::Full) full.push_back(int32_t(r));
        }
        auto p = m.partialQBlocks(b, h, c), f = m.fullQBlocks(b, h, c);
        EXPECT_EQ(std::vector<int32_t>(p.begin(), p.end()), partial) << "b " << b << " h " << h << " kv block " << c;
        EXPECT_EQ(std::vector<int32_t>(f.begin(), f.end()), full) << "b " << b << " h " << h << " kv block " << c;
      }
}

// A copy of a mask shares its host lists (a mask is immutable once built). Regression: the lists
// were copied with the mask, and flex_attention takes a const std::optional<BlockMask>&, so every
// call given a BlockMask copied them all — 250 µs a decode step on the host for a causal mask over
// 32768 keys (256 x 256 blocks), 5 µs once shared. A slice of the copy is a mask of its own and
// leaves the parent's lists as they were.
TEST(BlockMask, CopiesShareTheirHostLists) {
  SeededRandom rng;
  const int64_t S = pick(rng, {1000, 2049, 4096});
  BlockMask m = causalBlockMask(2, 1, S, S, {128, 128}, MemorySpace::Host);
  const std::vector<int32_t> before = m.partialKv().indices;
  BlockMask copy = m;
  const std::optional<BlockMask> asOptional = m;  // what a call on a BlockMask lvalue makes
  EXPECT_EQ(copy.partialKv().indices.data(), m.partialKv().indices.data());
  EXPECT_EQ(asOptional->fullKv().num.data(), m.fullKv().num.data());
  EXPECT_EQ(asOptional->partialQ().indices.data(), m.partialQ().indices.data());
  BlockMask slice = copy.sliceRows(m.numQBlocks() - 1, 1);
  EXPECT_NE(slice.partialKv().indices.data(), m.partialKv().indices.data());
  EXPECT_EQ(m.partialKv().indices, before);
  for (int64_t b = 0; b < 2; ++b) {  // the slice's one row is the parent's last
    auto want = m.fullKvBlocks(b, 0, m.numQBlocks() - 1), got = slice.fullKvBlocks(b, 0, 0);
    EXPECT_EQ(std::vector<int32_t>(got.begin(), got.end()), std::vector<int32_t>(want.begin(), want.end()));
    auto wantP = m.partialKvBlocks(b, 0, m.numQBlocks() - 1), gotP = slice.partialKvBlocks(b, 0, 0);
    EXPECT_EQ(std::vector<int32_t>(gotP.begin(), gotP.end()), std::vector<int32_t>(wantP.begin(), wantP.end()));
  }
  m.check();
  copy.check();
}

TEST(BlockMask, SlicingKeepsGlobalQueryPositions) {
  SeededRandom rng;
  const int64_t Q = 200, KV = 200;
  const int64_t w = pick(rng, {9, 40, 77});
  BlockMask m = slidingWindowBlockMask(1, 2, Q, KV, {w}, {32, 32});
  // Rows 2..4 of blocks: queries 64..159.
  BlockMask rows = m.sliceRows(2, 3);
  EXPECT_EQ(rows.qOffset(), 64);
  EXPECT_EQ(rows.qLen(), 96);
  EXPECT_EQ(rows.numQBlocks(), 3);
  EXPECT_EQ(rows.kvLen(), KV);
  expectExact(rows, ft::refWindow({w}), "rows 2..4");
  auto full = m.toDense(), part = rows.toDense();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 96; ++i)
      for (int64_t j = 0; j < KV; ++j)
        ASSERT_EQ(part[size_t((h * 96 + i) * KV + j)], full[size_t((h * Q + 64 + i) * KV + j)]) << i << "," << j;
  // The last row is cut short by Q_LEN.
  BlockMask tail = m.sliceRows(6, 1);
  EXPECT_EQ(tail.qOffset(), 192);
  EXPECT_EQ(tail.qLen(), 8);
  expectExact(tail, ft::refWindow({w}), "tail row");
  // Decode: one query at a random position t, its row, offset t (mid-row).
  for (int step = 0; step < 5; ++step) {
    const int64_t t = int64_t(rng() % uint64_t(Q));
    BlockMask one = m.sliceRows(t / 32, 1, t, 1);
    EXPECT_EQ(one.qOffset(), t);
    EXPECT_EQ(one.qPhase(), t % 32);
    EXPECT_EQ(one.qLen(), 1);
    expectExact(one, ft::refWindow({w}), "decode t=" + std::to_string(t), /*exactPartial=*/false);
    // Slicing a slice keeps the global offset.
    BlockMask again = one.sliceRows(0, 1);
    EXPECT_EQ(again.qOffset(), t);
    expectExact(again, ft::refWindow({w}), "re-slice t=" + std::to_string(t), /*exactPartial=*/false);
  }
  expectError([&] { (void)m.sliceRows(5, 3); }, {"rows [5, 8)", "[0, 7)"});
  expectError([&] { (void)m.sliceRows(1, 0); }, {"non-empty range"});
  expectError([&] { (void)m.sliceRows(1, 2, 40); }, {"mid-row", "single row"});
  expectError([&] { (void)m.sliceRows(1, 1, 70); }, {"queries [70,", "[32, 64)"});
  expectError([&] { (void)m.sliceRows(1, 1, 40, 30); }, {"queries [40, 70)"});
  expectError([&] { (void)m.sliceRows(1, 2, 32, 10); }, {"without queries"});
}

// A slice's forward list tensors are views of its parent's: same memory, the parent's strides, no
// allocation or upload; the values are the slice's rows, they outlive the parent, and a slice of
// a slice views the same memory. Its transposes are its own.
TEST(BlockMask, SlicesViewTheParentsListTensors) {
  std::optional<BlockMask> parent = slidingWindowBlockMask(2, 3, 300, 260, {40, 7, 100}, {32, 32}, MemorySpace::Host);
  const BlockMaskTensors& p = parent->kvTensors(MemorySpace::Host);
  const int64_t nQ = parent->numQBlocks(), nKv = parent->numKvBlocks();
  EXPECT_EQ(p.kvBatchStride, 3 * nQ);
  EXPECT_EQ(p.kvHeadStride, nQ);
  auto at = [](const Tensor& t) { return static_cast<const int32_t*>(t.hostData()); };
  BlockMask rows = parent->sliceRows(4, 3);
  BlockMask one = parent->sliceRows(8, 1, 270, 5);
  const BlockMaskTensors& r = rows.kvTensors(MemorySpace::Host);
  EXPECT_EQ(at(r.kvNum), at(p.kvNum) + 4);
  EXPECT_EQ(at(r.fullKvNum), at(p.fullKvNum) + 4);
  EXPECT_EQ(at(r.kvIndices), at(p.kvIndices) + 4 * nKv);
  EXPECT_EQ(at(r.fullKvIndices), at(p.fullKvIndices) + 4 * nKv);
  EXPECT_EQ(r.kvBatchStride, 3 * nQ);
  EXPECT_EQ(r.kvHeadStride, nQ);
  EXPECT_EQ(r.kvIndices.shape(), (Shape{2, 3, 3, nKv}));
  EXPECT_EQ(r.kvIndices.strides(), (std::vector<int64_t>{3 * nQ * nKv, nQ * nKv, nKv, 1}));
  BlockMask again = rows.sliceRows(1, 1);  // parent row 5
  EXPECT_EQ(at(again.kvTensors(MemorySpace::Host).fullKvIndices), at(p.fullKvIndices) + 5 * nKv);
  EXPECT_EQ(again.kvTensors(MemorySpace::Host).kvBatchStride, 3 * nQ);
  // The parent goes; the views keep its storage and read the slices' own rows.
  parent.reset();
  for (const BlockMask* s : {&rows, &one, &again}) {
    const BlockMaskTensors& t = s->kvTensors(MemorySpace::Host);
    EXPECT_EQ(t.kvNum.toHost<int32_t>(), s->partialKv().num);
    EXPECT_EQ(t.kvIndices.toHost<int32_t>(), s->partialKv().indices);
    EXPECT_EQ(t.fullKvNum.toHost<int32_t>(), s->fullKv().num);
    EXPECT_EQ(t.fullKvIndices.toHost<int32_t>(), s->fullKv().indices);
    const BlockMaskTensors& all = s->tensors(MemorySpace::Host);
    EXPECT_EQ(at(all.kvIndices), at(t.kvIndices));  // tensors() adds the transposes to the views
    EXPECT_EQ(all.qIndices.shape(), (Shape{2, 3, nKv, s->numQBlocks()}));
    EXPECT_EQ(all.fullQIndices.toHost<int32_t>(), s->fullQ().indices);
  }
  // A broadcast mask's views have stride 0 where it broadcasts.
  BlockMask causal = causalBlockMask(1, 1, 300, 300, {32, 32}, MemorySpace::Host);
  // The slice is named: a reference into a temporary slice's tensors dangled here (ASan:
  // heap-use-after-free); kvTensors() on an rvalue no longer compiles (see below).
  BlockMask causalRows = causal.sliceRows(2, 2);
  const BlockMaskTensors& c = causalRows.kvTensors(MemorySpace::Host);
  EXPECT_EQ(c.kvBatchStride, 0);
  EXPECT_EQ(c.kvHeadStride, 0);
  EXPECT_EQ(at(c.kvNum), at(causal.kvTensors(MemorySpace::Host).kvNum) + 2);
}

// tensors() and kvTensors() return references into the mask's cache: callable on a named mask,
// not on a temporary whose cache dies at the end of the statement.
template <class M>
concept CanAskForKvTensors = requires(M&& m) { std::forward<M>(m).kvTensors(MemorySpace::Host); };
template <class M>
concept CanAskForTensors = requires(M&& m) { std::forward<M>(m).tensors(MemorySpace::Host); };
static_assert(CanAskForKvTensors<BlockMask&> && CanAskForKvTensors<const BlockMask&>);
static_assert(!CanAskForKvTensors<BlockMask> && !CanAskForKvTensors<BlockMask&&>);
static_assert(CanAskForTensors<const BlockMask&> && !CanAskForTensors<BlockMask>);

// The forward's tile order (BlockMask::heaviestTilesFirst): tiles t = (b·H + h)·mTiles + m sorted
// by their mask row's live blocks, most first, ties in launch order; B and H broadcast from a mask
// of one; tiles smaller than the mask's rows share their row's count; a slice's rows start at its
// query phase; sizes the mask does not fit are errors.
TEST(BlockMask, HeaviestTilesFirstSortsTilesByTheirRowsLiveBlocks) {
  // Causal over 200 queries in blocks of 64: rows 0..3 have 1, 2, 3, 4 live blocks.
  BlockMask causal = createBlockMask(causal_mask(), 1, 1, 200, 200, {64, 64}, MemorySpace::Host);
  const std::vector<int32_t> order = causal.heaviestTilesFirst(2, 2, 200, 64);
  std::vector<int32_t> expected;
  for (int m = 3; m >= 0; --m)
    for (int bh = 0; bh < 4; ++bh) expected.push_back(bh * 4 + m);
  EXPECT_EQ(order, expected);
  // Tiles of 32 rows: two a mask row (the last row's second past the queries), with that row's
  // count, in launch order.
  const std::vector<int32_t> halves = causal.heaviestTilesFirst(1, 1, 200, 32);
  EXPECT_EQ(halves, (std::vector<int32_t>{6, 4, 5, 2, 3, 0, 1}));
  // A slice of rows 1..2 (queries 64..191): its own two rows, 2 and 3 live blocks.
  BlockMask rows = causal.sliceRows(1, 2);
  EXPECT_EQ(rows.heaviestTilesFirst(1, 1, 128, 64), (std::vector<int32_t>{1, 0}));
  // A random document mask: a permutation whose work never rises.
  SeededRandom rng;
  std::vector<int32_t> ids(600);  // [2, 300]: each batch its own documents
  for (size_t i = 0, doc = 0; i < ids.size(); ++i) {
    if (i % 300 == 0 || rng() % 40 == 0) ++doc;
    ids[i] = int32_t(doc);
  }
  CapturedTensor idTensor = capture(Tensor::fromHost(ids, {2, 300}, MemorySpace::Host), "document_ids");
  BlockMask docs = createBlockMask(and_masks(causal_mask(), document_mask(idTensor)), 2, 1, 300, 300, {32, 32},
                                   MemorySpace::Host);
  const std::vector<int32_t> d = docs.heaviestTilesFirst(2, 3, 300, 32);
  std::vector<int32_t> sorted = d;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int32_t> all(d.size());
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(sorted, all);
  const BlockMaskTensors& lists = docs.kvTensors(MemorySpace::Host);
  const std::vector<int32_t> partial = lists.kvNum.toHost<int32_t>(), full = lists.fullKvNum.toHost<int32_t>();
  auto work = [&](int32_t t) {
    const int64_t m = t % 10, b = t / 30;  // 10 tiles a head, 3 heads; the mask's H of 1 broadcasts
    return partial[size_t(b * 10 + m)] + full[size_t(b * 10 + m)];
  };
  for (size_t i = 1; i < d.size(); ++i) {
    EXPECT_GE(work(d[i - 1]), work(d[i])) << i;
    if (work(d[i - 1]) == work(d[i])) {
      EXPECT_LT(d[i - 1], d[i]) << i;
    }
  }
  // The backward's key tiles: causal column n of 4 has 4 − n live blocks, over G = 2 query heads
  // of each of Hkv = 2 (the mask's H of one broadcast): the first columns first.
  std::vector<int32_t> keyExpected;
  for (int n = 0; n < 4; ++n)
    for (int bh = 0; bh < 2; ++bh) keyExpected.push_back(bh * 4 + n);
  EXPECT_EQ(causal.heaviestKeyTilesFirst(1, 2, 2, 200, 64), keyExpected);
  EXPECT_THROW(causal.heaviestKeyTilesFirst(1, 2, 2, 300, 64), Error);  // longer than the mask
  EXPECT_THROW(causal.heaviestTilesFirst(1, 1, 300, 64), Error);  // longer than the mask
  EXPECT_THROW(causal.heaviestTilesFirst(1, 1, 200, 0), Error);
  // The tensor form: the same order, kept.
  const Tensor& t = causal.heaviestTilesFirstTensor(2, 2, 200, 64, MemorySpace::Host);
  EXPECT_EQ(t.toHost<int32_t>(), expected);
  EXPECT_EQ(&causal.heaviestTilesFirstTensor(2, 2, 200, 64, MemorySpace::Host), &t);
}

TEST(BlockMask, PictureOfASmallCausalMask) {
  BlockMask m = causalBlockMask(1, 1, 100, 100, {32, 32});
  EXPECT_EQ(m.picture(),
            "BlockMask 'causal': B=1 H=1 Q_LEN=100 KV_LEN=100, blocks 32 x 32 (4 x 4), 4 partial + 6 full, sparsity 37.5%\n"
            "b=0 h=0: one character per block, rows = q blocks, columns = kv blocks\n"
            "  0 |░   |\n"
            "  1 |█░  |\n"
            "  2 |██░ |\n"
            "  3 |███░|\n"
            "█ full (no mask_mod)   ░ partial (mask_mod applied)   ' ' empty (never loaded)\n");
  EXPECT_DOUBLE_EQ(m.sparsity(), 6.0 / 16);
  EXPECT_EQ(m.numPartialBlocks(), 4);
  EXPECT_EQ(m.numFullBlocks(), 6);
  // Large masks are cut to maxBlocks with a marker.
  std::string big = causalBlockMask(1, 1, 1000, 1000, {16, 16}).picture(0, 0, 8);
  EXPECT_NE(big.find("(first 8 x 8 shown)"), std::string::npos) << big;
  EXPECT_NE(big.find("|░       …"), std::string::npos) << big;
}

TEST(BlockMask, LengthAndShapeMismatchesAreErrors) {
  BlockMask m = causalBlockMask(2, 1, 300, 256, {64, 64});
  EXPECT_NO_THROW(m.checkInputs(2, 16, 300, 256));  // H broadcasts
  expectError([&] { m.checkInputs(2, 16, 256, 256); }, {"Q_LEN=300 KV_LEN=256", "Q_LEN=256 KV_LEN=256", "never cropped"});
  expectError([&] { m.checkInputs(2, 16, 300, 512); }, {"Q_LEN=300 KV_LEN=256", "Q_LEN=300 KV_LEN=512"});
  expectError([&] { m.checkInputs(3, 16, 300, 256); }, {"batch 2", "batch 3"});
  BlockMask heads = causalBlockMask(1, 4, 10, 10, {16, 16});
  EXPECT_NO_THROW(heads.checkInputs(7, 4, 10, 10));
  expectError([&] { heads.checkInputs(1, 8, 10, 10); }, {"4 heads", "8 query heads"});
  BlockMask slice = m.sliceRows(1, 1);
  expectError([&] { slice.checkInputs(1, 1, 300, 256); }, {"Q_LEN=64 KV_LEN=256", "Q_LEN=300"});
}

TEST(BlockMask, BadArgumentsAreErrors) {
  expectError([] { (void)createBlockMask(causal_mask(), 1, 1, 100, 100, {48, 64}, MemorySpace::Host); },
              {"createBlockMask", "powers of two", "48"});
  expectError([] { (void)createBlockMask(causal_mask(), 0, 1, 100, 100, {}, MemorySpace::Host); },
              {"B and H must be at least 1", "B=0"});
  expectError([] { (void)createBlockMask(causal_mask(), 1, 1, 0, 100, {}, MemorySpace::Host); },
              {"lengths must be at least 1", "Q_LEN=0"});
  expectError([] { (void)createBlockMask(MaskMod(), 1, 1, 10, 10, {}, MemorySpace::Host); }, {"mask_mod is empty"});
  expectError([] { (void)causalBlockMask(1, 1, int64_t(1) << 32, 10); }, {"below 2^31"});
  expectError([] { (void)slidingWindowBlockMask(1, 3, 10, 10, {4, 5}); }, {"one window or one per head", "H=3", "got 2"});
  expectError([] { (void)slidingWindowBlockMask(1, 1, 10, 10, {0}); }, {"windows must be in [1, 2^31)"});
  expectError([] { (void)documentBlockMask(2, 1, 10, 10, {{0, 5, 10}, {0, 10}, {0, 10}}, false); },
              {"one offset list or one per batch", "B=2", "got 3"});
  expectError([] { (void)documentBlockMask(1, 1, 10, 10, {{0, 5, 5, 10}}, false); }, {"strictly increasing", "5 then 5"});
  expectError([] { (void)documentBlockMask(1, 1, 10, 12, {{0, 5, 10}}, true); }, {"end at 10", "max(Q_LEN, KV_LEN) = 12"});
  expectError([] { (void)documentBlockMask(1, 1, 10, 10, {{1, 10}}, true); }, {"must start at 0"});
  BlockMask m = causalBlockMask(1, 2, 50, 50, {16, 16});
  expectError([&] { (void)m.partialKvBlocks(0, 2, 0); }, {"partialKvBlocks", "h 2", "[0, 2)"});
  expectError([&] { (void)m.fullQBlocks(0, 0, 4); }, {"fullQBlocks", "kv block 4", "[0, 4)"});
  expectError([&] { (void)m.picture(1, 0); }, {"picture", "b 1"});
  // A mask_mod with a host capture cannot be built on the GPU (named before anything runs).
  auto ids = capture(Tensor::zeros(DType::I32, {8}, MemorySpace::Host), "ids");
  if (!deviceAvailable()) {
    EXPECT_THROW((void)createBlockMask(document_mask(ids), 1, 1, 8, 8, {16, 16}, MemorySpace::Device), std::exception);
  }
}

TEST(BlockMask, CheckerCatchesCorruptLists) {
  BlockMask good = causalBlockMask(1, 1, 64, 64, {16, 16});  // 4 x 4 blocks
  auto rebuild = [&](auto edit) {
    BlockLists p = good.partialKv(), f = good.fullKv();
    edit(p, f);
    return BlockMask::fromKvLists(causal_mask(), 1, 1, 64, 64, {16, 16}, p, f);
  };
  EXPECT_NO_THROW(rebuild([](BlockLists&, BlockLists&) {}));
  // Row 3 (q 48..63) is full 0,1,2 and partial 3.
  expectError([&] { rebuild([](BlockLists& p, BlockLists&) { p.indices[3 * 4 + 0] = 4; }); },
              {"partialKv row 3", "block 4", "outside [0, 4)"});
  expectError([&] { rebuild([](BlockLists&, BlockLists& f) { std::swap(f.indices[3 * 4 + 0], f.indices[3 * 4 + 1]); }); },
              {"fullKv row 3", "not strictly ascending"});
  expectError([&] { rebuild([](BlockLists&, BlockLists& f) { f.indices[3 * 4 + 1] = 0; }); },
              {"fullKv row 3", "duplicated"});
  expectError([&] { rebuild([](BlockLists& p, BlockLists&) { p.num[0] = 5; }); }, {"partialKv row 0 has count 5", "outside [0, 4]"});
  expectError([&] {
    rebuild([](BlockLists& p, BlockLists& f) {
      f.num[3] = 3;
      p.indices[3 * 4] = 2;  // block (3, 2) both full and partial
    });
  }, {"both partial and full"});
  expectError([&] { rebuild([](BlockLists& p, BlockLists&) { p.indices[0 * 4 + 2] = 1; }); }, {"padding"});
  expectError([&] { rebuild([](BlockLists& p, BlockLists&) { p.num.pop_back(); }); }, {"partialKv has 3 counts"});
  // Transposes that disagree with the forward lists.
  BlockLists pq = good.partialQ(), fq = good.fullQ();
  EXPECT_NO_THROW(BlockMask::fromLists(causal_mask(), 1, 1, 64, 64, {16, 16}, good.partialKv(), good.fullKv(), pq, fq));
  fq.num[0] = 2;  // kv block 0: full for q blocks 1, 2 only (3 dropped)
  expectError([&] {
    (void)BlockMask::fromLists(causal_mask(), 1, 1, 64, 64, {16, 16}, good.partialKv(), good.fullKv(), pq, fq);
  }, {"padding"});
  fq.indices[2] = 0;
  expectError([&] {
    (void)BlockMask::fromLists(causal_mask(), 1, 1, 64, 64, {16, 16}, good.partialKv(), good.fullKv(), pq, fq);
  }, {"transposed lists disagree", "q 3, kv 0", "forward says full, transposed says empty"});
}

TEST(BlockMask, TensorsForKernels) {
  BlockMask m = documentBlockMask(2, 1, 100, 90, {{0, 40, 100}, {0, 10, 20, 100}}, true, {32, 16}, MemorySpace::Host);
  const BlockMaskTensors& t = m.tensors(MemorySpace::Host);
  EXPECT_EQ(t.kvNum.shape(), (Shape{2, 1, 4}));
  EXPECT_EQ(t.kvIndices.shape(), (Shape{2, 1, 4, 6}));
  EXPECT_EQ(t.fullQIndices.shape(), (Shape{2, 1, 6, 4}));
  EXPECT_EQ(t.kvIndices.toHost<int32_t>(), m.partialKv().indices);
  EXPECT_EQ(t.fullQNum.toHost<int32_t>(), m.fullQ().num);
  EXPECT_EQ(&m.tensors(MemorySpace::Host), &t);  // made once
  EXPECT_EQ(m.space(), MemorySpace::Host);
  EXPECT_EQ(m.maskMod().name(), "and(causal, document(document_ids))");
}

}  // namespace

// Every structural builder takes the same placement argument.
TEST(BlockMask, EveryStructuralBuilderTakesThePlacement) {
  using dsl::MemorySpace;
  const MemorySpace host = MemorySpace::Host;
  EXPECT_EQ(causalBlockMask(1, 1, 100, 100, {32, 32}, host).space(), std::optional<MemorySpace>(host));
  EXPECT_EQ(prefixLmBlockMask(1, 1, 100, 100, 20, {32, 32}, host).space(), std::optional<MemorySpace>(host));
  EXPECT_EQ(slidingWindowBlockMask(1, 1, 100, 100, {16}, {32, 32}, host).space(), std::optional<MemorySpace>(host));
  EXPECT_EQ(slidingWindowBlockMask(1, 2, 100, 100, {16, 8}, {32, 32}, host).space(), std::optional<MemorySpace>(host));
  EXPECT_EQ(documentBlockMask(1, 1, 100, 100, {{0, 40, 100}}, true, {32, 32}, host).space(),
            std::optional<MemorySpace>(host));
  // Without one, a mask that captures nothing follows the call that uses it.
  EXPECT_EQ(causalBlockMask(1, 1, 100, 100, {32, 32}).space(), std::nullopt);
  // The placement changes nothing about the lists.
  BlockMask a = causalBlockMask(1, 1, 100, 70, {32, 32}), b = causalBlockMask(1, 1, 100, 70, {32, 32}, host);
  EXPECT_EQ(a.toDenseBlocks(), b.toDenseBlocks());
}

// A per-head window mask built from the caller's own capture: exact lists (lengths not multiples
// of the blocks, random windows per head, an i64 tensor too), the mask's mod reads the caller's
// tensor itself (one capture slot), and the windows' mistakes are clear errors.
TEST(BlockMask, PerHeadWindowsFromTheCallersCapture) {
  SeededRandom rng;
  const int64_t H = 3;
  for (auto [qLen, kvLen] : {std::pair<int64_t, int64_t>{203, 150}, {129, 129}, {17, 64}}) {
    std::vector<int32_t> w32(static_cast<size_t>(H));
    for (auto& w : w32) w = int32_t(1 + rng() % 80);
    std::vector<int64_t> w64(w32.begin(), w32.end());
    const std::string context = "lengths " + std::to_string(qLen) + "x" + std::to_string(kvLen);
    CapturedTensor windows = capture(Tensor::fromHost(w32, {H}, MemorySpace::Host), "windows");
    BlockMask m = slidingWindowBlockMask(2, H, qLen, kvLen, windows, {32, 16});
    EXPECT_EQ(m.space(), std::optional<MemorySpace>(MemorySpace::Host));
    if (!expectExact(m, ft::refWindow(w64), context)) return;
    // The same lists as the builder that makes its own tensor, and as the generic builder.
    expectSameLists(m, slidingWindowBlockMask(2, H, qLen, kvLen, w64, {32, 16}, MemorySpace::Host), context);
    expectSameLists(m, createBlockMask(sliding_window_mask(windows), 2, H, qLen, kvLen, {32, 16}, MemorySpace::Host),
                    context);
    ASSERT_EQ(m.maskMod().captures().size(), 1u);
    EXPECT_EQ(m.maskMod().captures()[0].slot(), windows.slot()) << "the mask must read the caller's tensor";
    // A caller's mod reading the same capture and the mask's mod together still hold one capture.
    MaskMod mine("not_first_key", [windows](const Tile&, const Tile& h, const Tile&, const Tile& kv) {
      return kv >= windows(h) - windows(h);
    });
    EXPECT_EQ(and_masks(mine, m.maskMod()).captures().size(), 1u);
    CapturedTensor windows64 = capture(Tensor::fromHost(w64, {H}, MemorySpace::Host), "windows64");
    expectSameLists(m, slidingWindowBlockMask(2, H, qLen, kvLen, windows64, {32, 16}), context + " i64");
  }
  CapturedTensor two = capture(Tensor::fromHost(std::vector<int32_t>{4, 8}, {2}, MemorySpace::Host), "two");
  expectError([&] { (void)slidingWindowBlockMask(1, 3, 64, 64, two); }, {"'two'", "one entry per head (H=3)"});
  expectError([&] { (void)slidingWindowBlockMask(1, 2, 64, 64, two, {32, 32}, MemorySpace::Device); },
              {"'two'", "host memory", "placement asks for device"});
  CapturedTensor zero = capture(Tensor::fromHost(std::vector<int32_t>{4, 0}, {2}, MemorySpace::Host), "zero");
  expectError([&] { (void)slidingWindowBlockMask(1, 2, 64, 64, zero); }, {"head 1", "'zero'", "got 0"});
  CapturedTensor floats = capture(Tensor::fromHost(std::vector<float>{4, 8}, {2}, MemorySpace::Host), "floats");
  expectError([&] { (void)slidingWindowBlockMask(1, 2, 64, 64, floats); }, {"integer tensor [H]"});
  expectError([&] { (void)slidingWindowBlockMask(1, 2, 64, 64, CapturedTensor()); }, {"empty CapturedTensor"});
}
