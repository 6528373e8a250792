// Warpgroup ping-pong (pass "pingpong"): in an 8-warp program whose loop issues wgmma products, the
// two warpgroups take turns issuing them, so that one warpgroup's tensor-core work runs while the
// other does its element-wise work (FlashAttention-3's inter-warpgroup overlap). Without turns both
// warpgroups wait on the same ring slot, issue their products together and then run their softmax
// together, leaving the tensor cores idle through it.
//
// The schedule written (ir/Ops.def warpgroup_turn), per loop that qualifies:
//
//   warpgroup_turn {step = "open"}       warpgroup 1 lets warpgroup 0 go first
//   for ... {
//     ...
//     warpgroup_turn {step = "begin"}    before the body's first async dot: wait for the turn
//     dot {async = 1} ...                the products issued before the first wgmma_wait
//     warpgroup_turn {step = "end"}      after the last of them: hand the turn over
//     ...
//   }
//   warpgroup_turn {step = "close"}      warpgroup 0 takes the turn handed back last (with
//                                        handshake = 1 where a later open could follow before the
//                                        warpgroups meet: warpgroup 1 then waits for that)
//
// A loop qualifies when the function has 8 warps on a wgmma target, its body (not nested regions)
// holds at least one async dot, and nothing in the body waits for the whole CTA: no barrier op and
// no op with shared-memory scratch (whose lowering brackets it with CTA barriers): a warpgroup
// waiting for its turn would never reach such a barrier while the other waits there. Both
// warpgroups run the same trip count (the loop is the program's), so the turns balance. Opt-in:
// function attribute pingpong = 1, or FLEXTILE_PINGPONG=1 (=0 turns it off everywhere).
#include <functional>
#include <set>

#include "codegen/Passes.h"
#include "codegen/SharedMemory.h"
#include "codegen/Target.h"
#include "codegen/passes/LoopValues.h"

