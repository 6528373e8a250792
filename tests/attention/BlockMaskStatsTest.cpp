// BlockMask::stats() against brute force over the element mask: for random small shapes (lengths
// not multiples of the blocks, B and H broadcast or not, per-head and per-batch masks, fully
// masked rows) and random kernel tiles smaller than, equal to and larger than the mask's blocks,
// every (b, h) entry and the overall entry must equal counts made pair by pair from an
// independent C++ mask and the mask's block states.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "attention_templates/BlockMask.h"
#include "gpu/GpuTest.h"
#include "MaskTestUtil.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::dsl;
using flextile::testing::expectError;
using flextile::testing::RefMask;
using flextile::testing::SeededRandom;
namespace ft = flextile::testing;

namespace {

int64_t pick(std::mt19937_64& rng, std::initializer_list<int64_t> values) {
  return *(values.begin() + rng() % values.size());
}

// Nearest rank, by sorting: the smallest value with at least `percent` % of the values at or below it.
int64_t sortedPercentile(std::vector<int64_t> v, int percent) {
  std::sort(v.begin(), v.end());
  for (size_t i = 0; i < v.size(); ++i)
    if (100 * (i + 1) >= size_t(percent) * v.size()) return v[i];
  return v.back();
}

struct Expected {
  int64_t full = 0, partial = 0, emptyRows = 0, allowed = 0, computed = 0;
  std::vector<int64_t> rowLengths;
};

// Brute force for one (b, h) of mask `m`: allowed pairs from `ref` pair by pair; a pair is computed
// when its kernel tile holds a pair whose mask block is live. Queries at global qOffset + i; tiles
// and blocks both start at the row grid (local i + qPhase).
Expected bruteForce(const BlockMask& m, const RefMask& ref, int64_t b, int64_t h, BlockSizes tile) {
  Expected e;
  const int64_t Q = m.qLen(), KV = m.kvLen(), phase = m.qPhase();
  for (int64_t r = 0; r < m.numQBlocks(); ++r) {
    int64_t n = 0;
    for (int64_t c = 0; c < m.numKvBlocks(); ++c) {
      const BlockState s = m.state(b, h, r, c);
      e.full += s == BlockState::Full;
      e.partial += s == BlockState::Partial;
      n += s != BlockState::Empty;
    }
    e.rowLengths.push_back(n);
    e.emptyRows += n == 0;
  }
  const int64_t tileRows = (Q + phase + tile.q - 1) / tile.q, tileCols = (KV + tile.kv - 1) / tile.kv;
  std::vector<uint8_t> tileLive(size_t(tileRows * tileCols), 0);
  for (int64_t i = 0; i < Q; ++i)
    for (int64_t j = 0; j < KV; ++j) {
      const int64_t u = i + phase;
      e.allowed += ref(b, h, m.qOffset() + i, j) ? 1 : 0;
      if (m.state(b, h, u / m.qBlockSize(), j / m.kvBlockSize()) != BlockState::Empty)
        tileLive[size_t((u / tile.q) * tileCols + j / tile.kv)] = 1;
    }
  for (int64_t i = 0; i < Q; ++i)
    for (int64_t j = 0; j < KV; ++j) e.computed += tileLive[size_t(((i + phase) / tile.q) * tileCols + j / tile.kv)];
  return e;
}

void expectGamma(double gamma, int64_t computed, int64_t allowed, const std::string& context) {
  if (allowed > 0) EXPECT_DOUBLE_EQ(gamma, double(computed) / double(allowed)) << context;
  else if (computed > 0) EXPECT_TRUE(std::isinf(gamma) && gamma > 0) << context << ": gamma " << gamma;
  else EXPECT_TRUE(std::isnan(gamma)) << context << ": gamma " << gamma;
}

// Compares every entry of m.stats(tile) with the brute force; returns false after the first mismatch.
bool expectStats(const BlockMask& m, const RefMask& ref, std::optional<BlockSizes> tile, const std::string& context) {
  const BlockMaskStats st = m.stats(tile);
  const BlockSizes t = tile.value_or(m.blockSizes());
  const std::string c = context + " tile " + std::to_string(t.q) + "x" + std::to_string(t.kv) + "\n" + m.describe();
  EXPECT_EQ(st.tile.q, t.q) << c;
  EXPECT_EQ(st.tile.kv, t.kv) << c;
  if (st.heads.size() != size_t(m.batch() * m.heads())) {
    ADD_FAILURE() << c << ": " << st.heads.size() << " head entries";
    return false;
  }
  Expected all;
  for (int64_t b = 0; b < m.batch(); ++b)
    for (int64_t h = 0; h < m.heads(); ++h) {
      const Expected e = bruteForce(m, ref, b, h, t);
      const BlockMaskHeadStats& s = st.heads[size_t(b * m.heads() + h)];
      const std::string where = c + " (b " + std::to_string(b) + ", h " + std::to_string(h) + ")";
      EXPECT_EQ(s.b, b) << where;
      EXPECT_EQ(s.h, h) << where;
      EXPECT_EQ(s.rows, m.numQBlocks()) << where;
      EXPECT_EQ(s.fullBlocks, e.full) << where;
      EXPECT_EQ(s.partialBlocks, e.partial) << where;
      EXPECT_EQ(s.emptyRows, e.emptyRows) << where;
      EXPECT_EQ(s.allowedPairs, e.allowed) << where;
      EXPECT_EQ(s.computedPairs, e.computed) << where;
      EXPECT_EQ(s.live.max, *std::max_element(e.rowLengths.begin(), e.rowLengths.end())) << where;
      EXPECT_EQ(s.live.p50, sortedPercentile(e.rowLengths, 50)) << where;
      EXPECT_EQ(s.live.p95, sortedPercentile(e.rowLengths, 95)) << where;
      EXPECT_DOUBLE_EQ(s.live.mean, double(e.full + e.partial) / double(e.rowLengths.size())) << where;
      expectGamma(s.gamma, e.computed, e.allowed, where);
      all.full += e.full;
      all.partial += e.partial;
      all.emptyRows += e.emptyRows;
      all.allowed += e.allowed;
      all.computed += e.computed;
      all.rowLengths.insert(all.rowLengths.end(), e.rowLengths.begin(), e.rowLengths.end());
      if (::testing::Test::HasFailure()) return false;
    }
  const BlockMaskHeadStats& o = st.overall;
  EXPECT_EQ(o.b, -1) << c;
  EXPECT_EQ(o.rows, int64_t(all.rowLengths.size())) << c;
  EXPECT_EQ(o.fullBlocks, all.full) << c;
  EXPECT_EQ(o.partialBlocks, all.partial) << c;
  EXPECT_EQ(o.fullBlocks, m.numFullBlocks()) << c;
  EXPECT_EQ(o.partialBlocks, m.numPartialBlocks()) << c;
  EXPECT_EQ(o.emptyRows, all.emptyRows) << c;
  EXPECT_EQ(o.allowedPairs, all.allowed) << c;
  EXPECT_EQ(o.computedPairs, all.computed) << c;
  EXPECT_EQ(o.live.max, *std::max_element(all.rowLengths.begin(), all.rowLengths.end())) << c;
  EXPECT_EQ(o.live.p50, sortedPercentile(all.rowLengths, 50)) << c;
  EXPECT_EQ(o.live.p95, sortedPercentile(all.rowLengths, 95)) << c;
  EXPECT_DOUBLE_EQ(o.live.mean, double(all.full + all.partial) / double(all.rowLengths.size())) << c;
  expectGamma(o.gamma, all.computed, all.allowed, c);
  // Metadata: int32 counts and padded indices of the four lists; the live part is counts + entries.
  const int64_t bh = m.batch() * m.heads(), nQ = m.numQBlocks(), nKv = m.numKvBlocks();
  EXPECT_EQ(st.metadata.forward, int64_t(4 * (m.partialKv().num.size() + m.partialKv().indices.size() +
                                              m.fullKv().num.size() + m.fullKv().indices.size())))
      << c;
  EXPECT_EQ(st.metadata.transposes, int64_t(4 * (m.partialQ().num.size() + m.partialQ().indices.size() +
                                                 m.fullQ().num.size() + m.fullQ().indices.size())))
      << c;
  EXPECT_EQ(st.metadata.liveForward, 4 * (2 * bh * nQ + all.full + all.partial)) << c;
  EXPECT_EQ(st.metadata.forward, 4 * 2 * (bh * nQ + bh * nQ * nKv)) << c;
  return !::testing::Test::HasFailure();
}

std::optional<BlockSizes> randomTile(std::mt19937_64& rng, BlockSizes blocks) {
  switch (rng() % 4) {
    case 0: return std::nullopt;  // the mask's own blocks
    case 1: return BlockSizes{std::max<int64_t>(1, blocks.q / 4), std::max<int64_t>(1, blocks.kv / 2)};
    case 2: return BlockSizes{blocks.q * 2, blocks.kv * 4};
    default: return BlockSizes{pick(rng, {3, 16, 48, 128}), pick(rng, {5, 16, 64, 100})};  // not aligned to the blocks
  }
}

}  // namespace

