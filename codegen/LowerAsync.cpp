// The memory/async level (ir/Ops.def): shared buffers, async copies and their
// groups, slot reads, barriers and the async-proxy fence. Each op becomes its
// instruction and nothing more: the schedule (what is issued when, into which
// slot, which wait guards which read) is the IR's, written by the pipeline
// pass (codegen/passes/Pipeline.cpp) or by hand, and the lowering adds no
// barrier or wait of its own.
//
//   local_alloc         nothing: the buffer's bytes are the shared-memory
//                       plan's (SharedMemory.h; slot s at offset + s *
//                       sharedSlotBytes, live from the alloc to its last use)
//   async_copy          each owning thread (one per element group of the
//                       address layout) issues cp.async of `vec` elements per
//                       vector into its offset of the slot's swizzled tile,
//                       src-size 0 (zero fill, no global read) where the mask
//                       is off
//   async_commit        cp.async.commit_group
//   async_wait          cp.async.wait_group pending
//   local_load          ldmatrix from the slot (TensorCores.h ldmatrixReadPlan),
//                       or no registers when wgmma dots read the slot
//                       themselves: a B slot (wgmmaPlan), or an A tile whose
//                       readers are all wgmma dots (wgmmaResidentATile);
//                       LowerDot.cpp takes its address
//   local_store         each owning thread stores its registers into its
//                       swizzled offset of the slot, in vectors as wide as the
//                       registers' contiguity and the layout's chunks allow
//   barrier             bar.sync 0 (in the consumers of a warp-specialized program:
//                       bar.sync 3, num_warps * 32, unless the producer meets them
//                       there, ws = "both")
//   fence_async_shared  fence.proxy.async.shared::cta
//   mbarrier_init       thread 0 runs mbarrier.init of every slot with the
//                       program's thread count (every thread arrives once per
//                       phase); mbarrier_inval likewise mbarrier.inval
//   mbarrier_arrive     every thread mbarrier.arrive
//   async_copy_arrive   every thread cp.async.mbarrier.arrive.noinc (the
//                       barrier counts it among the thread count: it arrives
//                       once the thread's earlier cp.async copies land)
//   mbarrier_wait       a loop on mbarrier.try_wait.parity (sm_90: the thread
//                       may sleep until the phase completes or a time limit)
//                       or test_wait.parity (sm_80 to sm_89) until it holds
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/InlineAsm.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "codegen/LowerToLLVMImpl.h"
#include "codegen/Passes.h"
#include "codegen/SharedMemory.h"
#include "codegen/TensorCores.h"

