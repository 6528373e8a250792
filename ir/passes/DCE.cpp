// Dead code elimination. Uses are counted once, then blocks are swept from
// the end so a chain of dead ops dies in one sweep (a user is seen before the
// values it uses); sweeps repeat until nothing changes. Loop-carried values
// that are unused stay: removing them would change the loop's signature, which
// is a different transformation.
#include <unordered_map>

#include "ir/Passes.h"

namespace flextile::ir {

namespace {

// Whether erasing the op (its results being unused) changes nothing
// observable. Loads qualify: a read has no effect that the program can see.
bool removable(const Op& op) {
  if (op.hasTrait(kTerminator) || op.hasTrait(kSideEffect)) return false;
  if (op.hasTrait(kPure) || op.kind() == OpKind::Load) return true;
  if (op.kind() == OpKind::For) {
    for (const auto& region : op.regions())
      for (const auto& inner : region->ops())
        if (inner->kind() != OpKind::Yield && !removable(*inner)) return false;
    return true;
  }
  return false;
}

class DCE {
 public:
  explicit DCE(Function& f) : f_(f) {}

  bool run() {
    bool any = false;
    for (bool changed = true; changed;) {
      countUses();
      changed_ = false;
      block(f_.body());
      changed = changed_;
      any |= changed;
    }
    return any;
  }

 private:
  void countUses() {
    uses_.clear();
    f_.walk([&](const Op& op) {
      for (const Value* v : op.operands()) ++uses_[v];
    });
  }

  void release(const Op& op) {
    for (const Value* v : op.operands()) --uses_[v];
    for (const auto& region : op.regions())
      for (const auto& inner : region->ops()) release(*inner);
  }

  void block(Block& b) {
    std::vector<Op*> order;
    for (auto& op : b.ops()) order.push_back(op.get());
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      Op* op = *it;
      for (auto& region : op->regions()) block(*region);
      bool used = false;
      for (const Value* r : op->results()) used = used || uses_[r] > 0;
      if (used || !removable(*op)) continue;
      release(*op);
      b.erase(op);
      changed_ = true;
    }
  }

  Function& f_;
  std::unordered_map<const Value*, int> uses_;
  bool changed_ = false;
};

}  // namespace

bool dce(Function& f) { return DCE(f).run(); }

Pass dcePass() { return {"dce", [](Function& f) { dce(f); }}; }

}  // namespace flextile::ir
