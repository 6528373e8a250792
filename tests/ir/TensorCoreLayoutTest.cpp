// Tensor-core layouts: mma accumulators, dot operands, swizzled shared tiles
// and the ldmatrix plan. The expected fragment tables are written from the
// PTX ISA's formulas (groupID = lane >> 2, threadID_in_group = lane % 4),
// independently of the linear-layout code under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "ir/IR.h"
#include "ir/Layout.h"
#include "ir/SharedLayout.h"

namespace flextile::ir {
namespace {

using Coord = Layout::Coord;

struct WarpGrid {
  int64_t wm, wn;
};

// Every factorisation of 1, 2, 4, 8 warps into {wm, wn}.
std::vector<WarpGrid> warpGrids() {
  std::vector<WarpGrid> grids;
  for (int64_t nw : {1, 2, 4, 8})
    for (int64_t wm = 1; wm <= nw; wm *= 2) grids.push_back({wm, nw / wm});
  return grids;
}

std::vector<int64_t> pow2Range(int64_t lo, int64_t hi) {
  std::vector<int64_t> v;
  for (int64_t x = lo; x <= hi; x *= 2) v.push_back(x);
  return v;
}

std::string describe(const Shape& s, WarpGrid g) {
  return shapeString(s) + " warps {" + std::to_string(g.wm) + ", " + std::to_string(g.wn) + "}";
}

// ---------------------------------------------------------------------------
// ISA fragment formulas for one instruction tile, per lane and element index.

struct RowCol {
  int64_t row, col;
};

RowCol isaAccumulator(int lane, int i) {  // c0..c3, m16n8 f32
  const int g = lane >> 2, t = lane % 4;
  return {i < 2 ? g : g + 8, t * 2 + (i & 0x1)};
}

RowCol isaA16(int lane, int i) {  // a0..a7, m16n8k16 f16/bf16
  const int g = lane >> 2, t = lane % 4;
  const int64_t row = ((0 <= i && i < 2) || (4 <= i && i < 6)) ? g : g + 8;
  const int64_t col = i < 4 ? (t * 2) + (i & 0x1) : (t * 2) + (i & 0x1) + 8;
  return {row, col};
}

RowCol isaB16(int lane, int i) {  // b0..b3, m16n8k16 f16/bf16
  const int g = lane >> 2, t = lane % 4;
  return {i < 2 ? (t * 2) + (i & 0x1) : (t * 2) + (i & 0x1) + 8, g};
}

RowCol isaA32(int lane, int i) {  // a0..a3, m16n8k8 tf32
  const int g = lane >> 2, t = lane % 4;
  return {(i == 0 || i == 2) ? g : g + 8, (i == 0 || i == 1) ? t : t + 4};
}

RowCol isaB32(int lane, int i) {  // b0..b1, m16n8k8 tf32
  const int g = lane >> 2, t = lane % 4;
  return {i == 0 ? t : t + 4, g};
}

// ---------------------------------------------------------------------------
// Generic checks of any layout.

// Each element is owned exactly once by the threads whose replicated lane and
// warp bits are clear, and exactly 2^(replicated bits) times in all.
void expectExactlyOneOwnerPerReplica(const Layout& l) {
  SCOPED_TRACE(l.str());
  ASSERT_EQ(l.verify(), "");
  const uint32_t laneRep = l.replicatedLaneMask(), warpRep = l.replicatedWarpMask();
  const int64_t replicas = int64_t(1) << (__builtin_popcount(laneRep) + __builtin_popcount(warpRep));
  int64_t total = 1;
  for (auto d : l.shape()) total *= d;
  auto flat = [&](const Coord& c) {
    int64_t i = 0;
    for (size_t d = 0; d < c.size(); ++d) i = i * l.shape()[d] + c[d];
    return i;
  };
  std::vector<int64_t> owners(size_t(total), 0), primaryOwners(size_t(total), 0);
  for (int64_t w = 0; w < l.numWarps(); ++w)
    for (int64_t lane = 0; lane < 32; ++lane)
      for (int64_t r = 0; r < l.numRegisters(); ++r) {
        const int64_t i = flat(l.apply(r, lane, w));
        ASSERT_GE(i, 0);
        ASSERT_LT(i, total);
        ++owners[size_t(i)];
        if ((uint32_t(lane) & laneRep) == 0 && (uint32_t(w) & warpRep) == 0) ++primaryOwners[size_t(i)];
      }
  for (int64_t i = 0; i < total; ++i) {
    ASSERT_EQ(owners[size_t(i)], replicas) << "element " << i;
    ASSERT_EQ(primaryOwners[size_t(i)], 1) << "element " << i;
  }
}

void expectRoundTrip(const Layout& l) {
  Layout back = Layout::parse(l.str());
  EXPECT_EQ(back, l) << l.str();
}

// ---------------------------------------------------------------------------
// Accumulator.

TEST(MmaAccumulator, SingleInstructionMatchesIsaTable) {
  Layout acc = Layout::mmaAccumulator({16, 8}, 1, {1, 1});
  ASSERT_EQ(acc.numRegisters(), 4);
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      RowCol e = isaAccumulator(lane, i);
      EXPECT_EQ(acc.apply(i, lane, 0), (Coord{e.row, e.col})) << "lane " << lane << " c" << i;
    }
}

// The documented register/warp order: register c + 4*(nRep + numNReps*mRep),
// warp w at instruction tile (w / wn, w % wn) of each 16wm x 8wn super-tile.
TEST(MmaAccumulator, RepetitionOrderOverShapesAndWarps) {
  for (WarpGrid g : warpGrids())
    for (int64_t M : pow2Range(16, 128))
      for (int64_t N : pow2Range(8, 256)) {
        const Shape shape{M, N};
        SCOPED_TRACE(describe(shape, g));
        Layout acc = Layout::mmaAccumulator(shape, int(g.wm * g.wn), {g.wm, g.wn});
        const int64_t superM = 16 * g.wm, superN = 8 * g.wn;
        const int64_t mReps = std::max<int64_t>(1, M / superM), nReps = std::max<int64_t>(1, N / superN);
        ASSERT_EQ(acc.numRegisters(), 4 * mReps * nReps);
        for (int64_t w = 0; w < g.wm * g.wn; ++w)
          for (int64_t mRep = 0; mRep < mReps; ++mRep)
            for (int64_t nRep = 0; nRep < nReps; ++nRep)
              for (int lane = 0; lane < 32; ++lane)
                for (int c = 0; c < 4; ++c) {
                  RowCol e = isaAccumulator(lane, c);
                  // Warps beyond the tile wrap around: they replicate.
                  Coord want{(mRep * superM + 16 * (w / g.wn) + e.row) % M,
                             (nRep * superN + 8 * (w % g.wn) + e.col) % N};
                  ASSERT_EQ(acc.apply(c + 4 * (nRep + nReps * mRep), lane, w), want)
                      << "warp " << w << " mRep " << mRep << " nRep " << nRep << " lane " << lane << " c" << c;
                }
        expectExactlyOneOwnerPerReplica(acc);
        expectRoundTrip(acc);
      }
}

TEST(MmaAccumulator, SmallTilesReplicateSurplusWarps) {
  Layout acc = Layout::mmaAccumulator({16, 8}, 8, {4, 2});
  EXPECT_EQ(acc.replicatedWarpMask(), 0b111u);  // every warp bit replicates
  expectExactlyOneOwnerPerReplica(acc);
  Layout acc2 = Layout::mmaAccumulator({32, 8}, 8, {4, 2});
  EXPECT_EQ(acc2.replicatedWarpMask(), 0b101u);  // the wn bit and the second wm bit
  expectExactlyOneOwnerPerReplica(acc2);
}

TEST(MmaAccumulator, RejectsBadParameters) {
  EXPECT_THROW(Layout::mmaAccumulator({8, 8}, 1, {1, 1}), Error);    // M < 16
  EXPECT_THROW(Layout::mmaAccumulator({16, 4}, 1, {1, 1}), Error);   // N < 8
  EXPECT_THROW(Layout::mmaAccumulator({48, 8}, 1, {1, 1}), Error);   // not a power of two
  EXPECT_THROW(Layout::mmaAccumulator({64, 64}, 4, {2, 1}), Error);  // 2 * 1 != 4
  EXPECT_THROW(Layout::mmaAccumulator({64, 64}, 6, {3, 2}), Error);  // 3 warps
  EXPECT_THROW(Layout::mmaAccumulator({64, 64, 2}, 4, {2, 2}), Error);
  try {
    Layout::mmaAccumulator({64, 64}, 4, {2, 1});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[64, 64]"), std::string::npos) << e.what();
  }
}

// wgmma's split along N: warpgroup (gm, gn) holds rows [64 gm, 64 gm + 64) and the contiguous columns
// [gn N / G, (gn + 1) N / G) as one m64 x N / G wgmma accumulator (the ISA's fragment: warp w % 4 on
// 16 rows, c0..c3 then N by 8), every element once; one group along N is the warps-along-M mma split.
TEST(WgmmaAccumulator, EachWarpgroupOwnsAContiguousShareOfN) {
  for (int numWarps : {4, 8, 16})
    for (int64_t M : {64, 128, 256})
      for (int64_t N : pow2Range(8, 256)) {
        if (16 * numWarps < M) continue;
        const int64_t groupsN = 16 * numWarps / M, groupN = N / groupsN;
        if (groupN < 8) continue;
        SCOPED_TRACE(shapeString({M, N}) + " on " + std::to_string(numWarps) + " warps");
        Layout acc = Layout::wgmmaAccumulator({M, N}, numWarps, groupsN);
        ASSERT_EQ(acc.numRegisters(), groupN / 2);
        for (int64_t w = 0; w < numWarps; ++w) {
          const int64_t group = w / 4, gm = group % (M / 64), gn = group / (M / 64);
          for (int lane = 0; lane < 32; ++lane)
            for (int64_t nRep = 0; nRep < groupN / 8; ++nRep)
              for (int c = 0; c < 4; ++c) {
                RowCol e = isaAccumulator(lane, c);
                ASSERT_EQ(acc.apply(c + 4 * nRep, lane, w),
                          (Coord{64 * gm + 16 * (w % 4) + e.row, gn * groupN + 8 * nRep + e.col}))
                    << "warp " << w << " lane " << lane << " c" << c << " nRep " << nRep;
              }
        }
        expectExactlyOneOwnerPerReplica(acc);
        expectRoundTrip(acc);
        if (groupsN == 1) {
          EXPECT_EQ(acc, Layout::mmaAccumulator({M, N}, numWarps, {numWarps, 1}));
        } else {
          // A is replicated over the N groups: each warpgroup reads all of its rows' K.
          Layout a = Layout::dotOperand(acc, 0, 64, 16);
          EXPECT_NE(a.replicatedWarpMask(), 0u);
          for (int64_t w = 4; w < numWarps; ++w)
            if ((w / 4) % (M / 64) == 0)
              for (int lane = 0; lane < 32; ++lane) EXPECT_EQ(a.apply(0, lane, w), a.apply(0, lane, w % 4));
        }
      }
}

// Replicas: the groups past the N split compute the same tile (zero warp bases), each element held
// once per replica, and the first group's registers are every replica's.
TEST(WgmmaAccumulator, ReplicasHoldTheSameShare) {
  Layout acc = Layout::wgmmaAccumulator({64, 64}, 8, 1, 2);
  EXPECT_EQ(acc.replicatedWarpMask(), 0b100u);
  expectExactlyOneOwnerPerReplica(acc);
  for (int64_t w = 0; w < 4; ++w)
    for (int lane = 0; lane < 32; ++lane)
      for (int64_t r = 0; r < acc.numRegisters(); ++r) ASSERT_EQ(acc.apply(r, lane, w + 4), acc.apply(r, lane, w));
  EXPECT_EQ(Layout::wgmmaAccumulator({64, 128}, 16, 2, 2).replicatedWarpMask(), 0b1000u);
  EXPECT_THROW(Layout::wgmmaAccumulator({64, 64}, 8, 2, 2), Error);  // 4 groups on 2 warpgroups
}

TEST(WgmmaAccumulator, RejectsBadParameters) {
  EXPECT_THROW(Layout::wgmmaAccumulator({64, 64}, 8, 1), Error);   // 8 warps would need M = 128
  EXPECT_THROW(Layout::wgmmaAccumulator({32, 64}, 2, 1), Error);   // less than a warpgroup
  EXPECT_THROW(Layout::wgmmaAccumulator({64, 8}, 8, 2), Error);    // 4 columns a warpgroup
  EXPECT_THROW(Layout::wgmmaAccumulator({64, 96}, 8, 2), Error);   // not a power of two
  EXPECT_THROW(Layout::wgmmaAccumulator({64, 64, 2}, 8, 2), Error);
  try {
    Layout::wgmmaAccumulator({64, 64}, 8, 4);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4 warpgroups along N"), std::string::npos) << e.what();
  }
}

// A row-max over the accumulator: each row's values sit in one quad of 4
// lanes (lane bits 0 and 1 are the only lane bits along N), so the reduction
// is in-thread, then shuffles over lane bits 0 and 1, then (when wn > 1)
// across warps.
TEST(MmaAccumulator, SlicedAlongNIsTheRowLayoutOfARowReduction) {
  for (WarpGrid g : warpGrids())
    for (int64_t M : pow2Range(16, 128))
      for (int64_t N : {8, 64, 256}) {
        const Shape shape{M, N};
        SCOPED_TRACE(describe(shape, g));
        Layout acc = Layout::mmaAccumulator(shape, int(g.wm * g.wn), {g.wm, g.wn});
        int lanesAlongN = 0;
        for (size_t i = 0; i < acc.laneBases().size(); ++i) {
          const Coord& b = acc.laneBases()[i];
          if (b[1] != 0) {
            ++lanesAlongN;
            EXPECT_LT(i, 2u) << "lane bit " << i << " moves along N";
            EXPECT_EQ(b[0], 0) << "a lane bit along N also moves along M";
          }
        }
        EXPECT_EQ(lanesAlongN, 2);

        Layout rows = acc.sliced(1);
        ASSERT_EQ(rows.verify(), "");
        EXPECT_EQ(rows.shape(), (Shape{M}));
        EXPECT_EQ(rows.replicatedLaneMask() & 0b11u, 0b11u);
        expectExactlyOneOwnerPerReplica(rows);
        expectRoundTrip(rows);
        // Broadcasting the row values back is free: the [M, 1] operand of a
        // broadcast to the accumulator is the expanded row layout.
        EXPECT_EQ(acc.projected({M, 1}), rows.expanded(1));

        // Each row lives in one quad of one warp column, and the sliced
        // layout gives every thread of that quad the row it reduced.
        std::map<int64_t, std::set<std::pair<int64_t, int64_t>>> quadsOfRow;  // row -> {(warp M part, lane / 4)}
        for (int64_t w = 0; w < acc.numWarps(); ++w)
          for (int64_t lane = 0; lane < 32; ++lane) {
            std::set<int64_t> rowsHere;
            for (int64_t r = 0; r < acc.numRegisters(); ++r) {
              int64_t row = acc.apply(r, lane, w)[0];
              rowsHere.insert(row);
              quadsOfRow[row].insert({w / g.wn, lane / 4});
            }
            std::set<int64_t> slicedRows;
            for (int64_t r = 0; r < rows.numRegisters(); ++r) slicedRows.insert(rows.apply(r, lane, w)[0]);
            ASSERT_EQ(rowsHere, slicedRows) << "warp " << w << " lane " << lane;
          }
        for (const auto& [row, quads] : quadsOfRow)
          if (M >= 16 * g.wm) {
            EXPECT_EQ(quads.size(), 1u) << "row " << row;
          }
      }
}

// ---------------------------------------------------------------------------
// Dot operands.

struct OperandCase {
  int elementBits;
  int operandIndex;
};

// ISA formulas + the documented repetition order, for any parent grid.
void checkOperandAgainstIsa(const Layout& op, const Shape& accShape, WarpGrid g, int64_t K, OperandCase oc) {
  const bool isA = oc.operandIndex == 0;
  const int64_t instrK = oc.elementBits == 16 ? 16 : 8;
  const int perInstr = isA ? (oc.elementBits == 16 ? 8 : 4) : (oc.elementBits == 16 ? 4 : 2);
  auto isa = [&](int lane, int i) {
    if (oc.elementBits == 16) return isA ? isaA16(lane, i) : isaB16(lane, i);
    return isA ? isaA32(lane, i) : isaB32(lane, i);
  };
  const int64_t M = accShape[0], N = accShape[1];
  const int64_t kReps = K / instrK;
  const int64_t otherReps = isA ? std::max<int64_t>(1, M / (16 * g.wm)) : std::max<int64_t>(1, N / (8 * g.wn));
  ASSERT_EQ(op.shape(), isA ? (Shape{M, K}) : (Shape{K, N}));
  ASSERT_EQ(op.numRegisters(), perInstr * kReps * otherReps);
  for (int64_t w = 0; w < g.wm * g.wn; ++w)
    for (int64_t o = 0; o < otherReps; ++o)
      for (int64_t kRep = 0; kRep < kReps; ++kRep)
        for (int lane = 0; lane < 32; ++lane)
          for (int i = 0; i < perInstr; ++i) {
            RowCol e = isa(lane, i);
            Coord want = isA ? Coord{(o * 16 * g.wm + 16 * (w / g.wn) + e.row) % M, kRep * instrK + e.col}
                             : Coord{kRep * instrK + e.row, (o * 8 * g.wn + 8 * (w % g.wn) + e.col) % N};
            ASSERT_EQ(op.apply(i + perInstr * (kRep + kReps * o), lane, w), want)
                << (isA ? "A" : "B") << " warp " << w << " rep " << o << " kRep " << kRep << " lane " << lane
                << " element " << i;
          }
}

TEST(DotOperand, SingleInstructionMatchesIsaTables) {
  Layout acc = Layout::mmaAccumulator({16, 8}, 1, {1, 1});
  Layout a16 = Layout::dotOperand(acc, 0, 16, 16), b16 = Layout::dotOperand(acc, 1, 16, 16);
  Layout a32 = Layout::dotOperand(acc, 0, 8, 32), b32 = Layout::dotOperand(acc, 1, 8, 32);
  ASSERT_EQ(a16.numRegisters(), 8);
  ASSERT_EQ(b16.numRegisters(), 4);
  ASSERT_EQ(a32.numRegisters(), 4);
  ASSERT_EQ(b32.numRegisters(), 2);
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i) {
      RowCol e = isaA16(lane, i);
      EXPECT_EQ(a16.apply(i, lane, 0), (Coord{e.row, e.col})) << "lane " << lane << " a" << i;
    }
    for (int i = 0; i < 4; ++i) {
      RowCol e = isaB16(lane, i);
      EXPECT_EQ(b16.apply(i, lane, 0), (Coord{e.row, e.col})) << "lane " << lane << " b" << i;
      RowCol f = isaA32(lane, i);
      EXPECT_EQ(a32.apply(i, lane, 0), (Coord{f.row, f.col})) << "lane " << lane << " tf32 a" << i;
    }
    for (int i = 0; i < 2; ++i) {
      RowCol e = isaB32(lane, i);
      EXPECT_EQ(b32.apply(i, lane, 0), (Coord{e.row, e.col})) << "lane " << lane << " tf32 b" << i;
    }
  }
}

