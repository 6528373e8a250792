// Shared-memory planning: scratch sizes per op kind and reuse across ops.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "LayoutTestUtil.h"
#include "codegen/Passes.h"
#include "codegen/LowerToLLVM.h"
#include "codegen/SharedMemory.h"

namespace flextile::codegen {
namespace {

using namespace flextile::ir;
using namespace flextile::testing;

const Target kTarget = Target::sm90a();
// The FMA dot (sm_75 has no mma.sync of the shapes FlexTile uses: codegen/Target.h)
// stages its operands in its own scratch; mma dots have none (tests/codegen/MmaTest.cpp).
const Target kFmaTarget{75, false};

// x[BM, BN] loaded, then reduced along `axis`, stored.
std::unique_ptr<Function> reduceKernel(int64_t bm, int64_t bn, int axis, int nw, DType dt = DType::F32) {
  auto f = std::make_unique<Function>("reduce");
  Value* x = f->addParam(Type::pointer(dt), "x");
  Value* y = f->addParam(Type::pointer(dt), "y");
  setAttrs(*f, nw, {});
  Builder b(*f);
  K k{b};
  const Shape tile{bm, bn};
  Value* offs = k.add(k.col(k.mul(b.arange(0, bm), k.splat(k.i32(bn), {bm})), tile), k.row(b.arange(0, bn), tile));
  Value* r = b.reduce(b.load(k.ptrs(x, offs)), axis, "sum");
  b.store(k.ptrs(y, b.arange(0, axis == 0 ? bn : bm)), r);
  b.ret();
  return f;
}

TEST(SharedMemory, RowReductionWithinWarpsNeedsNone) {
  auto f = rowSoftmax(32, 128, 4, 16);
  assignLayouts(*f, kTarget);
  for (const Op* r : opsOf(*f, OpKind::Reduce)) {
    EXPECT_FALSE(reduceNeedsScratch(*r));
    EXPECT_EQ(scratchBytes(*r), 0);
  }
  SharedPlan plan = planSharedMemory(*f);
  EXPECT_TRUE(plan.offset.empty());
  EXPECT_EQ(plan.totalBytes, 0);
}

TEST(SharedMemory, ReductionAcrossWarpsNeedsPartials) {
  for (int nw : {2, 4, 8, 16}) {
    auto f = reduceKernel(64, 32, 0, nw);  // warps split the rows: partials per warp
    assignLayouts(*f, kTarget);
    const Op* r = opsOf(*f, OpKind::Reduce)[0];
    ASSERT_TRUE(reduceNeedsScratch(*r));
    EXPECT_EQ(scratchBytes(*r), int64_t(nw) * 32 * 4);
    SharedPlan plan = planSharedMemory(*f);
    EXPECT_EQ(plan.offset.at(r), 0);
    EXPECT_EQ(plan.totalBytes, nw * 32 * 4);
  }
  auto one = reduceKernel(64, 32, 0, 1);  // one warp: shuffles only
  assignLayouts(*one, kTarget);
  EXPECT_EQ(planSharedMemory(*one).totalBytes, 0);
}

TEST(SharedMemory, DotStagesBothOperands) {
  auto f = matmul(64, 32, 16, 4, false);
  assignLayouts(*f, kFmaTarget);
  const Op* dot = opsOf(*f, OpKind::Dot)[0];
  EXPECT_EQ(dotScratchBOffset(*dot), 64 * 16 * 2);
  EXPECT_EQ(scratchBytes(*dot), 64 * 16 * 2 + 16 * 32 * 2);
  SharedPlan plan = planSharedMemory(*f);
  EXPECT_EQ(plan.offset.at(dot), 0);
  EXPECT_EQ(plan.totalBytes, 64 * 16 * 2 + 16 * 32 * 2);
}

TEST(SharedMemory, DotBOffsetIsAligned) {
  Function f("tiny");
  Builder b(f);
  Value* a = b.constant(Type(DType::F16, {2, 2}), 1.0);  // 8 bytes
  Value* bb = b.constant(Type(DType::F16, {2, 2}), 1.0);
  Value* d = b.dot(a, bb, b.constant(Type(DType::F32, {2, 2}), 0.0));
  b.ret();
  EXPECT_EQ(dotScratchBOffset(*d->definingOp()), 16);
  EXPECT_EQ(scratchBytes(*d->definingOp()), 24);
}

TEST(SharedMemory, ConvertIsOneSourceTile) {
  // exp2 of the bias: a computed vector (a bare load would be reloaded in the
  // tile's layout instead, AssignLayouts.cpp reloadInLayout).
  BiasAdd p = biasAdd([](K& k, Value* bias) { return k.b.unary(OpKind::Exp2, k.b.load(bias)); });
  Function& f = *p.f;
  assignLayouts(f, kTarget);
  auto cvts = opsOf(f, OpKind::ConvertLayout);
  ASSERT_EQ(cvts.size(), 1u);
  EXPECT_EQ(scratchBytes(*cvts[0]), 128 * 4);
  EXPECT_EQ(planSharedMemory(f).totalBytes, 512);
}

TEST(SharedMemory, ScratchOfSequentialOpsIsReused) {
  // A cross-warp column sum (8 warps x 32 f32 = 1 KiB), a dot (a: 64x16 f16,
  // b: 16x32 f16 = 3 KiB) and a conversion: each buffer lives only during its
  // op, so all start at 0 and the kernel needs the largest.
  auto f = matmul(64, 32, 16, 8, true);
  Builder b(*f);
  b.setInsertionPointBefore(f->body().terminator());
  K k{b};
  Value* x = f->addParam(Type::pointer(DType::F32), "x");
  f->attrs()["arg_divisibility"] = std::vector<int64_t>{16, 16, 16, 16, 16, 16, 16};
  const Shape tile{64, 32};
  Value* offs = k.add(k.col(k.mul(b.arange(0, 64), k.splat(k.i32(32), {64})), tile), k.row(b.arange(0, 32), tile));
  Value* t = b.load(k.ptrs(x, offs));
  Value* colSum = b.reduce(t, 0, "sum");
  // A computed vector in its own layout: converted for the add (a bare load
  // would be reloaded in the sum's layout instead).
  Value* v = b.unary(OpKind::Exp2, b.load(k.ptrs(x, b.arange(0, 32))));
  b.store(k.ptrs(x, b.arange(0, 32)), k.add(colSum, v));
  assignLayouts(*f, kFmaTarget);
  SharedPlan plan = planSharedMemory(*f);
  ASSERT_EQ(plan.offset.size(), 3u);
  int largest = 0;
  for (auto [op, off] : plan.offset) {
    EXPECT_EQ(off, 0) << op->describe();
    EXPECT_EQ(plan.bytes.at(op) % 16, 0);
    largest = std::max(largest, plan.bytes.at(op));
  }
  EXPECT_EQ(largest, 64 * 16 * 2 + 16 * 32 * 2);
  EXPECT_EQ(plan.totalBytes, largest);
}

TEST(SharedMemory, LoweringPlanCarriesOffsetsAndVectorWidths) {
  auto f = matmul(64, 64, 32, 4, true);
  assignLayouts(*f, kFmaTarget);
  LoweringPlan plan = planLowering(*f);
  const Op* dot = opsOf(*f, OpKind::Dot)[0];
  EXPECT_EQ(plan.scratchOffset.at(dot), 0);
  EXPECT_EQ(plan.sharedBytes, 64 * 32 * 2 + 32 * 64 * 2);
  std::vector<int> widths;
  f->walk([&](const Op& op) {
    if (op.kind() == OpKind::Load || op.kind() == OpKind::Store) widths.push_back(plan.vectorWidth.count(&op) ? plan.vectorWidth.at(&op) : 1);
  });
  EXPECT_EQ(widths, (std::vector<int>{8, 8, 4}));

  auto odd = matmul(64, 64, 32, 4, true, /*dims divisible by*/ 1);
  assignLayouts(*odd, kFmaTarget);
  LoweringPlan oddPlan = planLowering(*odd);
  for (const auto& [op, w] : oddPlan.vectorWidth) EXPECT_EQ(w, 1) << op->describe();
}

TEST(SharedMemory, NeedsLayouts) {
  auto f = reduceKernel(64, 32, 0, 4);
  EXPECT_THROW(planSharedMemory(*f), Error);
}

TEST(SharedMemory, TooLargeForTheTargetIsAnError) {
  Function f("huge");
  Value* c = f.addParam(Type::pointer(DType::F32), "c");
  Builder b(f);
  K k{b};
  const Shape s{256, 256};
  Value* a = b.constant(Type(DType::F32, s), 1.0);  // 256 KiB
  Value* bb = b.constant(Type(DType::F32, s), 1.0);
  Value* d = b.dot(a, bb, b.constant(Type(DType::F32, s), 0.0));
  b.store(k.ptrs(c, k.add(k.col(k.mul(b.arange(0, 256), k.splat(k.i32(256), {256})), s), k.row(b.arange(0, 256), s))), d);
  b.ret();
  assignLayouts(f, kFmaTarget);
  SharedPlan plan = planSharedMemory(f);
  EXPECT_EQ(plan.totalBytes, 2 * 256 * 256 * 4);
  try {
    checkSharedMemoryFits(plan, f, Target::sm80());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("op 'dot'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sm_80"), std::string::npos) << e.what();
  }
}

TEST(SharedMemory, RandomReductionsMatchTheFormula) {
  const unsigned seed = testSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 40; ++trial) {
    int nw = 1 << (rng() % 5);
    int64_t bm = int64_t(1) << (1 + rng() % 7), bn = int64_t(1) << (1 + rng() % 7);
    int axis = int(rng() % 2);
    DType dt = rng() % 2 ? DType::F32 : DType::F16;
    SCOPED_TRACE(std::to_string(bm) + "x" + std::to_string(bn) + " axis " + std::to_string(axis) + " warps " +
                 std::to_string(nw));
    auto f = reduceKernel(bm, bn, axis, nw, dt);
    assignLayouts(*f, kTarget);
    const Op* r = opsOf(*f, OpKind::Reduce)[0];
    const Layout& in = *r->operand(0)->type().layout();
    // Brute force: do warps hold different parts of one output?
    std::set<int64_t> axisStarts;
    for (int64_t w = 0; w < nw; ++w) axisStarts.insert(in.apply(0, 0, w)[size_t(axis)]);
    const bool crossWarp = axisStarts.size() > 1;
    EXPECT_EQ(reduceNeedsScratch(*r), crossWarp);
    SharedPlan plan = planSharedMemory(*f);
    // One slot per warp id and result element.
    int64_t want = crossWarp ? int64_t(nw) * (axis == 0 ? bn : bm) * byteWidth(dt) : 0;
    EXPECT_EQ(scratchBytes(*r), want);
    EXPECT_EQ(plan.totalBytes, (want + 15) / 16 * 16);
  }
}

}  // namespace
}  // namespace flextile::codegen
