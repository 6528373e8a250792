// Tensor cores on the host: which layouts layout assignment gives a dot and
// its neighbours, what the PTX holds (mma.sync, ldmatrix, tf32 conversion),
// and ptxas over a grid of tile configurations for sm_80 and sm_90a.
// The numbers are checked on the GPU in tests/gpu/MmaGpuTest.cpp.
#include <gtest/gtest.h>

#include <cstdio>
#include <regex>

#include "LayoutTestUtil.h"
#include "MmaKernels.h"
#include "codegen/Compiler.h"
#include "codegen/Passes.h"
#include "codegen/Ptxas.h"
#include "codegen/SharedMemory.h"
#include "codegen/TensorCores.h"
#include "codegen/TensorMaps.h"
#include "ir/Verifier.h"

namespace flextile::codegen {
namespace {

using namespace flextile::ir;
using namespace flextile::testing;

const Target kTargets[] = {Target::sm80(), Target::sm90a()};

int countMatches(const std::string& text, const std::string& pattern) {
  std::regex re(pattern);
  return int(std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

// ---- warp split -------------------------------------------------------------

TEST(Mma, WarpSplitRule) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(mmaWarpsPerCTA(128, 128, 4, false), (V{2, 2}));  // square warp tiles
  EXPECT_EQ(mmaWarpsPerCTA(128, 128, 8, false), (V{4, 2}));
  EXPECT_EQ(mmaWarpsPerCTA(128, 64, 4, false), (V{4, 1}));
  EXPECT_EQ(mmaWarpsPerCTA(16, 128, 4, false), (V{1, 4}));  // M is one instruction tall
  EXPECT_EQ(mmaWarpsPerCTA(16, 8, 8, false), (V{8, 1}));    // too small: replicate along M
  EXPECT_EQ(mmaWarpsPerCTA(128, 128, 4, true), (V{4, 1}));  // chained: all along M
  EXPECT_EQ(mmaWarpsPerCTA(32, 64, 4, true), (V{2, 2}));    // ... while M allows
  for (int nw : {1, 2, 4, 8, 16})
    for (int64_t m : {16, 32, 64, 128, 256})
      for (int64_t n : {8, 16, 64, 256})
        for (bool chained : {false, true}) {
          V w = mmaWarpsPerCTA(m, n, nw, chained);
          EXPECT_EQ(w[0] * w[1], nw);
          EXPECT_NO_THROW(Layout::mmaAccumulator({m, n}, nw, w));
        }
}

// ---- layout assignment --------------------------------------------------------

// The checks every mma matmul passes: the dot's operands are the dot-operand
// layouts of its accumulator, each staged by one convert_layout of a load,
// the accumulator (loop-carried, the dot result, the loop result) keeps the
// mma layout, and the store takes it directly.
void checkMmaMatmul(Function& f, DType in, const Target& target) {
  assignLayouts(f, target);
  ASSERT_NO_THROW(verify(f)) << dump(f);
  auto dots = opsOf(f, OpKind::Dot);
  ASSERT_EQ(dots.size(), 1u);
  const Op* dot = dots[0];
  ASSERT_TRUE(isMmaDot(*dot)) << dump(f);
  const Shape& c = dot->result()->type().shape();
  const int64_t K = dot->operand(0)->type().shape()[1];
  const int nw = f.numWarps();
  const Layout acc = Layout::mmaAccumulator(c, nw, mmaWarpsPerCTA(c[0], c[1], nw, false));
  EXPECT_EQ(*dot->result()->type().layout(), acc);
  EXPECT_EQ(*dot->operand(2)->type().layout(), acc);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(*dot->operand(size_t(i))->type().layout(), Layout::dotOperand(acc, i, K, mmaOperandBits(in)));
    const Op* cvt = dot->operand(size_t(i))->definingOp();
    ASSERT_TRUE(cvt && cvt->kind() == OpKind::ConvertLayout) << dump(f);
    EXPECT_EQ(cvt->operand(0)->definingOp()->kind(), OpKind::Load);
  }
  EXPECT_EQ(countOps(f, OpKind::ConvertLayout), 2) << dump(f);
  const Op* loop = opsOf(f, OpKind::For)[0];
  EXPECT_EQ(*loop->result(0)->type().layout(), acc);
  EXPECT_EQ(*opsOf(f, OpKind::Store)[0]->operand(1)->type().layout(), acc);
  // No scratch of its own: operands arrive in registers.
  EXPECT_EQ(scratchBytes(*dot), 0);
  // The staging converts plan ldmatrix (16-bit) with 16-byte stores.
  if (in != DType::F32)
    for (int i = 0; i < 2; ++i) {
      const Op* cvt = dot->operand(size_t(i))->definingOp();
      auto plan = ldmatrixPlan(*cvt->operand(0)->type().layout(), *cvt->result()->type().layout(), in);
      ASSERT_TRUE(plan.has_value()) << cvt->describe();
      EXPECT_EQ(plan->trans, i == 1);  // row-major B [K, N] is read with .trans
      EXPECT_EQ(scratchBytes(*cvt), plan->smem.sizeBytes());
    }
}

TEST(Mma, MatmulLayouts) {
  for (DType in : {DType::F16, DType::BF16, DType::F32})
    for (int nw : {1, 2, 4, 8})
      for (auto [bm, bn, bk] : std::vector<std::array<int64_t, 3>>{{128, 128, 32}, {64, 32, 16}, {16, 64, 64}, {32, 16, 128}})
        for (bool carried : {false, true}) {
          SCOPED_TRACE(std::string(dtypeName(in)) + " " + std::to_string(bm) + "x" + std::to_string(bn) + "x" +
                       std::to_string(bk) + " warps " + std::to_string(nw) + (carried ? " carried" : ""));
          auto f = matmul(bm, bn, bk, nw, carried, 16, in);
          checkMmaMatmul(*f, in, Target::sm80());
        }
}

TEST(Mma, FmaPathForSmallShapesOldTargetsAndIeeeF32) {
  auto isFma = [](Function& f, const Target& t) {
    assignLayouts(f, t);
    return !isMmaDot(*opsOf(f, OpKind::Dot)[0]) && scratchBytes(*opsOf(f, OpKind::Dot)[0]) > 0;
  };
  EXPECT_TRUE(isFma(*matmul(8, 64, 32, 4, false), Target::sm90a()));   // M < 16
  EXPECT_TRUE(isFma(*matmul(64, 4, 32, 4, false), Target::sm90a()));   // N < 8
  EXPECT_TRUE(isFma(*matmul(64, 64, 8, 4, false), Target::sm90a()));   // K < 16 (f16)
  EXPECT_FALSE(isFma(*matmul(64, 64, 8, 4, false, 16, DType::F32), Target::sm90a()));  // tf32: K >= 8
  EXPECT_TRUE(isFma(*matmul(64, 64, 32, 4, false), Target{75, false}));
  auto ieee = matmul(64, 64, 32, 4, false, 16, DType::F32);
  ieee->walk([](Op& op) {
    if (op.kind() == OpKind::Dot) op.setAttr("input_precision", std::string("ieee"));
  });
  EXPECT_TRUE(isFma(*ieee, Target::sm90a()));
}

using testkernels::attentionBlock;

// ldmatrix instructions the staging converts of a laid-out function plan.
int plannedLdmatrix(Function& f) {
  int n = 0;
  f.walk([&](const Op& op) {
    if (op.kind() != OpKind::ConvertLayout) return;
    if (auto plan = ldmatrixPlan(*op.operand(0)->type().layout(), *op.result()->type().layout(),
                                 op.result()->type().dtype()))
      n += int(plan->accessBase.size());
  });
  return n;
}

bool isMmaAccumulatorLayout(const Layout& l) {
  if (l.rank() != 2 || l.regBases().size() < 2) return false;
  return l.regBases()[0] == Layout::Coord{0, 1} && l.regBases()[1] == Layout::Coord{8, 0} &&
         l.laneBases()[0] == Layout::Coord{0, 2} && l.laneBases()[2] == Layout::Coord{1, 0};
}

TEST(Mma, SoftmaxOverTheAccumulatorStaysInRegisters) {
  for (int nw : {1, 2, 4, 8})
    for (auto [bm, bn, d] : std::vector<std::array<int64_t, 3>>{{128, 64, 64}, {64, 64, 128}, {128, 128, 64}}) {
      if (bm < 16 * nw) continue;  // no room for every warp along M (next test)
      SCOPED_TRACE(std::to_string(bm) + "x" + std::to_string(bn) + " d " + std::to_string(d) + " warps " +
                   std::to_string(nw));
      auto f = attentionBlock(bm, bn, d, nw);
      assignLayouts(*f, Target::sm90a());
      ASSERT_NO_THROW(verify(*f)) << dump(*f);
      auto dots = opsOf(*f, OpKind::Dot);
      ASSERT_EQ(dots.size(), 2u);
      for (const Op* dot : dots) EXPECT_TRUE(isMmaDot(*dot)) << dump(*f);
      // Chained: all warps along M, the same split for S and O.
      const Layout& sLayout = *dots[0]->result()->type().layout();
      EXPECT_EQ(sLayout, Layout::mmaAccumulator({bm, bn}, nw, {nw, 1}));
      // Nothing converts an accumulator-layout value: the row max, exp2, row
      // sum and the division by it all stay in the mma layout (and its slice).
      for (const Op* cvt : opsOf(*f, OpKind::ConvertLayout))
        EXPECT_FALSE(isMmaAccumulatorLayout(*cvt->operand(0)->type().layout())) << cvt->describe() << "\n" << dump(*f);
      // P feeds P.V in place: its A operand is the cast of exp2, no convert.
      const Op* pFeed = dots[1]->operand(0)->definingOp();
      ASSERT_TRUE(pFeed);
      EXPECT_EQ(pFeed->kind(), OpKind::Cast) << dump(*f);
      // The only conversions stage Q, K^T and V for ldmatrix.
      EXPECT_EQ(countOps(*f, OpKind::ConvertLayout), 3) << dump(*f);
      for (const Op* r : opsOf(*f, OpKind::Reduce)) EXPECT_FALSE(reduceNeedsScratch(*r));

      // The PTX: every operand fragment but P's comes from ldmatrix;
      // K stored [N, D] is K-contiguous for K^T: no .trans; V [N, D] as B
      // (N-contiguous): .trans.
      if (bm * bn / (32 * nw) > 128) continue;  // PTX checks only where the accumulator fits in registers
      CompiledKernel k = compile(*attentionBlock(bm, bn, d, nw), CompileOptions{Target::sm90a(), true});
      EXPECT_GT(countMatches(k.ptx, R"(mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32)"), 0);
      EXPECT_GT(countMatches(k.ptx, R"(ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16)"), 0);
      EXPECT_GT(countMatches(k.ptx, R"(ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16)"), 0);
      // One ldmatrix per planned access: none merged (P: none at all).
      EXPECT_EQ(countMatches(k.ptx, "ldmatrix"), plannedLdmatrix(*f)) << k.ir;
      // Rows per thread: 2 per 16-row repetition; 2 quad shuffles per row
      // for the max and 2 for the sum.
      EXPECT_EQ(countMatches(k.ptx, R"(shfl\.sync\.bfly)"), 2 * (bm / (16 * nw)) * 4);
    }
}

// S summed over two column chunks, the second product accumulating into the first's result (the
// forward's split head dim): both products take the chain's split, all warps along M, so the second
// adds into the first's registers. The first once got a 2D split (it feeds no A operand itself) and
// its accumulator went through shared memory into the second's; on sm_90a neither ran on wgmma.
TEST(Mma, AnAccumulatorFromAnotherDotSharesItsWarpSplit) {
  for (int nw : {4, 8}) {
    SCOPED_TRACE("warps " + std::to_string(nw));
    auto f = attentionBlock(128, 64, 128, nw, DType::BF16, /*split=*/64);
    assignLayouts(*f, Target::sm90a());
    ASSERT_NO_THROW(verify(*f)) << dump(*f);
    auto dots = opsOf(*f, OpKind::Dot);
    ASSERT_EQ(dots.size(), 3u);
    for (size_t i = 0; i < 2; ++i)
      EXPECT_EQ(*dots[i]->result()->type().layout(), Layout::mmaAccumulator({128, 64}, nw, {nw, 1})) << dump(*f);
    EXPECT_EQ(dots[1]->operand(2), dots[0]->result()) << dump(*f);
    // Only the operands' staging converts: Q's and Kᵀ's chunks and V.
    EXPECT_EQ(countOps(*f, OpKind::ConvertLayout), 5) << dump(*f);
  }
}

TEST(Mma, EqualStagingsAreNotMerged) {
  // M = 16 with 4 warps: Q [16, 64] and P [16, 64] are staged to the same A
  // layout at the same scratch offset; each must load its own tile (LLVM once
  // reused Q's ldmatrix results for P when ldmatrix was inline asm).
  for (const Target& t : kTargets) {
    auto f = attentionBlock(16, 64, 64, 4);
    CompiledKernel k = compile(*f, CompileOptions{t, false});
    auto laidOut = attentionBlock(16, 64, 64, 4);
    assignLayouts(*laidOut, t);
    EXPECT_EQ(plannedLdmatrix(*laidOut), 16);  // Q, K^T, V, P: 4 accesses each
    EXPECT_EQ(countMatches(k.ptx, "ldmatrix"), 16) << k.ptx;
  }
}

TEST(Mma, ChainWithWarpsAlongNConvertsPThroughLdmatrix) {
  // M = 16 leaves no room for 4 warps along M: S is split along N, P's
  // layout is not P.V's A layout and is converted (generically, from the
  // linear layouts) through shared memory.
  auto f = attentionBlock(16, 64, 64, 4);
  assignLayouts(*f, Target::sm90a());
  auto dots = opsOf(*f, OpKind::Dot);
  EXPECT_EQ(*dots[0]->result()->type().layout(), Layout::mmaAccumulator({16, 64}, 4, {1, 4}));
  const Op* cvt = dots[1]->operand(0)->definingOp();
  ASSERT_TRUE(cvt && cvt->kind() == OpKind::ConvertLayout) << dump(*f);
  EXPECT_TRUE(ldmatrixPlan(*cvt->operand(0)->type().layout(), *cvt->result()->type().layout(), DType::BF16));
}

TEST(Mma, AccumulatorToOperandWithOneWarpColumnIsARegisterRenaming) {
  // With wn == 1 the accumulator of [M, N] and the A operand of [M, K = N]
  // have identical lane and warp bases: convert_layout only renames registers
  // (and the dot packs pairs), whatever the register order.
  for (int nw : {1, 2, 4, 8}) {
    Layout acc = Layout::mmaAccumulator({128, 64}, nw, {nw, 1});
    Layout a = Layout::dotOperand(Layout::mmaAccumulator({128, 32}, nw, {nw, 1}), 0, 64, 16);
    EXPECT_EQ(acc.laneBases(), a.laneBases());
    EXPECT_EQ(acc.warpBases(), a.warpBases());
    for (int64_t r = 0; r < a.numRegisters(); ++r) EXPECT_GE(acc.registerOf(a.regCoord(r)), 0);
  }
}

TEST(Mma, StagingAddressesAreLinear) {
  // The lowering writes element (reg, lane, warp) of the source at
  // offsetOf(regCoord) ^ offsetOf(lane part) ^ offsetOf(warp part), and reads
  // ldmatrix rows at accessBase ^ laneTerm ^ warpTerm: check both forms
  // against the direct formulas for the layouts matmuls and attention use.
  for (int nw : {1, 2, 4, 8})
    for (auto [bm, bk] : std::vector<std::array<int64_t, 2>>{{16, 16}, {64, 32}, {128, 64}, {32, 128}})
      for (int trans : {0, 1})
        for (int operand : {0, 1}) {
          const Shape shape = operand == 0 ? Shape{bm, bk} : Shape{bk, bm};
          Layout parent = Layout::mmaAccumulator(operand == 0 ? Shape{bm, 64} : Shape{64, bm}, nw,
                                                 mmaWarpsPerCTA(operand == 0 ? bm : 64, operand == 0 ? 64 : bm, nw, false));
          Layout to = Layout::dotOperand(parent, operand, bk, 16);
          Layout from = blockedLayout(shape, nw, trans ? 0 : 1, 8);
          auto plan = ldmatrixPlan(from, to, DType::BF16);
          ASSERT_TRUE(plan) << from.str() << " -> " << to.str();
          EXPECT_EQ(plan->smem.order()[0], trans ? 0 : 1);
          const SharedLayout& s = plan->smem;
          for (int w = 0; w < nw; ++w)
            for (int l = 0; l < 32; ++l) {
              int64_t thread = 0;
              for (int i = 0; i < 5; ++i)
                if (l >> i & 1) thread ^= s.offsetOf(from.laneBases()[size_t(i)]);
              for (size_t i = 0; i < from.warpBases().size(); ++i)
                if (w >> i & 1) thread ^= s.offsetOf(from.warpBases()[i]);
              for (int64_t r = 0; r < from.numRegisters(); ++r)
                ASSERT_EQ(s.offsetOf(from.apply(r, l, w)), thread ^ s.offsetOf(from.regCoord(r)));
            }
          // Every destination register is filled exactly once.
          std::vector<int> filled(size_t(to.numRegisters()), 0);
          for (const auto& regs : plan->registers)
            for (int64_t r : regs) ++filled[size_t(r)];
          for (int f : filled) EXPECT_EQ(f, 1);
        }
}

// Each ldmatrix access of `plan` from `smem` (element ids, row-major, at their shared offsets), with
// the instruction's semantics (PTX ISA): thread t gets row t/4, columns 2(t%4) and 2(t%4)+1 of each
// 8x8 matrix (with .trans rows 2(t%4), 2(t%4)+1 of column t/4). The first register of `to` that
// does not receive its element, or "".
std::string replayLdmatrix(const std::vector<int64_t>& smem, const Layout& to, const LdmatrixPlan& plan) {
  auto flat = [&](const Layout::Coord& c) { return c[0] * to.shape()[1] + c[1]; };
  for (int w = 0; w < to.numWarps(); ++w) {
    int64_t warpPart = 0;
    for (size_t i = 0; i < plan.warpTerm.size(); ++i)
      if (w >> i & 1) warpPart ^= plan.warpTerm[i];
    for (size_t q = 0; q < plan.accessBase.size(); ++q) {
      auto rowAddress = [&](int lane) {
        int64_t a = plan.accessBase[q] ^ warpPart;
        for (int i = 0; i < 5; ++i)
          if (lane >> i & 1) a ^= plan.laneTerm[size_t(i)];
        return a;
      };
      for (int t = 0; t < 32; ++t)
        for (int j = 0; j < plan.numMatrices; ++j)
          for (int half = 0; half < 2; ++half) {
            const int64_t got = plan.trans ? smem[size_t(rowAddress(8 * j + 2 * (t % 4) + half) + t / 4)]
                                           : smem[size_t(rowAddress(8 * j + t / 4) + 2 * (t % 4) + half)];
            const int64_t reg = plan.registers[q][size_t(2 * j + half)];
            if (got != flat(to.apply(reg, t, w)))
              return "warp " + std::to_string(w) + " lane " + std::to_string(t) + " register " + std::to_string(reg) +
                     " got element " + std::to_string(got) + ", wants " + std::to_string(flat(to.apply(reg, t, w)));
          }
    }
  }
  return "";
}

// Replays a staging convert as the lowering emits it, with the instructions'
// semantics (PTX ISA): every thread stores its registers in vectors of v at
// threadPart ^ offsetOf(regCoord), then each ldmatrix access loads 8x8
// matrices from the rows the lanes address (without .trans, thread t gets row
// t/4, columns 2(t%4) and 2(t%4)+1 of each matrix; with .trans rows 2(t%4),
// 2(t%4)+1 of column t/4). Returns a description of the first register that
// does not receive its element, or "".
std::string replayStaging(const Layout& from, const Layout& to, const LdmatrixPlan& plan) {
  const SharedLayout& s = plan.smem;
  std::vector<int64_t> smem(size_t(s.numElements()), -1);
  auto flat = [&](const Layout::Coord& c) { return c[0] * from.shape()[1] + c[1]; };
  const int fast = s.order()[0];
  int64_t v = std::min<int64_t>(from.contiguousRegisters(fast), s.vec());
  for (const Layout::Bases* bases : {&from.laneBases(), &from.warpBases()})
    for (const auto& basis : *bases)
      while (v > 1 && s.offsetOf(basis) % v != 0) v /= 2;
  for (int w = 0; w < from.numWarps(); ++w)
    for (int l = 0; l < 32; ++l) {
      int64_t thread = 0;
      for (int i = 0; i < 5; ++i)
        if (l >> i & 1) thread ^= s.offsetOf(from.laneBases()[size_t(i)]);
      for (size_t i = 0; i < from.warpBases().size(); ++i)
        if (w >> i & 1) thread ^= s.offsetOf(from.warpBases()[i]);
      for (int64_t r0 = 0; r0 < from.numRegisters(); r0 += v) {
        const int64_t at = thread ^ s.offsetOf(from.regCoord(r0));
        if (at % v != 0) return "misaligned vector store";
        for (int64_t i = 0; i < v; ++i) smem[size_t(at + i)] = flat(from.apply(r0 + i, l, w));
      }
    }
  return replayLdmatrix(smem, to, plan);
}

TEST(Mma, StagingConvertsDeliverEveryElement) {
  auto check = [](Function& f) {
    assignLayouts(f, Target::sm90a());
    int staged = 0;
    f.walk([&](const Op& op) {
      if (op.kind() != OpKind::ConvertLayout) return;
      const Layout &from = *op.operand(0)->type().layout(), &to = *op.result()->type().layout();
      auto plan = ldmatrixPlan(from, to, op.result()->type().dtype());
      if (!plan) return;
      ++staged;
      EXPECT_EQ(replayStaging(from, to, *plan), "") << op.describe() << ": " << from.str() << " -> " << to.str();
    });
    return staged;
  };
  for (int nw : {1, 2, 4, 8})
    for (auto [bm, bn, d] : std::vector<std::array<int64_t, 3>>{{16, 64, 64}, {32, 128, 64}, {64, 64, 64}, {128, 64, 128}}) {
      SCOPED_TRACE("attention " + std::to_string(bm) + "x" + std::to_string(bn) + " d " + std::to_string(d) + " warps " +
                   std::to_string(nw));
      auto f = attentionBlock(bm, bn, d, nw);
      EXPECT_GE(check(*f), 3);
      auto g = matmul(bm, bn, d, nw, true, 16, DType::BF16);
      EXPECT_EQ(check(*g), 2);
    }
}

// The ldmatrix reads of a tile that TMA stored in wgmma's 128-byte panels (the pipeline's
// ldmatrixPanels: rows wider than a TMA swizzle spans, the decode's K and V at D = 128). TMA puts
// element c at stored.offsetOf(c); then each ldmatrix access is replayed (replayLdmatrix).
std::string replayPanelReads(const SharedLayout& stored, const Layout& to, const LdmatrixPlan& plan) {
  const int64_t cols = to.shape()[1];
  std::vector<int64_t> smem(size_t(stored.numElements()), -1);
  for (int64_t r = 0; r < to.shape()[0]; ++r)
    for (int64_t c = 0; c < cols; ++c) smem[size_t(stored.offsetOf({r, c}))] = r * cols + c;
  return replayLdmatrix(smem, to, plan);
}

TEST(Mma, LdmatrixReadsTmaPanels) {
  // The decode's tile (16 rows, 64 keys, D = 128, 4 warps) and wider ones: every staged dot
  // operand whose row layout spans more than 128 bytes is read from the panels TMA writes.
  int read = 0;
  for (auto [bm, bn, d, nw] : std::vector<std::array<int64_t, 4>>{{16, 64, 128, 4}, {16, 128, 128, 4}, {64, 64, 256, 4},
                                                                   {32, 64, 128, 2}, {16, 64, 128, 1}}) {
    SCOPED_TRACE("attention " + std::to_string(bm) + "x" + std::to_string(bn) + " d " + std::to_string(d) + " warps " +
                 std::to_string(nw));
    auto f = attentionBlock(bm, bn, d, int(nw));
    assignLayouts(*f, Target::sm90a());
    f->walk([&](const Op& op) {
      if (op.kind() != OpKind::ConvertLayout) return;
      const Layout &from = *op.operand(0)->type().layout(), &to = *op.result()->type().layout();
      const DType t = op.result()->type().dtype();
      auto rows = ldmatrixPlan(from, to, t);
      if (!rows || rows->smem.order()[0] != 1 || rows->smem.panel() * 2 <= 128) return;
      const SharedLayout panels = wgmmaSharedLayout(to.shape(), 1, 2);
      ASSERT_EQ(tmaSlotRefusal(panels, to.shape(), t), "") << panels.str();
      auto plan = ldmatrixReadPlan(panels, to, t);
      ASSERT_TRUE(plan) << op.describe() << ": " << to.str() << " from " << panels.str();
      EXPECT_EQ(replayPanelReads(panels, to, *plan), "") << op.describe() << ": " << to.str() << " from " << panels.str();
      ++read;
    });
  }
  EXPECT_GE(read, 5);
}

// ---- PTX --------------------------------------------------------------------

// Regression (tile_program fuzzer, tests/fuzz/regressions/tile_program/wgmma_operand_with_4_byte_lines):
// an f16 operand tile [4, 2] has 4-byte lines, which no wgmma swizzle mode covers; the shared
// layout of such a tile used to be built first (maxPhase = 0) and threw out of the compiler.
TEST(Mma, WgmmaRefusesOperandLinesNarrowerThan32Bytes) {
  EXPECT_FALSE(wgmmaTile({4, 2}, 1, 1, 2).has_value());
  EXPECT_FALSE(wgmmaTile({64, 8}, 1, 1, 2).has_value());
  EXPECT_FALSE(wgmmaTile({64, 4}, 1, 1, 4).has_value());
  ASSERT_TRUE(wgmmaTile({64, 16}, 1, 1, 2).has_value());
  EXPECT_EQ(wgmmaTile({64, 16}, 1, 1, 2)->smem.panel(), 16);
}

TEST(Mma, PtxHoldsMmaAndLdmatrix) {
  struct Case {
    DType in;
    const char* mma;
  };
  for (Case c : {Case{DType::F16, R"(mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32)"},
                 Case{DType::BF16, R"(mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32)"},
                 Case{DType::F32, R"(mma\.sync\.aligned\.m16n8k8\.row\.col\.f32\.tf32\.tf32\.f32)"}})
    for (const Target& t : kTargets) {
      SCOPED_TRACE(std::string(dtypeName(c.in)) + " " + t.smName());
      auto f = matmul(64, 64, 32, 4, true, 16, c.in);
      CompiledKernel k = compile(*f, CompileOptions{t, true});
      // {2, 2} warps over 64 x 64: 32 x 32 per warp = 2 x 4 instruction
      // tiles per K step, 2 (f16) or 4 (tf32) K steps per BK = 32.
      const int kSteps = c.in == DType::F32 ? 4 : 2;
      EXPECT_EQ(countMatches(k.ptx, c.mma), 8 * kSteps);
      if (c.in == DType::F32) {
        EXPECT_GT(countMatches(k.ptx, R"(cvt\.rna\.tf32\.f32)"), 0);
        EXPECT_EQ(countMatches(k.ptx, "ldmatrix"), 0);
      } else {
        // A: 32 x 32 per warp = 2 x 2 fragments of 16 x 16, one x4 each;
        // B: 32 x 32 = 2 x 4 fragments of 16 x 8, two per x4 (.trans).
        EXPECT_EQ(countMatches(k.ptx, R"(ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16)"), 4);
        EXPECT_EQ(countMatches(k.ptx, R"(ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16)"), 4);
        EXPECT_GT(countMatches(k.ptx, R"(st\.shared\.v4\.b32)"), 0) << "16-byte stores into the swizzled tile";
      }
      EXPECT_NE(k.ptxasInfo.find("Used"), std::string::npos);
    }
}

// ---- ptxas over a grid of configurations ----------------------------------------

TEST(Mma, PtxasAssemblesAGridOfConfigs) {
  const int64_t sizes[] = {16, 32, 64, 128};
  std::string spills;
  int configs = 0;
  for (const Target& t : kTargets)
    for (int64_t bm : sizes)
      for (int64_t bn : sizes)
        for (int64_t bk : sizes)
          for (int nw : {1, 2, 4, 8, 16}) {
            // A config where every warp holds the whole 128 x 128 tile is
            // covered by smaller warp counts; keep the grid's time in check by
            // assembling each (BM, BN, BK) for one warp count per target in
            // rotation, plus every warp count for the 64 x 64 x 32 tile.
            const bool all = bm == 64 && bn == 64 && bk == 32;
            if (nw == 16) {  // 16 warps: the two tiles large enough to give each warp work
              if (!all && !(bm == 128 && bn == 128 && bk == 32)) continue;
            } else if (!all && (bm / 16 + bn / 16 + bk / 16 + (t == Target::sm80() ? 0 : 1)) % 4 != nw % 4 &&
                !(nw == 8 && (bm + bn + bk) % 3 == 0))
              continue;
            SCOPED_TRACE(t.smName() + " " + std::to_string(bm) + "x" + std::to_string(bn) + "x" + std::to_string(bk) +
                         " warps " + std::to_string(nw));
            auto f = matmul(bm, bn, bk, nw, true, 16, DType::BF16);
            CompiledKernel k;
            ASSERT_NO_THROW(k = compile(*f, CompileOptions{t, true}));
            EXPECT_GT(countMatches(k.ptx, "mma\\.sync"), 0);
            PtxasReport r = parsePtxasLog(k.ptxasInfo);
            ++configs;
            if (r.spillStoreBytes || r.spillLoadBytes)
              spills += "  " + t.smName() + " BM " + std::to_string(bm) + " BN " + std::to_string(bn) + " BK " +
                        std::to_string(bk) + " warps " + std::to_string(nw) + ": " + std::to_string(r.registers) +
                        " registers, spill stores " + std::to_string(r.spillStoreBytes) + " B, loads " +
                        std::to_string(r.spillLoadBytes) + " B\n";
          }
  std::printf("ptxas assembled %d mma matmul configs; spills:\n%s", configs, spills.empty() ? "  none\n" : spills.c_str());
  EXPECT_GT(configs, 40);
}

}  // namespace
}  // namespace flextile::codegen