TEST(DotOperand, RepetitionsAndWarpsOverShapes) {
  for (WarpGrid g : warpGrids())
    for (int64_t M : {16, 64, 128})
      for (int64_t N : {8, 32, 256})
        for (OperandCase oc : {OperandCase{16, 0}, OperandCase{16, 1}, OperandCase{32, 0}, OperandCase{32, 1}})
          for (int64_t K : {8, 16, 64}) {
            if (oc.elementBits == 16 && K < 16) continue;
            const Shape shape{M, N};
            SCOPED_TRACE(describe(shape, g) + " K " + std::to_string(K) + " bits " + std::to_string(oc.elementBits) +
                         " operand " + std::to_string(oc.operandIndex));
            Layout acc = Layout::mmaAccumulator(shape, int(g.wm * g.wn), {g.wm, g.wn});
            Layout op = Layout::dotOperand(acc, oc.operandIndex, K, oc.elementBits);
            checkOperandAgainstIsa(op, shape, g, K, oc);
            expectExactlyOneOwnerPerReplica(op);
            expectRoundTrip(op);
            // A is shared by the warps of one row of the warp grid (the first
            // log2(wn) warp bits step along N), B by those of one column.
            const int nBits = __builtin_ctzll(uint64_t(g.wn));
            for (size_t i = 0; i < op.warpBases().size(); ++i) {
              const bool alongN = int(i) < nBits;
              if (alongN == (oc.operandIndex == 0)) {
                EXPECT_EQ(op.warpBases()[i], (Coord{0, 0})) << "warp bit " << i << " should replicate";
              }
            }
          }
}

