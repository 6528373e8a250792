// Hopper warpgroup MMA as an asynchronous op (pass "wgmma").
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
//   * before control flow (a `for`, a `yield`, the `return`), a `fence` and any op with
//     shared-memory scratch (codegen/SharedMemory.h): wait for every group, `pending = 0`.
//     Each group thus completes in the block that issued it (a loop's next iteration overwrites
//     the ring slots its wgmmas read; a yield hands the accumulators to the next iteration), and
//     no generic-proxy store or barrier of a scratch user runs while the async proxy still reads.
//     The async level's copies, commits, waits, barriers and slot reads are not such ops: the
//     pipeline's schedule writes only the slot the pending groups do not read.
// Every use of a completed accumulator after the wait reads the wait's result, so independent
// products, and the element-wise work between them, overlap on the tensor cores: the S = QKᵀ
// wgmma of the forward is waited at the softmax that reads it, the O += PV one at the yield.
// Runs after "pipeline" (wgmma reads its rings). FLEXTILE_WGMMA=0 selects nothing.
#include <algorithm>
#include <vector>

#include "codegen/Passes.h"
#include "codegen/SharedMemory.h"
#include "codegen/TensorCores.h"

namespace flextile::codegen {

using ir::Op;
using ir::OpKind;

namespace {

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
                         op->kind() == OpKind::Fence || !op->regions().empty() || scratchBytes(*op) > 0;
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

void selectWgmma(ir::Function& f, const Target& target) {
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
