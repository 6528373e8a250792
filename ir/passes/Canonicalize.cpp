// Canonicalization: local rewrites to a simpler equivalent, applied until
// nothing changes. Folding computes exactly what the interpreter (the semantic
// oracle, ir/Interpreter.h) computes: integers wrap to their width, i1 is 0 or
// 1, f32/f16/bf16 ops run in float and round once to their dtype (to nearest
// even), f64 ops in double, maximum/minimum propagate NaN and order -0 < +0,
// shifts past the width give 0 or the sign fill, float->int casts saturate.
// Only integer division by zero (a run-time error) is left unfolded.
#include <cmath>
#include <cstring>
#include <limits>

#include "ir/Passes.h"

namespace flextile::ir {

namespace {

// A constant element: `i` for integer dtypes (sign-extended to 64 bits, i1 is
// 0 or 1), `f` for floats.
struct Scalar {
  int64_t i = 0;
  double f = 0;
};

int64_t wrapInt(uint64_t v, DType t) {
  switch (t) {
    case DType::I1: return int64_t(v & 1);
    case DType::I8: return int8_t(uint8_t(v));
    case DType::I32: return int32_t(uint32_t(v));
    default: return int64_t(v);
  }
}

// Rounds a double to a float format with `precision` significand bits and
// smallest normal exponent `minExp` (as frexp counts: 0.5 <= m < 1), with
// round-to-nearest-even, overflowing to infinity.
double roundToFormat(double v, int precision, int minExp, double maxFinite) {
  if (!std::isfinite(v) || v == 0) return v;
  int e = 0;
  std::frexp(v, &e);
  double ulp = std::ldexp(1.0, std::max(e, minExp) - precision);
  double r = std::nearbyint(v / ulp) * ulp;  // exact scaling by a power of two; default rounding is to-nearest-even
  if (std::fabs(r) > maxFinite) return std::copysign(std::numeric_limits<double>::infinity(), v);
  return r;
}

double roundFloat(double v, DType t) {
  switch (t) {
    case DType::F32: return double(float(v));
    case DType::F16: return roundToFormat(v, 11, -13, 65504.0);
    case DType::BF16: return roundToFormat(v, 8, -125, 3.3895313892515355e38);
    default: return v;
  }
}

// Float element-wise ops in the precision the interpreter uses: T is float for
// f32/f16/bf16 (the caller rounds to the dtype), double for f64.
template <class T>
std::optional<double> foldFloat(OpKind k, T a, T b) {
  switch (k) {
    case OpKind::Neg: return -a;
    case OpKind::Abs: return std::fabs(a);
    case OpKind::Exp: return std::exp(a);
    case OpKind::Exp2: return std::exp2(a);
    case OpKind::Log: return std::log(a);
    case OpKind::Log2: return std::log2(a);
    case OpKind::Tanh: return std::tanh(a);
    case OpKind::Sqrt: return std::sqrt(a);
    case OpKind::Rsqrt: return T(1) / std::sqrt(a);
    case OpKind::Add: return a + b;
    case OpKind::Sub: return a - b;
    case OpKind::Mul: return a * b;
    case OpKind::Div: return a / b;
    case OpKind::Rem: return std::fmod(a, b);
    case OpKind::Maximum:
      if (std::isnan(a) || std::isnan(b)) return a + b;
      if (a == b) return std::signbit(a) ? b : a;
      return a > b ? a : b;
    case OpKind::Minimum:
      if (std::isnan(a) || std::isnan(b)) return a + b;
      if (a == b) return std::signbit(a) ? a : b;
      return a < b ? a : b;
    default: return std::nullopt;
  }
}

// An integer rounded once to a float dtype. Beyond 2^53 the int is first
// rounded to odd in a double (53 bits, at least two more than f16/bf16/f32
// keep), which makes the final rounding to nearest even exact.
double intToFloat(int64_t v, DType t) {
  if (t == DType::F64) return double(v);
  if (t == DType::F32) return double(float(v));
  uint64_t mag = v < 0 ? 0 - uint64_t(v) : uint64_t(v);
  double d;
  if (mag <= (uint64_t(1) << 53)) {
    d = double(mag);
  } else {
    int shift = 64 - __builtin_clzll(mag) - 53;
    uint64_t kept = mag >> shift;
    if (mag & ((uint64_t(1) << shift) - 1)) kept |= 1;
    d = std::ldexp(double(kept), shift);
  }
  return roundFloat(v < 0 ? -d : d, t);
}

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
      if (auto* x = std::get_if<double>(&a)) s.f = roundFloat(*x, v->type().dtype());
      else if (auto* y = std::get_if<int64_t>(&a)) s.f = intToFloat(*y, v->type().dtype());
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
    Attr value = isFloat(t.dtype()) ? Attr(roundFloat(s.f, t.dtype())) : Attr(wrapInt(uint64_t(s.i), t.dtype()));
    return insertBefore(at, OpKind::Constant, {}, t, {{"value", value}});
  }