// With wn == 1 the f32 accumulator of [M, N] and the 16-bit A operand of
// [M, K = N] are the same map: P = softmax(S) feeds P.V from registers.
TEST(DotOperand, AccumulatorIsTheAOperandOfTheNextProduct) {
  for (int64_t nw : {1, 2, 4, 8})
    for (int64_t M : pow2Range(16 * nw, 128))
      for (int64_t N : pow2Range(16, 128)) {
        Layout acc = Layout::mmaAccumulator({M, N}, int(nw), {nw, 1});
        Layout a = Layout::dotOperand(acc, 0, N, 16);
        EXPECT_EQ(acc, a) << acc.str() << "\n" << a.str();
      }
  // With warps along N it is not: the A operand needs every K column.
  Layout acc = Layout::mmaAccumulator({64, 64}, 4, {2, 2});
  EXPECT_NE(acc, Layout::dotOperand(acc, 0, 64, 16));
}

TEST(DotOperand, RejectsBadParameters) {
  Layout acc = Layout::mmaAccumulator({64, 64}, 4, {2, 2});
  EXPECT_THROW(Layout::dotOperand(acc, 2, 16, 16), Error);
  EXPECT_THROW(Layout::dotOperand(acc, 0, 8, 16), Error);    // K below the instruction's
  EXPECT_THROW(Layout::dotOperand(acc, 0, 4, 32), Error);
  EXPECT_THROW(Layout::dotOperand(acc, 0, 48, 16), Error);   // not a power of two
  EXPECT_THROW(Layout::dotOperand(acc, 0, 32, 8), Error);    // 8-bit: future work
  Layout blocked = Layout::defaultBlocked({64, 64}, 4, 4);
  EXPECT_THROW(Layout::dotOperand(blocked, 0, 32, 16), Error);
  Layout b = Layout::dotOperand(acc, 1, 32, 16);
  EXPECT_THROW(Layout::dotOperand(b, 0, 32, 16), Error);  // a B operand is no accumulator
  Layout a32 = Layout::dotOperand(acc, 0, 32, 32);
  EXPECT_THROW(Layout::dotOperand(a32, 1, 32, 16), Error);
  // (A 16-bit A operand has the accumulator's structure, see above, and is accepted.)
}

