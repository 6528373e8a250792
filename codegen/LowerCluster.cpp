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
#include <llvm/IR/InlineAsm.h>
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

// With {rows = R}: whether register `reg` of a tile in layout `l` (its row `row`) crosses the
// cluster: null when every row does, false when the register's own row bits put it at or past R
// whatever the thread (the thread's row bits are disjoint from them), else `row < R`.
llvm::Value* Lowering::rowsCross(const ir::Op& op, const ir::Layout& l, int64_t reg, llvm::Value* row) {
  if (!op.hasAttr("rows") || op.intAttr("rows") >= l.shape()[0]) return nullptr;
  const int64_t rows = op.intAttr("rows");
  int64_t threadBits = 0;
  for (const auto* bases : {&l.laneBases(), &l.warpBases()})
    for (const ir::Layout::Coord& basis : *bases) threadBits |= basis[0];
  const int64_t own = l.regCoord(reg)[0];
  if ((own & threadBits) == 0 && own >= rows) return b.getFalse();
  return b.CreateICmpSLT(row, i32(rows));
}

// ld.shared::cluster of one element where `crosses`, else 0, without a branch.
llvm::Value* Lowering::predicatedClusterLoad(llvm::Value* addr, llvm::Value* crosses, ir::DType t) {
  llvm::Type* mt = memoryType(t);
  if (auto* c = llvm::dyn_cast<llvm::ConstantInt>(crosses); c && c->isZero()) return llvm::Constant::getNullValue(mt);
  const int64_t bytes = ir::byteWidth(t);
  const std::string bits = std::to_string(bytes == 1 ? 16 : bytes * 8);
  const char* reg = bytes == 8 ? "l" : bytes == 4 ? "r" : "h";
  llvm::Type* asmTy = bytes == 8 ? b.getInt64Ty() : bytes == 4 ? b.getInt32Ty() : b.getInt16Ty();
  const std::string text = "{ .reg .pred p; setp.ne.b32 p, $2, 0; mov.b" + bits + " $0, 0; @p ld.shared::cluster." +
                           (bytes == 1 ? std::string("u8") : "b" + bits) + " $0, [$1]; }";
  auto* fnTy = llvm::FunctionType::get(asmTy, {b.getInt64Ty(), b.getInt32Ty()}, false);
  llvm::Value* v = b.CreateCall(fnTy, llvm::InlineAsm::get(fnTy, text, std::string("=") + reg + ",l,r,~{memory}", true),
                                {b.CreatePtrToInt(addr, b.getInt64Ty()), b.CreateZExt(crosses, b.getInt32Ty())});
  if (bytes == 1) return b.CreateTrunc(v, mt);
  return mt == asmTy ? v : b.CreateBitCast(v, mt);
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
  // {to}: only that rank reads; every other program's results are its own operands.
  llvm::BasicBlock* before = b.GetInsertBlock();
  llvm::BasicBlock* reads = nullptr;
  llvm::BasicBlock* done = nullptr;
  if (op.hasAttr("to")) {
    llvm::Value* rank = b.CreateIntrinsic(llvm::Intrinsic::nvvm_read_ptx_sreg_cluster_ctarank, llvm::ArrayRef<llvm::Value*>{});
    reads = llvm::BasicBlock::Create(ctx, "gather.reads", kernel);
    done = llvm::BasicBlock::Create(ctx, "gather.done", kernel);
    b.CreateCondBr(b.CreateICmpEQ(rank, i32(op.intAttr("to"))), reads, done);
    b.SetInsertPoint(reads);
  }
  // Rank r's shared memory is one window: its base mapped once, then the same byte offsets.
  auto* clusterPtr = llvm::PointerType::get(ctx, 7);  // NVPTX's shared::cluster address space
  std::vector<llvm::Value*> windows;
  for (int64_t rank = 0; rank < size; ++rank)
    windows.push_back(b.CreateIntrinsic(clusterPtr, llvm::Intrinsic::nvvm_mapa_shared_cluster,
                                        llvm::ArrayRef<llvm::Value*>{sharedBase, i32(rank)}));
  std::vector<Regs> received(op.numResults());
  for (size_t i = 0; i < op.numOperands(); ++i) {
    const ir::Value* x = op.operand(i);
    const ir::DType t = x->type().dtype();
    const int64_t offset = base + clusterGatherOffset(op, i);
    // This thread's elements, as byte offsets in any rank's window, and whether each crosses
    // ({rows}: null where it always does, a constant false where its row is past them for every thread).
    std::vector<llvm::Value*> bytes, crosses;
    if (x->type().isTile()) {
      const ir::Layout& l = layoutOf(x, op);
      for (int64_t r = 0; r < l.numRegisters(); ++r) {
        const std::vector<llvm::Value*> c = coordinate(l, r);
        bytes.push_back(b.CreateAdd(i32(offset), b.CreateMul(flatIndex(l.shape(), c), i32(ir::byteWidth(t)))));
        crosses.push_back(rowsCross(op, l, r, c[0]));
      }
    } else {
      bytes.push_back(i32(offset));
      crosses.push_back(nullptr);
    }
    for (int64_t rank = 0; rank < size; ++rank) {
      Regs& regs = received[i * size_t(size) + size_t(rank)];
      for (size_t k = 0; k < bytes.size(); ++k) {
        llvm::Value* addr = b.CreateGEP(b.getInt8Ty(), windows[size_t(rank)], bytes[k]);
        llvm::Value* v = crosses[k] ? predicatedClusterLoad(addr, crosses[k], t)
                                    : b.CreateAlignedLoad(memoryType(t), addr, llvm::Align(ir::byteWidth(t)));
        regs.push_back(t == ir::DType::I1 ? b.CreateICmpNE(v, b.getInt8(0)) : v);
      }
    }
  }
  if (reads) {
    llvm::BasicBlock* readsEnd = b.GetInsertBlock();
    b.CreateBr(done);
    b.SetInsertPoint(done);
    for (size_t j = 0; j < received.size(); ++j) {
      const Regs& own = get(op.operand(j / size_t(size)));
      for (size_t k = 0; k < received[j].size(); ++k) {
        llvm::PHINode* phi = b.CreatePHI(received[j][k]->getType(), 2);
        phi->addIncoming(received[j][k], readsEnd);
        phi->addIncoming(own[k], before);
        received[j][k] = phi;
      }
    }
  }
  for (size_t j = 0; j < received.size(); ++j) set(op.result(j), std::move(received[j]));
  clusterArrive();
  clusterWaitPending = true;  // waited for before the next op that needs it (clusterWaitNeededBefore)
}

}  // namespace flextile::codegen
