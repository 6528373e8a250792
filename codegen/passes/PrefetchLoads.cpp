// Load prefetching (pass "prefetch-loads"): a small tile load in a loop body whose address the
// loop can compute for another iteration (the induction variable, loop-invariant values, pure ops
// and scalar loads of a loop that writes no global memory) is issued one iteration early and its
// value carried, so that its latency hides behind an iteration's products instead of stalling the
// element-wise work that reads it. The document mask's per-key ids are the case: each partial step
// reads the step's block index from the BlockMask list, then `doc_ids[b, kv]` for the step's
// BLOCK_N keys, and compares them with the queries' ids — two dependent round trips to L2 before
// the mask, every step.
//
//   %ids0 = <load's slice at lb, masks AND (lb < ub)>            before the loop
//   for %t = lb .. ub (.. %ids = %ids0) {
//     ... async products issued ...
//     %next = <load's slice at t + step, masks AND (t + step < ub)>   before the first wgmma_wait
//     ... uses of the load read %ids ...
//     yield ..., %next
//   }
//
// Only loads of at most kMaxElements elements (row and column vectors of a tile: a few registers
// a thread across the back edge) and loops that store nothing global (a store might change what a
// load of the next iteration reads) qualify; the clones' loads are masked off past the loop's end,
// so nothing is read that the loop would not read. The slice's other loads (the block index) are
// recomputed for the next iteration, not carried. Ring loads are the pipeline's: this pass runs
// after it (and after wgmma and pingpong, whose waits and turns place the prefetch) and before
// warp-specialize (the carried values are the consumers'). Opt-in: function attribute
// prefetch_loads = 1, or FLEXTILE_PREFETCH_LOADS=1 (=0 turns it off everywhere).
#include <algorithm>
#include <map>
#include <set>

#include "codegen/Passes.h"
#include "codegen/passes/LoopValues.h"
#include "ir/Passes.h"

