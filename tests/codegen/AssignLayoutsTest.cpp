// Layout assignment on the kernels it must handle without any conversion
// (vector add, row softmax, matmul, loops with carried reductions, broadcasts
// both ways, trans, mixed ranks), for every warp count, plus vectorization of
// loads and stores and the places where a conversion is the right answer.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <random>

#include "LayoutTestUtil.h"
#include "codegen/AxisInfo.h"
#include "codegen/Passes.h"
#include "codegen/TensorCores.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"

namespace flextile::codegen {
namespace {

using namespace flextile::ir;
using namespace flextile::testing;

const Target kTarget = Target::sm90a();
const Target kNoTensorCores{75, false};  // sm_75: no mma.sync of the shapes FlexTile uses (codegen/Target.h)
const int kWarpCounts[] = {1, 2, 4, 8, 16};

std::string joinErrors(const std::vector<std::string>& errs) {
  std::string s;
  for (const auto& e : errs) s += "  " + e + "\n";
  return s;
}

// Converts that stage an operand of a tensor-core dot (loaded tile ->
// dot-operand layout, through shared memory and ldmatrix) are the point of
// the mma path, not needless conversions; they are counted apart.
int countOperandStaging(Function& f) {
  int n = 0;
  f.walk([&](const Op& op) {
    if (op.kind() != OpKind::Dot || !isMmaDot(op)) return;
    for (size_t i = 0; i < 2; ++i)
      if (const Op* def = op.operand(i)->definingOp(); def && def->kind() == OpKind::ConvertLayout) ++n;
  });
  return n;
}

// Runs the pass and the checks every kernel must pass.
void assignAndCheck(Function& f, int expectedConverts = 0, const Target& target = kTarget) {
  assignLayouts(f, target);
  auto errs = layoutRuleViolations(f);
  EXPECT_TRUE(errs.empty()) << f.name() << " breaks layout rules:\n" << joinErrors(errs);
  EXPECT_NO_THROW(verify(f)) << dump(f);
  EXPECT_EQ(countOps(f, OpKind::ConvertLayout) - countOperandStaging(f), expectedConverts)
      << f.name() << " (num_warps " << f.numWarps() << ")\n" << dump(f);
  if (const char* env = std::getenv("FLEXTILE_TEST_DUMP"); env && std::string(env) == f.name()) std::cout << dump(f);
}

// The vector width each load and store of `f` gets.
std::vector<int64_t> accessWidths(const Function& f) {
  AxisInfoAnalysis ai(f);
  std::vector<int64_t> out;
  f.walk([&](const Op& op) {
    if (op.kind() == OpKind::Load || op.kind() == OpKind::Store) out.push_back(memoryAccessWidth(op, ai).width);
  });
  return out;
}

TEST(AssignLayouts, VectorAddVectorizesWhenNIsDivisible) {
  for (int nw : kWarpCounts) {
    SCOPED_TRACE("num_warps " + std::to_string(nw));
    auto f = vectorAdd(4096, nw, 16);
    assignAndCheck(*f);
    for (const Op* ld : opsOf(*f, OpKind::Load)) EXPECT_EQ(ld->result()->type().layout()->contiguousRegisters(0), 4);
    EXPECT_EQ(accessWidths(*f), (std::vector<int64_t>{4, 4, 4}));
  }
}

TEST(AssignLayouts, VectorAddStaysScalarWhenTheMaskForbidsVectors) {
  for (int nw : kWarpCounts) {
    auto f = vectorAdd(4096, nw, /*n divisible by*/ 1);
    assignAndCheck(*f);
    for (const Op* ld : opsOf(*f, OpKind::Load)) EXPECT_EQ(ld->result()->type().layout()->contiguousRegisters(0), 1);
    EXPECT_EQ(accessWidths(*f), (std::vector<int64_t>{1, 1, 1}));
  }
}

TEST(AssignLayouts, VectorAddSmallBlockSpreadsOverThreads) {
  // 128 elements over 128 threads: one element each rather than 4 per thread
  // with 3/4 of the threads idle.
  auto f = vectorAdd(128, 4, 16);
  assignAndCheck(*f);
  const Layout& l = *opsOf(*f, OpKind::Load)[0]->result()->type().layout();
  EXPECT_EQ(l.numRegisters(), 1);
  EXPECT_EQ(l.replicatedLaneMask(), 0u);
  EXPECT_EQ(l.replicatedWarpMask(), 0u);
}

TEST(AssignLayouts, RowSoftmaxNeedsNoConversion) {
  for (int nw : kWarpCounts) {
    SCOPED_TRACE("num_warps " + std::to_string(nw));
    auto f = rowSoftmax(32, 128, nw, 16);
    assignAndCheck(*f);
    const Layout& ld = *opsOf(*f, OpKind::Load)[0]->result()->type().layout();
    EXPECT_EQ(ld.contiguousRegisters(1), 4);
    EXPECT_EQ(accessWidths(*f), (std::vector<int64_t>{4, 4}));
    // The reductions come out in the sliced layout; the store uses the load's layout.
    for (const Op* r : opsOf(*f, OpKind::Reduce)) EXPECT_EQ(*r->result()->type().layout(), ld.sliced(1));
    EXPECT_EQ(*opsOf(*f, OpKind::Store)[0]->operand(1)->type().layout(), ld);
    // Index arithmetic is computed once per layout it is needed in: rows and
    // cols each in one layout, shared by the load, the store and the masks.
    EXPECT_EQ(countOps(*f, OpKind::Arange), 2);
  }
}

TEST(AssignLayouts, RowSoftmaxVectorWidthFollowsAlignmentAndType) {
  auto odd = rowSoftmax(32, 128, 4, /*N divisible by*/ 1);
  assignAndCheck(*odd);
  EXPECT_EQ(opsOf(*odd, OpKind::Load)[0]->result()->type().layout()->contiguousRegisters(1), 1);
  EXPECT_EQ(accessWidths(*odd), (std::vector<int64_t>{1, 1}));

  auto half = rowSoftmax(32, 256, 4, 16, DType::F16);
  assignAndCheck(*half);
  EXPECT_EQ(opsOf(*half, OpKind::Load)[0]->result()->type().layout()->contiguousRegisters(1), 8);
  EXPECT_EQ(accessWidths(*half), (std::vector<int64_t>{8, 8}));

  auto four = rowSoftmax(32, 128, 4, 4);  // N % 4 == 0: mask groups of 4, 16-byte rows
  assignAndCheck(*four);
  EXPECT_EQ(accessWidths(*four), (std::vector<int64_t>{4, 4}));
  auto two = rowSoftmax(32, 128, 4, 2);  // 8-byte aligned rows
  assignAndCheck(*two);
  EXPECT_EQ(accessWidths(*two), (std::vector<int64_t>{2, 2}));
}

TEST(AssignLayouts, MatmulNeedsNoConversion) {
  for (bool carried : {false, true})
    for (int nw : kWarpCounts) {
      SCOPED_TRACE(std::string(carried ? "carried pointers" : "recomputed pointers") + ", num_warps " +
                   std::to_string(nw));
      auto f = matmul(128, 128, 64, nw, carried);
      assignAndCheck(*f);
      EXPECT_EQ(countOperandStaging(*f), 2);  // a and b, staged for ldmatrix
      auto loads = opsOf(*f, OpKind::Load);
      ASSERT_EQ(loads.size(), 2u);
      // f16 tiles: 8 elements = 16 bytes per access along the contiguous dim.
      EXPECT_EQ(loads[0]->result()->type().layout()->contiguousRegisters(1), 8);
      EXPECT_EQ(loads[1]->result()->type().layout()->contiguousRegisters(1), 8);
      const Op* dot = opsOf(*f, OpKind::Dot)[0];
      const Op* loop = opsOf(*f, OpKind::For)[0];
      EXPECT_EQ(*loop->result(0)->type().layout(), *dot->result()->type().layout());
      auto widths = accessWidths(*f);
      // a, b, then the f32 store of c straight from the mma accumulator
      // (c0, c1 are adjacent columns: 8-byte stores).
      EXPECT_EQ(widths, (std::vector<int64_t>{8, 8, 2}));
      // Without tensor cores (sm_75: no mma.sync) the FMA dot takes the
      // operands as loaded and c keeps a 16-byte-store blocked layout.
      auto g = matmul(128, 128, 64, nw, carried);
      assignAndCheck(*g, 0, kNoTensorCores);
      EXPECT_EQ(countOperandStaging(*g), 0);
      EXPECT_EQ(accessWidths(*g), (std::vector<int64_t>{8, 8, 4}));
    }
}

TEST(AssignLayouts, MatmulWithUnalignedDimensionsDoesNotVectorize) {
  for (bool carried : {false, true}) {
    auto f = matmul(64, 64, 32, 4, carried, /*dims divisible by*/ 1);
    assignAndCheck(*f);
    for (const Op* ld : opsOf(*f, OpKind::Load))
      EXPECT_EQ(ld->result()->type().layout()->contiguousRegisters(1), 1);
    EXPECT_EQ(accessWidths(*f), (std::vector<int64_t>{1, 1, 1}));
  }
}

TEST(AssignLayouts, LoopCarriedReductions) {
  for (bool online : {false, true})
    for (int nw : kWarpCounts) {
      SCOPED_TRACE(std::string(online ? "online" : "plain") + ", num_warps " + std::to_string(nw));
      auto f = rowSumLoop(64, 64, nw, online);
      assignAndCheck(*f);
      const Op* loop = opsOf(*f, OpKind::For)[0];
      const Layout& tile = *opsOf(*f, OpKind::Load)[0]->result()->type().layout();
      for (size_t i = 0; i < loop->numResults(); ++i) EXPECT_EQ(*loop->result(i)->type().layout(), tile.sliced(1));
    }
}

TEST(AssignLayouts, BroadcastBothDirectionsOfReductions) {
  for (int nw : kWarpCounts) {
    Function f("center");
    Value* x = f.addParam(Type::pointer(DType::F32), "x");
    Value* y = f.addParam(Type::pointer(DType::F32), "y");
    setAttrs(f, nw, {});
    Builder b(f);
    K k{b};
    const Shape tile{64, 32};
    Value* offs = k.add(k.col(k.mul(b.arange(0, 64), k.splat(k.i32(32), {64})), tile), k.row(b.arange(0, 32), tile));
    Value* t = b.load(k.ptrs(x, offs));
    Value* rowMax = b.reduce(t, 1, "max");  // [64]
    Value* colSum = b.reduce(t, 0, "sum");  // [32]
    Value* centered = k.sub(k.sub(t, k.col(rowMax, tile)), k.row(colSum, tile));
    // The broadcast operand first, the computed tile second.
    Value* scaled = k.mul(k.row(colSum, tile), centered);
    b.store(k.ptrs(y, offs), scaled);
    b.ret();
    assignAndCheck(f);
  }
}

TEST(AssignLayouts, BroadcastOfALoadedVectorReloadsItInTheTilesSlice) {
  // bias[BN] added to every row of a 2-D tile: the tile needs it in its
  // column slice. A small vector load with a cheap address is issued again in
  // that layout (replicated reads of a few cached elements) instead of being
  // converted through shared memory; the original load disappears.
  BiasAdd p = biasAdd([](K& k, Value* bias) {
    k.b.load(bias);  // unused: left alone
    return k.b.load(bias);
  });
  Function& f = *p.f;
  Value* t = p.tile;
  assignAndCheck(f, 0);
  auto loads = opsOf(f, OpKind::Load);
  ASSERT_EQ(loads.size(), 3u);  // the tile, the unused bias load (kept: not reloaded), the reloaded bias
  const Layout& tileLayout = *t->type().layout();
  EXPECT_EQ(*loads.back()->result()->type().layout(), tileLayout.sliced(0));
}

TEST(AssignLayouts, BroadcastOfAComputedVectorConvertsTheVectorNotTheTile) {
  // exp2(bias[BN]) is computed in the bias load's coalesced 1-D layout; adding
  // it to every row needs it in the tile's column slice. One conversion, on
  // the small vector.
  Value* bv = nullptr;
  BiasAdd p = biasAdd([&](K& k, Value* bias) { return bv = k.b.unary(OpKind::Exp2, k.b.load(bias)); });
  Function& f = *p.f;
  assignAndCheck(f, 1);
  const Op* cvt = opsOf(f, OpKind::ConvertLayout)[0];
  EXPECT_EQ(cvt->operand(0), bv);
  EXPECT_EQ(cvt->result()->type().shape(), (Shape{128}));
}

TEST(AssignLayouts, ElementwiseMixOfTwoLoadsConvertsTheSecond) {
  // Two loads with different access patterns want different layouts; their
  // sum takes the first one's and converts the second.
  Function f("mix");
  Value* x = f.addParam(Type::pointer(DType::F32), "x");
  Value* xt = f.addParam(Type::pointer(DType::F32), "xt");
  Value* y = f.addParam(Type::pointer(DType::F32), "y");
  setAttrs(f, 4, {});
  Builder b(f);
  K k{b};
  const Shape tile{64, 64};
  Value* r = b.arange(0, 64);
  Value* c = b.arange(0, 64);
  Value* sixtyFour = k.splat(k.i32(64), {64});
  Value* rowMajor = k.add(k.col(k.mul(r, sixtyFour), tile), k.row(c, tile));
  Value* colMajor = k.add(k.col(r, tile), k.row(k.mul(c, sixtyFour), tile));
  Value* a = b.load(k.ptrs(x, rowMajor));
  Value* at = b.load(k.ptrs(xt, colMajor));  // contiguous along dim 0
  b.store(k.ptrs(y, rowMajor), k.add(a, at));
  b.ret();
  assignAndCheck(f, 1);
  EXPECT_EQ(at->type().layout()->contiguousRegisters(0), 4);
  EXPECT_EQ(opsOf(f, OpKind::ConvertLayout)[0]->operand(0), at);
}

TEST(AssignLayouts, ARowValueReadForEveryColumnTakesTheTilesLayout) {
  // A merge of partial results reads each row's weight for every column of the partial (the
  // decode template's lse): an address that repeats along the fastest dim. Laid out as a
  // contiguous read of that shape, it meets the partial without a conversion (with one element
  // a thread it took one, a shared-memory round trip between two barriers, per partial).
  for (int warps : kWarpCounts) {
    Function f("row_value");
    Value* x = f.addParam(Type::pointer(DType::F32), "x");
    Value* w = f.addParam(Type::pointer(DType::F32), "w");
    Value* y = f.addParam(Type::pointer(DType::F32), "y");
    setAttrs(f, warps, {});
    Builder b(f);
    K k{b};
    const Shape tile{16, 128};
    Value* r = b.arange(0, 16);
    Value* c = b.arange(0, 128);
    Value* rowMajor = k.add(k.col(k.mul(r, k.splat(k.i32(128), {16})), tile), k.row(c, tile));
    Value* part = b.load(k.ptrs(x, rowMajor));
    Value* weight = b.load(k.ptrs(w, k.col(k.mul(r, k.splat(k.i32(3), {16})), tile)));  // row r: w[3 r]
    b.store(k.ptrs(y, rowMajor), k.mul(part, b.unary(OpKind::Exp2, weight)));
    b.ret();
    assignAndCheck(f, 0);
    EXPECT_EQ(*weight->type().layout(), *part->type().layout()) << "num_warps " << warps;
  }
}

TEST(AssignLayouts, AtomicAddOverCheapOperandsRunsOnceInOneLayout) {
  // Its pointer and value are cheap (recomputed per user's layout), but an
  // atomic must run once: its old values are converted, never the op cloned.
  // Alone it takes one element per thread along the contiguous dimension.
  for (int warps : kWarpCounts) {
    Function f("atomic");
    Value* acc = f.addParam(Type::pointer(DType::F32), "acc");
    Value* xt = f.addParam(Type::pointer(DType::F32), "xt");
    Value* y = f.addParam(Type::pointer(DType::F32), "y");
    setAttrs(f, warps, {});
    Builder b(f);
    K k{b};
    const Shape tile{64, 64};
    Value* r = b.arange(0, 64);
    Value* c = b.arange(0, 64);
    Value* sixtyFour = k.splat(k.i32(64), {64});
    Value* rowMajor = k.add(k.col(k.mul(r, sixtyFour), tile), k.row(c, tile));
    Value* colMajor = k.add(k.col(r, tile), k.row(k.mul(c, sixtyFour), tile));
    Value* old = b.atomicAdd(k.ptrs(acc, rowMajor), b.constant(Type(DType::F32, tile), 1.0));
    Value* at = b.load(k.ptrs(xt, colMajor));  // wants dim 0 fastest
    b.store(k.ptrs(y, colMajor), k.add(at, old));
    b.store(k.ptrs(y, rowMajor), old);
    b.ret();
    assignAndCheck(f, 1);
    EXPECT_EQ(countOps(f, OpKind::AtomicAdd), 1);
    EXPECT_EQ(opsOf(f, OpKind::ConvertLayout)[0]->operand(0), old);
    const Layout& l = *old->type().layout();
    EXPECT_EQ(l.contiguousRegisters(1), 1) << l.str();
    EXPECT_EQ(l.laneBases()[0], (Layout::Coord{0, 1})) << l.str();
  }
}

TEST(AssignLayouts, TransposeAndStoreTransposed) {
  for (int nw : kWarpCounts) {
    Function f("transpose");
    Value* x = f.addParam(Type::pointer(DType::F32), "x");
    Value* y = f.addParam(Type::pointer(DType::F32), "y");
    setAttrs(f, nw, {});
    Builder b(f);
    K k{b};
    Value* r = b.arange(0, 32);
    Value* c = b.arange(0, 64);
    Value* in = k.add(k.col(k.mul(r, k.splat(k.i32(64), {32})), {32, 64}), k.row(c, {32, 64}));
    Value* t = b.load(k.ptrs(x, in));
    Value* tt = b.trans(t, {1, 0});  // [64, 32]
    // y[c, r] = x[r, c] + (index of the trans'd cheap offsets, to exercise trans of cheap values)
    Value* out = b.trans(in, {1, 0});
    Value* v = k.add(tt, b.cast(out, DType::F32));
    b.store(k.ptrs(y, out), v);
    b.ret();
    assignAndCheck(f);
  }
}

TEST(AssignLayouts, MixedRanks) {
  for (int nw : kWarpCounts) {
    Function f("ranks");
    Value* x = f.addParam(Type::pointer(DType::F32), "x");
    Value* y = f.addParam(Type::pointer(DType::F32), "y");
    Value* z = f.addParam(Type::pointer(DType::F32), "z");
    setAttrs(f, nw, {});
    Builder b(f);
    K k{b};
    const Shape s3{2, 16, 32};
    // offsets of a [2, 16, 32] row-major block
    Value* i0 = b.broadcast(b.expandDims(b.expandDims(k.mul(b.arange(0, 2), k.splat(k.i32(512), {2})), 1), 2), s3);
    Value* i1 = b.broadcast(b.expandDims(b.expandDims(k.mul(b.arange(0, 16), k.splat(k.i32(32), {16})), 0), 2), s3);
    Value* i2 = b.broadcast(b.expandDims(b.expandDims(b.arange(0, 32), 0), 0), s3);
    Value* offs = k.add(k.add(i0, i1), i2);
    Value* t = b.load(k.ptrs(x, offs));
    Value* s = b.reduce(t, 2, "sum");  // [2, 16]
    Value* s1 = b.reduce(s, 0, "max");  // [16]
    Value* total = b.reduce(s1, 0, "sum");  // scalar
    // back up to 3-D: t - s[:, :, None] + s1[None, :, None]
    Value* centered = k.sub(t, b.broadcast(b.expandDims(s, 2), s3));
    Value* shifted = k.add(centered, b.broadcast(b.expandDims(b.expandDims(s1, 0), 2), s3));
    b.store(k.ptrs(y, offs), shifted);
    // the same data as a [32, 32] matrix plus its own cheap offsets
    Value* flat = b.reshape(shifted, {32, 32});
    Value* offs2 = k.add(k.col(k.mul(b.arange(0, 32), k.splat(k.i32(32), {32})), {32, 32}), k.row(b.arange(0, 32), {32, 32}));
    b.store(k.ptrs(z, offs2), k.add(flat, k.splat(total, {32, 32})));
    b.ret();
    assignAndCheck(f);
  }
}

TEST(AssignLayouts, IsIdempotent) {
  auto f = matmul(64, 32, 16, 4, true);
  assignLayouts(*f, kTarget);
  std::vector<std::string> first;
  f->walk([&](const Op& op) {
    for (const Value* r : op.results()) first.push_back(layoutOf(r));
  });
  assignAndCheck(*f);
  std::vector<std::string> second;
  f->walk([&](const Op& op) {
    for (const Value* r : op.results()) second.push_back(layoutOf(r));
  });
  EXPECT_EQ(first, second);
}

TEST(AssignLayouts, RejectsNonPowerOfTwoTiles) {
  Function f("bad");
  Builder b(f);
  b.arange(0, 48);
  b.ret();
  EXPECT_THROW(assignLayouts(f, kTarget), Error);
}

TEST(AssignLayouts, RandomTileSizesAndWarps) {
  const unsigned seed = testSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  auto pow2 = [&](int lo, int hi) { return int64_t(1) << (lo + int(rng() % unsigned(hi - lo + 1))); };
  for (int trial = 0; trial < 60; ++trial) {
    int nw = kWarpCounts[rng() % 5];
    int64_t bm = pow2(0, 7), bn = pow2(0, 8), bk = pow2(0, 6);
    int64_t div = pow2(0, 5);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": num_warps " + std::to_string(nw) + " BM " + std::to_string(bm) +
                 " BN " + std::to_string(bn) + " BK " + std::to_string(bk) + " div " + std::to_string(div));
    auto sm = rowSoftmax(bm, bn, nw, div);
    assignAndCheck(*sm);
    auto mm = matmul(bm, bn, bk, nw, rng() % 2, div);
    assignAndCheck(*mm);
    auto rs = rowSumLoop(bm, bn, nw, rng() % 2);
    assignAndCheck(*rs);
    auto va = vectorAdd(bn, nw, div);
    assignAndCheck(*va);
    // Whatever the sizes, a vector access never exceeds 16 bytes or what the
    // facts allow.
    for (auto* fn : {sm.get(), mm.get(), va.get()}) {
      AxisInfoAnalysis ai(*fn);
      fn->walk([&](const Op& op) {
        if (op.kind() != OpKind::Load && op.kind() != OpKind::Store) return;
        auto w = memoryAccessWidth(op, ai);
        EXPECT_LE(w.width * byteWidth(op.operand(0)->type().pointee()), 16);
        EXPECT_LE(w.width, vectorWidth(op.operand(0), ai, nullptr, w.dim));
      });
    }
  }
}

}  // namespace
}  // namespace flextile::codegen
