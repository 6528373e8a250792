// emitReverseMode: every rule checked end to end against central finite
// differences. Each case is a small "mod" built with the Builder; the harness
// traces it twice — a forward kernel that stores y, and a backward kernel that
// appends the adjoint computation after the mod's ops and stores the adjoints
// — and runs both through the interpreter. The objective is L = sum(seed * y)
// for a random seed, so dL/dx is what the adjoints must be. Loads the mod makes
// from trainable captured tensors hand their adjoints to a callback that
// scatter-adds them (load, add, store: the cases read each element once per
// load) into a gradient buffer, which is compared with finite differences of
// the tensor in memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "TestPrograms.h"
#include "ir/Interpreter.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "ir/passes/ReverseMode.h"
#include "tests/ThrownMessage.h"

namespace flextile::ir {
namespace {

// The mod: given the differentiated inputs (loaded tiles) and the pointers of
// the captured tensors, builds its ops and returns its result.
using Mod = std::function<Value*(Builder&, const std::vector<Value*>& inputs, const std::vector<Value*>& captured)>;

struct Captured {
  Shape shape;
  bool trainable = true;
};

struct Problem {
  DType dtype = DType::F64;
  std::vector<Shape> inputs;      // differentiated (wrt), loaded before the mod
  std::vector<Captured> captured; // read by the mod's own loads
  Mod mod;
};

struct Data {
  std::vector<std::vector<double>> inputs, captured;
};

// Pointers to the row-major elements of a tensor of `shape` at `base` (the
// scalar pointer itself for a scalar).
Value* rowMajorPointers(Builder& b, Value* base, const Shape& shape) {
  if (shape.empty()) return base;
  Value* offsets = nullptr;
  int64_t stride = 1;
  for (int d = int(shape.size()) - 1; d >= 0; --d) {
    Shape alone(shape.size(), 1);
    alone[size_t(d)] = shape[size_t(d)];
    Value* index = b.arange(0, shape[size_t(d)]);
    if (shape.size() > 1) index = b.broadcast(b.reshape(index, alone), shape);
    if (stride != 1) index = b.binary(OpKind::Mul, index, b.constantInt(Type(DType::I32, shape), stride));
    offsets = offsets ? b.binary(OpKind::Add, offsets, index) : index;
    stride *= shape[size_t(d)];
  }
  return b.addptr(b.splat(base, shape), offsets);
}

// The parameter a pointer value derives from (through splat, broadcast, addptr...).
const Value* basePointer(const Value* p) {
  while (p->definingOp() && p->type().isPointer()) p = p->definingOp()->operand(0);
  return p;
}

// The same pointer computation with `from` replaced by `to` (the gradient buffer).
Value* rebase(Builder& b, Value* p, const Value* from, Value* to) {
  if (p == from) return to;
  Op* d = p->definingOp();
  std::vector<Value*> operands = d->operands();
  operands[0] = rebase(b, operands[0], from, to);
  return b.create1(d->kind(), operands, p->type(), d->attrs());
}

std::vector<unsigned char> toBytes(DType t, const std::vector<double>& v) {
  std::vector<unsigned char> out(v.size() * size_t(byteWidth(t)));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::F64) std::memcpy(&out[i * 8], &v[i], 8);
    else {
      float f = float(v[i]);
      std::memcpy(&out[i * 4], &f, 4);
    }
  }
  return out;
}

std::vector<double> fromBytes(DType t, const std::vector<unsigned char>& bytes) {
  std::vector<double> out(bytes.size() / size_t(byteWidth(t)));
  for (size_t i = 0; i < out.size(); ++i) {
    if (t == DType::F64) std::memcpy(&out[i], &bytes[i * 8], 8);
    else {
      float f;
      std::memcpy(&f, &bytes[i * 4], 4);
      out[i] = f;
    }
  }
  return out;
}

// A traced backward kernel and what emitReverseMode did while tracing it.
struct Backward {
  std::unique_ptr<Function> f;
  Shape outputShape;
  std::vector<Value*> adjoints;
  std::vector<Shape> loadAdjointShapes;  // one per callback, in call order
  std::vector<const Op*> emitted;        // the ops emitReverseMode added (callbacks' included)
};

class Harness {
 public:
  Harness(Problem p, Data d) : p_(std::move(p)), d_(std::move(d)) {
    buildForward();
    buildBackward();
  }

  const Backward& backward() const { return bw_; }

  // L = sum(seed * y) with the inputs and captured tensors of `d`.
  double objective(const Data& d) const {
    std::vector<std::vector<unsigned char>> buffers;
    for (auto& v : d.inputs) buffers.push_back(toBytes(p_.dtype, v));
    for (auto& v : d.captured) buffers.push_back(toBytes(p_.dtype, v));
    buffers.push_back(toBytes(p_.dtype, std::vector<double>(size_t(numElements(bw_.outputShape)), 0.0)));
    std::vector<InterpArg> args;
    for (auto& b : buffers) args.push_back(InterpArg::buffer(b.data(), b.size()));
    interpret(*forward_, args, {1, 1, 1}, {.threads = 1});
    std::vector<double> y = fromBytes(p_.dtype, buffers.back());
    double sum = 0;
    for (size_t i = 0; i < y.size(); ++i) sum += seed_[i] * y[i];
    return sum;
  }