// The standard masks and mask algebra (per-batch documents, per-(b, h) stripes), B and H broadcast
// or not, on lengths that are not multiples of the blocks.
TEST(BlockMaskStats, EqualBruteForceOnRandomMasks) {
  SeededRandom rng;
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t B = 1 + int64_t(rng() % 2), H = 1 + int64_t(rng() % 3);
    const int64_t Q = pick(rng, {1, 17, 63, 100, 129}), KV = pick(rng, {3, 33, 100, 130});
    const BlockSizes sizes{pick(rng, {8, 16, 32}), pick(rng, {8, 16, 64})};
    const int64_t L = std::max(Q, KV);
    const auto combos = ft::maskAlgebraCombos(rng, B, H, L, 4, MemorySpace::Host, 1);
    const ft::MaskCombo& combo = combos[rng() % combos.size()];
    const BlockMask m = createBlockMask(combo.mod, combo.maskB, combo.maskH, Q, KV, sizes, MemorySpace::Host);
    const std::string c = combo.name + " B=" + std::to_string(combo.maskB) + " H=" + std::to_string(combo.maskH) +
                          " Q=" + std::to_string(Q) + " KV=" + std::to_string(KV);
    if (!expectStats(m, combo.ref, randomTile(rng, sizes), c)) return;
  }
}