namespace flextile::codegen {

using ir::DType;
using ir::Layout;

namespace {
// The local_alloc that made buffer operand `i`.
const ir::Op& allocOf(const ir::Op& op, size_t i = 0) {
  const ir::Op* alloc = op.operand(i)->definingOp();
  if (!alloc || alloc->kind() != ir::OpKind::LocalAlloc)
    throw Error(op.describe() + ": its buffer does not come from a local_alloc", ErrorKind::Internal);
  return *alloc;
}
}  // namespace

int64_t Lowering::bufferByteOffset(const ir::Op& op, size_t bufferOperand) {
  const ir::Type& buf = op.operand(bufferOperand)->type();
  return scratchOffset(allocOf(op, bufferOperand), sharedSlotBytes(buf) * buf.slots());
}

llvm::Value* Lowering::slotByteOffset(const ir::Op& op, size_t bufferOperand) {
  const int64_t slotBytes = sharedSlotBytes(op.operand(bufferOperand)->type());
  return b.CreateAdd(i32(bufferByteOffset(op, bufferOperand)),
                     b.CreateMul(get(op.operand(bufferOperand + 1))[0], i32(slotBytes)));
}

llvm::Value* Lowering::barrierAddress(const ir::Op& op) {
  return b.CreateAdd(b.CreatePtrToInt(sharedBase, b.getInt32Ty()), slotByteOffset(op));
}

void Lowering::lowerAsyncOp(const ir::Op& op) {
  switch (op.kind()) {
    case ir::OpKind::LocalAlloc: set(op.result(), {}); return;  // addressed through the plan
    case ir::OpKind::AsyncCommit:
      b.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_commit_group, llvm::ArrayRef<llvm::Value*>{});
      return;
    case ir::OpKind::AsyncWait:
      b.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_wait_group,
                        llvm::ArrayRef<llvm::Value*>{i32(op.intAttr("pending"))});
      return;
    case ir::OpKind::Barrier:  // ws = "both": where a specialized program's producer meets the consumers
      if (specialized && warpRole(op) == WarpRole::Both) programBarrier();
      else barrier();
      return;
    case ir::OpKind::FenceAsyncShared: {
      // cp.async and ordinary stores write through the generic proxy; wgmma reads through the async one.
      asmStatement("fence.proxy.async.shared::cta;");
      return;
    }
    case ir::OpKind::MbarrierInit:
    case ir::OpKind::MbarrierInval: {
      const ir::Type& buf = op.operand(0)->type();
      const int64_t slotBytes = sharedSlotBytes(buf), base = bufferByteOffset(op, 0);
      llvm::Value* smem = b.CreatePtrToInt(sharedBase, b.getInt32Ty());
      const int threads = op.hasAttr("arrivals") ? int(op.intAttr("arrivals")) : func.numWarps() * 32;
      // Thread 0. In the common prefix of a warp-specialized program (ws = "all") the producer's
      // warps run it too, and the warp bits of num_warps would also pick the producer's first thread.
      llvm::Value* who = specialized && warpRole(op) == WarpRole::All ? b.CreateICmpEQ(tid, i32(0))
                                                                      : threadsWithBitsClear(31, uint32_t(func.numWarps() - 1));
      onlyWhere(who, "mbarrier.setup", [&] {
        for (int64_t s = 0; s < buf.slots(); ++s) {
          llvm::Value* addr = b.CreateAdd(smem, i32(base + s * slotBytes));
          if (op.kind() == ir::OpKind::MbarrierInit)
            asmStatement("mbarrier.init.shared.b64 [$0], $1;", "r,n,~{memory}", {addr, i32(threads)});
          else
            asmStatement("mbarrier.inval.shared.b64 [$0];", "r,~{memory}", {addr});
        }
      });
      return;
    }
    case ir::OpKind::MbarrierArrive:
      asmStatement("{ .reg .b64 state; mbarrier.arrive.shared.b64 state, [$0]; }", "r,~{memory}", {barrierAddress(op)});
      return;
    case ir::OpKind::AsyncCopyArrive:
      if (!target.has(Feature::CpAsync)) fail(op, "needs cp.async, which " + target.smName() + " does not have");
      asmStatement("cp.async.mbarrier.arrive.noinc.shared.b64 [$0];", "r,~{memory}", {barrierAddress(op)});
      return;
    case ir::OpKind::MbarrierWait: {
      llvm::Value* addr = barrierAddress(op);
      llvm::Value* parity = get(op.operand(2))[0];
      // {issuer = 1}: only thread 0, the one that issues TMA copies and expect_tx arrivals, waits.
      llvm::Value* who = op.hasAttr("issuer") ? threadsWithBitsClear(31, uint32_t(func.numWarps() - 1)) : nullptr;
      onlyWhere(who, "mbarrier.issuer", [&] {
        auto* spin = llvm::BasicBlock::Create(ctx, "mbarrier.wait", kernel);
        auto* done = llvm::BasicBlock::Create(ctx, "mbarrier.wait.done", kernel);
        b.CreateBr(spin);
        b.SetInsertPoint(spin);
        auto* ty = llvm::FunctionType::get(b.getInt32Ty(), {b.getInt32Ty(), b.getInt32Ty()}, false);
        const std::string test = target.has(Feature::TensorMemoryAccelerator) ? "try_wait" : "test_wait";
        auto* probe = llvm::InlineAsm::get(
            ty, "{ .reg .pred p; mbarrier." + test + ".parity.shared.b64 p, [$1], $2; selp.u32 $0, 1, 0, p; }",
            "=r,r,r,~{memory}", /*hasSideEffects=*/true);
        llvm::Value* complete = b.CreateCall(ty, probe, {addr, parity});
        b.CreateCondBr(b.CreateICmpNE(complete, i32(0)), done, spin);
        b.SetInsertPoint(done);
      });
      return;
    }
    case ir::OpKind::MbarrierExpectTx: {
      if (!target.has(Feature::TensorMemoryAccelerator))
        fail(op, "needs mbarrier transaction counts (sm_90), which " + target.smName() + " does not have");
      llvm::Value* addr = barrierAddress(op);
      llvm::Value* on = get(op.operand(2))[0];
      llvm::Value* bytes = b.CreateSelect(on, i32(op.intAttr("bytes")), i32(0));
      // {only_on = 1}: no arrival at all where `on` is false (shared rings: a later loop's stage
      // takes that slot and phase).
      llvm::Value* who = threadsWithBitsClear(31, uint32_t(func.numWarps() - 1));
      if (op.hasAttr("only_on") && op.intAttr("only_on")) who = b.CreateAnd(who, on);
      onlyWhere(who, "mbarrier.expect_tx", [&] {
        asmStatement("mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", "r,r,~{memory}", {addr, bytes});
      });
      return;
    }
    case ir::OpKind::TmaCopy: return lowerTmaCopy(op);
    case ir::OpKind::WarpgroupTurn: return lowerWarpgroupTurn(op);
    case ir::OpKind::AsyncCopy: return lowerAsyncCopy(op);
    case ir::OpKind::LocalLoad: return lowerLocalLoad(op);
    case ir::OpKind::LocalStore: return lowerLocalStore(op);
    default: fail(op, "is not an op of the memory/async level");
  }
}

