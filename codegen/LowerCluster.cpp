// Thread block clusters: cluster_all_gather (ir/Ops.def) through distributed shared memory.
//
// Every program writes its operands into its own scratch (codegen/SharedMemory.h), the cluster
// meets at barrier.cluster (arrive has release semantics, wait acquire: the writes of every
// program are visible after it), each program reads every rank's copy from the same offset of
// that rank's shared memory (mapa.shared::cluster, ld.shared::cluster), and the cluster meets
// again, so that no program overwrites its scratch or exits while another still reads it (a CTA's
// shared memory is gone once it exits). That second meeting's wait is put off until the program
// next touches shared memory or leaves the block, so it overlaps the work on the gathered values.
// The barriers count every thread of every program of the cluster, so all of them run the op
// (ir/Ops.def).
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "codegen/LowerToLLVMImpl.h"
#include "codegen/SharedMemory.h"

namespace flextile::codegen {

void Lowering::clusterArrive() {
  b.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier_cluster_arrive_aligned, llvm::ArrayRef<llvm::Value*>{});
}

void Lowering::clusterWait() {
  b.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier_cluster_wait_aligned, llvm::ArrayRef<llvm::Value*>{});
}

// The closing barrier's arrive follows the reads (its release orders them before it); its wait may
// come later, as long as this program neither rewrites shared memory (an op with scratch, the
// async level's buffers) nor leaves the block (a loop, a yield, the return: the last also frees
// the shared memory other programs may still read) before it.
bool Lowering::clusterWaitNeededBefore(const ir::Op& op) {
  using ir::OpKind;
  if (op.kind() == OpKind::For || op.kind() == OpKind::Yield || op.kind() == OpKind::Return) return true;
  return op.hasTrait(ir::kMemoryAsyncLevel) || scratchBytes(op) > 0;
}

void Lowering::lowerClusterAllGather(const ir::Op& op) {
  if (!target.has(Feature::ThreadBlockClusters))
    fail(op, "needs thread block clusters (sm_90 and later); the target " + std::string(target.description().name) +
                 " has none");
  // The producer warps of a specialized program would have to arrive on the cluster barrier too.
  if (specialized) fail(op, "cannot run in a warp-specialized kernel (its producer warps do not take part)");
  const int64_t size = op.intAttr("size");
  const int64_t base = scratchOffset(op, scratchBytes(op));
  barrier();  // this program's earlier readers of the scratch bytes are done
  for (size_t i = 0; i < op.numOperands(); ++i) {
    const ir::Value* x = op.operand(i);
    const ir::DType t = x->type().dtype();
    const int64_t offset = base + clusterGatherOffset(op, i);
    if (x->type().isTile()) {
      storeTileToShared(get(x), layoutOf(x, op), t, offset);
    } else {
      llvm::Value* first = b.CreateAnd(b.CreateICmpEQ(lane, i32(0)), b.CreateICmpEQ(warp, i32(0)));
      onlyWhere(first, "gather.scalar", [&] { storeShared(sharedAddress(offset, i32(0), t), get(x)[0], t); });
    }
  }
  clusterArrive();
  clusterWait();
  // Rank r's shared memory is one window: its base mapped once, then the same byte offsets.
  auto* clusterPtr = llvm::PointerType::get(ctx, 7);  // NVPTX's shared::cluster address space
  std::vector<llvm::Value*> windows;
  for (int64_t rank = 0; rank < size; ++rank)
    windows.push_back(b.CreateIntrinsic(clusterPtr, llvm::Intrinsic::nvvm_mapa_shared_cluster,
                                        llvm::ArrayRef<llvm::Value*>{sharedBase, i32(rank)}));
  for (size_t i = 0; i < op.numOperands(); ++i) {
    const ir::Value* x = op.operand(i);
    const ir::DType t = x->type().dtype();
    const int64_t offset = base + clusterGatherOffset(op, i);
    std::vector<llvm::Value*> bytes;  // this thread's elements, as byte offsets in any rank's window
    if (x->type().isTile()) {
      const ir::Layout& l = layoutOf(x, op);
      for (int64_t r = 0; r < l.numRegisters(); ++r)
        bytes.push_back(b.CreateAdd(i32(offset), b.CreateMul(flatIndex(l.shape(), coordinate(l, r)), i32(ir::byteWidth(t)))));
    } else {
      bytes.push_back(i32(offset));
    }
    for (int64_t rank = 0; rank < size; ++rank) {
      Regs regs;
      for (llvm::Value* at : bytes) {
        llvm::Value* addr = b.CreateGEP(b.getInt8Ty(), windows[size_t(rank)], at);
        llvm::Value* v = b.CreateAlignedLoad(memoryType(t), addr, llvm::Align(ir::byteWidth(t)));
        regs.push_back(t == ir::DType::I1 ? b.CreateICmpNE(v, b.getInt8(0)) : v);
      }
      set(op.result(i * size_t(size) + size_t(rank)), std::move(regs));
    }
  }
  clusterArrive();
  clusterWaitPending = true;  // waited for before the next op that needs it (clusterWaitNeededBefore)
}

}  // namespace flextile::codegen
