// Canonicalization: local rewrites to a simpler equivalent, applied until
// nothing changes. Folding computes exactly what the interpreter (the semantic
// oracle, ir/Interpreter.h) computes, because both call the scalar semantics
// of ir/Elementwise.h: integers wrap to their width, i1 is 0 or 1, f32/f16/bf16
// ops run in float and round once to their dtype, f64 ops in double. Only
// integer division by zero (a run-time error) is left unfolded.
#include <cmath>

#include "ir/Elementwise.h"
#include "ir/Passes.h"

namespace flextile::ir {

namespace {

// A constant element: `i` for integer dtypes (sign-extended to 64 bits, i1 is
// 0 or 1), `f` for floats.
struct Scalar {
  int64_t i = 0;
  double f = 0;
};

class Canonicalizer {
 public:
  explicit Canonicalizer(Function& f) : f_(f) {}

  bool run() {
    bool any = false;
    for (int round = 0; round < 1000; ++round) {
      changed_ = false;
      block(f_.body());
      if (!changed_) break;
      any = true;
    }
    any |= dce(f_);
    return any;
  }

 private:
  void block(Block& b) {
    for (auto it = b.ops().begin(); it != b.ops().end();) {
      Op* op = it->get();
      ++it;  // `op` may be erased below
      for (auto& region : op->regions()) block(*region);
      rewrite(*op);
    }
  }

  // ---- helpers ----
  std::optional<Scalar> constant(const Value* v) const {
    const Op* d = v->definingOp();
    if (!d || d->kind() != OpKind::Constant || !d->hasAttr("value")) return std::nullopt;
    const Attr& a = d->attrs().at("value");
    Scalar s;
    if (isFloat(v->type().dtype())) {
      // The value the interpreter materializes: rounded once to the dtype.
      if (auto* x = std::get_if<double>(&a)) s.f = toFloatDType(*x, v->type().dtype());
      else if (auto* y = std::get_if<int64_t>(&a)) s.f = toFloatDType(*y, v->type().dtype());
      else return std::nullopt;
    } else if (isInteger(v->type().dtype())) {
      auto* x = std::get_if<int64_t>(&a);
      if (!x) return std::nullopt;
      s.i = *x;
    } else {
      return std::nullopt;
    }
    return s;
  }

  bool isConstantEqual(const Value* v, double value) const {
    auto s = constant(v);
    if (!s) return false;
    if (isFloat(v->type().dtype())) return s->f == value && std::signbit(s->f) == std::signbit(value);
    return double(s->i) == value;
  }

  Value* makeConstant(Op& at, const Type& t, Scalar s) {
    Attr value = isFloat(t.dtype()) ? Attr(toFloatDType(s.f, t.dtype())) : Attr(wrapToWidth(s.i, t.dtype()));
    return insertBefore(at, OpKind::Constant, {}, t, {{"value", value}});
  }

  Value* insertBefore(Op& at, OpKind k, std::vector<Value*> operands, const Type& t, Attrs attrs = {}) {
    Block* b = at.parentBlock();
    return b->insert(b->find(&at), f_.createOp(k, std::move(operands), {t}, withRoleOf(at, std::move(attrs)), at.loc()))->result();
  }

  void replace(Op& op, Value* with) {
    f_.replaceAllUsesWith(op.result(), with);
    op.parentBlock()->erase(&op);
    changed_ = true;
  }

  // ---- rewrites ----
  void rewrite(Op& op) {
    if (op.numResults() == 1 && op.kind() != OpKind::Constant) {
      if (Value* v = simplify(op)) return replace(op, v);
    }
    if (op.kind() == OpKind::For) zeroTripLoop(op);
  }

  Value* simplify(Op& op) {
    const Type& rt = op.result()->type();
    auto operand = [&](size_t i) { return op.operand(i); };
    switch (op.kind()) {
      case OpKind::Splat:
        if (auto s = constant(operand(0))) return makeConstant(op, rt, *s);
        return nullptr;
      case OpKind::Broadcast:
      case OpKind::ExpandDims:
      case OpKind::Reshape:
      case OpKind::Trans: {
        Value* x = operand(0);
        if (x->type() == rt && op.kind() != OpKind::Trans) return x;
        if (op.kind() == OpKind::Trans && x->type() == rt && isIdentityPerm(op)) return x;
        if (auto s = constant(x)) return makeConstant(op, rt, *s);
        if (Op* d = x->definingOp(); d && d->kind() == OpKind::Splat)
          return insertBefore(op, OpKind::Splat, {d->operand(0)}, rt);
        return nullptr;
      }
      case OpKind::ConvertLayout:
        return operand(0)->type() == rt ? operand(0) : nullptr;
      case OpKind::Cast:
        if (operand(0)->type() == rt) return operand(0);
        break;
      case OpKind::Neg:
      case OpKind::Not:
        if (Op* d = operand(0)->definingOp(); d && d->kind() == op.kind() && d->operand(0)->type() == rt)
          return d->operand(0);
        break;
      case OpKind::Select:
        if (auto c = constant(operand(0))) return c->i ? operand(1) : operand(2);
        if (operand(1) == operand(2)) return operand(1);
        break;
      default:
        break;
    }
    if (!op.hasTrait(kElementwise)) return nullptr;
    if (Value* v = algebra(op)) return v;
    // Folding: every operand a constant (scalar or uniform tile).
    std::vector<Scalar> in;
    for (Value* v : op.operands()) {
      auto s = constant(v);
      if (!s) return nullptr;
      in.push_back(*s);
    }
    if (auto r = fold(op, in)) return makeConstant(op, rt, *r);
    return nullptr;
  }

