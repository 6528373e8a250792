// Reverse-mode differentiation of a straight-line slice (see ReverseMode.h for
// the rules). Three sweeps over the slice: forward for what is varied,
// backward for what is useful, then backward again emitting, per op whose
// result has an adjoint, the contributions to its active operands. Emitted
// ops are created one statement at a time, never two in the arguments of one
// call (whose evaluation order C++ leaves open), so the output is the same
// with every compiler.
#include "ir/passes/ReverseMode.h"

#include <cmath>
#include <map>
#include <numbers>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace flextile::ir {

namespace {

bool isFloatValue(const Value* v) { return !v->type().isPointer() && isFloat(v->type().dtype()); }

// Whether the op's result depends differentiably on operand `i`. Integer,
// boolean and pointer values never carry a derivative, so comparisons, select
// conditions, casts from or to integers and addptr fall out of the float
// checks; a load's pointer and mask are not differentiable, its `other` is.
bool differentiableOperand(const Op& op, size_t i) {
  if (op.numResults() != 1 || !isFloatValue(op.result()) || !isFloatValue(op.operand(i))) return false;
  switch (op.kind()) {
    case OpKind::Load: return i == 2;
    case OpKind::Select: return i >= 1;
    default: return true;
  }
}

// What an op that cannot be differentiated contains, for the error message.
const char* undifferentiable(OpKind k) {
  switch (k) {
    case OpKind::For: return "a run-time loop";
    case OpKind::Yield:
    case OpKind::Return: return "a terminator";
    case OpKind::Store: return "a store";
    default: return nullptr;
  }
}

class ReverseMode {
 public:
  ReverseMode(Builder& b, const ReverseModeRequest& r) : b_(b), r_(r) {}

  std::vector<Value*> run() {
    check();
    findActive();
    const Location callerLoc = b_.loc();
    if (active_.count(r_.output)) adjoint_[r_.output] = r_.seed;
    for (auto it = r_.ops.rbegin(); it != r_.ops.rend(); ++it) {
      const Op& op = **it;
      if (op.numResults() != 1 || !adjoint_.count(op.result())) continue;
      b_.setLoc(op.loc());
      differentiate(op, adjoint_.at(op.result()));
      if (isDifferentiableLoad(op)) r_.onLoadAdjoint(b_, op, adjoint_.at(op.result()));
    }
    b_.setLoc(callerLoc);
    std::vector<Value*> out;
    for (Value* x : r_.wrt) {
      auto it = adjoint_.find(x);
      out.push_back(it != adjoint_.end() ? it->second : constant(x->type(), 0.0));
    }
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw Error(r_.subject + " cannot be differentiated: " + why);
  }

  void check() const {
    if (!r_.output) fail("no output value");
    if (!isFloatValue(r_.output)) fail("its result is " + r_.output->type().str() + ", not a float");
    if (!r_.seed || r_.seed->type() != r_.output->type())
      fail("the seed is " + (r_.seed ? r_.seed->type().str() : std::string("missing")) + ", the output " +
           r_.output->type().str());
    for (const Value* x : r_.wrt)
      if (x->type().isPointer()) fail("a pointer (" + x->type().str() + ") has no adjoint");
    if (r_.isDifferentiableLoad && !r_.onLoadAdjoint) fail("differentiable loads need an onLoadAdjoint callback");
    if (r_.ops.empty()) return;
    // One block, in program order.
    Block* block = r_.ops.front()->parentBlock();
    std::unordered_map<const Op*, size_t> position;
    if (block) {
      size_t i = 0;
      for (const auto& op : block->ops()) position[op.get()] = i++;
    }
    for (size_t i = 0; i < r_.ops.size(); ++i) {
      const Op* op = r_.ops[i];
      if (const char* what = undifferentiable(op->kind()))
        fail(std::string("it contains ") + what + " (" + op->describe() + ")");
      if (!block || op->parentBlock() != block) fail("its ops are not in one block (" + op->describe() + ")");
      if (i && position.at(op) <= position.at(r_.ops[i - 1]))
        fail("its ops are not in program order (" + op->describe() + ")");
      auto hasLayout = [](const Value* v) { return v->type().hasLayout(); };
      for (const Value* v : op->operands())
        if (hasLayout(v)) fail("it runs after layout assignment (" + op->describe() + ")");
      for (const Value* v : op->results())
        if (hasLayout(v)) fail("it runs after layout assignment (" + op->describe() + ")");
    }
  }

