// The schedule of pipelined loads (marked by the "pipeline" pass,
// codegen/passes/Pipeline.cpp, with async_stages = S).
//
// Shared memory: each marked load owns a ring of S tiles, each in the
// swizzled SharedLayout ldmatrix reads (ldmatrixPlan of its convert),
// slot s at scratchOffset(load) + s * tileBytes (codegen/SharedMemory.h).
//
//   prologue   a barrier (the ring may reuse bytes a slower warp still reads),
//              then for s in 0..S-2: the load's pointer and mask recomputed for
//              iteration s (iv = lb + s*step), cp.async of each thread's
//              vectors into slot s, src-size 0 where the mask is off or the
//              iteration does not exist (zero-fill, no global read);
//              cp.async.commit_group per stage.
//   iteration i, at the first convert of a marked load:
//              cp.async.wait_group S-2 (the group of iteration i is done),
//              bar.sync (every thread's copies are visible, and every thread
//              finished reading slot (i-1) mod S in iteration i-1),
//              issue iteration i+S-1 into slot (i+S-1) mod S = (i-1) mod S,
//              commit_group; then each convert is ldmatrix from slot i mod S.
//   after the loop: cp.async.wait_all, so no copy (of the zero-filled stages
//              past the end) lands in bytes a later op reuses.
// One barrier per iteration instead of the staged path's two per operand.
// Commit groups are issued uniformly (possibly empty), so the wait count is
// the constant S-2.
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/InlineAsm.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <set>

#include "codegen/LowerToLLVMImpl.h"
#include "codegen/SharedMemory.h"
#include "codegen/TensorCores.h"

namespace flextile::codegen {

using ir::DType;
using ir::Layout;

namespace {
// Ops of `body` that compute the load's pointer and mask, in body order.
std::vector<const ir::Op*> addressSlice(const ir::Op& load, const ir::Block& body) {
  std::set<const ir::Op*> need;
  std::vector<const ir::Value*> work;
  for (size_t i = 0; i < std::min<size_t>(2, load.numOperands()); ++i) work.push_back(load.operand(i));
  while (!work.empty()) {
    const ir::Value* v = work.back();
    work.pop_back();
    const ir::Op* d = v->definingOp();
    if (!d || d->parentBlock() != &body || !need.insert(d).second) continue;
    for (const ir::Value* o : d->operands()) work.push_back(o);
  }
  std::vector<const ir::Op*> out;
  for (const auto& op : body.ops())
    if (need.count(op.get())) out.push_back(op.get());
  return out;
}
}  // namespace

bool Lowering::isPipelinedLoad(const ir::Op* op) const {
  return op && op->kind() == ir::OpKind::Load && op->hasAttr("async_stages") && pipe_ &&
         op->parentBlock() == &pipe_->forOp->region(0);
}

void Lowering::issueAsyncCopies(PipelineLoop& p, llvm::Value* ivValue, llvm::Value* slot) {
  const ir::Block& body = p.forOp->region(0);
  // Recompute the addresses for iteration ivValue, then put back the values
  // of the current iteration (other users may need them).
  std::vector<std::pair<const ir::Value*, Regs>> saved;
  auto save = [&](const ir::Value* v) {
    auto it = values_.find(v);
    saved.emplace_back(v, it == values_.end() ? Regs{} : it->second);
  };
  save(body.arg(0));
  set(body.arg(0), {ivValue});
  std::set<const ir::Op*> lowered;
  llvm::Value* exists = b.CreateICmpSLT(ivValue, p.ub);
  for (const ir::Op* load : p.loads) {
    for (const ir::Op* op : addressSlice(*load, body)) {
      if (!lowered.insert(op).second) continue;
      for (const ir::Value* r : op->results()) save(r);
      lowerOp(*op);
    }
    const Layout& from = layoutOf(load->result(), *load);
    const PipelinedBuffer& buf = p.buffers.at(load);
    const DType t = load->result()->type().dtype();
    const int64_t v = buf.width, bytes = v * ir::byteWidth(t);
    const Regs& ptrs = get(load->operand(0));
    const Regs* mask = load->numOperands() >= 2 ? &get(load->operand(1)) : nullptr;
    onlyWhere(ownerPredicate(from), "cp.async", [&] {
      llvm::Value* threadOff = sharedThreadOffset(from, buf.plan->smem);
      llvm::Value* slotBase = b.CreateAdd(i32(buf.offset), b.CreateMul(slot, i32(buf.slotBytes)));
      const llvm::Intrinsic::ID id = bytes == 16 ? llvm::Intrinsic::nvvm_cp_async_cg_shared_global_16_s
                                     : bytes == 8 ? llvm::Intrinsic::nvvm_cp_async_ca_shared_global_8_s
                                                  : llvm::Intrinsic::nvvm_cp_async_ca_shared_global_4_s;
      for (int64_t r0 = 0; r0 < from.numRegisters(); r0 += v) {
        llvm::Value* elem = b.CreateXor(threadOff, i32(buf.plan->smem.offsetOf(from.regCoord(r0))));
        llvm::Value* dst = b.CreateGEP(b.getInt8Ty(), sharedBase,
                                       b.CreateAdd(slotBase, b.CreateMul(elem, i32(ir::byteWidth(t)))));
        llvm::Value* on = mask ? b.CreateAnd((*mask)[size_t(r0)], exists) : exists;
        llvm::Value* srcSize = b.CreateSelect(on, i32(bytes), i32(0));
        b.CreateIntrinsic(id, llvm::ArrayRef<llvm::Value*>{dst, ptrs[size_t(r0)], srcSize});
      }
    });
  }
  b.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_commit_group, llvm::ArrayRef<llvm::Value*>{});
  for (auto it = saved.rbegin(); it != saved.rend(); ++it)
    if (it->second.empty())
      values_.erase(it->first);
    else
      values_[it->first] = it->second;
}

