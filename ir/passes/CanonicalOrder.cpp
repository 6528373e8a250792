// canonical-order: places each block's pure ops and loads by the use-def graph instead of the
// order they were traced in.
//
// Why: C++ leaves the order in which a call's arguments, or the two operands of an overloaded
// operator, are evaluated unspecified. A template's `a + b`, with both operands tracing ops, is
// traced a then b by one compiler (clang) and b then a by another (gcc), so one template gave
// differently ordered IR, and ptxas allocated registers differently (a spill of 44 bytes under
// one build, 56 under the other): the sanitizer build tested other kernels than users ran.
//
// What stays: every op with effects (stores, atomics, fences, loops, barriers, the clock; the
// terminator), every tensor-core product and every reduction (a template's order of those is its
// schedule) keeps its place relative to the others — the anchors. What moves: each pure op and
// each load is placed just before the first anchor that needs it, directly or through other such
// ops, after its own operands, visited in operand order (a loop needs what its body uses from the
// block). A load may not pass an anchor (a store might change what it reads): the loads traced
// before an anchor that nothing has needed by then are placed before it, in the order the first
// rule alone would have placed them. So the order depends only on the anchors' order and the
// graph, never on the order a compiler evaluated operands in (`ids(q) == ids(kv)`: two loads).
// Nested blocks are ordered first, so a loop's uses are read in their canonical order. Pure ops
// and loads that nothing needs are dead and are erased.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "ir/Passes.h"

namespace flextile::ir {

namespace {

// The ops that keep their order: everything but pure ops and loads, and the products and
// reductions — a template issues them in the order it means them to run (two independent products
// back to back, one overlapped with the softmax, a row sum before or after P·V), and the later
// passes keep that order.
bool isAnchor(const Op& op) {
  return (!op.hasTrait(kPure) && op.kind() != OpKind::Load) || op.kind() == OpKind::Dot || op.kind() == OpKind::Reduce;
}

class CanonicalOrder {
 public:
  bool run(Block& b) {
    bool changed = false;
    for (auto& op : b.ops())
      for (auto& region : op->regions()) changed |= run(*region);

    std::vector<Op*> before;
    for (auto& op : b.ops()) before.push_back(op.get());
    inBlock_ = std::unordered_set<const Op*>(before.begin(), before.end());

    // First as if loads could move anywhere: each op's place in that order is its rank.
    std::vector<Op*> free = placeAll(before, nullptr);
    std::unordered_map<const Op*, size_t> rank;
    for (size_t i = 0; i < free.size(); ++i) rank[free[i]] = i;
    // Then for real: a load may not move past an op with effects, so before each anchor the
    // loads traced before it that nothing has needed yet are placed, in rank order.
    std::vector<Op*> order = placeAll(before, &rank);

    std::unordered_set<const Op*> kept(order.begin(), order.end());
    std::vector<const Op*> dead;  // pure ops and loads nothing needs
    for (Op* op : before)
      if (!kept.count(op)) dead.push_back(op);
    Block::OpList& list = b.ops();
    std::unordered_map<const Op*, Block::OpList::iterator> at;
    for (auto it = list.begin(); it != list.end(); ++it) at[it->get()] = it;
    for (Op* op : order) list.splice(list.end(), list, at[op]);
    for (auto it = dead.rbegin(); it != dead.rend(); ++it) b.erase(*it);
    std::vector<Op*> after;
    for (auto& op : list) after.push_back(op.get());
    return changed || after != before;
  }

 private:
  // The block's ops in placement order: anchors in their order, each preceded by what it needs.
  // With `rank`, the loads traced before an anchor are placed before it (by rank) if nothing
  // needed them yet.
  std::vector<Op*> placeAll(const std::vector<Op*>& before, const std::unordered_map<const Op*, size_t>* rank) {
    placed_.clear();
    order_.clear();
    std::vector<Op*> pendingLoads;
    for (Op* op : before) {
      if (!isAnchor(*op)) {
        if (rank && op->kind() == OpKind::Load) pendingLoads.push_back(op);
        continue;
      }
      if (rank && !pendingLoads.empty()) {
        std::vector<Op*> loads;
        for (Op* l : pendingLoads)
          if (!placed_.count(l) && rank->count(l)) loads.push_back(l);
        std::sort(loads.begin(), loads.end(), [&](Op* x, Op* y) { return rank->at(x) < rank->at(y); });
        for (Op* l : loads) place(l->result());
        pendingLoads.clear();
      }
      placeOperandsOf(*op);
      order_.push_back(op);
      placed_.insert(op);
    }
    return order_;
  }

  // Places the in-block ops that `op` needs (its operands, and what its regions use from this
  // block), depth first in operand order.
  void placeOperandsOf(const Op& op) {
    for (const Value* v : op.operands()) place(v);
    for (const auto& region : op.regions())
      for (const auto& inner : region->ops()) placeOperandsOf(*inner);
  }

  void place(const Value* v) {
    Op* def = v->definingOp();
    if (!def || placed_.count(def) || !inBlock_.count(def) || isAnchor(*def)) return;
    placed_.insert(def);  // before its operands: the graph has no cycles, this only stops revisits
    placeOperandsOf(*def);
    order_.push_back(def);
  }

  std::unordered_set<const Op*> inBlock_, placed_;
  std::vector<Op*> order_;
};

}  // namespace

bool canonicalOrder(Function& f) { return CanonicalOrder().run(f.body()); }

Pass canonicalOrderPass() { return {"canonical-order", [](Function& f) { canonicalOrder(f); }}; }

}  // namespace flextile::ir
