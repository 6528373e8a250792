// What the local rewrites of f32 tile arithmetic (fold-scales, regroup-sums) share: each round
// counts uses, looks for one rewrite and applies it, until a round finds none; new ops go right
// before the op being rewritten. Private to ir/passes.
#pragma once

#include <functional>
#include <unordered_map>

#include "ir/IR.h"
#include "ir/Passes.h"

namespace flextile::ir {

class LocalRewriter {
 protected:
  explicit LocalRewriter(Function& f) : f_(f) {}

  // Rounds of `rewriteOne` (true when it changed the function) until it finds nothing; then dce.
  bool untilDone(const std::function<bool()>& rewriteOne) {
    bool any = false;
    for (;;) {
      countUses();
      if (!rewriteOne()) break;
      any = true;
    }
    if (any) dce(f_);
    return any;
  }

  // The ops of the function for which `want` holds, in program order (a round's candidates).
  std::vector<Op*> opsWhere(const std::function<bool(const Op&)>& want) {
    std::vector<Op*> out;
    f_.walk([&](Op& op) {
      if (want(op)) out.push_back(&op);
    });
    return out;
  }

  static bool isF32Tile(const Value* v) { return v->type().isTile() && v->type().dtype() == DType::F32; }
  // A splat of a scalar or a constant: the same value in every element.
  static bool isUniform(const Value* v) {
    const Op* d = v->definingOp();
    return d && ((d->kind() == OpKind::Splat && d->operand(0)->type().isScalar()) ||
                 (d->kind() == OpKind::Constant && d->hasAttr("value")));
  }

  // Whether v is the same in every run of `block`: defined outside it, or by pure ops of it whose
  // operands are (an arange, a constant); not a block argument of `block` (a loop's iv or carried
  // values), not a load.
  static bool invariantIn(const Value* v, const Block* block) {
    const Op* d = v->definingOp();
    if (!d) return v->ownerBlock() != block;
    if (d->parentBlock() != block) return true;
    if (!d->hasTrait(kPure) || !d->regions().empty() || d->kind() == OpKind::Load) return false;
    for (const Value* o : d->operands())
      if (!invariantIn(o, block)) return false;
    return true;
  }

  int uses(const Value* v) const {
    auto it = uses_.find(v);
    return it == uses_.end() ? 0 : it->second;
  }
  // The user of a value used once (else any of its users).
  const Op* user(const Value* v) const { return users_.at(v); }

  Value* emit(OpKind k, std::vector<Value*> operands, const Type& t, Attrs attrs = {}) {
    Block* b = at_->parentBlock();
    return b->insert(b->find(at_), f_.createOp(k, std::move(operands), {t}, withRoleOf(*at_, std::move(attrs)), at_->loc()))->result();
  }

  Function& f_;
  Op* at_ = nullptr;  // new ops go right before the op being rewritten

 private:
  void countUses() {
    uses_.clear();
    users_.clear();
    f_.walk([&](const Op& op) {
      for (const Value* v : op.operands()) {
        ++uses_[v];
        users_[v] = &op;
      }
    });
  }

  std::unordered_map<const Value*, int> uses_;
  std::unordered_map<const Value*, const Op*> users_;
};

}  // namespace flextile::ir