// ---------------------------------------------------------------------------
// Shared layouts.

struct OperandTile {
  Shape shape;
  int64_t elemBytes;
  int operandIndex;
  bool transposed;
};

// Operand tiles of the GEMM and attention configurations we plan to use.
std::vector<OperandTile> operandTiles() {
  std::vector<OperandTile> tiles;
  for (int64_t bytes : {1, 2, 4})
    for (int operand : {0, 1})
      for (bool transposed : {false, true})
        for (int64_t rows : {16, 32, 64, 128, 256})
          for (int64_t cols : {8, 16, 32, 64, 128, 256}) tiles.push_back({{rows, cols}, bytes, operand, transposed});
  return tiles;
}

TEST(SharedLayout, ForDotOperandChoosesTheDocumentedSwizzle) {
  auto s = SharedLayout::forDotOperand({64, 32}, 2, 0, false);  // A, K contiguous, 64-byte rows
  EXPECT_EQ(s.str(), "#ft.shared<[64, 32], order=[1,0], vec=8, perPhase=2, maxPhase=4, bytes=2>");
  EXPECT_FALSE(s.needsTransposedLdmatrix(0));
  auto b = SharedLayout::forDotOperand({32, 128}, 2, 1, false);  // B [K, N], N contiguous, 256-byte rows
  EXPECT_EQ(b.str(), "#ft.shared<[32, 128], order=[1,0], vec=8, perPhase=1, maxPhase=8, bytes=2>");
  EXPECT_TRUE(b.needsTransposedLdmatrix(1));
  auto bt = SharedLayout::forDotOperand({64, 128}, 2, 1, true);  // B stored [N, K], 128-byte rows
  EXPECT_EQ(bt.order(), (std::vector<int>{0, 1}));
  EXPECT_EQ(bt.maxPhase(), 8);
  EXPECT_FALSE(bt.needsTransposedLdmatrix(1));
  auto narrow = SharedLayout::forDotOperand({64, 8}, 2, 0, false);  // 16-byte rows need no swizzle
  EXPECT_EQ(narrow.maxPhase(), 1);
}

