// Sum regrouping (pass "regroup-sums"): a sum of f32 tiles whose terms include several broadcasts
// of the same smaller shape adds those first, on the smaller tile, and broadcasts the result once:
//
//   (s * c + (bcast(kv') - bcast(q'))) - bcast(lse)          kv': [BN, 1]; q', lse: [1, BM]
//     ==>  (s * c + bcast(kv')) - bcast(q' + lse)
//
// Full-tile ops before: sub, add, sub; after: add, sub (one an FMA with s * c once the NVPTX backend
// contracts it). That is the backward's recomputed P with ALiBi, exp2(s·c + slope'·(kv − q) − lse),
// after fold-scales has scaled the positions.
//
// A max or min reduction of such a sum first takes out the terms that are constant along the
// reduced axis (broadcasts from a shape of extent 1 there, uniform values): max(y + bcast(r)) is
// max(y) + r exactly, since rounding is monotonic. The forward's row maximum of
// s·c + bcast(kv') − bcast(q') becomes max(s·c + bcast(kv')) − q', after which the score's one
// remaining use, exp2(score − bcast(m)), regroups to exp2((s·c + bcast(kv')) − bcast(q' + m)).
//
// A sum is the tree of add, sub and neg ops under one root whose interior values are f32 tiles of
// the root's type, each used once (by its parent) and defined in the root's block. Its terms are
// then sorted by kind: full tiles, broadcasts (grouped by the shape they broadcast from, which must
// be f32) and uniform values (splats and constants, which join the first group of broadcasts). The
// sum is rebuilt, full terms first in their order, then one broadcast per group, only where that
// takes fewer full-tile ops than before. Like fold-scales it reassociates, so it runs only on
// functions with attribute reassociate = 1, after fold-scales and before cse and dce.
#include <algorithm>
#include <functional>

#include "ir/passes/LocalRewriter.h"

namespace flextile::ir {

namespace {

struct Term {
  Value* value;
  bool negative;
};

class SumRegrouper : LocalRewriter {
 public:
  explicit SumRegrouper(Function& f) : LocalRewriter(f) {}

  // A round tries the reductions first (taking their shifts out leaves sums to regroup), then the
  // conversions, then the sums.
  bool run() {
    return untilDone([&] {
      for (Op* reduce : opsWhere([](const Op& op) {
             return op.kind() == OpKind::Reduce && isF32Tile(op.operand(0)) &&
                    (op.strAttr("kind") == "max" || op.strAttr("kind") == "min");
           }))
        if (unshift(*reduce)) return true;
      for (Op* cast : opsWhere([](const Op& op) { return op.kind() == OpKind::Cast && isF32Tile(op.result()); }))
        if (castTerms(*cast)) return true;
      for (Op* root : opsWhere([&](const Op& op) {
             return isSumOp(op) && isF32Tile(op.result()) && !isInterior(op.result(), op.parentBlock());
           }))
        if (regroup(*root)) return true;
      return false;
    });
  }

 private:
  static bool isSumOp(const Op& op) {
    return (op.kind() == OpKind::Add || op.kind() == OpKind::Sub || op.kind() == OpKind::Neg) && op.numResults() == 1;
  }

  // Whether v is part of a larger sum: its one user is a sum op of its type in its block.
  bool isInterior(const Value* v, const Block* block) const {
    if (uses(v) != 1) return false;
    const Op* u = user(v);
    return isSumOp(*u) && u->parentBlock() == block && u->result()->type() == v->type();
  }

  // The terms of the sum rooted at v (v itself when `root`).
  void collect(Value* v, bool negative, bool root, const Block* block, std::vector<Term>& terms) const {
    const Op* d = v->definingOp();
    const bool expand = d && isSumOp(*d) && d->parentBlock() == block && (root || isInterior(v, block));
    if (!expand || d->result()->type() != v->type()) {
      terms.push_back({v, negative});
      return;
    }
    for (size_t i = 0; i < d->numOperands(); ++i)
      if (d->operand(i)->type() != v->type()) {
        terms.push_back({v, negative});
        return;
      }
    if (d->kind() == OpKind::Neg) return collect(d->operand(0), !negative, false, block, terms);
    collect(d->operand(0), negative, false, block, terms);
    collect(d->operand(1), d->kind() == OpKind::Sub ? !negative : negative, false, block, terms);
  }