  // The adjoints the backward kernel computes: one vector per input, then one
  // per captured tensor (zero where no callback wrote).
  std::vector<std::vector<double>> adjoints() const {
    std::vector<std::vector<unsigned char>> buffers;
    for (auto& v : d_.inputs) buffers.push_back(toBytes(p_.dtype, v));
    for (auto& v : d_.captured) buffers.push_back(toBytes(p_.dtype, v));
    buffers.push_back(toBytes(p_.dtype, seed_));
    for (auto& v : d_.inputs) buffers.push_back(toBytes(p_.dtype, std::vector<double>(v.size(), 0.0)));
    for (auto& v : d_.captured) buffers.push_back(toBytes(p_.dtype, std::vector<double>(v.size(), 0.0)));
    std::vector<InterpArg> args;
    for (auto& b : buffers) args.push_back(InterpArg::buffer(b.data(), b.size()));
    interpret(*bw_.f, args, {1, 1, 1}, {.threads = 1});
    std::vector<std::vector<double>> out;
    size_t first = d_.inputs.size() + d_.captured.size() + 1;
    for (size_t i = first; i < buffers.size(); ++i) out.push_back(fromBytes(p_.dtype, buffers[i]));
    return out;
  }

  // Compares every adjoint with central finite differences: |ad - fd| <= tol * (1 + |fd|).
  void checkAgainstFiniteDifferences(double tol, double step) const {
    auto ad = adjoints();
    auto check = [&](bool input, size_t k, const std::vector<double>& got) {
      const auto& values = input ? d_.inputs[k] : d_.captured[k];
      for (size_t e = 0; e < values.size(); ++e) {
        Data plus = d_, minus = d_;
        double h = step * std::max(1.0, std::fabs(values[e]));
        (input ? plus.inputs : plus.captured)[k][e] += h;
        (input ? minus.inputs : minus.captured)[k][e] -= h;
        double fd = (objective(plus) - objective(minus)) / (2 * h);
        EXPECT_NEAR(got[e], fd, tol * (1 + std::fabs(fd)))
            << (input ? "input " : "captured ") << k << " element " << e << " (value " << values[e] << ")";
      }
    };
    for (size_t k = 0; k < d_.inputs.size(); ++k) check(true, k, ad[k]);
    for (size_t k = 0; k < d_.captured.size(); ++k)
      if (p_.captured[k].trainable) check(false, k, ad[d_.inputs.size() + k]);
  }

  // The default tolerances of the problem's dtype.
  void check() const {
    if (p_.dtype == DType::F64) checkAgainstFiniteDifferences(1e-6, 1e-6);
    else checkAgainstFiniteDifferences(2e-2, 1e-2);
  }

 private:
  void buildForward() {
    forward_ = std::make_unique<Function>("forward");
    Function& f = *forward_;
    std::vector<Value*> inputs, captured;
    for (size_t i = 0; i < p_.inputs.size(); ++i) inputs.push_back(f.addParam(Type::pointer(p_.dtype), "x" + std::to_string(i)));
    for (size_t i = 0; i < p_.captured.size(); ++i) captured.push_back(f.addParam(Type::pointer(p_.dtype), "c" + std::to_string(i)));
    Value* yPtr = f.addParam(Type::pointer(p_.dtype), "y");
    Builder b(f);
    std::vector<Value*> xs;
    for (size_t i = 0; i < inputs.size(); ++i) xs.push_back(b.load(rowMajorPointers(b, inputs[i], p_.inputs[i])));
    Value* y = p_.mod(b, xs, captured);
    if (y->type().dtype() != p_.dtype) throw Error("the test mod must return " + std::string(dtypeName(p_.dtype)));
    bw_.outputShape = y->type().shape();
    b.store(rowMajorPointers(b, yPtr, y->type().shape()), y);
    b.ret();
    verify(f);
  }