TEST(SharedLayout, SwizzlesAreLinearBijections) {
  for (const OperandTile& t : operandTiles()) {
    SharedLayout s = SharedLayout::forDotOperand(t.shape, t.elemBytes, t.operandIndex, t.transposed);
    SCOPED_TRACE(s.str());
    ASSERT_EQ(s.verify(), "");
    const int64_t n = s.numElements();
    std::vector<char> hit(size_t(n), 0);
    const auto bases = s.offsetBases();
    for (int64_t r = 0; r < t.shape[0]; ++r)
      for (int64_t c = 0; c < t.shape[1]; ++c) {
        const int64_t off = s.offsetOf({r, c});
        ASSERT_GE(off, 0);
        ASSERT_LT(off, n);
        ASSERT_EQ(hit[size_t(off)], 0) << "offset " << off << " used twice";
        hit[size_t(off)] = 1;
        ASSERT_EQ(s.coordOf(off), (Coord{r, c}));
        Coord viaBases{0, 0};
        for (size_t i = 0; i < bases.size(); ++i)
          if (off >> i & 1)
            for (int d = 0; d < 2; ++d) viaBases[d] ^= bases[i][d];
        ASSERT_EQ(viaBases, (Coord{r, c})) << "offset " << off;
      }
    // A 16-byte chunk stays contiguous: vector stores and ldmatrix rows.
    const int64_t contiguous = t.transposed ? 0 : 1;
    for (int64_t r = 0; r < t.shape[0]; ++r)
      for (int64_t c = 0; c < t.shape[1]; ++c) {
        Coord here{r, c}, next{r, c};
        if (++next[contiguous] % s.vec() == 0 || next[contiguous] >= t.shape[contiguous]) continue;
        ASSERT_EQ(s.offsetOf(next), s.offsetOf(here) + 1);
      }
  }
}