  Value* insertBefore(Op& at, OpKind k, std::vector<Value*> operands, const Type& t, Attrs attrs = {}) {
    Block* b = at.parentBlock();
    return b->insert(b->find(&at), f_.createOp(k, std::move(operands), {t}, std::move(attrs), at.loc()))->result();
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
    DType rt = op.result()->type().dtype();
    DType it = op.operand(0)->type().dtype();
    bool fp = isFloat(it);
    int bits = bitWidth(it);
    Scalar r;
    auto f1 = [&](double v) -> std::optional<Scalar> {
      r.f = v;
      return r;
    };
    auto i1 = [&](uint64_t v) -> std::optional<Scalar> {
      r.i = int64_t(v);
      return r;
    };
    const Scalar& a = in[0];
    const Scalar& b = in.size() > 1 ? in[1] : in[0];
    uint64_t ua = uint64_t(a.i), ub = uint64_t(b.i);
    if (fp && op.kind() != OpKind::Cmp && op.kind() != OpKind::Cast) {
      auto v = it == DType::F64 ? foldFloat<double>(op.kind(), a.f, b.f)
                                : foldFloat<float>(op.kind(), float(a.f), float(b.f));
      if (!v) return std::nullopt;
      return f1(*v);
    }
    switch (op.kind()) {
      case OpKind::Neg: return i1(0 - ua);
      case OpKind::Not: return i1(~ua);
      case OpKind::Abs: return i1(a.i < 0 ? 0 - ua : ua);
      case OpKind::Add: return i1(ua + ub);
      case OpKind::Sub: return i1(ua - ub);
      case OpKind::Mul: return i1(ua * ub);
      case OpKind::Div:
      case OpKind::Rem: {
        bool div = op.kind() == OpKind::Div;
        if (b.i == 0) return std::nullopt;  // a run-time error in the interpreter; not ours to decide
        if (b.i == -1) return i1(div ? 0 - ua : 0);  // INT_MIN / -1 wraps
        return i1(uint64_t(div ? a.i / b.i : a.i % b.i));
      }
      case OpKind::Maximum: return i1(uint64_t(std::max(a.i, b.i)));
      case OpKind::Minimum: return i1(uint64_t(std::min(a.i, b.i)));
      case OpKind::And: return i1(ua & ub);
      case OpKind::Or: return i1(ua | ub);
      case OpKind::Xor: return i1(ua ^ ub);
      case OpKind::Shl:
      case OpKind::Shr: {
        uint64_t amount = bits == 64 ? ub : ub & ((uint64_t(1) << bits) - 1);  // read as unsigned
        if (op.kind() == OpKind::Shl) return i1(amount >= uint64_t(bits) ? 0 : ua << amount);
        if (it == DType::I1) return i1(ua);  // the only bit is the sign bit
        if (amount >= uint64_t(bits)) return i1(a.i < 0 ? ~uint64_t(0) : 0);
        return i1(uint64_t(a.i >> amount));  // a is sign-extended, so this is the arithmetic shift
      }
      case OpKind::Cmp: {
        const std::string& p = op.strAttr("pred");
        auto cmp = [&](auto x, auto y) -> std::optional<Scalar> {
          bool v = p == "eq" ? x == y : p == "ne" ? x != y : p == "lt" ? x < y : p == "le" ? x <= y
                 : p == "gt" ? x > y : p == "ge" ? x >= y : false;
          r.i = v;
          return r;
        };
        return fp ? cmp(a.f, b.f) : cmp(a.i, b.i);
      }
      case OpKind::Cast: {
        if (rt == DType::I1) return i1(fp ? a.f != 0 : a.i != 0);
        if (isFloat(rt)) {
          return f1(fp ? a.f : intToFloat(a.i, rt));
        }
        if (!fp) return i1(ua);
        // Float to int truncates toward zero and saturates; NaN gives 0.
        if (std::isnan(a.f)) return i1(0);
        const int rbits = bitWidth(rt);
        const int64_t maxValue = rbits == 64 ? std::numeric_limits<int64_t>::max() : (int64_t(1) << (rbits - 1)) - 1;
        const int64_t minValue = rbits == 64 ? std::numeric_limits<int64_t>::min() : -(int64_t(1) << (rbits - 1));
        double t = std::trunc(a.f), lim = std::ldexp(1.0, rbits - 1);
        if (t >= lim) return i1(uint64_t(maxValue));
        if (t < -lim) return i1(uint64_t(minValue));
        return i1(uint64_t(int64_t(t)));
      }
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