  void buildBackward() {
    bw_.f = std::make_unique<Function>("backward");
    Function& f = *bw_.f;
    std::vector<Value*> inputs, captured, gradInputs, gradCaptured;
    for (size_t i = 0; i < p_.inputs.size(); ++i) inputs.push_back(f.addParam(Type::pointer(p_.dtype), "x" + std::to_string(i)));
    for (size_t i = 0; i < p_.captured.size(); ++i) captured.push_back(f.addParam(Type::pointer(p_.dtype), "c" + std::to_string(i)));
    Value* seedPtr = f.addParam(Type::pointer(p_.dtype), "seed");
    for (size_t i = 0; i < p_.inputs.size(); ++i) gradInputs.push_back(f.addParam(Type::pointer(p_.dtype), "dx" + std::to_string(i)));
    for (size_t i = 0; i < p_.captured.size(); ++i) gradCaptured.push_back(f.addParam(Type::pointer(p_.dtype), "dc" + std::to_string(i)));
    Builder b(f);
    std::vector<Value*> xs;
    for (size_t i = 0; i < inputs.size(); ++i) xs.push_back(b.load(rowMajorPointers(b, inputs[i], p_.inputs[i])));

    size_t before = f.body().ops().size();
    Value* y = p_.mod(b, xs, captured);
    ReverseModeRequest r;
    for (auto it = std::next(f.body().ops().begin(), long(before)); it != f.body().ops().end(); ++it) r.ops.push_back(it->get());
    Value* seed = b.load(rowMajorPointers(b, seedPtr, y->type().shape()));
    std::vector<const Op*> existing;
    for (auto& op : f.body().ops()) existing.push_back(op.get());

    r.output = y;
    r.seed = seed;
    r.wrt = xs;
    auto capturedIndex = [&](const Op& load) -> int {
      const Value* base = basePointer(load.operand(0));
      for (size_t i = 0; i < captured.size(); ++i)
        if (base == captured[i]) return int(i);
      return -1;
    };
    r.isDifferentiableLoad = [&](const Op& load) {
      int i = capturedIndex(load);
      return i >= 0 && p_.captured[size_t(i)].trainable;
    };
    r.onLoadAdjoint = [&](Builder& cb, const Op& load, Value* adjoint) {
      EXPECT_EQ(adjoint->type(), load.result()->type()) << "the adjoint of a load has the load's type";
      bw_.loadAdjointShapes.push_back(adjoint->type().shape());
      int i = capturedIndex(load);
      Value* grad = rebase(cb, load.operand(0), captured[size_t(i)], gradCaptured[size_t(i)]);
      Value* mask = load.numOperands() > 1 ? load.operand(1) : nullptr;
      Value* old = cb.load(grad, mask);
      cb.store(grad, cb.binary(OpKind::Add, old, adjoint), mask);
    };
    bw_.adjoints = emitReverseMode(b, r);
    for (auto& op : f.body().ops())
      if (std::find(existing.begin(), existing.end(), op.get()) == existing.end()) bw_.emitted.push_back(op.get());
    for (size_t i = 0; i < xs.size(); ++i) {
      EXPECT_EQ(bw_.adjoints[i]->type(), xs[i]->type());
      b.store(rowMajorPointers(b, gradInputs[i], p_.inputs[i]), bw_.adjoints[i]);
    }
    b.ret();
    verify(f);
  }

  Problem p_;
  Data d_;
  std::vector<double> seed_;
  std::unique_ptr<Function> forward_;
  Backward bw_;

 public:
  // Set after construction (the seed is data, not part of the kernels).
  void setSeed(std::vector<double> s) { seed_ = std::move(s); }
};

std::vector<double> uniform(testing::Random& rng, const Shape& shape, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(size_t(numElements(shape)));
  for (auto& x : v) x = dist(rng.gen);
  return v;
}

// Runs the problem with random inputs in [lo, hi] (captured tensors too) and
// checks every adjoint; returns the harness for further checks.
std::unique_ptr<Harness> checkProblem(const Problem& p, testing::Random& rng, double lo, double hi) {
  Data d;
  for (auto& s : p.inputs) d.inputs.push_back(uniform(rng, s, lo, hi));
  for (auto& c : p.captured) d.captured.push_back(uniform(rng, c.shape, lo, hi));
  auto h = std::make_unique<Harness>(p, d);
  h->setSeed(uniform(rng, h->backward().outputShape, -1, 1));
  h->check();
  return h;
}

int countOps(const std::vector<const Op*>& ops, OpKind k) {
  return int(std::count_if(ops.begin(), ops.end(), [&](const Op* op) { return op->kind() == k; }));
}

const Shape kTile{4, 8};

// ---- element-wise rules ----

struct UnaryCase {
  OpKind kind;
  double lo, hi;  // away from kinks and outside the domain
};

class UnaryRule : public ::testing::TestWithParam<UnaryCase> {};

TEST_P(UnaryRule, MatchesFiniteDifferences) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  const UnaryCase c = GetParam();
  for (DType dtype : {DType::F64, DType::F32}) {
    SCOPED_TRACE(std::string(dtypeName(dtype)));
    Problem p{.dtype = dtype, .inputs = {kTile}, .mod = [&](Builder& b, auto& x, auto&) { return b.unary(c.kind, x[0]); }};
    checkProblem(p, rng, c.lo, c.hi);
  }
}

INSTANTIATE_TEST_SUITE_P(
    ReverseMode, UnaryRule,
    ::testing::Values(UnaryCase{OpKind::Neg, -3, 3}, UnaryCase{OpKind::Exp, -2, 2}, UnaryCase{OpKind::Exp2, -2, 2},
                      UnaryCase{OpKind::Log, 0.2, 4}, UnaryCase{OpKind::Log2, 0.2, 4}, UnaryCase{OpKind::Tanh, -2, 2},
                      UnaryCase{OpKind::Sqrt, 0.2, 4}, UnaryCase{OpKind::Rsqrt, 0.2, 4}, UnaryCase{OpKind::Abs, 0.1, 3},
                      UnaryCase{OpKind::Abs, -3, -0.1}),
    [](const auto& info) {
      return std::string(opName(info.param.kind)) + (info.param.lo < 0 && info.param.hi < 0 ? "_negative" : "");
    });