TEST(SharedLayout, HigherRankAndPlainLayouts) {
  SharedLayout s({2, 16, 64}, {2, 1, 0}, 8, 1, 8, 2);
  std::set<int64_t> seen;
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 16; ++j)
      for (int64_t k = 0; k < 64; ++k) {
        int64_t off = s.offsetOf({i, j, k});
        EXPECT_TRUE(seen.insert(off).second);
        EXPECT_EQ(s.coordOf(off), (Coord{i, j, k}));
        EXPECT_EQ(off / (16 * 64), i);  // the outer dimension stays outermost
      }
  SharedLayout p = SharedLayout::plain({8, 4}, {0, 1}, 4);  // column-major
  EXPECT_EQ(p.offsetOf({3, 2}), 2 * 8 + 3);
}

TEST(SharedLayout, PrintParseRoundTripAndErrors) {
  for (const OperandTile& t : operandTiles()) {
    SharedLayout s = SharedLayout::forDotOperand(t.shape, t.elemBytes, t.operandIndex, t.transposed);
    EXPECT_EQ(SharedLayout::parse(s.str()), s);
  }
  SharedLayout s = SharedLayout::parse("#ft.shared<[64, 32], order=[1,0], vec=8, perPhase=1, maxPhase=4, bytes=2>");
  EXPECT_EQ(s.shape(), (Shape{64, 32}));
  EXPECT_EQ(s.vec(), 8);
  EXPECT_EQ(s.maxPhase(), 4);
  EXPECT_THROW(SharedLayout::parse("#ft.shared<[64, 32], order=[1,0], vec=8, perPhase=1, maxPhase=8, bytes=2>"),
               Error);  // 8 chunks of 8 do not fit a row of 32
  EXPECT_THROW(SharedLayout::parse("#ft.shared<[64, 24], order=[1,0], vec=8, perPhase=1, maxPhase=1, bytes=2>"),
               Error);
  EXPECT_THROW(SharedLayout::parse("#ft.shared<[64, 32], order=[1,1], vec=8, perPhase=1, maxPhase=1, bytes=2>"),
               Error);
  EXPECT_THROW(SharedLayout::parse("#ft.shared<[64, 32], order=[1,0], vec=8, perPhase=1, maxPhase=1, bytes=3>"),
               Error);
  EXPECT_THROW(SharedLayout::parse("#ft.shared<[64, 32], order=[1,0], vec=8, perPhase=1>"), Error);
  EXPECT_THROW(SharedLayout::parse("#ft.shared<[64, 32], order=[1,5], vec=8, perPhase=1, maxPhase=1, bytes=2>"),
               Error);
  EXPECT_THROW(s.offsetOf({64, 0}), Error);
  EXPECT_THROW(s.coordOf(64 * 32), Error);
}

// ---------------------------------------------------------------------------
// Bank conflicts.

TEST(BankConflicts, CounterOnHandMadePatterns) {
  std::vector<int64_t> consecutive, sameBankGroup, broadcast;
  for (int lane = 0; lane < 32; ++lane) {
    consecutive.push_back(16 * lane);
    sameBankGroup.push_back(128 * lane);  // every lane of a phase in banks 0..3
    broadcast.push_back(0);
  }
  EXPECT_EQ(sharedBankConflicts(consecutive, 16), 0);
  EXPECT_EQ(sharedBankConflicts(sameBankGroup, 16), 4 * 7);  // 8 wavefronts in each of 4 phases
  EXPECT_EQ(sharedBankConflicts(broadcast, 16), 0);
  std::vector<int64_t> words;
  for (int lane = 0; lane < 32; ++lane) words.push_back(4 * ((lane * 2) % 32) + (lane >= 16 ? 128 : 0));
  EXPECT_EQ(sharedBankConflicts(words, 4), 1);  // two words per even bank
  EXPECT_THROW(sharedBankConflicts({0, 4}, 16), Error);
  EXPECT_THROW(sharedBankConflicts(std::vector<int64_t>(8, 4), 16), Error);  // misaligned
}

// The rows one ldmatrix matrix reads: 8 consecutive rows of the stored tile
// (along the non-contiguous dimension), one 16-byte chunk of each. Computed
// here from the tile geometry, not from the ldmatrix plan.
int64_t ldmatrixRowConflicts(const SharedLayout& s) {
  const int contiguous = s.order()[0], rowsDim = s.order()[1];
  const int64_t chunk = 16 / s.elemBytes();
  int64_t conflicts = 0;
  for (int64_t r0 = 0; r0 + 8 <= s.shape()[rowsDim]; r0 += 8)
    for (int64_t c0 = 0; c0 < s.shape()[contiguous]; c0 += chunk) {
      std::vector<int64_t> addresses;
      for (int64_t q = 0; q < 8; ++q) {
        Coord c(2, 0);
        c[rowsDim] = r0 + q;
        c[contiguous] = c0;
        addresses.push_back(s.offsetOf(c) * s.elemBytes());
      }
      conflicts += sharedBankConflicts(addresses, 16);
    }
  return conflicts;
}