  bool isDifferentiableLoad(const Op& op) const {
    return op.kind() == OpKind::Load && isFloatValue(op.result()) && r_.isDifferentiableLoad &&
           r_.isDifferentiableLoad(op);
  }

  // Active = varied (depends on a wrt value or a differentiable load) and
  // useful (the output depends on it).
  void findActive() {
    std::unordered_set<const Value*> varied(r_.wrt.begin(), r_.wrt.end());
    for (const Op* op : r_.ops) {
      bool v = isDifferentiableLoad(*op);
      for (size_t i = 0; i < op->numOperands() && !v; ++i)
        v = differentiableOperand(*op, i) && varied.count(op->operand(i));
      if (v) varied.insert(op->result());
    }
    std::unordered_set<const Value*> useful{r_.output};
    for (auto it = r_.ops.rbegin(); it != r_.ops.rend(); ++it) {
      const Op& op = **it;
      if (op.numResults() != 1 || !useful.count(op.result())) continue;
      for (size_t i = 0; i < op.numOperands(); ++i)
        if (differentiableOperand(op, i)) useful.insert(op.operand(i));
    }
    for (const Value* v : varied)
      if (useful.count(v)) active_.insert(v);
  }

  bool active(const Value* v) const { return active_.count(v) != 0; }

  // Adds a contribution to x's adjoint (subtracts it when `negated`), if x is active.
  void accumulate(Value* x, Value* contribution, bool negated = false) {
    if (!active(x)) return;
    auto it = adjoint_.find(x);
    if (it == adjoint_.end()) {
      adjoint_[x] = negated ? neg(contribution) : contribution;
    } else {
      it->second = b_.binary(negated ? OpKind::Sub : OpKind::Add, it->second, contribution);
    }
  }

  // ---- emission helpers: each skips what it can prove is an identity ----

  // One constant per type and value.
  Value* constant(const Type& t, double value) {
    std::ostringstream key;
    key << t.str() << '=' << std::hexfloat << value;
    auto [it, fresh] = constants_.try_emplace(key.str(), nullptr);
    if (fresh) it->second = b_.constant(t, value);
    return it->second;
  }

  static bool isConstant(const Value* v, double value) {
    const Op* d = v->definingOp();
    if (d && d->kind() == OpKind::Splat) d = d->operand(0)->definingOp();
    if (!d || d->kind() != OpKind::Constant || !d->hasAttr("value")) return false;
    const Attr& a = d->attrs().at("value");
    if (auto* f = std::get_if<double>(&a)) return *f == value;
    if (auto* i = std::get_if<int64_t>(&a)) return double(*i) == value;
    return false;
  }

  Value* neg(Value* x) {
    if (const Op* d = x->definingOp(); d && d->kind() == OpKind::Neg) return d->operand(0);
    return b_.unary(OpKind::Neg, x);
  }
  Value* mul(Value* x, Value* y) {
    if (isConstant(y, 1)) return x;
    if (isConstant(x, 1)) return y;
    return b_.binary(OpKind::Mul, x, y);
  }
  Value* mul(Value* x, double c) { return c == 1 ? x : mul(x, constant(x->type(), c)); }
  Value* div(Value* x, Value* y) { return isConstant(y, 1) ? x : b_.binary(OpKind::Div, x, y); }
  Value* zeroLike(const Value* x) { return constant(x->type(), 0.0); }