class BinaryRule : public ::testing::TestWithParam<OpKind> {};

TEST_P(BinaryRule, MatchesFiniteDifferencesInBothOperands) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  const OpKind k = GetParam();
  for (DType dtype : {DType::F64, DType::F32}) {
    SCOPED_TRACE(std::string(dtypeName(dtype)));
    Problem p{.dtype = dtype, .inputs = {kTile, kTile}, .mod = [&](Builder& b, auto& x, auto&) { return b.binary(k, x[0], x[1]); }};
    // b differs from a by 0.2 to 1 either way: far from maximum's and minimum's kink for every step.
    auto a = uniform(rng, kTile, 1.5, 3), gap = uniform(rng, kTile, 0.2, 1), b = a;  // b >= 0.5 for div
    for (size_t i = 0; i < b.size(); ++i) b[i] += i % 2 ? gap[i] : -gap[i];
    Harness h(p, {.inputs = {a, b}});
    h.setSeed(uniform(rng, kTile, -1, 1));
    h.check();
  }
}

INSTANTIATE_TEST_SUITE_P(ReverseMode, BinaryRule,
                         ::testing::Values(OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Maximum,
                                           OpKind::Minimum),
                         [](const auto& info) { return std::string(opName(info.param)); });

TEST(ReverseMode, RemOfFloatsAwayFromItsJumps) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  // a = b * (k + f) with f in [0.2, 0.8]: a/b is never near an integer.
  Data d;
  auto b = uniform(rng, kTile, 1.2, 2.5), f = uniform(rng, kTile, 0.2, 0.8), a = b;
  for (size_t i = 0; i < a.size(); ++i) a[i] = b[i] * (double(i % 4) + f[i]) * (i % 3 == 0 ? -1 : 1);
  d.inputs = {a, b};
  Problem p{.inputs = {kTile, kTile}, .mod = [](Builder& bb, auto& x, auto&) { return bb.binary(OpKind::Rem, x[0], x[1]); }};
  Harness h(p, d);
  h.setSeed(uniform(rng, kTile, -1, 1));
  h.check();
}

// ---- accumulation ----

TEST(ReverseMode, AValueUsedTwiceByOneOpSumsBothUses) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  Problem p{.inputs = {kTile}, .mod = [](Builder& b, auto& x, auto&) { return b.binary(OpKind::Mul, x[0], x[0]); }};
  auto h = checkProblem(p, rng, -2, 2);
  // 2*g*x as t = g*x; t + t.
  EXPECT_EQ(h->backward().emitted.size(), 2u) << printFunction(*h->backward().f);
  EXPECT_EQ(countOps(h->backward().emitted, OpKind::Mul), 1);
  EXPECT_EQ(countOps(h->backward().emitted, OpKind::Add), 1);
}

TEST(ReverseMode, AValueUsedByTwoLaterOpsSumsBothAdjoints) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  // y = exp(s); out = y*s + tanh(y): y and s each reach the output twice.
  Problem p{.inputs = {kTile}, .mod = [](Builder& b, auto& x, auto&) {
              Value* y = b.unary(OpKind::Exp, x[0]);
              return b.binary(OpKind::Add, b.binary(OpKind::Mul, y, x[0]), b.unary(OpKind::Tanh, y));
            }};
  checkProblem(p, rng, -1, 1);
  // The same through subtraction, division and select: s - s/y, with both branches of a select using s.
  Problem q{.inputs = {kTile}, .mod = [](Builder& b, auto& x, auto&) {
              Value* y = b.unary(OpKind::Exp, x[0]);
              Value* r = b.binary(OpKind::Sub, x[0], b.binary(OpKind::Div, x[0], y));
              Value* zero = b.constant(x[0]->type(), 0.0);
              return b.select(b.cmp("gt", x[0], zero), r, b.binary(OpKind::Mul, r, y));
            }};
  checkProblem(q, rng, -1, 1);
}

TEST(ReverseMode, AdjointOfAValueDefinedInsideTheSlice) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  Function f("inner");
  Value* p = f.addParam(Type::pointer(DType::F64));
  Builder b(f);
  Value* s = b.load(rowMajorPointers(b, p, kTile));
  size_t before = f.body().ops().size();
  Value* t = b.unary(OpKind::Exp, s);
  Value* y = b.binary(OpKind::Mul, t, t);
  ReverseModeRequest r{.output = y, .seed = s, .wrt = {t, s}};
  for (auto it = std::next(f.body().ops().begin(), long(before)); it != f.body().ops().end(); ++it) r.ops.push_back(it->get());
  auto adj = emitReverseMode(b, r);
  // dy/dt = 2t (mul, add), dy/ds = 2t * t (one more mul).
  Op* add = adj[0]->definingOp();
  ASSERT_EQ(add->kind(), OpKind::Add);
  EXPECT_EQ(add->operand(0), add->operand(1));
  ASSERT_EQ(adj[1]->definingOp()->kind(), OpKind::Mul);
  EXPECT_EQ(adj[1]->definingOp()->operand(0), adj[0]);
  EXPECT_EQ(adj[1]->definingOp()->operand(1), t);
}