namespace flextile::codegen {

using ir::Op;
using ir::OpKind;

namespace {

void turn(ir::Function& f, ir::Block& block, ir::Block::OpList::iterator pos, const char* step, ir::Location loc) {
  block.insert(pos, f.createOp(OpKind::WarpgroupTurn, {}, {}, {{"step", std::string(step)}}, loc));
}

bool isTurn(const Op& op, const char* step) {
  return op.kind() == OpKind::WarpgroupTurn && op.strAttr("step") == step;
}

// Whether both warpgroups meet at `op`: a CTA barrier, or an op whose lowering brackets it with some.
bool meets(const Op& op) { return op.kind() == OpKind::Barrier || scratchBytes(op) > 0; }

bool opensTurns(const Op& op) {
  for (const auto& region : op.regions())
    for (const auto& inner : region->ops())
      if (isTurn(*inner, "open") || opensTurns(*inner)) return true;
  return false;
}

// Whether a warpgroup that leaves `close` may reach an `open` before the two warpgroups meet:
// along the rest of its block, then — the block a loop's body — around to the body's start (the
// next trip) and on after the loop, and so outwards to the function's end. A nested region on the
// way counts as an open if it holds one (its trips are unknown here) and as no meeting otherwise.
bool mayReachAnOpenAlone(Op& close) {
  std::set<const ir::Block*> wrapped;
  std::function<bool(ir::Block&, ir::Block::OpList::iterator)> from = [&](ir::Block& block, auto it) {
    for (; it != block.ops().end(); ++it) {
      const Op& op = **it;
      if (isTurn(op, "open") || (!op.regions().empty() && opensTurns(op))) return true;
      if (meets(op)) return false;
    }
    Op* parent = block.parentOp();
    if (!parent) return false;  // the function's end: no open follows
    if (parent->kind() == OpKind::For && wrapped.insert(&block).second && from(block, block.ops().begin())) return true;
    ir::Block& outer = *parent->parentBlock();
    return from(outer, std::next(outer.find(parent)));
  };
  ir::Block& block = *close.parentBlock();
  return from(block, std::next(block.find(&close)));
}

}  // namespace

void scheduleWarpgroupTurns(ir::Function& f, const Target& target) {
  if (!target.has(Feature::Wgmma) || f.numWarps() != 8 || !passSwitch(f, "FLEXTILE_PINGPONG", "pingpong")) return;
  std::vector<Op*> loops;
  f.walk([&](Op& op) {
    if (op.kind() == OpKind::For && op.regions().size() == 1) loops.push_back(&op);
  });
  for (Op* loop : loops) {
    ir::Block& body = loop->region(0);
    // The turn covers the products issued from the first async dot up to the first wait for one
    // (or the last async dot): with defer-accumulation, S_t and the deferred P_{t-1}·V; without,
    // S_t alone. What follows the wait (the softmax) then runs while the other warpgroup issues.
    Op* first = nullptr;
    Op* last = nullptr;
    for (auto& op : body.ops()) {
      if (first && op->kind() == OpKind::WgmmaWait) break;
      if (op->kind() == OpKind::Dot && op->hasAttr("async") && op->intAttr("async")) {
        if (!first) first = op.get();
        last = op.get();
      }
    }
    if (!first || waitsForTheCta(body)) continue;
    const ir::Location loc = loop->loc();
    turn(f, body, body.find(first), "begin", first->loc());
    turn(f, body, std::next(body.find(last)), "end", last->loc());
    ir::Block& outer = *loop->parentBlock();
    turn(f, outer, outer.find(loop), "open", loc);
    turn(f, outer, std::next(outer.find(loop)), "close", loc);
  }
  // Two loops with turns one after the other and no CTA barrier between them (the walks of a
  // program whose rings the pipeline shares): the first loop's close and the second's
  // open go, and the turns run on as through one loop. Kept, they let warpgroup 1 leave the first
  // loop and arrive on barrier 1 for the second's open before warpgroup 0 had synced on it for the
  // first's close: two arrivals of one warpgroup complete the barrier, and the turns fall out of
  // step (a hang on the H200, 2026-12-04).
  std::vector<std::pair<Op*, Op*>> joins;
  f.walk([&](Op& op) {
    if (op.kind() != OpKind::WarpgroupTurn || op.strAttr("step") != "close") return;
    ir::Block& block = *op.parentBlock();
    for (auto it = std::next(block.find(&op)); it != block.ops().end(); ++it) {
      const Op& between = **it;
      if (between.kind() == OpKind::WarpgroupTurn && between.strAttr("step") == "open") {
        joins.emplace_back(&op, it->get());
        return;
      }
      // What matters between them is only whether both warpgroups meet there: a CTA barrier (or an
      // op whose lowering brackets it with some) keeps the close and open apart safely, and a
      // nested region may take turns of its own. Anything else — stores, a ring's issue (shared
      // rings put the next loop's first stages here; thread 0 then waits only for slots the other
      // warpgroup releases without a turn) — waits for no turn.
      if (!between.regions().empty() || between.kind() == OpKind::Barrier || scratchBytes(between) > 0) return;
    }
  });
  for (auto [close, open] : joins) {
    close->parentBlock()->erase(close);
    open->parentBlock()->erase(open);
  }
  // The same hazard where a close and the next open are not neighbours of one block: the turns of
  // a loop nested in another (the backward's dkdv opens and closes them once a head of the GQA
  // group, the heads' walks often empty) let warpgroup 1 leave the close and arrive for the next
  // trip's open while warpgroup 0 is still on its way to the close. Such a close also hands the
  // end of the turns to warpgroup 1 (handshake = 1: warpgroup 1 waits for warpgroup 0 to have
  // taken its last turn), so no later arrival of warpgroup 1 can overtake it. (The backward's
  // turns stalled so under the parallel GPU suite three times, 2026-12-05 and -06.)
  std::vector<Op*> closes;
  f.walk([&](Op& op) {
    if (isTurn(op, "close")) closes.push_back(&op);
  });
  for (Op* close : closes)
    if (mayReachAnOpenAlone(*close)) close->setAttr("handshake", int64_t(1));
}

ir::Pass pingpongPass(const Target& target) {
  return {"pingpong", [target](ir::Function& f) { scheduleWarpgroupTurns(f, target); }};
}

}  // namespace flextile::codegen