  // g summed over every dim, to a scalar.
  Value* sumAll(Value* g) {
    while (g->type().isTile()) g = b_.reduce(g, g->type().rank() - 1, "sum");
    return g;
  }

  // g summed to `shape`, whose dims are each g's or 1 (the inverse of a broadcast).
  Value* sumToShape(Value* g, const Shape& shape) {
    const Shape& from = g->type().shape();
    std::vector<int> summed;
    for (int d = int(from.size()) - 1; d >= 0; --d)
      if (shape[size_t(d)] == 1 && from[size_t(d)] != 1) summed.push_back(d);
    if (summed.empty()) return g;
    for (int d : summed) g = b_.reduce(g, d, "sum");  // descending, so the remaining axes keep their numbers
    if (g->type().isScalar()) return b_.splat(g, shape);
    if (summed.size() == 1) return b_.expandDims(g, summed.front());
    return b_.reshape(g, shape);
  }

  // g (x's shape without `axis`) repeated along `axis` to x's shape.
  Value* repeatAlong(Value* g, int axis, const Shape& shape) {
    if (g->type().isScalar()) return b_.splat(g, shape);
    return b_.broadcast(b_.expandDims(g, axis), shape);
  }

  // The share of g that `first` gets from maximum(first, second) (minimum
  // when `wins` is "lt"): all of it where it wins, half where they tie.
  Value* extremumShare(Value* g, Value* first, Value* second, const char* wins) {
    Value* win = b_.cmp(wins, first, second);
    Value* tie = b_.cmp("eq", first, second);
    Value* half = mul(g, 0.5);
    Value* tieShare = b_.select(tie, half, zeroLike(g));
    return b_.select(win, g, tieShare);
  }