// ---- activity: what emits nothing ----

TEST(ReverseMode, ComparisonsAndSelectConditionsOnTheScoreHaveNoDerivative) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  // where(s > 1, s * 2, exp(s)): the comparison emits nothing, the branches do.
  Problem p{.inputs = {kTile}, .mod = [](Builder& b, auto& x, auto&) {
              Value* one = b.constant(x[0]->type(), 1.0);
              Value* two = b.constant(x[0]->type(), 2.0);
              return b.select(b.cmp("gt", x[0], one), b.binary(OpKind::Mul, x[0], two), b.unary(OpKind::Exp, x[0]));
            }};
  auto h = checkProblem(p, rng, 0, 2);
  EXPECT_EQ(countOps(h->backward().emitted, OpKind::Cmp), 0) << printFunction(*h->backward().f);
}

TEST(ReverseMode, AModThatIgnoresTheScoreGetsAZeroAdjointAndNoCallback) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  // out = cast(kv - q) * bias[kv]: integer index math and a trainable load, no score.
  Problem p{.inputs = {{8}}, .captured = {{{8}}}, .mod = [](Builder& b, auto& x, auto& c) {
              Value* kv = b.arange(0, 8);
              Value* q = b.constant(Type(DType::I32, {8}), 3);
              Value* distance = b.cast(b.binary(OpKind::Sub, kv, q), DType::F64);
              Value* bias = b.load(b.addptr(b.splat(c[0], {8}), kv));
              Value* zero = b.constant(Type(DType::F64, {8}), 0.0);
              return b.binary(OpKind::Add, zero, b.binary(OpKind::Mul, distance, bias));
            }};
  Data d{.inputs = {uniform(rng, {8}, -1, 1)}, .captured = {uniform(rng, {8}, -1, 1)}};
  Harness h(p, d);
  h.setSeed(uniform(rng, {8}, -1, 1));
  h.check();
  // The bias load does get an adjoint (the output depends on it); the score only a zero constant.
  EXPECT_EQ(h.backward().loadAdjointShapes.size(), 1u);
  Op* zero = h.backward().adjoints[0]->definingOp();
  ASSERT_EQ(zero->kind(), OpKind::Constant);
  EXPECT_EQ(std::get<double>(zero->attrs().at("value")), 0.0);

  // Without any float dependence at all: no callback, nothing but the zero.
  Problem q{.inputs = {{8}}, .captured = {{{8}}}, .mod = [](Builder& b, auto& x, auto& c) {
              Value* kv = b.arange(0, 8);
              Value* evens = b.cmp("eq", b.binary(OpKind::And, kv, b.constant(Type(DType::I32, {8}), 1)),
                                   b.constant(Type(DType::I32, {8}), 0));
              return b.cast(evens, DType::F64);
            }};
  Harness h2(q, {.inputs = {uniform(rng, {8}, -1, 1)}, .captured = {uniform(rng, {8}, -1, 1)}});
  h2.setSeed(uniform(rng, {8}, -1, 1));
  h2.check();
  EXPECT_TRUE(h2.backward().loadAdjointShapes.empty());
  ASSERT_EQ(h2.backward().emitted.size(), 1u) << printFunction(*h2.backward().f);
  EXPECT_EQ(h2.backward().emitted[0]->kind(), OpKind::Constant);
}

TEST(ReverseMode, ALoadTheResultDoesNotDependOnGetsNoCallback) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  // The table is read (and feeds a comparison), but the result is s * 2.
  Problem p{.inputs = {{8}}, .captured = {{{8}}}, .mod = [](Builder& b, auto& x, auto& c) {
              Value* table = b.load(b.addptr(b.splat(c[0], {8}), b.arange(0, 8)));
              Value* big = b.cmp("gt", table, x[0]);
              Value* two = b.constant(x[0]->type(), 2.0);
              Value* doubled = b.binary(OpKind::Mul, x[0], two);
              b.binary(OpKind::Add, doubled, table);  // unused
              return b.select(big, doubled, doubled);
            }};
  auto h = checkProblem(p, rng, -1, 1);
  EXPECT_TRUE(h->backward().loadAdjointShapes.empty());
  EXPECT_EQ(h->backward().emitted.size(), 1u) << printFunction(*h->backward().f);  // g * 2
}

TEST(ReverseMode, NonTrainableLoadsAreConstants) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  Problem p{.inputs = {{8}}, .captured = {{{8}, /*trainable=*/false}}, .mod = [](Builder& b, auto& x, auto& c) {
              Value* table = b.load(b.addptr(b.splat(c[0], {8}), b.arange(0, 8)));
              return b.binary(OpKind::Mul, x[0], table);
            }};
  auto h = checkProblem(p, rng, -1, 1);
  EXPECT_TRUE(h->backward().loadAdjointShapes.empty());
}

// ---- shapes ----