namespace flextile::codegen {

using ir::Op;
using ir::OpKind;

namespace {

constexpr int64_t kMaxElements = 256;

bool writesGlobalMemory(const ir::Block& body) {
  for (const auto& op : body.ops()) {
    if (ir::writesGlobalMemory(*op)) return true;
    for (const auto& r : op->regions())
      if (writesGlobalMemory(*r)) return true;
  }
  return false;
}

// Whether the load's address changes from one iteration to the next (else it is loop-invariant:
// hoist-invariant-loads' case, not this pass's).
bool followsTheIterations(Op& load, ir::Block& body) {
  for (const Op* op : bodySlice({load.result()}, body))
    for (const ir::Value* o : op->operands())
      if (o == body.arg(0)) return true;
  return false;
}

// The loads of `body` to carry: small tile loads whose operands the loop can recompute.
std::vector<Op*> prefetchable(ir::Block& body) {
  std::vector<Op*> out;
  for (auto& op : body.ops()) {
    if (op->kind() != OpKind::Load || op->hasAttr("async_stages")) continue;
    const ir::Type& t = op->result()->type();
    if (!t.isTile() || !t.hasLayout() || t.numElements() > kMaxElements) continue;
    std::set<const ir::Value*> seen;
    bool recomputable = true;
    for (const ir::Value* o : op->operands()) recomputable = recomputable && recomputableInLoop(o, body, true, seen);
    if (recomputable && followsTheIterations(*op, body)) out.push_back(op.get());
  }
  return out;
}

// Clones `slice` (body ops in order) at `at` for induction value `iv`; every load of it (the
// prefetched ones and the scalar loads their addresses read) is masked off unless `exists`.
std::map<const ir::Value*, ir::Value*> cloneForIteration(Inserter& at, const std::vector<Op*>& slice, ir::Block& body,
                                                         ir::Value* iv, ir::Value* exists) {
  std::map<const ir::Value*, ir::Value*> clone{{body.arg(0), iv}};
  auto mapped = [&](ir::Value* v) {
    auto it = clone.find(v);
    return it == clone.end() ? v : it->second;
  };
  for (Op* op : slice) {
    if (op->kind() != OpKind::Load) {
      cloneAt(at, {op}, clone);
      continue;
    }
    const ir::Type& ptr = op->operand(0)->type();
    const ir::Type maskType = ptr.isTile() ? ir::Type(ir::DType::I1, ptr.shape()).withLayout(ptr.layout()) : ir::Type(ir::DType::I1);
    ir::Value* on = ptr.isTile() ? at.value(OpKind::Splat, {exists}, maskType) : exists;
    std::vector<ir::Value*> operands{mapped(op->operand(0))};
    operands.push_back(op->numOperands() >= 2 ? at.value(OpKind::And, {mapped(op->operand(1)), on}, maskType) : on);
    if (op->numOperands() >= 3) operands.push_back(mapped(op->operand(2)));
    // A load that names a tensor box is cloned without it: masked off past the loop's end, the
    // clone's mask is no longer the box's bounds, and a prefetched load is an ordinary one.
    ir::Attrs attrs = op->attrs();
    attrs.erase("tensor_rank");
    Op* copy = at.op(OpKind::Load, std::move(operands), {op->result()->type()}, std::move(attrs));
    clone[op->result()] = copy->result();
  }
  return clone;
}

// Where the next iteration's loads go: after the body's async products are issued (before the
// first wgmma_wait), else at the top of the body.
ir::Block::OpList::iterator prefetchPoint(ir::Block& body) {
  for (auto it = body.ops().begin(); it != body.ops().end(); ++it)
    if ((*it)->kind() == OpKind::WgmmaWait) return it;
  return body.ops().begin();
}

bool prefetchLoop(ir::Function& f, Op& forOp) {
  ir::Block& body = forOp.region(0);
  if (body.args().empty() || writesGlobalMemory(body)) return false;
  const std::vector<Op*> loads = prefetchable(body);
  if (loads.empty()) return false;
  std::vector<const ir::Value*> roots;
  for (Op* l : loads) roots.push_back(l->result());
  const std::vector<Op*> slice = bodySlice(roots, body);
  // The prefetch goes before the first wgmma_wait: nothing the slice reads may come after it.
  const auto at = prefetchPoint(body);
  std::set<const Op*> beforePoint;
  for (auto it = body.ops().begin(); it != at; ++it) beforePoint.insert(it->get());
  for (Op* op : slice)
    for (ir::Value* o : op->operands())
      if (const Op* d = o->definingOp(); d && d->parentBlock() == &body && !beforePoint.count(d) &&
                                         std::find(slice.begin(), slice.end(), d) == slice.end())
        return false;

  ir::Value* lb = forOp.operand(0);
  ir::Value* ub = forOp.operand(1);
  ir::Value* step = forOp.operand(2);
  const ir::Type ivType = body.arg(0)->type();
  const ir::Type i1(ir::DType::I1);
  const ir::Attrs lt{{"pred", std::string("lt")}};

  Inserter before{f, *forOp.parentBlock(), forOp.parentBlock()->find(&forOp), forOp.loc()};
  auto first = cloneForIteration(before, slice, body, lb, before.value(OpKind::Cmp, {lb, ub}, i1, lt));
  Inserter inside{f, body, at, forOp.loc()};
  ir::Value* nextIv = inside.value(OpKind::Add, {body.arg(0), step}, ivType);
  auto next = cloneForIteration(inside, slice, body, nextIv, inside.value(OpKind::Cmp, {nextIv, ub}, i1, lt));

  Op* yield = body.terminator();
  for (Op* load : loads) {
    forOp.addOperand(first.at(load->result()));
    ir::Value* carried = body.addArg(load->result()->type(), "prefetched");
    forOp.addResult(load->result()->type());
    yield->addOperand(next.at(load->result()));
    f.replaceAllUsesWith(load->result(), carried);
  }
  return true;
}

}  // namespace

bool prefetchLoadsWanted(const ir::Function& f) { return passSwitch(f, "FLEXTILE_PREFETCH_LOADS", "prefetch_loads"); }

void prefetchLoads(ir::Function& f) {
  if (!prefetchLoadsWanted(f)) return;
  std::vector<Op*> loops;
  f.walk([&](Op& op) {
    if (op.kind() == OpKind::For && op.regions().size() == 1) loops.push_back(&op);
  });
  bool any = false;
  for (Op* loop : loops) any |= prefetchLoop(f, *loop);
  if (any) ir::dce(f);
}

ir::Pass prefetchLoadsPass() {
  return {"prefetch-loads", [](ir::Function& f) { prefetchLoads(f); }};
}

}  // namespace flextile::codegen
