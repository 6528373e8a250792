// reduce(x) {axis, kind}: the result layout is the operand's sliced along
// axis (Layout::sliced), so every partial result a thread computes lands in
// one of its own result registers. Three steps, each only where needed:
//   1. in registers: combine the registers whose coordinates differ only
//      along axis (a sum as a pairwise tree, a max or min as a chain);
//   2. in the warp: butterfly shuffles (shfl.sync.bfly) over each lane bit
//      whose basis lies along axis; afterwards every lane of a group holds
//      the same value (the combines are commutative);
//   3. across warps: when warp bases lie along axis, barrier, each warp
//      writes its partials to scratch [warp][result element], barrier, every
//      thread combines the partials of its results in the same order.
// Lane or warp bits whose basis is zero in the operand are replication, not
// data: they are never combined (a sum would count an element twice).
// A reduction to rank 0 gives a scalar that every thread holds.
#include <cstdlib>
#include <string>

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/IntrinsicsNVPTX.h>

#include "codegen/LowerToLLVMImpl.h"
#include "codegen/SharedMemory.h"

namespace flextile::codegen {

using ir::DType;
using ir::Layout;

llvm::Value* Lowering::shuffleXor(llvm::Value* v, int laneMask) {
  auto shfl32 = [&](llvm::Value* w) {
    return b.CreateIntrinsic(llvm::Intrinsic::nvvm_shfl_sync_bfly_i32,
                             llvm::ArrayRef<llvm::Value*>{i32(-1), w, i32(laneMask), i32(0x1f)});
  };
  llvm::Type* ty = v->getType();
  unsigned bits = ty->getPrimitiveSizeInBits();
  if (bits == 64) {
    auto* pair = llvm::FixedVectorType::get(b.getInt32Ty(), 2);
    llvm::Value* halves = b.CreateBitCast(v, pair);
    llvm::Value* lo = shfl32(b.CreateExtractElement(halves, uint64_t(0)));
    llvm::Value* hi = shfl32(b.CreateExtractElement(halves, uint64_t(1)));
    llvm::Value* out = b.CreateInsertElement(b.CreateInsertElement(llvm::PoisonValue::get(pair), lo, uint64_t(0)), hi,
                                             uint64_t(1));
    return b.CreateBitCast(out, ty);
  }
  llvm::Type* intTy = b.getIntNTy(bits);
  llvm::Value* w = b.CreateBitCast(v, intTy);
  if (bits < 32) w = b.CreateZExt(w, b.getInt32Ty());
  w = shfl32(w);
  if (bits < 32) w = b.CreateTrunc(w, intTy);
  return b.CreateBitCast(w, ty);
}

std::string reduceTreeSetting() {
  const char* e = std::getenv("FLEXTILE_REDUCE_TREE");
  const std::string v = e ? e : "";
  return v == "1" || v == "0" || v == "max" ? v : "sum";
}

void Lowering::lowerReduce(const ir::Op& op) {
  const ir::Value* x = op.operand(0);
  const ir::Value* res = op.result();
  const int axis = int(op.intAttr("axis"));
  const std::string& kind = op.strAttr("kind");
  if (kind != "sum" && kind != "max" && kind != "min") fail(op, "unknown reduction kind '" + kind + "'");
  if (!x->type().isTile() || axis < 0 || axis >= x->type().rank())
    fail(op, "axis " + std::to_string(axis) + " is not a dimension of " + x->type().str());
  const DType t = x->type().dtype();
  const Layout& L = layoutOf(x, op);
  const Layout S = L.sliced(axis);
  if (auto err = S.verify(); !err.empty())
    fail(op, "the operand layout " + L.str() + " cannot be reduced along axis " + std::to_string(axis) + ": " + err);
  if (res->type().isTile() && layoutOf(res, op) != S)
    fail(op, "result layout " + res->type().layout()->str() + " is not the operand layout sliced along axis " +
                 std::to_string(axis) + " (" + S.str() + ")");
  const Regs& xs = get(x);

  // 1. Registers. A sum combines them as a pairwise tree (log2 n dependent steps, and it rounds
  // better than a chain), a max or min as a chain in register order: on the H200 (2026-12-04,
  // forward, B=2 H=16 N=8192 D=128) that mix ran 591 TFLOP/s without a mask against 568 with trees
  // for both and 557 with chains for both (causal 529 / 512 / 501, ALiBi 454 / 439 / 451); why
  // ptxas schedules the max chain better is not understood yet (bench/RESULTS.md).
  std::vector<Regs> parts(size_t(S.numRegisters()));
  for (int64_t r = 0; r < L.numRegisters(); ++r) {
    Layout::Coord c = L.regCoord(r);
    c.erase(c.begin() + axis);
    int64_t j = S.registerOf(c);
    if (j < 0) fail(op, "register " + std::to_string(r) + " of " + L.str() + " has no place in " + S.str());
    parts[size_t(j)].push_back(xs[size_t(r)]);
  }
  // FLEXTILE_REDUCE_TREE (reduceTreeSetting): 0 is the lowering before 2026-12-04.
  const std::string treeKinds = reduceTreeSetting();
  // (Four interleaved chains for the max, a quarter of the dependent steps, measured 590 against 631
  // TFLOP/s without a mask on the H200, 2026-12-05: one chain stays.)
  const bool tree = treeKinds == "1" || treeKinds == (kind == "sum" ? "sum" : "max");
  Regs acc(size_t(S.numRegisters()), nullptr);
  for (size_t j = 0; j < parts.size(); ++j) {
    Regs level = std::move(parts[j]);
    if (!tree) {
      for (size_t i = 1; i < level.size(); ++i) level[0] = combine(kind, level[0], level[i], t);
      level.resize(std::min<size_t>(level.size(), 1));
    }
    while (level.size() > 1) {
      Regs next;
      for (size_t i = 0; i + 1 < level.size(); i += 2) next.push_back(combine(kind, level[i], level[i + 1], t));
      if (level.size() % 2) next.push_back(level.back());
      level = std::move(next);
    }
    if (!level.empty()) acc[j] = level.front();
  }

  auto alongAxisOnly = [&](const Layout::Coord& basis) {
    if (basis[size_t(axis)] == 0) return false;
    for (size_t d = 0; d < basis.size(); ++d)
      if (int(d) != axis && basis[d] != 0) return false;
    return true;
  };
  // 2. Lanes.
  for (size_t i = 0; i < L.laneBases().size(); ++i)
    if (alongAxisOnly(L.laneBases()[i]))
      for (auto& a : acc) a = combine(kind, a, shuffleXor(a, 1 << i), t);

  // 3. Warps (scratch as codegen/SharedMemory.h lays it out: the partial of
  // warp w for result element i at (w * numElements(result) + i)).
  if (reduceNeedsScratch(op)) {
    const uint32_t warpBits = reduceWarpMask(L, axis);
    for (size_t i = 0; i < L.warpBases().size(); ++i)
      if (L.warpBases()[i][size_t(axis)] != 0 && !(warpBits >> i & 1))
        fail(op, "warp basis " + std::to_string(i) + " of " + L.str() + " mixes the reduced axis with another");
    const int64_t offset = scratchOffset(op, scratchBytes(op));
    const int64_t resultElems = res->type().numElements();
    auto slot = [&](int64_t j, llvm::Value* w) {
      llvm::Value* elem = S.rank() == 0 ? i32(0) : flatIndex(S.shape(), coordinate(S, j));
      return b.CreateAdd(b.CreateMul(w, i32(resultElems)), elem);
    };
    barrier();  // an earlier user of these bytes may still be reading them
    // Every warp writes its own slots; one lane per element of S writes.
    onlyWhere(threadsWithBitsClear(S.replicatedLaneMask(), 0), "reduce", [&] {
      for (int64_t j = 0; j < S.numRegisters(); ++j) storeShared(sharedAddress(offset, slot(j, warp), t), acc[size_t(j)], t);
    });
    barrier();
    // Combine the partials of the warps that differ from this one only in
    // the axis bits, in increasing order of those bits (the same order in
    // every thread, so replicated results agree).
    llvm::Value* otherBits = b.CreateAnd(warp, i32(~int64_t(warpBits) & 0xffffffff));
    const int k = __builtin_popcount(warpBits);
    for (int64_t j = 0; j < S.numRegisters(); ++j) {
      llvm::Value* a = nullptr;
      for (int64_t p = 0; p < (int64_t(1) << k); ++p) {
        int64_t w = 0;
        for (int i = 0, bit = 0; i < 32; ++i)
          if (warpBits >> i & 1) w |= ((p >> bit++) & 1) << i;
        llvm::Value* v = loadShared(sharedAddress(offset, slot(j, b.CreateOr(otherBits, i32(w))), t), t);
        a = a ? combine(kind, a, v, t) : v;
      }
      acc[size_t(j)] = a;
    }
  }
  set(res, std::move(acc));
}

}  // namespace flextile::codegen