TEST(ReverseMode, BroadcastedGathersHandTheCallbackTheLoadsOwnShape) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  // s + row[q] (a [4,1] gather) + col[kv] (a [1,8] gather) + slope (a scalar load), all broadcast to [4,8].
  Problem p{.inputs = {kTile}, .captured = {{{4}}, {{8}}, {{1}}}, .mod = [](Builder& b, auto& x, auto& c) {
              Value* q = b.expandDims(b.arange(0, 4), 1);
              Value* row = b.load(b.addptr(b.splat(c[0], {4, 1}), q));
              Value* kv = b.expandDims(b.arange(0, 8), 0);
              Value* col = b.load(b.addptr(b.splat(c[1], {1, 8}), kv));
              Value* slope = b.load(c[2]);
              Value* y = b.binary(OpKind::Add, x[0], b.broadcast(row, kTile));
              y = b.binary(OpKind::Mul, y, b.broadcast(col, kTile));
              return b.binary(OpKind::Mul, y, b.splat(slope, kTile));
            }};
  auto h = checkProblem(p, rng, 0.5, 2);
  // Reverse program order: slope, col, row.
  EXPECT_EQ(h->backward().loadAdjointShapes, (std::vector<Shape>{{}, {1, 8}, {4, 1}}));
}

TEST(ReverseMode, ShapeOps) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  // [1,1] broadcast to [4,8] (two summed dims), expand_dims, reshape, trans, splat of a scalar input.
  Problem p{.inputs = {{1, 1}, {8}, {2, 4}, {8, 4}, {}}, .mod = [](Builder& b, auto& x, auto&) {
              Value* all = b.broadcast(x[0], kTile);
              Value* cols = b.broadcast(b.expandDims(x[1], 0), kTile);
              Value* flat = b.broadcast(b.reshape(x[2], {1, 8}), kTile);
              Value* t = b.trans(x[3], {1, 0});
              Value* s = b.splat(x[4], kTile);
              Value* y = b.binary(OpKind::Mul, all, cols);
              y = b.binary(OpKind::Add, y, b.binary(OpKind::Mul, flat, t));
              return b.binary(OpKind::Mul, y, s);
            }};
  checkProblem(p, rng, -2, 2);
  // A [1] from a scalar, reshaped to [1,1] and broadcast; a rank-3 reshape.
  Problem q{.inputs = {{}, {2, 2, 2}}, .mod = [](Builder& b, auto& x, auto&) {
              Value* one = b.reshape(b.expandDims(x[0], 0), {1, 1});
              Value* cube = b.reshape(x[1], {1, 8});
              return b.binary(OpKind::Mul, b.broadcast(one, {4, 8}), b.broadcast(cube, {4, 8}));
            }};
  checkProblem(q, rng, -2, 2);
}

TEST(ReverseMode, ReductionsSumAndExtrema) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  for (const char* kind : {"sum", "max", "min"}) {
    SCOPED_TRACE(kind);
    for (int axis : {0, 1}) {
      Problem p{.inputs = {kTile}, .mod = [&](Builder& b, auto& x, auto&) {
                  Value* r = b.reduce(b.binary(OpKind::Mul, x[0], x[0]), axis, kind);
                  return b.broadcast(b.expandDims(r, axis), kTile);  // the reduced values reused per element
                }};
      checkProblem(p, rng, 0.1, 3);
    }
    // A rank-1 reduction to a scalar.
    Problem q{.inputs = {{8}}, .mod = [&](Builder& b, auto& x, auto&) { return b.reduce(x[0], 0, kind); }};
    checkProblem(q, rng, -3, 3);
  }
}

TEST(ReverseMode, CastsBetweenFloatsCastTheAdjointBack) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  Problem p{.inputs = {kTile}, .mod = [](Builder& b, auto& x, auto&) {
              Value* narrow = b.cast(x[0], DType::F32);
              return b.cast(b.unary(OpKind::Exp, narrow), DType::F64);
            }};
  Data d{.inputs = {uniform(rng, kTile, -1, 1)}};
  Harness h(p, d);
  h.setSeed(uniform(rng, kTile, -1, 1));
  h.checkAgainstFiniteDifferences(1e-3, 1e-3);  // f32 in the middle
}

TEST(ReverseMode, DotDifferentiatesBothOperandsAndTheAccumulator) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  Problem p{.inputs = {{4, 2}, {2, 8}, kTile},
            .mod = [](Builder& b, auto& x, auto&) { return b.dot(x[0], x[1], x[2]); }};
  checkProblem(p, rng, -2, 2);
  // a used for both operands: dot(a, aᵀ); the products keep the dot's input_precision.
  Problem q{.inputs = {{4, 4}}, .mod = [](Builder& b, auto& x, auto&) {
              Value* d = b.dot(x[0], b.trans(x[0], {1, 0}), b.constant(Type(DType::F64, {4, 4}), 0.0));
              d->definingOp()->setAttr("input_precision", std::string("ieee"));
              return d;
            }};
  auto h = checkProblem(q, rng, -2, 2);
  EXPECT_EQ(countOps(h->backward().emitted, OpKind::Dot), 2);
  for (const Op* op : h->backward().emitted)
    if (op->kind() == OpKind::Dot) {
      EXPECT_EQ(op->strAttr("input_precision"), "ieee");
    }
}