bool Lowering::beginPipelinedLoop(const ir::Op& forOp, llvm::Value* lb, llvm::Value* ub, llvm::Value* step) {
  std::vector<const ir::Op*> loads;
  int stages = 0;
  for (const auto& op : forOp.region(0).ops())
    if (op->kind() == ir::OpKind::Load && op->hasAttr("async_stages")) {
      loads.push_back(op.get());
      stages = int(op->intAttr("async_stages"));
    }
  if (loads.empty() || stages < 2) return false;
  auto p = std::make_unique<PipelineLoop>();
  p->forOp = &forOp;
  p->stages = stages;
  p->loads = loads;
  p->ub = ub;
  p->step = step;
  // Loads whose tile a wgmma reads from the ring (TensorCores.h): their slots
  // take the wgmma layout instead of the ldmatrix one.
  std::map<const ir::Op*, ir::SharedLayout> wgmmaTiles;
  std::set<const ir::Op*> wgmmaConverts;  // the converts whose dot reads the slot itself
  for (const auto& op : forOp.region(0).ops())
    if (op->kind() == ir::OpKind::Dot)
      if (auto w = wgmmaPlan(*op, target)) {
        wgmmaTiles.emplace(w->load, w->b.smem);
        const ir::Op* first = op->operand(1)->definingOp();
        wgmmaConverts.insert(first->kind() == ir::OpKind::Trans ? first->operand(0)->definingOp() : first);
      }
  // The converts of each load give the ldmatrix plans (all read one swizzled tile, checked by the
  // pass); the ring is made at the first.
  for (const auto& op : forOp.region(0).ops())
    if (op->kind() == ir::OpKind::ConvertLayout)
      for (const ir::Op* load : loads)
        if (op->operand(0) == load->result()) {
          const DType t = load->result()->type().dtype();
          const bool wgmma = wgmmaTiles.count(load) != 0;
          if (wgmma != (wgmmaConverts.count(op.get()) != 0))
            fail(*op, "reads a ring tile that another product reads with wgmma, but its own product cannot run "
                      "on wgmma (one slot cannot hold both layouts)");
          if (auto it = p->buffers.find(load); it != p->buffers.end()) {
            if (!wgmma) {
              auto ldm = ldmatrixPlan(layoutOf(load->result(), *load), layoutOf(op->result(), *op), t);
              if (!ldm || !(ldm->smem == it->second.plan->smem))
                fail(*op, "is a second reader of a pipelined tile but ldmatrix cannot read the ring's layout");
              it->second.readers[op.get()] = std::make_shared<LdmatrixPlan>(*ldm);
            }
            continue;
          }
          PipelinedBuffer buf;
          std::optional<LdmatrixPlan> ldm;
          if (wgmma) {
            ldm = LdmatrixPlan{wgmmaTiles.at(load)};
            buf.wgmma = true;
            p->feedsWgmma = true;
          } else {
            ldm = ldmatrixPlan(layoutOf(load->result(), *load), layoutOf(op->result(), *op), t);
          }
          if (!ldm) fail(*op, "is marked for pipelining but ldmatrix cannot read its layout");
          buf.plan = std::make_shared<LdmatrixPlan>(*ldm);
          buf.readers[op.get()] = buf.plan;
          buf.slotBytes = pipelineSlotBytes(*load);
          buf.offset = scratchOffset(*load, buf.slotBytes * stages);
          auto vw = plan.vectorWidth.count(load) ? plan.vectorWidth.at(load) : 1;
          buf.width = asyncCopyWidth(layoutOf(load->result(), *load), *ldm, vw, t);
          if (buf.width < 2) fail(*load, "is marked for pipelining but its accesses are narrower than 4 bytes");
          p->buffers[load] = buf;
        }
  for (const ir::Op* load : loads)
    if (!p->buffers.count(load)) fail(*load, "is marked for pipelining but no convert_layout reads it");
  pipes_.push_back(std::move(p));
  pipe_ = pipes_.back().get();
  // Prologue: iterations 0..S-2 into slots 0..S-2. The ring's bytes may be
  // those an earlier op still reads in a slower warp (a convert's staging
  // tile, or the ring of a previous loop that its last ldmatrix or wgmma
  // reads): every thread passes a barrier before the first copy lands.
  barrier();
  llvm::Type* ivTy = lb->getType();
  for (int s = 0; s + 1 < stages; ++s) {
    llvm::Value* it = b.CreateAdd(lb, b.CreateMul(step, llvm::ConstantInt::get(ivTy, uint64_t(s))));
    issueAsyncCopies(*pipe_, it, i32(s));
  }
  return true;
}