  // ---- the rules ----
  void differentiate(const Op& op, Value* g) {
    Value* y = op.result();
    auto x = [&](size_t i) { return op.operand(i); };
    switch (op.kind()) {
      case OpKind::Neg: return accumulate(x(0), g, /*negated=*/true);
      case OpKind::Exp: return accumulate(x(0), mul(g, y));
      case OpKind::Exp2: return accumulate(x(0), mul(mul(g, y), std::numbers::ln2));
      case OpKind::Log: return accumulate(x(0), div(g, x(0)));
      case OpKind::Log2: return accumulate(x(0), mul(div(g, x(0)), std::numbers::log2e));
      case OpKind::Tanh: {
        Value* square = b_.binary(OpKind::Mul, y, y);
        Value* slope = b_.binary(OpKind::Sub, constant(y->type(), 1.0), square);
        return accumulate(x(0), mul(g, slope));
      }
      case OpKind::Sqrt: return accumulate(x(0), div(g, b_.binary(OpKind::Add, y, y)));
      case OpKind::Rsqrt: return accumulate(x(0), mul(mul(g, div(y, x(0))), -0.5));
      case OpKind::Abs: {
        Value* zero = zeroLike(x(0));
        Value* positive = b_.cmp("gt", x(0), zero);
        Value* negative = b_.cmp("lt", x(0), zero);
        return accumulate(x(0), b_.select(positive, g, b_.select(negative, neg(g), zero)));
      }
      case OpKind::Add:
        accumulate(x(0), g);
        return accumulate(x(1), g);
      case OpKind::Sub:
        accumulate(x(0), g);
        return accumulate(x(1), g, /*negated=*/true);
      case OpKind::Mul:
        if (x(0) == x(1)) {  // x*x: 2*g*x, as one product added to itself
          Value* t = mul(g, x(0));
          return accumulate(x(0), b_.binary(OpKind::Add, t, t));
        }
        if (active(x(0))) accumulate(x(0), mul(g, x(1)));
        if (active(x(1))) accumulate(x(1), mul(g, x(0)));
        return;
      case OpKind::Div: {
        Value* da = div(g, x(1));
        accumulate(x(0), da);
        if (active(x(1))) accumulate(x(1), mul(da, y), /*negated=*/true);
        return;
      }
      case OpKind::Rem:  // fmod: y = a - trunc(a/b)*b, and trunc(a/b) = (a - y)/b
        accumulate(x(0), g);
        if (active(x(1))) accumulate(x(1), mul(g, div(b_.binary(OpKind::Sub, x(0), y), x(1))), /*negated=*/true);
        return;
      case OpKind::Maximum:
      case OpKind::Minimum: {
        const char* wins = op.kind() == OpKind::Maximum ? "gt" : "lt";
        if (active(x(0))) {
          Value* da = extremumShare(g, x(0), x(1), wins);
          accumulate(x(0), da);
          if (active(x(1))) accumulate(x(1), b_.binary(OpKind::Sub, g, da));
        } else if (active(x(1))) {
          accumulate(x(1), extremumShare(g, x(1), x(0), wins));
        }
        return;
      }
      case OpKind::Select:
        if (x(1) == x(2)) return accumulate(x(1), g);
        if (active(x(1))) accumulate(x(1), b_.select(x(0), g, zeroLike(g)));
        if (active(x(2))) accumulate(x(2), b_.select(x(0), zeroLike(g), g));
        return;
      case OpKind::Cast: return accumulate(x(0), b_.cast(g, x(0)->type().dtype()));
      case OpKind::Splat: return accumulate(x(0), sumAll(g));
      case OpKind::Broadcast:
        if (x(0)->type().isScalar()) return accumulate(x(0), sumAll(g));
        return accumulate(x(0), sumToShape(g, x(0)->type().shape()));
      case OpKind::ExpandDims:
      case OpKind::Reshape:
        if (x(0)->type().isScalar()) return accumulate(x(0), sumAll(g));  // a [1] (or [1,1]) back to the scalar
        return accumulate(x(0), b_.reshape(g, x(0)->type().shape()));
      case OpKind::Trans: {
        const auto& perm = op.intsAttr("perm");
        std::vector<int64_t> inverse(perm.size());
        for (size_t i = 0; i < perm.size(); ++i) inverse[size_t(perm[i])] = int64_t(i);
        return accumulate(x(0), b_.trans(g, inverse));
      }
      case OpKind::Reduce: {
        const int axis = int(op.intAttr("axis"));
        const Shape& shape = x(0)->type().shape();
        const std::string& kind = op.strAttr("kind");
        if (kind == "sum") return accumulate(x(0), repeatAlong(g, axis, shape));
        // max/min: the tied extrema share g evenly.
        Value* winner = b_.cmp("eq", x(0), repeatAlong(y, axis, shape));
        Value* share = g;
        if (shape[size_t(axis)] != 1) {
          Value* count = b_.reduce(b_.cast(winner, x(0)->type().dtype()), axis, "sum");
          share = div(g, count);
        }
        Value* repeated = repeatAlong(share, axis, shape);
        return accumulate(x(0), b_.select(winner, repeated, zeroLike(x(0))));
      }
      case OpKind::Dot: {
        Value *a = x(0), *bm = x(1);
        const DType inputs = a->type().dtype();
        Value* gIn = g->type().dtype() == inputs ? g : b_.cast(g, inputs);
        // The products keep the forward dot's attributes (its input_precision).
        auto product = [&](Value* l, Value* r, Value* like) {
          Type t = g->type().withShape({l->type().shape()[0], r->type().shape()[1]});
          Value* p = b_.create1(OpKind::Dot, {l, r, constant(t, 0.0)}, t, op.attrs());
          return p->type().dtype() == like->type().dtype() ? p : b_.cast(p, like->type().dtype());
        };
        if (active(a)) accumulate(a, product(gIn, b_.trans(bm, {1, 0}), a));
        if (active(bm)) accumulate(bm, product(b_.trans(a, {1, 0}), gIn, bm));
        return accumulate(x(2), g);
      }
      case OpKind::Load:
        if (op.numOperands() == 3 && active(x(2))) accumulate(x(2), b_.select(x(1), zeroLike(g), g));
        return;
      default:
        fail("no derivative rule for " + op.describe());
    }
  }