TEST(BlockMaskStats, StructuralBuildersWithPerHeadWindowsAndPerBatchDocuments) {
  SeededRandom rng;
  const int64_t Q = 150, KV = 111;
  const BlockSizes sizes{32, 16};
  {
    const std::vector<int64_t> windows{1, 7, 40};
    const BlockMask m = slidingWindowBlockMask(1, 3, Q, KV, windows, sizes, MemorySpace::Host);
    for (auto tile : {std::optional<BlockSizes>{}, std::optional<BlockSizes>{{16, 16}}, std::optional<BlockSizes>{{64, 64}}})
      if (!expectStats(m, ft::refWindow(windows), tile, "per-head windows")) return;
  }
  {
    std::vector<std::vector<int64_t>> offsets{{0, 20, 90, 200}, {0, 150, 151, 200}};
    std::vector<std::vector<int32_t>> ids{ft::idsFromOffsets(offsets[0], 200), ft::idsFromOffsets(offsets[1], 200)};
    const BlockMask m = documentBlockMask(2, 1, Q, KV, offsets, true, sizes, MemorySpace::Host);
    if (!expectStats(m, ft::refAnd(ft::refCausal(), ft::refDocuments(ids)), BlockSizes{64, 8}, "per-batch documents"))
      return;
  }
  const BlockMask causal = causalBlockMask(1, 1, Q, KV, sizes, MemorySpace::Host);
  expectStats(causal, ft::refCausal(), BlockSizes{int64_t(rng() % 40 + 1), int64_t(rng() % 40 + 1)}, "causal");
}

// Rows that see no key at all (queries before the keys they may attend) are counted as empty rows,
// with 0 live blocks in the distribution; a (b, h) that allows nothing has gamma NaN.
TEST(BlockMaskStats, FullyMaskedRowsAndHeads) {
  const int64_t Q = 100, KV = 70;
  MaskMod late("late_keys_per_head", [](const Tile& b, const Tile& h, const Tile& q, const Tile& kv) {
    return (kv <= q - 40) & (h == 0);
  });
  RefMask ref = [](int64_t, int64_t h, int64_t q, int64_t kv) { return kv <= q - 40 && h == 0; };
  const BlockMask m = createBlockMask(late, 1, 2, Q, KV, {16, 16}, MemorySpace::Host);
  ASSERT_TRUE(expectStats(m, ref, std::nullopt, "late keys"));
  ASSERT_TRUE(expectStats(m, ref, BlockSizes{32, 8}, "late keys"));
  const BlockMaskStats st = m.stats();
  EXPECT_EQ(st.heads[0].emptyRows, 2);  // queries 0..31: the first key is allowed from query 40 on
  EXPECT_EQ(st.heads[1].emptyRows, m.numQBlocks());
  EXPECT_EQ(st.heads[1].allowedPairs, 0);
  EXPECT_TRUE(std::isnan(st.heads[1].gamma));
  EXPECT_GT(st.heads[0].gamma, 1.0);
}