void Lowering::endPipelinedLoop() {
  b.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_wait_all, llvm::ArrayRef<llvm::Value*>{});
  pipes_.pop_back();
  pipe_ = pipes_.empty() ? nullptr : pipes_.back().get();
}

Regs Lowering::lowerPipelinedConvert(const ir::Op& cvt, const ir::Op& load) {
  PipelineLoop& p = *pipe_;
  if (!p.waitedThisIteration) {
    p.waitedThisIteration = true;
    b.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_wait_group, llvm::ArrayRef<llvm::Value*>{i32(p.stages - 2)});
    if (p.feedsWgmma) {
      // cp.async wrote through the generic proxy; wgmma reads through the async one.
      auto* fenceTy = llvm::FunctionType::get(b.getVoidTy(), false);
      b.CreateCall(fenceTy, llvm::InlineAsm::get(fenceTy, "fence.proxy.async.shared::cta;", "~{memory}", true));
    }
    barrier();
    llvm::Type* ivTy = p.iv->getType();
    llvm::Value* ahead =
        b.CreateAdd(p.iv, b.CreateMul(p.step, llvm::ConstantInt::get(ivTy, uint64_t(p.stages - 1))));
    issueAsyncCopies(p, ahead, p.writeSlot);
  }
  const PipelinedBuffer& buf = p.buffers.at(&load);
  if (buf.wgmma) return {};  // the dot reads the slot itself (lowerWgmmaDot)
  llvm::Value* slotBase = b.CreateAdd(i32(buf.offset), b.CreateMul(p.readSlot, i32(buf.slotBytes)));
  return ldmatrixFromShared(layoutOf(cvt.result(), cvt), *buf.readers.at(&cvt), load.result()->type().dtype(), slotBase);
}

}  // namespace flextile::codegen