  static const Op* broadcastOf(const Value* v) {
    const Op* d = v->definingOp();
    if (d && d->kind() == OpKind::Broadcast && d->operand(0)->type().dtype() == DType::F32 &&
        d->operand(0)->type().isTile())
      return d;
    return nullptr;
  }
  // A uniform term as a tile of type t.
  Value* uniformAs(const Value* v, const Type& t) {
    const Op* d = v->definingOp();
    if (d->kind() == OpKind::Splat) return emit(OpKind::Splat, {d->operand(0)}, t);
    return emit(OpKind::Constant, {}, t, {{"value", d->attrs().at("value")}});
  }
  // acc ± term (acc null: the term, negated when it is negative).
  Value* accumulate(Value* acc, Value* term, bool negative) {
    if (!acc) return negative ? emit(OpKind::Neg, {term}, term->type()) : term;
    return emit(negative ? OpKind::Sub : OpKind::Add, {acc, term}, acc->type());
  }

  bool regroup(Op& root) {
    const Block* block = root.parentBlock();
    std::vector<Term> terms;
    collect(root.result(), false, true, block, terms);
    std::vector<Term> full, uniform;
    std::vector<std::pair<Shape, std::vector<Term>>> groups;  // the smaller shape, its terms (sources)
    for (const Term& t : terms) {
      if (const Op* b = broadcastOf(t.value)) {
        const Shape& shape = b->operand(0)->type().shape();
        auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& e) { return e.first == shape; });
        if (g == groups.end()) groups.push_back({shape, {}}), g = groups.end() - 1;
        g->second.push_back({b->operand(0), t.negative});
      } else if (isUniform(t.value)) {
        uniform.push_back(t);
      } else {
        full.push_back(t);
      }
    }
    if (groups.empty()) return false;
    // Full-tile ops: one per term but the first before; one per full term and group after (a
    // leading negative group costs a negation).
    const size_t before = terms.size() - 1;
    const size_t after = full.size() + groups.size() - 1;
    if (after >= before) return false;
    at_ = &root;
    const Type& type = root.result()->type();
    Value* acc = nullptr;
    for (const Term& t : full) acc = accumulate(acc, t.value, t.negative);
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      auto& [shape, sources] = groups[gi];
      const Type small = sources.front().value->type();
      std::vector<Term> parts = sources;
      if (gi == 0)
        for (const Term& u : uniform) parts.push_back({uniformAs(u.value, small), u.negative});
      // The positive parts summed, then the negative ones subtracted (their sum when none is
      // positive, subtracted from the full tile instead).
      Value* pos = nullptr;
      Value* neg = nullptr;
      for (const Term& p : parts) {
        Value*& into = p.negative ? neg : pos;
        into = into ? emit(OpKind::Add, {into, p.value}, small) : p.value;
      }
      Value* groupSum = pos && neg ? emit(OpKind::Sub, {pos, neg}, small) : pos ? pos : neg;
      acc = accumulate(acc, emit(OpKind::Broadcast, {groupSum}, type), !pos);
    }
    f_.replaceAllUsesWith(root.result(), acc);
    root.parentBlock()->erase(&root);
    return true;
  }

  // f32(expand_dims*(splat(s1) + ... + t1 + ...)) with every t the same in every run of the cast's
  // block (ranges, values from outside it) -> expand_dims*(splat(f32(s1 + ...)) + f32(t1 + ...)):
  // f32(t1 + ...) is loop-invariant (cse or LLVM hoists it), so a step converts one scalar instead
  // of every element (int-to-float runs at a fraction of the FP32 rate on the SM). ALiBi's
  // positions: block * BLOCK + arange (+ offset).
  bool castTerms(Op& cast) {
    std::vector<const Op*> expands;  // outermost first
    Value* x = cast.operand(0);
    const Block* block = cast.parentBlock();
    while (const Op* d = x->definingOp()) {
      if (d->kind() != OpKind::ExpandDims || d->parentBlock() != block) break;
      expands.push_back(d);
      x = d->operand(0);
    }
    const Op* sum = x->definingOp();
    if (!sum || sum->kind() != OpKind::Add || sum->parentBlock() != block || !x->type().isTile() ||
        x->type().hasLayout() || !isInteger(x->type().dtype()))
      return false;
    // The integer sum's terms: splatted scalars, and the rest (each the same in every run).
    std::vector<Value*> scalars, rest;
    std::function<void(Value*)> terms = [&](Value* v) {
      const Op* d = v->definingOp();
      if (d && d->kind() == OpKind::Add && d->parentBlock() == block) {
        terms(d->operand(0));
        terms(d->operand(1));
      } else if (d && d->kind() == OpKind::Splat && d->operand(0)->type().isScalar()) {
        scalars.push_back(d->operand(0));
      } else {
        rest.push_back(v);
      }
    };
    terms(x);
    if (scalars.empty() || rest.empty()) return false;
    for (const Value* r : rest)
      if (!invariantIn(r, block)) return false;
    at_ = &cast;
    const Type tf = x->type().withDType(DType::F32);
    Value* s = scalars.front();
    for (size_t i = 1; i < scalars.size(); ++i) s = emit(OpKind::Add, {s, scalars[i]}, s->type());
    Value* t = rest.front();
    for (size_t i = 1; i < rest.size(); ++i) t = emit(OpKind::Add, {t, rest[i]}, t->type());
    Value* value = emit(OpKind::Add, {emit(OpKind::Splat, {emit(OpKind::Cast, {s}, Type(DType::F32))}, tf),
                                      emit(OpKind::Cast, {t}, tf)},
                        tf);
    for (auto it = expands.rbegin(); it != expands.rend(); ++it)
      value = emit(OpKind::ExpandDims, {value}, (*it)->result()->type().withDType(DType::F32), (*it)->attrs());
    f_.replaceAllUsesWith(cast.result(), value);
    cast.parentBlock()->erase(&cast);
    return true;
  }

  static bool encloses(const Block* outer, const Block* inner) {
    for (const Block* b = inner; b; b = b->parentOp() ? b->parentOp()->parentBlock() : nullptr)
      if (b == outer) return true;
    return false;
  }

  // reduce(max|min, axis)(y ± shifts) -> reduce(y) ± shifts, the shifts constant along the axis.
  bool unshift(Op& reduce) {
    Value* x = reduce.operand(0);
    const Op* d = x->definingOp();
    const Block* block = reduce.parentBlock();
    if (!d || !isSumOp(*d) || d->parentBlock() != block) return false;
    const int64_t axis = reduce.hasAttr("axis") ? reduce.intAttr("axis") : -1;
    const Type& resultType = reduce.result()->type();
    if (axis < 0 || axis >= x->type().rank() || resultType.rank() != x->type().rank() - 1) return false;
    std::vector<Term> terms, rest, shifts;
    collect(x, false, true, block, terms);
    for (const Term& t : terms) {
      const Op* b = broadcastOf(t.value);
      const bool constantAlongAxis =
          isUniform(t.value) || (b && b->operand(0)->type().rank() == x->type().rank() &&
                                 b->operand(0)->type().shape()[size_t(axis)] == 1);
      (constantAlongAxis ? shifts : rest).push_back(t);
    }
    if (shifts.empty() || rest.empty()) return false;
    at_ = &reduce;
    Value* y = nullptr;
    for (const Term& t : rest) y = accumulate(y, t.value, t.negative);
    Value* reduced = emit(OpKind::Reduce, {y}, resultType, reduce.attrs());
    for (const Term& t : shifts) {
      Value* shift = isUniform(t.value) ? uniformAs(t.value, resultType)
                                        : emit(OpKind::Reshape, {broadcastOf(t.value)->operand(0)}, resultType);
      reduced = emit(t.negative ? OpKind::Sub : OpKind::Add, {reduced, shift}, resultType);
    }
    f_.replaceAllUsesWith(reduce.result(), reduced);
    reduce.parentBlock()->erase(&reduce);
    return true;
  }

};

}  // namespace

bool regroupSums(Function& f) { return SumRegrouper(f).run(); }

Pass regroupSumsPass() {
  return {"regroup-sums", [](Function& f) {
            if (f.intAttrOr("reassociate", 0) != 0) regroupSums(f);
          }};
}

}  // namespace flextile::ir
