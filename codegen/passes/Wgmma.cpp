// Hopper warpgroup MMA as an asynchronous op (pass "wgmma").
//
// Resident A. First, each loop-invariant A operand that may stay in shared memory
// (codegen/SharedMemory.h residentAConverts: TensorCores.h wgmmaResidentA, and the plan with all
// of them fits) becomes a one-slot shared buffer: local_alloc, barrier, local_store, proxy fence,
// barrier, local_load in place of its convert; the dots read that slot through a descriptor.
//
// Selection. Every dot that wgmmaPlan accepts for the target (codegen/TensorCores.h: sm_90a,
// a ring slot as B, the accumulator split of 16 rows per warp) gets `async = 1`: the lowering
// issues it as one wgmma group and does not wait for it (LowerDot.cpp). A dot without the
// attribute that still runs on wgmma (hand-written IR) is waited for at once.
//
// Waits. The result of an async dot may only be read after a `wgmma_wait` that passes it
// through (ir/Ops.def). The pass places them as late as the hardware allows, simulating the
// groups in flight in program order (the lowering's order, regions at their op):
//   * before an op that reads pending accumulators: wait until the newest group it reads is
//     complete, `pending` = the groups issued after that one (groups complete in commit order,
//     so the older ones are complete too, and pass through the same wait);
//   * before control flow (a `for`, a `yield`, the `return`), a `fence`, an `mbarrier_arrive`
//     (it may release a slot the groups read) or setup, and any op with shared-memory scratch
//     (codegen/SharedMemory.h): wait for every group, `pending = 0`.
//     Each group thus completes in the block that issued it (a loop's next iteration overwrites
//     the ring slots its wgmmas read; a yield hands the accumulators to the next iteration), and
//     no generic-proxy store or barrier of a scratch user runs while the async proxy still reads.
//     A bulk_rows atomic_add inside a loop is the exception: its bytes are its own from the
//     outermost loop's start to the kernel's end (codegen/SharedMemory.h), so no in-flight group
//     reads them, and the backward's dK product stays in flight while dQ's rows are staged and sent.
//     The async level's copies, commits, waits, barriers and slot reads are not such ops: the
//     pipeline's schedule writes only the slot the pending groups do not read.
// Every use of a completed accumulator after the wait reads the wait's result, so independent
// products, and the element-wise work between them, overlap on the tensor cores: the S = QKᵀ
// wgmma of the forward is waited at the softmax that reads it, the O += PV one at the yield.
// Runs after "pipeline" (wgmma reads its rings). FLEXTILE_WGMMA=0 selects nothing.
#include <algorithm>
#include <memory>
#include <vector>

#include "codegen/Passes.h"
#include "codegen/SharedMemory.h"
#include "codegen/TensorCores.h"
#include "ir/SharedLayout.h"

namespace flextile::codegen {

using ir::Op;
using ir::OpKind;

namespace {

// A bulk_rows atomic_add inside a loop: its scratch overlaps no other buffer from the start of its
// outermost loop to the kernel's end (SharedMemory.h), and every group issued before that loop
// completed at the loop's `for`. (One outside loops may share bytes with a buffer whose last
// reader, a product still in flight, comes before it: the rule drains those.)
bool bulkRowsInALoop(const Op& op) {
  return op.kind() == OpKind::AtomicAdd && addsInBulk(op) && op.parentBlock() && op.parentBlock()->parentOp();
}

struct PendingGroup {
  ir::Value* result;  // the accumulator in flight
  int64_t group;      // its number in issue order
};

struct WaitWriter {
  ir::Function& f;
  std::vector<PendingGroup> pending;
  int64_t issued = 0;

  // Waits, before `op` of `block`, until `group` is complete.
  void waitFor(ir::Block& block, Op& op, int64_t group) {
    std::vector<ir::Value*> done;
    std::vector<ir::Type> types;
    for (const PendingGroup& p : pending)
      if (p.group <= group) {
        done.push_back(p.result);
        types.push_back(p.result->type());
      }
    if (done.empty()) return;
    Op* wait = block.insert(block.find(&op), f.createOp(OpKind::WgmmaWait, done, types, {{"pending", issued - group}}, op.loc()));
    for (size_t i = 0; i < done.size(); ++i) {
      f.replaceAllUsesWith(done[i], wait->result(i));
      wait->setOperand(i, done[i]);
    }
    std::erase_if(pending, [&](const PendingGroup& p) { return p.group <= group; });
  }