// A warp's 16-byte cp.async stores: consecutive lanes take consecutive chunks
// of the tile in row-major order of the stored rows, as a coalesced global
// read does.
int64_t chunkStoreConflicts(const SharedLayout& s) {
  const int contiguous = s.order()[0], rowsDim = s.order()[1];
  const int64_t chunk = 16 / s.elemBytes();
  const int64_t chunksPerRow = s.shape()[contiguous] / chunk;
  const int64_t numChunks = s.numElements() / chunk;
  int64_t conflicts = 0;
  for (int64_t first = 0; first < numChunks; first += 32) {
    std::vector<int64_t> addresses;
    for (int64_t lane = 0; lane < 32; ++lane) {
      const int64_t k = (first + lane) % numChunks;
      Coord c(2, 0);
      c[rowsDim] = k / chunksPerRow;
      c[contiguous] = (k % chunksPerRow) * chunk;
      addresses.push_back(s.offsetOf(c) * s.elemBytes());
    }
    conflicts += sharedBankConflicts(addresses, 16);
  }
  return conflicts;
}

TEST(BankConflicts, ChosenSwizzlesAreConflictFreeAndPlainLayoutsAreNot) {
  int checked = 0;
  for (const OperandTile& t : operandTiles()) {
    const int contiguous = t.transposed ? 0 : 1;
    const int64_t rowBytes = t.shape[contiguous] * t.elemBytes;
    if (rowBytes < 16 || t.shape[1 - contiguous] < 8) continue;  // no 16-byte chunk / no 8 rows
    SharedLayout s = SharedLayout::forDotOperand(t.shape, t.elemBytes, t.operandIndex, t.transposed);
    SharedLayout plain = SharedLayout::plain(t.shape, s.order(), t.elemBytes);
    SCOPED_TRACE(s.str());
    EXPECT_EQ(ldmatrixRowConflicts(s), 0);
    EXPECT_EQ(chunkStoreConflicts(s), 0);
    EXPECT_EQ(chunkStoreConflicts(plain), 0);  // rows are contiguous either way
    if (rowBytes >= 32)
      EXPECT_GT(ldmatrixRowConflicts(plain), 0) << "rows of " << rowBytes << " bytes";
    else
      EXPECT_EQ(ldmatrixRowConflicts(plain), 0);
    ++checked;
  }
  EXPECT_GT(checked, 100);
}

// ---------------------------------------------------------------------------
// ldmatrix.

// Runs the plan the way the hardware does: lane i supplies the address of row
// i%8 of matrix i/8; lane l receives elements (l/4, 2(l%4) + e) of each matrix,
// or with .trans (2(l%4) + e, l/4).
void simulateLdmatrix(const Layout& dot, const SharedLayout& smem, int operandIndex, std::mt19937_64& rng) {
  SCOPED_TRACE(dot.str() + "\n" + smem.str());
  std::vector<uint64_t> buffer(size_t(smem.numElements()));
  for (auto& v : buffer) v = rng();
  for (int w = 0; w < dot.numWarps(); ++w) {
    auto accesses = ldmatrixAccesses(dot, smem, w);
    std::map<int64_t, int> filled;
    for (const auto& acc : accesses) {
      ASSERT_EQ(acc.trans, smem.needsTransposedLdmatrix(operandIndex));
      ASSERT_EQ(acc.laneRowOffset.size(), 32u);
      ASSERT_EQ(int(acc.registers.size()), 2 * acc.numMatrices);
      std::vector<int64_t> byteAddresses;
      for (int64_t off : acc.laneRowOffset) byteAddresses.push_back(off * 2);
      EXPECT_EQ(sharedBankConflicts(byteAddresses, 16), 0);
      for (int j = 0; j < acc.numMatrices; ++j)
        for (int lane = 0; lane < 32; ++lane)
          for (int e = 0; e < 2; ++e) {
            const int64_t row = acc.trans ? 2 * (lane % 4) + e : lane / 4;
            const int64_t col = acc.trans ? lane / 4 : 2 * (lane % 4) + e;
            const uint64_t got = buffer[size_t(acc.laneRowOffset[8 * j + row] + col)];
            const int64_t reg = acc.registers[2 * j + e];
            const uint64_t want = buffer[size_t(smem.offsetOf(dot.apply(reg, lane, w)))];
            ASSERT_EQ(got, want) << "warp " << w << " lane " << lane << " register " << reg;
            if (lane == 0) ++filled[reg];
          }
    }
    ASSERT_EQ(int64_t(filled.size()), dot.numRegisters());
    for (const auto& [reg, n] : filled) ASSERT_EQ(n, 1) << "register " << reg;
  }
}

TEST(Ldmatrix, FillsTheDotOperandRegisters) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int cases = 0;
  for (WarpGrid g : warpGrids())
    for (int64_t M : {16, 64, 128})
      for (int64_t N : {8, 16, 128})
        for (int64_t K : {16, 32, 64})
          for (int operand : {0, 1})
            for (bool transposed : {false, true}) {
              Layout acc = Layout::mmaAccumulator({M, N}, int(g.wm * g.wn), {g.wm, g.wn});
              Layout dot = Layout::dotOperand(acc, operand, K, 16);
              SharedLayout smem = SharedLayout::forDotOperand(dot.shape(), 2, operand, transposed);
              simulateLdmatrix(dot, smem, operand, rng);
              ++cases;
            }
  EXPECT_GT(cases, 100);
}