TEST(ReverseMode, LoadOtherGetsTheMaskedOffLanes) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  // load(table + kv, kv < 5, other = s): s flows through the lanes kv >= 5.
  Problem p{.inputs = {{8}}, .captured = {{{8}}}, .mod = [](Builder& b, auto& x, auto& c) {
              Value* kv = b.arange(0, 8);
              Value* ok = b.cmp("lt", kv, b.constant(Type(DType::I32, {8}), 5));
              Value* v = b.load(b.addptr(b.splat(c[0], {8}), kv), ok, x[0]);
              return b.binary(OpKind::Mul, v, x[0]);
            }};
  checkProblem(p, rng, -2, 2);
}

// ---- tie rules, exactly ----

TEST(ReverseMode, TiesSplitTheAdjointEvenly) {
  // maximum(s, 1) and minimum(s, 1) at s = 1 give half; a max reduction over
  // [3, 1, 3, 2] gives half to each 3; abs at 0 gives 0.
  auto run = [](const Mod& mod, Shape shape, std::vector<double> x) {
    Problem p{.inputs = {shape}, .mod = mod};
    Harness h(p, {.inputs = {x}});
    h.setSeed(std::vector<double>(size_t(numElements(h.backward().outputShape)), 1.0));
    return h.adjoints()[0];
  };
  for (OpKind k : {OpKind::Maximum, OpKind::Minimum}) {
    auto ad = run([&](Builder& b, auto& x, auto&) { return b.binary(k, x[0], b.constant(x[0]->type(), 1.0)); }, {4},
                  {0.5, 1.0, 1.5, 1.0});
    EXPECT_EQ(ad, (std::vector<double>{k == OpKind::Minimum ? 1.0 : 0.0, 0.5, k == OpKind::Maximum ? 1.0 : 0.0, 0.5}));
    auto same = run([&](Builder& b, auto& x, auto&) { return b.binary(k, x[0], x[0]); }, {4}, {0.5, 1.0, 1.5, -2});
    EXPECT_EQ(same, (std::vector<double>{1, 1, 1, 1}));
  }
  auto reduced = run([](Builder& b, auto& x, auto&) { return b.reduce(x[0], 0, "max"); }, {4}, {3, 1, 3, 2});
  EXPECT_EQ(reduced, (std::vector<double>{0.5, 0, 0.5, 0}));
  auto abs = run([](Builder& b, auto& x, auto&) { return b.unary(OpKind::Abs, x[0]); }, {4}, {-2, 0, 2, -0.0});
  EXPECT_EQ(abs, (std::vector<double>{-1, 0, 1, 0}));
}

// ---- the attention mods ----

TEST(ReverseMode, SoftCap) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  for (DType dtype : {DType::F64, DType::F32}) {
    SCOPED_TRACE(std::string(dtypeName(dtype)));
    Problem p{.dtype = dtype, .inputs = {kTile}, .mod = [&](Builder& b, auto& x, auto&) {
                Value* cap = b.constant(Type(dtype, kTile), 20.0);
                return b.binary(OpKind::Mul, cap, b.unary(OpKind::Tanh, b.binary(OpKind::Div, x[0], cap)));
              }};
    auto h = checkProblem(p, rng, -60, 60);
    // g*20, t*t, 1 - t², times, / 20: five ops and the constant 1.
    EXPECT_EQ(h->backward().emitted.size(), 6u) << printFunction(*h->backward().f);
  }
}

TEST(ReverseMode, AlibiWithATrainableSlope) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  // s + slope[h] * (kv - q), kv and q integer tiles cast to float; h = 2.
  Problem p{.inputs = {kTile}, .captured = {{{4}}}, .mod = [](Builder& b, auto& x, auto& c) {
              Value* q = b.broadcast(b.cast(b.expandDims(b.arange(0, 4), 1), DType::F64), kTile);
              Value* kv = b.broadcast(b.cast(b.expandDims(b.arange(0, 8), 0), DType::F64), kTile);
              Value* slope = b.load(b.addptr(c[0], b.constant(Type(DType::I32), 2)));
              Value* bias = b.binary(OpKind::Mul, b.splat(slope, kTile), b.binary(OpKind::Sub, kv, q));
              return b.binary(OpKind::Add, x[0], bias);
            }};
  auto h = checkProblem(p, rng, -2, 2);
  EXPECT_EQ(h->backward().loadAdjointShapes, (std::vector<Shape>{{}}));
  // dscore is the seed itself: nothing is emitted for it.
  EXPECT_EQ(h->backward().adjoints[0]->definingOp()->kind(), OpKind::Load);
  // Nothing of the index math (cast, sub, broadcast of q and kv) is differentiated.
  EXPECT_EQ(countOps(h->backward().emitted, OpKind::Cast), 0) << printFunction(*h->backward().f);
}