  void block(ir::Block& blk) {
    std::vector<Op*> ops;
    for (auto& op : blk.ops()) ops.push_back(op.get());
    for (Op* op : ops) {
      if (!pending.empty()) {
        const bool all = op->kind() == OpKind::For || op->kind() == OpKind::Yield || op->kind() == OpKind::Return ||
                         op->kind() == OpKind::Fence || op->kind() == OpKind::MbarrierArrive ||
                         op->kind() == OpKind::MbarrierInit || op->kind() == OpKind::MbarrierInval ||
                         !op->regions().empty() || (!bulkRowsInALoop(*op) && scratchBytes(*op) > 0);
        int64_t needed = all ? issued : 0;
        for (const ir::Value* v : op->operands())
          for (const PendingGroup& p : pending)
            if (p.result == v) needed = std::max(needed, p.group);
        if (needed) waitFor(blk, *op, needed);
      }
      for (auto& region : op->regions()) block(*region);
      if (op->kind() == OpKind::Dot && op->hasAttr("async") && op->intAttr("async") != 0) pending.push_back({op->result(), ++issued});
    }
  }
};

}  // namespace

// A loop-invariant A operand kept in shared memory (TensorCores.h wgmmaResidentA; the fit is
// residentAConverts'): the convert becomes a one-slot buffer written once where the tile is first
// read (outside the loops; where the convert was, inside them), with the barrier before (the
// planner may give these bytes to an op before it that a slower warp still reads), the owners'
// stores, a proxy fence (generic-proxy stores, async-proxy reads) and the barrier after, and a
// local_load that the dots read through a descriptor.
// A tile already resident in the same shared layout earlier in the block is read from that
// buffer: the atomic-dQ dkdv reads K as the A of K·Qᵀ and as the B of dS·K (or, specialized, as
// the M-major A of Kᵀ·dSᵀ), the same swizzled [BN, D] panels for both, so one copy and one store
// (16 KB less at 64 keys and D = 128).
namespace {
struct ResidentTile {
  const ir::Value* source;
  ir::SharedLayout smem;
  ir::Value* buffer;
  ir::Value* slot;
};

// Whether `op` or an op of its regions reads `v`.
bool reads(const Op& op, const ir::Value* v) {
  for (const ir::Value* o : op.operands())
    if (o == v) return true;
  for (const auto& r : op.regions())
    for (const auto& inner : r->ops())
      if (reads(*inner, v)) return true;
  return false;
}

void keepResident(ir::Function& f, Op& cvt, const Target& target, std::vector<ResidentTile>& made) {
  ir::Block& block = *cvt.parentBlock();
  auto resident = wgmmaResidentA(cvt, target);
  if (!resident) resident = wgmmaResidentB(cvt, target);
  if (!resident) resident = wgmmaStagedB(cvt, target);
  if (!resident) resident = wgmmaStagedA(cvt, target);
  const ir::Type& x = cvt.operand(0)->type();
  // A tile outside the loops is stored where it is first read: before the loop that reads it,
  // after that loop's ring prologue, so that the first K/V (or Q/dO) stages are issued before the
  // program waits for the tile's global load and stores it (the producer of a specialized kernel
  // no longer waits at the ring's barrier for the consumers' copy of Q). FLEXTILE_STAGE_AT_FIRST_USE=0:
  // where the convert was, as before.
  Op* where = &cvt;
  if (cvt.parentBlock() == &f.body() && passSwitch(f, "FLEXTILE_STAGE_AT_FIRST_USE", "stage_at_first_use", true))
    for (auto it = std::next(block.find(&cvt)); it != block.ops().end(); ++it)
      if (reads(**it, cvt.result())) {
        where = it->get();
        break;
      }
  auto at = [&](OpKind k, std::vector<ir::Value*> operands, std::vector<ir::Type> types, ir::Attrs attrs = {}) {
    return block.insert(block.find(where), f.createOp(k, std::move(operands), std::move(types), std::move(attrs), cvt.loc()));
  };
  // Reusable only when the earlier store precedes where this tile would be stored, in its block (a
  // staged B's buffer may come later, or in another block).
  auto precedes = [&](const ir::Value* buffer) {
    for (const auto& op : block.ops()) {
      if (op.get() == where) return false;
      if (op->kind() == OpKind::LocalStore && op->operand(0) == buffer) return true;
    }
    return false;
  };
  ir::Value *buf = nullptr, *slot = nullptr;
  for (const ResidentTile& r : made)
    if (r.source == cvt.operand(0) && r.smem == resident->tile.smem && precedes(r.buffer)) {
      buf = r.buffer;
      slot = r.slot;
    }
  if (!buf) {
    // A tile staged inside a loop (wgmmaStagedB: the atomic dQ's dSᵀ; wgmmaStagedA: Pᵀ and dSᵀ where
    // the warpgroups split N) gets its buffer before the outermost loop, live through it; the store
    // and its barriers stay where the convert was.
    const Op* outermost = &cvt;
    while (outermost->parentBlock() != &f.body()) outermost = outermost->parentBlock()->parentOp();
    auto bufferType = ir::Type::sharedBuffer(x.dtype(), 1, std::make_shared<const ir::SharedLayout>(resident->tile.smem));
    buf = outermost == &cvt ? at(OpKind::LocalAlloc, {}, {bufferType})->result()
                            : f.body().insert(f.body().find(outermost),
                                              f.createOp(OpKind::LocalAlloc, {}, {bufferType}, {}, cvt.loc()))->result();
    at(OpKind::Barrier, {}, {});
    slot = at(OpKind::Constant, {}, {ir::Type(ir::DType::I32)}, {{"value", int64_t(0)}})->result();
    at(OpKind::LocalStore, {buf, slot, cvt.operand(0)}, {});
    at(OpKind::FenceAsyncShared, {}, {});
    at(OpKind::Barrier, {}, {});
    made.push_back({cvt.operand(0), resident->tile.smem, buf, slot});
  }
  ir::Value* tile = at(OpKind::LocalLoad, {buf, slot}, {cvt.result()->type()})->result();
  f.replaceAllUsesWith(cvt.result(), tile);
  block.erase(&cvt);
  // A reader outside the loops (wgmmaResidentA allows one when ldmatrix can read the tile back)
  // gets its own local_load, so that the loops' one stays a descriptor and no register copy of the
  // tile lives through them.
  f.walk([&](Op& dot) {
    if (dot.kind() != OpKind::Dot || dot.operand(0) != tile || dot.parentBlock() != &block) return;
    Op* own = block.insert(block.find(&dot), f.createOp(OpKind::LocalLoad, {buf, slot}, {tile->type()}, {}, dot.loc()));
    dot.setOperand(0, own->result());
  });
  // (A tile staged in a loop is read by dots of its own block, which now have loads of their own.)
  if (!f.hasUses(tile)) block.erase(tile->definingOp());
}
}  // namespace

void selectWgmma(ir::Function& f, const Target& target) {
  // IR this pass already ran on (printed and read back): its dots and waits stay as they are.
  bool selected = false;
  f.walk([&](const Op& op) {
    selected = selected || op.kind() == OpKind::WgmmaWait || (op.kind() == OpKind::Dot && op.hasAttr("async"));
  });
  if (selected) return;
  // B of the products outside loops, in kernels whose loops run wgmma (the prologue and epilogue
  // of a loop that defer-accumulation rotated): staged in one-slot buffers, so that they run on
  // wgmma too. A kernel without such loops keeps what it had (mma.sync from registers).
  bool loopsRunWgmma = false;
  f.walk([&](Op& op) {
    const Op* loop = op.parentBlock() ? op.parentBlock()->parentOp() : nullptr;
    loopsRunWgmma = loopsRunWgmma || (op.kind() == OpKind::Dot && loop && loop->kind() == OpKind::For && wgmmaPlan(op, target));
  });
  // (A B staged inside a loop, for a resident M-major A, puts that loop's product on wgmma itself.)
  std::vector<Op*> staged;
  f.walk([&](Op& op) {
    const Op* parent = op.parentBlock() ? op.parentBlock()->parentOp() : nullptr;
    if (op.kind() == OpKind::ConvertLayout && (loopsRunWgmma || parent) && wgmmaStagedB(op, target))
      staged.push_back(&op);
  });
  // (A computed in a loop for products whose warpgroups split N: stored each iteration.)
  for (const Op* cvt : stagedAConverts(f, target)) staged.push_back(const_cast<Op*>(cvt));
  std::vector<ResidentTile> made;
  for (Op* cvt : staged) keepResident(f, *cvt, target, made);
  // In program order: a tile's first convert makes its buffer, later ones read it.
  for (const Op* cvt : residentAConverts(f, target)) keepResident(f, const_cast<Op&>(*cvt), target, made);
  bool any = false;
  f.walk([&](Op& op) {
    if (op.kind() == OpKind::Dot && wgmmaPlan(op, target)) {
      op.setAttr("async", int64_t(1));
      any = true;
    }
  });
  if (!any) return;
  WaitWriter writer{f};
  writer.block(f.body());
}

ir::Pass wgmmaPass(const Target& target) {
  return {"wgmma", [target](ir::Function& f) { selectWgmma(f, target); }};
}

}  // namespace flextile::codegen