  static bool isIdentityPerm(const Op& op) {
    const auto& perm = op.intsAttr("perm");
    for (size_t i = 0; i < perm.size(); ++i)
      if (perm[i] != int64_t(i)) return false;
    return true;
  }

  // Identities that hold for every value of x (which is why x+0 is only for
  // integers: -0.0 + 0.0 is +0.0, while x + -0.0 and x - 0.0 are exactly x).
  Value* algebra(Op& op) {
    if (op.numOperands() != 2) return nullptr;
    Value *a = op.operand(0), *b = op.operand(1);
    const Type& rt = op.result()->type();
    if (a->type() != rt || b->type() != rt) return nullptr;
    bool fp = isFloat(rt.dtype()), integer = isInteger(rt.dtype());
    auto additiveZero = [&](Value* v) { return isConstantEqual(v, fp ? -0.0 : 0.0); };
    auto one = [&](Value* v) { return isConstantEqual(v, 1.0); };
    switch (op.kind()) {
      case OpKind::Add:
        if (additiveZero(b)) return a;
        if (additiveZero(a)) return b;
        break;
      case OpKind::Sub:
        if (isConstantEqual(b, 0.0)) return a;
        break;
      case OpKind::Mul:
        if (one(b)) return a;
        if (one(a)) return b;
        if (integer && isConstantEqual(b, 0)) return b;
        if (integer && isConstantEqual(a, 0)) return a;
        break;
      case OpKind::Div:
        if (one(b)) return a;
        break;
      case OpKind::Or:
      case OpKind::Xor:
      case OpKind::Shl:
      case OpKind::Shr:
        if (isConstantEqual(b, 0)) return a;
        if (op.kind() != OpKind::Shl && op.kind() != OpKind::Shr && isConstantEqual(a, 0)) return b;
        break;
      case OpKind::And:
        if (isConstantEqual(b, 0)) return b;
        if (isConstantEqual(a, 0)) return a;
        break;
      default:
        break;
    }
    return nullptr;
  }

  static std::optional<Scalar> fold(const Op& op, const std::vector<Scalar>& in) {
    const DType rt = op.result()->type().dtype();
    const DType it = op.operand(0)->type().dtype();
    const bool fp = isFloat(it);
    const Scalar& a = in[0];
    const Scalar& b = in.size() > 1 ? in[1] : in[0];
    Scalar r;
    if (op.hasTrait(kArithmetic)) {
      if (fp) {
        auto v = evaluateFloatArithmetic(op.kind(), it, a.f, b.f);
        if (!v) return std::nullopt;
        r.f = *v;
      } else {
        auto v = evaluateIntArithmetic(op.kind(), it, a.i, b.i);
        if (!v) return std::nullopt;  // a zero divisor: a run-time error in the interpreter, not ours to decide
        r.i = *v;
      }
      return r;
    }
    switch (op.kind()) {
      case OpKind::Cmp: {
        auto pred = parseComparePredicate(op.strAttr("pred"));
        if (!pred) return std::nullopt;
        r.i = withComparePredicate(*pred, [&](auto p) {
          return fp ? compareValues<decltype(p)::value>(a.f, b.f) : compareValues<decltype(p)::value>(a.i, b.i);
        });
        return r;
      }
      case OpKind::Cast:
        if (isFloat(rt)) r.f = fp ? toFloatDType(a.f, rt) : toFloatDType(a.i, rt);
        else r.i = fp ? floatToInt(a.f, rt) : intToInt(a.i, rt);
        return r;
      default:
        return std::nullopt;  // select is handled above; addptr has no pointer constants
    }
  }

  void zeroTripLoop(Op& op) {
    auto lb = constant(op.operand(0)), ub = constant(op.operand(1)), step = constant(op.operand(2));
    if (!lb || !ub || !step || step->i <= 0 || lb->i < ub->i) return;
    for (size_t i = 0; i < op.numResults(); ++i) f_.replaceAllUsesWith(op.result(i), op.operand(3 + i));
    op.parentBlock()->erase(&op);
    changed_ = true;
  }

  Function& f_;
  bool changed_ = false;
};

}  // namespace

bool canonicalize(Function& f) { return Canonicalizer(f).run(); }

Pass canonicalizePass() { return {"canonicalize", [](Function& f) { canonicalize(f); }}; }

}  // namespace flextile::ir