TEST(ReverseMode, BiasTableGather) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  // s + table[h, q, kv] with table [2, 4, 8] and h = 1: a [4,8] gather.
  Problem p{.inputs = {kTile}, .captured = {{{2, 4, 8}}}, .mod = [](Builder& b, auto& x, auto& c) {
              Value* q = b.broadcast(b.expandDims(b.arange(0, 4), 1), kTile);
              Value* kv = b.broadcast(b.expandDims(b.arange(0, 8), 0), kTile);
              Value* offsets = b.binary(OpKind::Add, b.binary(OpKind::Mul, q, b.constant(Type(DType::I32, kTile), 8)), kv);
              Value* base = b.addptr(c[0], b.constant(Type(DType::I32), 32));
              Value* bias = b.load(b.addptr(b.splat(base, kTile), offsets));
              return b.binary(OpKind::Mul, x[0], bias);
            }};
  auto h = checkProblem(p, rng, -2, 2);
  EXPECT_EQ(h->backward().loadAdjointShapes, (std::vector<Shape>{kTile}));
}

// ---- locations and errors ----

TEST(ReverseMode, EmittedOpsCarryTheLocationOfTheOpTheyDifferentiate) {
  Function f("locs");
  Value* p = f.addParam(Type::pointer(DType::F32));
  Builder b(f);
  Value* s = b.load(p);
  b.setLoc({"mod.cpp", 7});
  Value* t = b.unary(OpKind::Tanh, s);
  b.setLoc({"mod.cpp", 8});
  Value* y = b.binary(OpKind::Mul, t, t);
  b.setLoc({"template.cpp", 100});
  ReverseModeRequest r{.ops = {t->definingOp(), y->definingOp()}, .output = y, .seed = s, .wrt = {s}};
  auto before = f.body().ops().size();
  emitReverseMode(b, r);
  EXPECT_EQ(b.loc().str(), "template.cpp:100") << "the builder's location is restored";
  std::vector<std::string> locs;
  for (auto it = std::next(f.body().ops().begin(), long(before)); it != f.body().ops().end(); ++it)
    locs.push_back((*it)->loc().str());
  // mul: g*t, t+t (line 8); tanh: t*t, 1, 1 - t², times (line 7).
  EXPECT_EQ(locs, (std::vector<std::string>{"mod.cpp:8", "mod.cpp:8", "mod.cpp:7", "mod.cpp:7", "mod.cpp:7", "mod.cpp:7"}));
}

std::string errorOf(const std::function<void()>& f) { return flextile::testing::thrownMessage<Error>(f, "no error"); }

TEST(ReverseMode, ARunTimeLoopInTheSliceIsAnErrorNamingIt) {
  Function f("loop");
  Value* p = f.addParam(Type::pointer(DType::F32));
  Builder b(f);
  Value* s = b.load(p);
  Value* zero = b.constantInt(Type(DType::I32), 0);
  Value* four = b.constantInt(Type(DType::I32), 4);
  Value* one = b.constantInt(Type(DType::I32), 1);
  size_t before = f.body().ops().size();
  b.setLoc({"user.cpp", 12});
  Value* y = b.forLoop(zero, four, one, {s}, [&](Value*, std::vector<Value*> c) {
    return std::vector<Value*>{b.binary(OpKind::Mul, c[0], s)};
  })[0];
  ReverseModeRequest r{.output = y, .seed = s, .wrt = {s}};
  for (auto it = std::next(f.body().ops().begin(), long(before)); it != f.body().ops().end(); ++it) r.ops.push_back(it->get());
  EXPECT_EQ(errorOf([&] { emitReverseMode(b, r); }),
            "score_mod cannot be differentiated: it contains a run-time loop (op 'for' (user.cpp:12))");
}

TEST(ReverseMode, OtherErrors) {
  Function f("errors");
  Value* p = f.addParam(Type::pointer(DType::F32));
  Builder b(f);
  Value* s = b.load(p);
  b.setLoc({"user.cpp", 3});
  Value* y = b.unary(OpKind::Exp, s);
  b.store(p, y);
  Op* store = &*f.body().ops().back();
  ReverseModeRequest r{.ops = {y->definingOp(), store}, .output = y, .seed = s, .wrt = {s}, .subject = "the mod"};
  EXPECT_EQ(errorOf([&] { emitReverseMode(b, r); }),
            "the mod cannot be differentiated: it contains a store (op 'store' (user.cpp:3))");
  Value* wide = b.cast(s, DType::F64);
  ReverseModeRequest seed{.ops = {y->definingOp()}, .output = y, .seed = wide, .wrt = {s}};
  EXPECT_EQ(errorOf([&] { emitReverseMode(b, seed); }), "score_mod cannot be differentiated: the seed is f64, the output f32");
  ReverseModeRequest order{.ops = {wide->definingOp(), y->definingOp()}, .output = y, .seed = s, .wrt = {s}};
  EXPECT_EQ(errorOf([&] { emitReverseMode(b, order); }),
            "score_mod cannot be differentiated: its ops are not in program order (op 'exp' (user.cpp:3))");
}

}  // namespace
}  // namespace flextile::ir
