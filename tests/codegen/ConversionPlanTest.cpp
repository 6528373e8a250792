// The measured shared-memory plan of convert_layout (codegen/ConversionPlan.h):
// transposing conversions get swizzles with no (or far fewer) bank conflicts
// than the unswizzled row-major scratch, counted over every access of every
// warp, and the plan is a bijection that fits the scratch the planner sized.
#include <gtest/gtest.h>

#include <set>

#include "codegen/ConversionPlan.h"
#include "ir/IR.h"

namespace flextile::codegen {
namespace {

using ir::Layout;
using ir::SharedLayout;

struct Pair {
  std::string name;
  Layout from, to;
};

// Row-major blocked (sizePerThread spt along dim 1) and its column-major twin.
Layout rowBlocked(const ir::Shape& s, int64_t spt, int warps) {
  const int64_t lanesFast = std::min<int64_t>(32, s[1] / spt);
  return Layout::blocked(s, {1, spt}, {32 / lanesFast, lanesFast}, {warps, 1}, {1, 0});
}
Layout colBlocked(const ir::Shape& s, int64_t spt, int warps) {
  const int64_t lanesFast = std::min<int64_t>(32, s[0] / spt);
  return Layout::blocked(s, {spt, 1}, {lanesFast, 32 / lanesFast}, {1, warps}, {0, 1});
}

std::vector<Pair> transposePairs() {
  std::vector<Pair> pairs;
  for (ir::Shape shape : {ir::Shape{64, 64}, ir::Shape{128, 32}})
    for (int warps : {4, 8})
      for (auto [sptFrom, sptTo] : {std::pair<int64_t, int64_t>{4, 4}, {1, 4}, {4, 1}, {2, 8}, {8, 2}}) {
        std::string name = std::to_string(shape[0]) + "x" + std::to_string(shape[1]) + " w" + std::to_string(warps) +
                           " spt " + std::to_string(sptFrom) + "->" + std::to_string(sptTo);
        pairs.push_back({"row->col " + name, rowBlocked(shape, sptFrom, warps), colBlocked(shape, sptTo, warps)});
        pairs.push_back({"col->row " + name, colBlocked(shape, sptFrom, warps), rowBlocked(shape, sptTo, warps)});
      }
  return pairs;
}

// Every transpose pair, f32/bf16/i8: the plan's measured conflicts equal a
// full count over every access of every warp, are strictly fewer than the
// row-major scratch's (which has 128 to 3968 extra wavefronts on these), and
// are 0 on both sides for all but a few (at most 128 left, where the chooser
// trades them for wider vectors at an equal or lower wavefront count).
TEST(ConversionPlan, TransposesAreConflictFreeOrNearly) {
  int zero = 0, total = 0;
  for (const Pair& p : transposePairs())
    for (int64_t bytes : {4, 2, 1}) {
      SCOPED_TRACE(p.name + " " + std::to_string(bytes) + "-byte elements");
      const ConversionPlan base = rowMajorConversionPlan(p.from, p.to, bytes);
      const ConversionPlan plan = chooseConversionPlan(p.from, p.to, bytes);
      EXPECT_EQ(plan.storeConflicts, layoutAccessConflicts(p.from, plan.smem, plan.storeVec));
      EXPECT_EQ(plan.loadConflicts, layoutAccessConflicts(p.to, plan.smem, plan.loadVec));
      EXPECT_EQ(base.storeConflicts, layoutAccessConflicts(p.from, base.smem, 1));
      EXPECT_EQ(base.loadConflicts, layoutAccessConflicts(p.to, base.smem, 1));
      EXPECT_GE(base.storeConflicts + base.loadConflicts, 128);
      EXPECT_LT(plan.storeConflicts + plan.loadConflicts, base.storeConflicts + base.loadConflicts);
      EXPECT_LE(plan.wavefronts, base.wavefronts);
      EXPECT_LE(plan.storeConflicts + plan.loadConflicts, 128);
      zero += plan.storeConflicts + plan.loadConflicts == 0;
      ++total;
      // The swizzle permutes the scratch: same size, every element once.
      EXPECT_EQ(plan.smem.sizeBytes(), base.smem.sizeBytes());
      std::set<int64_t> offsets;
      for (int64_t o = 0; o < plan.smem.numElements(); ++o) offsets.insert(plan.smem.offsetOf(plan.smem.coordOf(o)));
      EXPECT_EQ(int64_t(offsets.size()), plan.smem.numElements());
    }
  std::printf("%d of %d plans conflict-free\n", zero, total);
  EXPECT_GE(zero, total - 8);
}

// The 64x64 f32 transpose of the GPU test and the lowering's PTX check:
// vectors on one side and far fewer wavefronts than row-major scratch.
TEST(ConversionPlan, Transpose64x64F32UsesVectors) {
  Layout a = Layout::blocked({64, 64}, {1, 4}, {2, 16}, {4, 1}, {1, 0});
  Layout b = Layout::blocked({64, 64}, {4, 1}, {16, 2}, {1, 4}, {0, 1});
  const ConversionPlan plan = chooseConversionPlan(a, b, 4);
  EXPECT_EQ(plan.storeConflicts, 0);
  EXPECT_LE(plan.loadConflicts, 128);  // 4-element vectors at no more wavefronts than scalar conflict-free
  EXPECT_LT(plan.wavefronts, rowMajorConversionPlan(a, b, 4).wavefronts);
  EXPECT_GE(std::max(plan.storeVec, plan.loadVec), 2) << plan.smem.str();
  const ConversionPlan base = rowMajorConversionPlan(a, b, 4);
  EXPECT_GT(base.storeConflicts + base.loadConflicts, 0);
  // i1/pointer tiles: one element per access, still measured.
  const ConversionPlan scalar = chooseConversionPlan(a, b, 8, false);
  EXPECT_EQ(scalar.storeVec, 1);
  EXPECT_EQ(scalar.loadVec, 1);
}

// Rank 1 and 3 tiles get a valid plan too.
TEST(ConversionPlan, Ranks1And3) {
  Layout a1 = Layout::defaultBlocked({256}, 4, 4), b1 = Layout::defaultBlocked({256}, 4, 1);
  ConversionPlan p1 = chooseConversionPlan(a1, b1, 4);
  EXPECT_EQ(p1.storeConflicts + p1.loadConflicts, 0);
  Layout a3 = Layout::defaultBlocked({4, 16, 32}, 4, 4), b3 = Layout::defaultBlocked({4, 16, 32}, 8 / 2, 1);
  ConversionPlan p3 = chooseConversionPlan(a3, b3, 2);
  EXPECT_EQ(p3.storeConflicts, layoutAccessConflicts(a3, p3.smem, p3.storeVec));
  EXPECT_LE(p3.wavefronts, rowMajorConversionPlan(a3, b3, 2).wavefronts);
  EXPECT_THROW(chooseConversionPlan(a1, Layout::defaultBlocked({128}, 4), 4), Error);
}

}  // namespace
}  // namespace flextile::codegen
