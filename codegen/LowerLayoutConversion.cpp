// convert_layout, and the shared-memory helpers that reduce and dot use too.
//
// Scratch follows codegen/SharedMemory.h: row-major by tile coordinate,
// element c of a T[s] tile at byte base + flatIndex(s, c) * bytes(T) of the
// dynamic shared memory (i1 as one byte), and the barrier rule there: a
// bar.sync before an op's first write to its scratch (an earlier op, or the
// same op one loop iteration earlier, may still be reading those bytes) and
// one between its writes and its reads.
// A conversion that is only a renaming of registers (same lane and warp
// bases) stays in registers; any other goes through scratch: barrier, store
// by the source layout (one thread per element), barrier, load by the
// destination layout.
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/IntrinsicsNVPTX.h>

#include "codegen/LowerToLLVMImpl.h"
#include "codegen/SharedMemory.h"

namespace flextile::codegen {

using ir::DType;
using ir::Layout;

namespace {
const std::function<Layout::Coord(const Layout::Coord&)> kIdentity = [](const Layout::Coord& c) { return c; };

// Warp bits of `l` whose basis lies along `axis` alone: their partial results
// must be combined through shared memory when reducing along axis.
uint32_t warpBitsAlong(const Layout& l, int axis) {
  uint32_t m = 0;
  for (size_t i = 0; i < l.warpBases().size(); ++i) {
    const auto& basis = l.warpBases()[i];
    bool along = basis[size_t(axis)] != 0;
    for (size_t d = 0; d < basis.size(); ++d)
      if (int(d) != axis && basis[d] != 0) along = false;
    if (along) m |= 1u << i;
  }
  return m;
}
}  // namespace

uint32_t reduceWarpMask(const Layout& l, int axis) { return warpBitsAlong(l, axis); }

llvm::Value* Lowering::sharedAddress(int64_t offset, llvm::Value* elementIndex, DType t) {
  llvm::Value* byteOffset = b.CreateAdd(i32(offset), b.CreateMul(elementIndex, i32(ir::byteWidth(t))));
  return b.CreateGEP(b.getInt8Ty(), sharedBase, byteOffset);
}

void Lowering::storeShared(llvm::Value* addr, llvm::Value* v, DType t) {
  if (t == DType::I1) v = b.CreateZExt(v, b.getInt8Ty());
  b.CreateAlignedStore(v, addr, llvm::Align(ir::byteWidth(t)));
}

llvm::Value* Lowering::loadShared(llvm::Value* addr, DType t) {
  llvm::Value* v = b.CreateAlignedLoad(memoryType(t), addr, llvm::Align(ir::byteWidth(t)));
  return t == DType::I1 ? b.CreateICmpNE(v, b.getInt8(0)) : v;
}

void Lowering::barrier() { b.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier_cta_sync_aligned_all, llvm::ArrayRef<llvm::Value*>{i32(0)}); }

void Lowering::storeTileToShared(const Regs& regs, const Layout& l, DType t, int64_t offset) {
  // Replicated threads hold the same values: only the owner writes, under
  // one branch for the whole tile.
  llvm::Value* owner = ownerPredicate(l);
  llvm::BasicBlock* cont = nullptr;
  if (owner) {
    auto* write = llvm::BasicBlock::Create(ctx, "smem.write", kernel);
    cont = llvm::BasicBlock::Create(ctx, "smem.written", kernel);
    b.CreateCondBr(owner, write, cont);
    b.SetInsertPoint(write);
  }
  for (int64_t r = 0; r < l.numRegisters(); ++r)
    storeShared(sharedAddress(offset, flatIndex(l.shape(), coordinate(l, r)), t), regs[size_t(r)], t);
  if (owner) {
    b.CreateBr(cont);
    b.SetInsertPoint(cont);
  }
}

Regs Lowering::loadTileFromShared(const Layout& to, DType t, int64_t offset) {
  return mapRegs(size_t(to.numRegisters()), [&](size_t r) {
    return loadShared(sharedAddress(offset, flatIndex(to.shape(), coordinate(to, int64_t(r))), t), t);
  });
}

void Lowering::lowerConvertLayout(const ir::Op& op) {
  const ir::Value* x = op.operand(0);
  const ir::Value* res = op.result();
  if (!x->type().isTile() || !res->type().sameShapeAndElement(x->type()))
    fail(op, "converts " + x->type().str() + " to " + res->type().str() + "; it needs one tile type on both sides");
  const Layout& from = layoutOf(x, op);
  const Layout& to = layoutOf(res, op);
  const Regs& xs = get(x);
  std::vector<int64_t> map = registerRenaming(from, to, kIdentity);
  if (!map.empty()) {
    set(res, mapRegs(map.size(), [&](size_t r) { return xs[size_t(map[r])]; }));
    return;
  }
  const DType t = x->type().dtype();
  int64_t offset = scratchOffset(op, scratchBytes(op));
  barrier();
  storeTileToShared(xs, from, t, offset);
  barrier();
  set(res, loadTileFromShared(to, t, offset));
}

}  // namespace flextile::codegen
