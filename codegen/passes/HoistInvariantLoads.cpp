// Hoisting loop-invariant loads (pass "hoist-invariant-loads"): a load in a `for` body whose
// pointer, mask and `other` do not change from one iteration to the next reads the same values in
// every iteration of a loop that writes no memory, so it is issued once, before the loop, with the
// pure ops that compute its operands. Mods inlined into the attention templates make such loads:
// the document mask's `ids(b, q_idx)` is re-read for every key block of the walk although q_idx is
// the program's.
//
// What moves, per loop (each loop's own body, not its nested regions; inner loops first, so a load
// can leave a nest one level per loop):
//   * a load whose operands are all defined outside the body (or by ops that move), that has a mask
//     (a masked load reads nothing where the mask is off, so issuing it when the loop runs no
//     iteration reads only what the program may read), and whose result is a scalar or a row or a
//     column (at most one dimension above 1: a few registers per thread kept across the loop; a
//     whole tile would cost more registers than the load it saves),
//   * the pure, region-free ops of the body that compute those operands.
// The loop must write no memory: no store, atomic or fence anywhere in it.
//
// Opt-in: function attribute hoist_invariant_loads = 1, or FLEXTILE_HOIST_INVARIANT_LOADS=1 (=0 for
// none). Runs before layout assignment, so the hoisted values get layouts like any other.
#include "codegen/Passes.h"

#include <functional>
#include <set>
#include <vector>

namespace flextile::codegen {

using ir::Op;
using ir::OpKind;

namespace {

bool writesMemory(const ir::Block& block) {
  for (const auto& op : block.ops()) {
    // (load_tagged waits for other programs' stores: nothing moves across it either.)
    if (ir::writesGlobalMemory(*op) || op->kind() == OpKind::Fence || op->kind() == OpKind::LoadTagged) return true;
    for (const auto& r : op->regions())
      if (writesMemory(*r)) return true;
  }
  return false;
}

bool rowOrColumn(const ir::Type& t) {
  int wide = 0;
  for (int64_t d : t.shape()) wide += d > 1;
  return wide <= 1;
}

// Whether `v` is computed inside `body` (by one of its ops, in nested regions too, or as an
// argument of the body or of a nested region).
bool definedInside(const ir::Value* v, const ir::Block& body) {
  const ir::Block* b = v->definingOp() ? v->definingOp()->parentBlock() : v->ownerBlock();
  while (b) {
    if (b == &body) return true;
    b = b->parentOp() ? b->parentOp()->parentBlock() : nullptr;
  }
  return false;
}

void hoistFrom(Op& loop) {
  ir::Block& body = loop.region(0);
  if (writesMemory(body)) return;
  // The ops that may move: a fixed point over the body in order (an op moves when every operand is
  // defined outside or by an op that moves).
  std::set<const Op*> movable;
  auto invariant = [&](const ir::Value* v) {
    return !definedInside(v, body) || (v->definingOp() && movable.count(v->definingOp()));
  };
  for (auto& op : body.ops()) {
    if (!op->regions().empty() || op->numResults() != 1) continue;
    const bool pure = op->hasTrait(ir::kPure);
    const bool load = op->kind() == OpKind::Load && op->numOperands() >= 2 && rowOrColumn(op->result()->type());
    if (!pure && !load) continue;
    bool allInvariant = true;
    for (const ir::Value* o : op->operands()) allInvariant = allInvariant && invariant(o);
    if (allInvariant) movable.insert(op.get());
  }
  // Only the loads and the ops their operands come from move: hoisting every invariant pure op would
  // keep whole tiles live across the loop.
  std::set<const Op*> moving;
  std::function<void(const Op*)> take = [&](const Op* op) {
    if (!moving.insert(op).second) return;
    for (const ir::Value* o : op->operands())
      if (const Op* d = o->definingOp(); d && movable.count(d)) take(d);
  };
  for (const Op* op : movable)
    if (op->kind() == OpKind::Load) take(op);
  if (moving.empty()) return;
  ir::Block& outer = *loop.parentBlock();
  const auto at = outer.find(&loop);
  for (auto it = body.ops().begin(); it != body.ops().end();) {
    if (!moving.count(it->get())) {
      ++it;
      continue;
    }
    std::unique_ptr<Op> op = std::move(*it);
    it = body.ops().erase(it);
    outer.insert(at, std::move(op));
  }
}

}  // namespace

void hoistInvariantLoads(ir::Function& f) {
  if (!passSwitch(f, "FLEXTILE_HOIST_INVARIANT_LOADS", "hoist_invariant_loads")) return;
  std::vector<Op*> loops;  // in walk order: an outer loop before the loops nested in it
  f.walk([&](Op& op) {
    if (op.kind() == OpKind::For && op.regions().size() == 1) loops.push_back(&op);
  });
  for (auto it = loops.rbegin(); it != loops.rend(); ++it) hoistFrom(**it);
}

ir::Pass hoistInvariantLoadsPass() {
  return {"hoist-invariant-loads", [](ir::Function& f) { hoistInvariantLoads(f); }};
}

}  // namespace flextile::codegen
