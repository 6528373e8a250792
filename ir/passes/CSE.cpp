// Common subexpression elimination over the region tree. The table of
// available expressions is scoped: entering a for body pushes a scope, so an
// op in the body may be replaced by an equal op before the loop, but an op
// after the loop never reuses one defined inside it (that value would not
// dominate).
#include <algorithm>
#include <unordered_map>

#include "ir/Passes.h"
#include "ir/Printer.h"

namespace flextile::ir {

namespace {

class CSE {
 public:
  explicit CSE(Function& f) : f_(f) {}

  bool run() {
    block(f_.body());
    return changed_;
  }

 private:
  static bool candidate(const Op& op) {
    return op.hasTrait(kPure) && op.regions().empty() && op.numResults() > 0;
  }

  // Two ops compute the same value iff their keys are equal.
  static std::string key(const Op& op) {
    std::vector<int> ids;
    for (const Value* v : op.operands()) ids.push_back(v->id());
    if (op.hasTrait(kCommutative)) std::sort(ids.begin(), ids.end());
    std::string k(op.name());
    k += '(';
    for (int id : ids) k += std::to_string(id) + ',';
    k += "){";
    for (const auto& [name, value] : op.attrs()) k += name + '=' + printAttr(value) + ',';
    k += "}:";
    for (const Value* r : op.results()) k += typeString(r->type()) + ',';
    return k;
  }

  Op* lookup(const std::string& k) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (auto f = it->find(k); f != it->end()) return f->second;
    return nullptr;
  }

  void block(Block& b) {
    scopes_.emplace_back();
    for (auto it = b.ops().begin(); it != b.ops().end();) {
      Op* op = it->get();
      ++it;
      for (auto& region : op->regions()) block(*region);
      if (!candidate(*op)) continue;
      std::string k = key(*op);
      if (Op* same = lookup(k)) {
        for (size_t i = 0; i < op->numResults(); ++i) f_.replaceAllUsesWith(op->result(i), same->result(i));
        b.erase(op);
        changed_ = true;
      } else {
        scopes_.back().emplace(std::move(k), op);
      }
    }
    scopes_.pop_back();
  }

  Function& f_;
  std::vector<std::unordered_map<std::string, Op*>> scopes_;
  bool changed_ = false;
};

}  // namespace

bool cse(Function& f) { return CSE(f).run(); }

Pass csePass() { return {"cse", [](Function& f) { cse(f); }}; }

}  // namespace flextile::ir
