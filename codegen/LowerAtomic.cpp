// atomic_add: one `atomicrmw fadd/add ... syncscope("device") monotonic` per
// element on its global (addrspace 1) pointer; NVPTX (LLVM 22) prints
// `atom.global.add.{f32,u32,u64}` whether or not the old value is used (it
// selects no `red`; an unused destination is left for ptxas to drop).
//
// One adder per element. A layout may give an element to several threads:
// lanes or warps whose basis is zero (Layout::replicatedLaneMask /
// replicatedWarpMask; the layout rules allow no other kind of replica), as in
// a [1, N] row or a tile smaller than the warps. A replicated store is
// harmless, a replicated atomic adds twice. So, as for stores, an element is
// added only by the thread whose replicated lane and warp bits are all clear
// (the lowest replica), and a scalar by thread 0 alone: each register's
// atomic runs under `owner && mask`, in a branch of its own.
//
// Old values. The adder has the element's old value (0 where the mask is
// off); the other holders have none. When the result is used
// (codegen::atomicOldValuesShared) the adders write the old values to the
// op's scratch and every holder reads its elements back, with the two
// barriers of the scratch rule (codegen/SharedMemory.h). A non-replicated
// tile needs nothing: each element has exactly one holder.
//
// fence: `bar.sync 0; fence.acq_rel.gpu; bar.sync 0` (LLVM `fence syncscope("device")
// acq_rel`), every thread. The IR's fence orders the accesses of the whole program, but
// fence.acq_rel.gpu orders only its own thread's, and the atomic that follows it (a ticket)
// is one thread's. In the PTX memory model (PTX ISA, "Memory Consistency Model") a release
// pattern is a fence followed *in program order* by a strong write, and bar.sync makes the
// threads of a CTA synchronize. So:
//   release — thread T's stores, bar.sync, thread 0's fence, thread 0's atomic: T's stores
//     precede the fence in causality order (through the barrier), and fence + atomic are
//     thread 0's release pattern;
//   acquire — thread 0's atomic, thread 0's fence, bar.sync, thread T's loads: atomic +
//     fence are thread 0's acquire pattern, and the barrier puts T's loads after it.
// The first barrier serves the release, the second the acquire; causality order is
// transitive, so a writer program's stores happen before the reader program's loads. Each
// thread fences (not only thread 0) because the op does not know which thread a later
// atomic runs on (a tile atomic runs on many).
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "codegen/LowerToLLVMImpl.h"
#include "codegen/SharedMemory.h"

namespace flextile::codegen {

using ir::DType;

void Lowering::lowerAtomicAdd(const ir::Op& op) {
  if (op.numOperands() < 2 || op.numOperands() > 3) fail(op, "atomic_add takes (ptr, value [, mask])");
  const ir::Value* ptrV = op.operand(0);
  const ir::Value* res = op.result();
  const ir::Type& pt = ptrV->type();
  const DType t = pt.pointee();
  if (t != DType::F32 && t != DType::I32 && t != DType::I64)
    fail(op, "adds f32, i32 or i64 atomically, not through " + pt.str());
  const ir::Layout* l = nullptr;
  if (pt.isTile()) {
    l = &layoutOf(ptrV, op);
    for (const ir::Value* v : std::initializer_list<const ir::Value*>{op.operand(1), res})
      if (layoutOf(v, op) != *l)
        fail(op, "layout " + v->type().layout()->str() + " differs from the pointer layout " + l->str() +
                     " (ptr, value, mask and result share one layout)");
    if (op.numOperands() == 3 && layoutOf(op.operand(2), op) != *l)
      fail(op, "mask layout " + op.operand(2)->type().layout()->str() + " differs from the pointer layout " + l->str());
  } else {
    for (const ir::Value* v : op.operands())
      if (!v->type().isScalar()) fail(op, "adds the tile " + v->type().str() + " through a scalar pointer");
  }
  const size_t n = l ? size_t(l->numRegisters()) : 1;
  const Regs& ptrs = get(ptrV);
  const Regs& vals = get(op.operand(1));
  const Regs* mask = op.numOperands() == 3 ? &get(op.operand(2)) : nullptr;
  // The one thread per element that adds: the lowest replica, or thread 0
  // for a scalar (every bit of lane and warp "replicated").
  llvm::Value* owner = l ? ownerPredicate(*l) : threadsWithBitsClear(31u, uint32_t(func.numWarps() - 1));

  const auto rmw = ir::isFloat(t) ? llvm::AtomicRMWInst::FAdd : llvm::AtomicRMWInst::Add;
  const llvm::SyncScope::ID device = ctx.getOrInsertSyncScopeID("device");
  llvm::Type* ty = llvmType(t);
  Regs old(n);
  for (size_t r = 0; r < n; ++r) {
    llvm::Value* pred = owner;
    if (mask) pred = pred ? b.CreateAnd(pred, (*mask)[r]) : (*mask)[r];
    auto add = [&] {
      return b.CreateAtomicRMW(rmw, ptrs[r], vals[r], llvm::MaybeAlign(ir::byteWidth(t)),
                               llvm::AtomicOrdering::Monotonic, device);
    };
    if (!pred) {
      old[r] = add();
      continue;
    }
    llvm::BasicBlock* before = b.GetInsertBlock();
    auto* then = llvm::BasicBlock::Create(ctx, "atomic", kernel);
    auto* done = llvm::BasicBlock::Create(ctx, "atomic.done", kernel);
    b.CreateCondBr(pred, then, done);
    b.SetInsertPoint(then);
    llvm::Value* got = add();
    b.CreateBr(done);
    b.SetInsertPoint(done);
    auto* phi = b.CreatePHI(ty, 2, "old");
    phi->addIncoming(got, then);
    phi->addIncoming(llvm::Constant::getNullValue(ty), before);  // masked off, or not the adder
    old[r] = phi;
  }

  if (atomicOldValuesShared(op)) {
    const int64_t bytes = res->type().numElements() * ir::byteWidth(t);
    const int64_t offset = scratchOffset(op, bytes);
    barrier();  // an earlier op (or this one, one iteration back) may still read the scratch
    if (l) {
      storeTileToShared(old, *l, t, offset);  // by the owners only
      barrier();
      old = loadTileFromShared(*l, t, offset);
    } else {
      onlyWhere(owner, "atomic.smem", [&] { storeShared(sharedAddress(offset, i32(0), t), old[0], t); });
      barrier();
      old = {loadShared(sharedAddress(offset, i32(0), t), t)};
    }
  }
  set(res, std::move(old));
}

void Lowering::lowerFence(const ir::Op& op) {
  if (op.numOperands() != 0 || op.numResults() != 0) fail(op, "fence takes no operands and gives no results");
  barrier();
  b.CreateFence(llvm::AtomicOrdering::AcquireRelease, ctx.getOrInsertSyncScopeID("device"));
  barrier();
}

}  // namespace flextile::codegen