void Lowering::lowerAsyncCopy(const ir::Op& op) {
  if (!target.has(Feature::CpAsync)) fail(op, "needs cp.async, which " + target.smName() + " does not have");
  const ir::Type& buf = op.operand(0)->type();
  const ir::SharedLayout& smem = *buf.sharedLayout();
  const Layout& from = layoutOf(op.operand(2), op);
  const DType t = buf.dtype();
  const int64_t v = op.intAttr("vec"), bytes = v * ir::byteWidth(t);
  const Regs& ptrs = get(op.operand(2));
  const Regs* mask = op.numOperands() >= 4 ? &get(op.operand(3)) : nullptr;
  llvm::Value* slotBase = slotByteOffset(op);
  onlyWhere(ownerPredicate(from), "cp.async", [&] {
    llvm::Value* threadOff = sharedThreadOffset(from, smem);
    const llvm::Intrinsic::ID id = bytes == 16 ? llvm::Intrinsic::nvvm_cp_async_cg_shared_global_16_s
                                   : bytes == 8 ? llvm::Intrinsic::nvvm_cp_async_ca_shared_global_8_s
                                                : llvm::Intrinsic::nvvm_cp_async_ca_shared_global_4_s;
    for (int64_t r0 = 0; r0 < from.numRegisters(); r0 += v) {
      llvm::Value* elem = b.CreateXor(threadOff, i32(smem.offsetOf(from.regCoord(r0))));
      llvm::Value* dst = b.CreateGEP(b.getInt8Ty(), sharedBase, b.CreateAdd(slotBase, b.CreateMul(elem, i32(ir::byteWidth(t)))));
      llvm::Value* srcSize = mask ? b.CreateSelect((*mask)[size_t(r0)], i32(bytes), i32(0)) : i32(bytes);
      b.CreateIntrinsic(id, llvm::ArrayRef<llvm::Value*>{dst, ptrs[size_t(r0)], srcSize});
    }
  });
}

// One cp.async.bulk.tensor per panel of the slot (TensorMaps.h), from thread 0 where `on` holds.
// Coordinates go innermost first; a later panel starts `panel` elements further along the last dim.
void Lowering::lowerTmaCopy(const ir::Op& op) {
  if (!target.has(Feature::TensorMemoryAccelerator)) fail(op, "needs TMA, which " + target.smName() + " does not have");
  const size_t rank = (op.numOperands() - 5) / 3;
  const TmaCopyPlan tma = tmaCopyPlan(op, func, tensorMaps_);
  const int64_t slotBytes = sharedSlotBytes(op.operand(0)->type()), base = bufferByteOffset(op, 0);
  if (base % tma.alignment != 0 || slotBytes % tma.alignment != 0)
    fail(op, "its slots start at byte " + std::to_string(base) + " + s * " + std::to_string(slotBytes) +
                 " of shared memory; TMA with this layout needs multiples of " + std::to_string(tma.alignment));
  llvm::Value* dst = slotByteOffset(op);
  llvm::Value* barOffset = slotByteOffset(op, 2);  // bars, barSlot
  std::vector<llvm::Value*> coords;
  for (size_t k = rank; k-- > 0;) coords.push_back(get(op.operand(6 + 2 * rank - 1 + k))[0]);
  llvm::Value* on = get(op.operand(4))[0];
  llvm::Value* leader = threadsWithBitsClear(31, uint32_t(func.numWarps() - 1));
  static const llvm::Intrinsic::ID ids[] = {llvm::Intrinsic::nvvm_cp_async_bulk_tensor_g2s_tile_1d,
                                            llvm::Intrinsic::nvvm_cp_async_bulk_tensor_g2s_tile_2d,
                                            llvm::Intrinsic::nvvm_cp_async_bulk_tensor_g2s_tile_3d,
                                            llvm::Intrinsic::nvvm_cp_async_bulk_tensor_g2s_tile_4d,
                                            llvm::Intrinsic::nvvm_cp_async_bulk_tensor_g2s_tile_5d};
  onlyWhere(b.CreateAnd(leader, on), "tma.copy", [&] {
    llvm::Value* bar = b.CreateGEP(b.getInt8Ty(), sharedBase, barOffset);
    for (int64_t p = 0; p < tma.numPanels; ++p) {
      llvm::Value* at = b.CreateGEP(b.getInt8Ty(), sharedBase, b.CreateAdd(dst, i32(p * tma.panelBytes)));
      std::vector<llvm::Value*> args{b.CreateAddrSpaceCast(at, b.getPtrTy(7)), bar, tensorMapArgs_[tma.map]};
      for (size_t k = 0; k < rank; ++k) args.push_back(k == 0 && p ? b.CreateAdd(coords[0], i32(p * tma.panel)) : coords[k]);
      args.insert(args.end(), {b.getInt16(0), b.getInt64(0), b.getFalse(), b.getFalse(), i32(0)});
      b.CreateIntrinsic(ids[rank - 1], llvm::ArrayRef<llvm::Value*>(args));
    }
  });
}