// A slice keeps its queries' global positions: allowed pairs are those of its own queries, and
// its row grid starts qPhase before its first query.
TEST(BlockMaskStats, SlicesCountTheirOwnQueries) {
  const int64_t L = 300;
  const BlockMask m = slidingWindowBlockMask(1, 1, L, L, {50}, {64, 32}, MemorySpace::Host);
  const BlockMask rows = m.sliceRows(1, 2);
  ASSERT_TRUE(expectStats(rows, ft::refWindow({50}), BlockSizes{16, 16}, "two-row slice"));
  const BlockMask token = m.sliceRows(4, 1, 290, 3);
  ASSERT_EQ(token.qPhase(), 290 - 256);
  ASSERT_TRUE(expectStats(token, ft::refWindow({50}), std::nullopt, "mid-row slice"));
  ASSERT_TRUE(expectStats(token, ft::refWindow({50}), BlockSizes{16, 8}, "mid-row slice"));
}

// A list that says more than its mod (fromKvLists): work is done where nothing is allowed, so
// gamma is infinite rather than a division by zero.
TEST(BlockMaskStats, ListsThatSayMoreThanTheirMod) {
  BlockLists partial{{1, 0}, {0, 0, 0, 0}}, full{{0, 0}, {0, 0, 0, 0}};
  MaskMod none("nothing", [](const Tile&, const Tile&, const Tile& q, const Tile& kv) { return q < 0; });
  const BlockMask m = BlockMask::fromKvLists(none, 1, 1, 40, 40, {32, 32}, partial, full);
  const BlockMaskStats st = m.stats();
  EXPECT_EQ(st.overall.allowedPairs, 0);
  EXPECT_EQ(st.overall.computedPairs, 32 * 32);
  EXPECT_TRUE(std::isinf(st.overall.gamma));
}

// The kernel-tile amplification of a causal mask in closed form. The kernel knows only the mask's
// lists, so tiles smaller than the blocks cannot skip the forbidden pairs of a partial block: 1 x 1
// tiles compute what 16 x 16 tiles compute. A 128 x 128 tile on 100 positions computes all of them.
TEST(BlockMaskStats, GammaOfCausalInClosedForm) {
  const BlockMask m = causalBlockMask(1, 1, 100, 100, {16, 16}, MemorySpace::Host);
  // 16 x 16 blocks: rows 0..5 list 1..6 whole blocks, the tail row (4 queries) 6 blocks of 16
  // keys and a 4 x 4 corner.
  const int64_t blocks = 21 * 256 + 6 * 64 + 16;
  EXPECT_EQ(m.stats().overall.computedPairs, blocks);
  EXPECT_EQ(m.stats().overall.allowedPairs, 5050);
  EXPECT_DOUBLE_EQ(m.stats().overall.gamma, double(blocks) / 5050.0);
  EXPECT_EQ(m.stats(BlockSizes{1, 1}).overall.computedPairs, blocks);
  EXPECT_EQ(m.stats(BlockSizes{8, 4}).overall.computedPairs, blocks);
  EXPECT_DOUBLE_EQ(m.stats(BlockSizes{128, 128}).overall.gamma, 10000.0 / 5050.0);
  // 32 x 32 tiles: tile rows 0..2 compute 1..3 tiles of 32 x 32 (each touches a live block), and
  // the 4-query tail row all 100 keys.
  EXPECT_EQ(m.stats(BlockSizes{32, 32}).overall.computedPairs, 6 * 1024 + 4 * 100);
  // With 1 x 1 blocks the mask is exact element by element, so nothing is wasted.
  EXPECT_DOUBLE_EQ(causalBlockMask(1, 1, 100, 100, {1, 1}, MemorySpace::Host).stats().overall.gamma, 1.0);
}

TEST(BlockMaskStats, BadTileIsAnError) {
  const BlockMask m = causalBlockMask(1, 1, 10, 10, {16, 16}, MemorySpace::Host);
  expectError([&] { (void)m.stats(BlockSizes{0, 16}); }, {"BlockMask::stats", "kernel tile", "0 x 16"});
  expectError([&] { (void)m.stats(BlockSizes{16, -2}); }, {"BlockMask::stats", "16 x -2"});
}