TEST(Ldmatrix, PlanShapes) {
  Layout acc = Layout::mmaAccumulator({64, 8}, 4, {4, 1});
  Layout b = Layout::dotOperand(acc, 1, 16, 16);  // 4 registers: one x2
  auto plan = ldmatrixAccesses(b, SharedLayout::forDotOperand(b.shape(), 2, 1, true), 0);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].numMatrices, 2);
  EXPECT_FALSE(plan[0].trans);
  Layout a = Layout::dotOperand(acc, 0, 64, 16);  // 8 * 4 registers: four x4
  auto planA = ldmatrixAccesses(a, SharedLayout::forDotOperand(a.shape(), 2, 0, false), 3);
  ASSERT_EQ(planA.size(), 4u);
  EXPECT_EQ(planA[2].registers, (std::vector<int64_t>{16, 17, 18, 19, 20, 21, 22, 23}));
}

TEST(Ldmatrix, UnswizzledTilesLoadCorrectlyButConflict) {
  std::mt19937_64 rng(std::random_device{}());
  Layout acc = Layout::mmaAccumulator({64, 64}, 4, {2, 2});
  Layout a = Layout::dotOperand(acc, 0, 64, 16);
  SharedLayout plain = SharedLayout::plain(a.shape(), {1, 0}, 2);
  int64_t conflicts = 0;
  for (const auto& access : ldmatrixAccesses(a, plain, 0)) {
    std::vector<int64_t> bytes;
    for (int64_t off : access.laneRowOffset) bytes.push_back(off * 2);
    conflicts += sharedBankConflicts(bytes, 16);
  }
  EXPECT_GT(conflicts, 0);
}

TEST(Ldmatrix, RejectsLayoutsItCannotRead) {
  Layout acc = Layout::mmaAccumulator({64, 64}, 4, {2, 2});
  Layout a = Layout::dotOperand(acc, 0, 32, 16);
  // 8-byte chunks swizzled: a matrix row is no longer 16 contiguous bytes.
  SharedLayout narrowChunks({64, 32}, {1, 0}, 4, 1, 8, 2);
  EXPECT_THROW(ldmatrixAccesses(a, narrowChunks, 0), Error);
  // tf32 operands are 4-byte elements.
  Layout a32 = Layout::dotOperand(acc, 0, 32, 32);
  EXPECT_THROW(ldmatrixAccesses(a32, SharedLayout::forDotOperand({64, 32}, 4, 0, false), 0), Error);
  // A blocked layout is no mma operand.
  Layout blocked = Layout::defaultBlocked({64, 32}, 4, 8);
  EXPECT_THROW(ldmatrixAccesses(blocked, SharedLayout::forDotOperand({64, 32}, 2, 0, false), 0), Error);
  EXPECT_THROW(ldmatrixAccesses(a, SharedLayout::forDotOperand({64, 64}, 2, 0, false), 0), Error);  // shapes differ
}

}  // namespace
}  // namespace flextile::ir

namespace flextile::ir {

// Panels (the wgmma tile format): the contiguous dimension cut into 64-element
// panels of 128 bytes, each holding every row, rows swizzled in 16-byte chunks
// by their index mod 8; printed with panel= and parsed back.
TEST(SharedLayout, PanelsFollowTheWgmmaTileFormula) {
  for (auto [rows, cols, rowMajor] : std::vector<std::tuple<int64_t, int64_t, bool>>{
           {64, 128, true}, {32, 256, true}, {128, 64, false}, {128, 16, false}}) {
    const std::vector<int> order = rowMajor ? std::vector<int>{1, 0} : std::vector<int>{0, 1};
    SharedLayout s({rows, cols}, order, 8, 1, 8, 2, 64);
    SCOPED_TRACE(s.str());
    ASSERT_EQ(s.verify(), "");
    const int64_t lines = rowMajor ? rows : cols, along = rowMajor ? cols : rows;
    EXPECT_EQ(s.numPanels(), along / 64);
    EXPECT_EQ(s.rowsPerPanel(), lines);
    std::vector<char> hit(size_t(s.numElements()), 0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t line = rowMajor ? r : c, x = rowMajor ? c : r;
        const int64_t want = (x / 64) * lines * 64 + line * 64 + (((x % 64) / 8) ^ (line % 8)) * 8 + x % 8;
        ASSERT_EQ(s.offsetOf({r, c}), want) << r << ", " << c;
        ASSERT_EQ(s.coordOf(want), (Layout::Coord{r, c}));
        ASSERT_EQ(hit[size_t(want)]++, 0);
      }
    EXPECT_NE(s.str().find("panel=64"), std::string::npos);
    EXPECT_EQ(SharedLayout::parse(s.str()), s);
  }
  // A panel equal to the row prints and parses as before.
  SharedLayout whole({64, 64}, {1, 0}, 8, 1, 8, 2, 64);
  EXPECT_EQ(whole.str().find("panel"), std::string::npos);
  EXPECT_EQ(whole, SharedLayout({64, 64}, {1, 0}, 8, 1, 8, 2));
  EXPECT_THROW(SharedLayout({64, 64}, {1, 0}, 8, 1, 8, 2, 48), Error);   // not a power of two
  EXPECT_THROW(SharedLayout({64, 64}, {1, 0}, 8, 1, 8, 2, 128), Error);  // wider than the row
}

}  // namespace flextile::ir