// Named barriers 1 and 2 (bar.sync 0 is the CTA's), 256 threads each: warpgroup g's 128 wait on
// 1 + g, the other's 128 arrive there.
void Lowering::lowerWarpgroupTurn(const ir::Op& op) {
  if (func.numWarps() != 8)
    fail(op, "takes turns between two warpgroups: it needs num_warps = 8, the function has " +
                 std::to_string(func.numWarps()) + " warps");
  const std::string& step = op.strAttr("step");
  llvm::Value* tid = b.CreateIntrinsic(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x, {});
  llvm::Value* group = b.CreateLShr(tid, i32(7));
  auto named = [&](const char* instr, llvm::Value* id) {
    asmStatement(std::string(instr) + " $0, 256;", "r,~{memory}", {id});
  };
  if (step == "begin") return named("bar.sync", b.CreateAdd(group, i32(1)));
  if (step == "end") return named("bar.arrive", b.CreateSub(i32(2), group));
  const bool open = step == "open";
  onlyWhere(b.CreateICmpEQ(group, i32(open ? 1 : 0)), open ? "turns.open" : "turns.close",
            [&] { named(open ? "bar.arrive" : "bar.sync", i32(1)); });
  if (open || !op.hasAttr("handshake")) return;
  // The close's handshake: warpgroup 0, its last turn taken, arrives on barrier 2, where warpgroup 1
  // waits — so warpgroup 1 arrives on barrier 1 again (a later open) only after warpgroup 0 synced there.
  onlyWhere(b.CreateICmpEQ(group, i32(0)), "turns.handover", [&] { named("bar.arrive", i32(2)); });
  onlyWhere(b.CreateICmpEQ(group, i32(1)), "turns.handback", [&] { named("bar.sync", i32(2)); });
}

void Lowering::lowerLocalLoad(const ir::Op& op) {
  const ir::Type& buf = op.operand(0)->type();
  if (localLoadsReadByWgmma_.count(&op)) {
    set(op.result(), {});  // the dot reads the slot itself (lowerWgmmaDot)
    return;
  }
  const Layout& to = layoutOf(op.result(), op);
  const ir::SharedLayout& smem = *buf.sharedLayout();
  if (auto plan = ldmatrixReadPlan(smem, to, buf.dtype())) {
    set(op.result(), ldmatrixFromShared(to, *plan, buf.dtype(), slotByteOffset(op)));
    return;
  }
  // Any other layout from an unswizzled slot (a row ring: the pipeline's TMA copies of per-row
  // values such as the backward's LSE): each register's element, read where the layout stores it.
  if (smem.maxPhase() != 1)
    fail(op, "reads " + to.str() + " from " + buf.str() + ", which ldmatrix cannot (only 16-bit dot operands are "
             "read from a swizzled slot)");
  set(op.result(), loadTileFromSharedLayout(to, smem, 1, buf.dtype(), slotByteOffset(op)));
}

void Lowering::lowerLocalStore(const ir::Op& op) {
  const ir::Type& buf = op.operand(0)->type();
  storeToSwizzledTile(get(op.operand(2)), layoutOf(op.operand(2), op), *buf.sharedLayout(), buf.dtype(), slotByteOffset(op));
}

}  // namespace flextile::codegen