  Builder& b_;
  const ReverseModeRequest& r_;
  std::unordered_set<const Value*> active_;
  std::unordered_map<const Value*, Value*> adjoint_;
  std::map<std::string, Value*> constants_;
};

// ---- the test pass ----

std::vector<std::string> splitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    size_t b = item.find_first_not_of(' '), e = item.find_last_not_of(' ');
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

void reverseModeTest(Function& f) {
  auto attr = [&](const std::string& k) -> std::string {
    auto it = f.attrs().find(k);
    if (it == f.attrs().end()) return "";
    if (auto* s = std::get_if<std::string>(&it->second)) return *s;
    throw Error("reverse-mode: @" + f.name() + ": attribute " + k + " must be a string");
  };
  if (attr("grad_output").empty()) return;
  std::unordered_map<std::string, Value*> named;
  for (Value* p : f.params()) named[p->nameHint()] = p;
  for (const auto& op : f.body().ops())
    for (Value* v : op->results())
      if (!v->nameHint().empty()) named[v->nameHint()] = v;
  auto lookup = [&](const std::string& name) {
    auto it = named.find(name);
    if (it == named.end()) throw Error("reverse-mode: @" + f.name() + " has no value %" + name + " in its body");
    return it->second;
  };

  ReverseModeRequest r;
  r.output = lookup(attr("grad_output"));
  r.seed = lookup(attr("grad_seed"));
  for (const auto& n : splitList(attr("grad_wrt"))) r.wrt.push_back(lookup(n));
  std::vector<Value*> stores;
  for (const auto& n : splitList(attr("grad_store"))) stores.push_back(lookup(n));
  if (stores.size() != r.wrt.size())
    throw Error("reverse-mode: @" + f.name() + ": grad_store needs one pointer per grad_wrt value");
  std::unordered_map<const Value*, Value*> loadStores;
  for (const auto& pair : splitList(attr("grad_loads"))) {
    size_t colon = pair.find(':');
    if (colon == std::string::npos) throw Error("reverse-mode: @" + f.name() + ": grad_loads takes load:pointer pairs");
    loadStores[lookup(pair.substr(0, colon))] = lookup(pair.substr(colon + 1));
  }
  r.isDifferentiableLoad = [&](const Op& load) { return loadStores.count(load.result()) != 0; };
  r.onLoadAdjoint = [&](Builder& b, const Op& load, Value* adjoint) { b.store(loadStores.at(load.result()), adjoint); };

  Op* last = r.output->definingOp();
  if (!last || last->parentBlock() != &f.body())
    throw Error("reverse-mode: @" + f.name() + ": grad_output must be defined by an op of the body");
  auto begin = f.body().ops().begin();
  for (auto it = f.body().ops().begin(); it->get() != last; ++it)
    for (Value* w : r.wrt)
      if (w->definingOp() == it->get()) begin = std::next(it);
  for (auto it = begin;; ++it) {
    r.ops.push_back(it->get());
    if (it->get() == last) break;
  }

  Builder b(f);
  b.setInsertionPointAfter(last);
  std::vector<Value*> adjoints = emitReverseMode(b, r);
  for (size_t i = 0; i < adjoints.size(); ++i) b.store(stores[i], adjoints[i]);
  for (const char* k : {"grad_output", "grad_seed", "grad_wrt", "grad_store", "grad_loads"}) f.attrs().erase(k);
}

}  // namespace

std::vector<Value*> emitReverseMode(Builder& b, const ReverseModeRequest& r) { return ReverseMode(b, r).run(); }

Pass reverseModeTestPass() { return {"reverse-mode", reverseModeTest}; }

}  // namespace flextile::ir
