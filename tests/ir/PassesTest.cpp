// canonicalize, cse and dce: folding checked against independent references
// on random values, each rewrite on a small program, and the scoping rules.
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <functional>
#include <limits>

#include "TestPrograms.h"
#include "ir/Builder.h"
#include "ir/Interpreter.h"
#include "ir/Parser.h"
#include "ir/Passes.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"

namespace flextile::ir {
namespace {

// Parses `text`, runs `pass`, checks the result verifies, returns its text.
std::string after(bool (*pass)(Function&), const std::string& text) {
  auto f = parseFunction(text, "pass.ftir");
  verify(*f);
  pass(*f);
  verify(*f);
  return printFunction(*f);
}

// ---- constant folding against references ----

// Folds `kind` over constants of type `t` feeding a store; returns the stored
// constant's value, or nothing when canonicalize left the op alone.
std::optional<Attr> fold(OpKind kind, const Type& t, std::vector<Attr> values, DType resultDType,
                         const std::string& pred = "") {
  Function f("fold");
  Value* out = f.addParam(Type::pointer(resultDType));
  Builder b(f);
  std::vector<Value*> operands;
  for (auto& v : values) operands.push_back(b.create1(OpKind::Constant, {}, t, {{"value", v}}));
  Attrs attrs;
  if (!pred.empty()) attrs["pred"] = pred;
  Value* r = b.create1(kind, operands, Type(resultDType, t.shape()), attrs);
  if (t.isTile()) out = b.splat(out, t.shape());
  b.store(out, r);
  b.ret();
  verify(f);
  canonicalize(f);
  verify(f);
  Op* store = testing::firstOp(f, OpKind::Store);
  Op* def = store->operand(1)->definingOp();
  if (def->kind() != OpKind::Constant) return std::nullopt;
  EXPECT_EQ(def->result()->type(), r->type());
  return def->attrs().at("value");
}

int64_t wrap32(int64_t v) { return int32_t(uint32_t(uint64_t(v))); }

TEST(Canonicalize, FoldsI32ArithmeticWithWrapAround) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  std::uniform_int_distribution<int32_t> any(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
  std::uniform_int_distribution<int32_t> shift(0, 31);
  const Type i32(DType::I32);
  for (int trial = 0; trial < 200; ++trial) {
    int64_t a = any(rng.gen), b = any(rng.gen), s = shift(rng.gen);
    if (trial % 4 == 0) b = int64_t(shift(rng.gen)) - 16;  // small divisors, zero included
    SCOPED_TRACE("a=" + std::to_string(a) + " b=" + std::to_string(b));
    auto check = [&](OpKind k, std::optional<int64_t> want, int64_t rhs) {
      auto got = fold(k, i32, {a, rhs}, DType::I32);
      if (!want) {
        EXPECT_FALSE(got) << opName(k) << " must not fold";
        return;
      }
      ASSERT_TRUE(got) << opName(k);
      EXPECT_EQ(std::get<int64_t>(*got), *want) << opName(k);
    };
    check(OpKind::Add, wrap32(a + b), b);
    check(OpKind::Sub, wrap32(a - b), b);
    check(OpKind::Mul, wrap32(a * b), b);
    // Division by zero is a run-time error, left alone; INT_MIN / -1 wraps (as the interpreter defines).
    check(OpKind::Div, b == 0 ? std::nullopt : std::optional<int64_t>(wrap32(b == -1 ? -a : a / b)), b);
    check(OpKind::Rem, b == 0 ? std::nullopt : std::optional<int64_t>(b == -1 ? 0 : a % b), b);
    check(OpKind::Maximum, std::max(a, b), b);
    check(OpKind::Minimum, std::min(a, b), b);
    check(OpKind::And, a & b, b);
    check(OpKind::Or, a | b, b);
    check(OpKind::Xor, a ^ b, b);
    check(OpKind::Shl, wrap32(int64_t(uint64_t(a) << s)), s);
    check(OpKind::Shr, a >> s, s);
    check(OpKind::Shl, 0, 32 + s);  // past the width: 0, and the sign fill for shr
    check(OpKind::Shr, a < 0 ? -1 : 0, 32 + s);
    check(OpKind::Shr, a < 0 ? -1 : 0, -1);  // the amount is read as unsigned
    for (auto [pred, want] : std::vector<std::pair<std::string, bool>>{
             {"eq", a == b}, {"ne", a != b}, {"lt", a < b}, {"le", a <= b}, {"gt", a > b}, {"ge", a >= b}}) {
      auto got = fold(OpKind::Cmp, i32, {a, b}, DType::I1, pred);
      ASSERT_TRUE(got) << pred;
      EXPECT_EQ(std::get<int64_t>(*got), int64_t(want)) << pred;
    }
    auto neg = fold(OpKind::Neg, i32, {a}, DType::I32);
    ASSERT_TRUE(neg);
    EXPECT_EQ(std::get<int64_t>(*neg), wrap32(-a));
    auto inv = fold(OpKind::Not, i32, {a}, DType::I32);
    ASSERT_TRUE(inv);
    EXPECT_EQ(std::get<int64_t>(*inv), ~a);
  }
  // i8 wraps at its own width; i1 is a bool.
  EXPECT_EQ(std::get<int64_t>(*fold(OpKind::Add, Type(DType::I8), {int64_t(100), int64_t(100)}, DType::I8)), -56);
  EXPECT_EQ(std::get<int64_t>(*fold(OpKind::Not, Type(DType::I1), {int64_t(1)}, DType::I1)), 0);
  EXPECT_EQ(std::get<int64_t>(*fold(OpKind::Xor, Type(DType::I1), {int64_t(1), int64_t(1)}, DType::I1)), 0);
}

// The half (or bfloat16) nearest to d with ties to even, found by comparing
// neighbours of Eigen's conversion: an independent reference for doubles.
template <class H>
double nearest(double d) {
  H h(static_cast<float>(d));
  uint16_t bits = Eigen::numext::bit_cast<uint16_t>(h);
  double best = double(static_cast<float>(h));
  uint16_t bestBits = bits;
  for (int delta : {-1, 1}) {
    uint16_t nb = uint16_t(bits + delta);
    double v = double(static_cast<float>(Eigen::numext::bit_cast<H>(nb)));
    if (std::isnan(v) || std::signbit(v) != std::signbit(best)) continue;
    double dv = std::fabs(v - d), db = std::fabs(best - d);
    if (dv < db || (dv == db && (nb & 1) == 0)) {
      best = v;
      bestBits = nb;
    }
  }
  (void)bestBits;
  return best;
}

TEST(Canonicalize, FoldsCastsWithRoundToNearestEven) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  std::uniform_real_distribution<double> wide(-60000.0, 60000.0), tiny(-1e-4, 1e-4);
  std::uniform_real_distribution<double> big(-1e30, 1e30);
  for (int trial = 0; trial < 300; ++trial) {
    double d = trial % 3 == 0 ? tiny(rng.gen) : trial % 3 == 1 ? wide(rng.gen) : big(rng.gen);
    float fl = float(d);
    SCOPED_TRACE("value " + std::to_string(d));
    // f32 -> f16 / bf16: Eigen's conversions from float are the reference.
    auto h = fold(OpKind::Cast, Type(DType::F32), {double(fl)}, DType::F16);
    ASSERT_TRUE(h);
    EXPECT_EQ(std::get<double>(*h), double(float(Eigen::half(fl))));
    auto bf = fold(OpKind::Cast, Type(DType::F32), {double(fl)}, DType::BF16);
    ASSERT_TRUE(bf);
    EXPECT_EQ(std::get<double>(*bf), double(float(Eigen::bfloat16(fl))));
    // f64 -> f16 / bf16 rounds once, from the double.
    if (std::fabs(d) < 65000) {
      auto h64 = fold(OpKind::Cast, Type(DType::F64), {d}, DType::F16);
      EXPECT_EQ(std::get<double>(*h64), nearest<Eigen::half>(d));
    }
    auto b64 = fold(OpKind::Cast, Type(DType::F64), {d}, DType::BF16);
    EXPECT_EQ(std::get<double>(*b64), nearest<Eigen::bfloat16>(d));
    auto f32 = fold(OpKind::Cast, Type(DType::F64), {d}, DType::F32);
    EXPECT_EQ(std::get<double>(*f32), double(float(d)));
    // float -> int truncates toward zero and saturates.
    auto i = fold(OpKind::Cast, Type(DType::F64), {d}, DType::I32);
    ASSERT_TRUE(i);
    EXPECT_EQ(std::get<int64_t>(*i), int64_t(std::clamp(std::trunc(d), -2147483648.0, 2147483647.0)));
    auto nonzero = fold(OpKind::Cast, Type(DType::F32), {double(fl)}, DType::I1);
    EXPECT_EQ(std::get<int64_t>(*nonzero), fl != 0);
  }
  // Overflow to infinity and a tie that rounds to even.
  EXPECT_EQ(std::get<double>(*fold(OpKind::Cast, Type(DType::F32), {65520.0}, DType::F16)),
            std::numeric_limits<double>::infinity());
  EXPECT_EQ(std::get<double>(*fold(OpKind::Cast, Type(DType::F32), {65519.0}, DType::F16)), 65504.0);
  EXPECT_EQ(std::get<double>(*fold(OpKind::Cast, Type(DType::F64), {1.0 + std::ldexp(1.0, -11)}, DType::F16)), 1.0);
  EXPECT_EQ(std::get<double>(*fold(OpKind::Cast, Type(DType::F64), {1.0 + 3 * std::ldexp(1.0, -11)}, DType::F16)),
            1.0 + std::ldexp(1.0, -9));
  // int -> float and int -> int.
  EXPECT_EQ(std::get<double>(*fold(OpKind::Cast, Type(DType::I32), {int64_t(16777217)}, DType::F32)), 16777216.0);
  EXPECT_EQ(std::get<int64_t>(*fold(OpKind::Cast, Type(DType::I32), {int64_t(-1)}, DType::I8)), -1);
  EXPECT_EQ(std::get<int64_t>(*fold(OpKind::Cast, Type(DType::I32), {int64_t(384)}, DType::I8)), -128);
  EXPECT_EQ(std::get<int64_t>(*fold(OpKind::Cast, Type(DType::I1), {int64_t(1)}, DType::I32)), 1);
  EXPECT_EQ(std::get<int64_t>(*fold(OpKind::Cast, Type(DType::F32), {std::nan("")}, DType::I32)), 0);
  EXPECT_EQ(std::get<int64_t>(*fold(OpKind::Cast, Type(DType::F64), {1e300}, DType::I64)),
            std::numeric_limits<int64_t>::max());
}

TEST(Canonicalize, FoldsFloatArithmeticInTheOperandsPrecision) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  std::uniform_real_distribution<float> dist(-1000.f, 1000.f);
  for (int trial = 0; trial < 200; ++trial) {
    Eigen::half ha(dist(rng.gen)), hb(dist(rng.gen));
    double a = double(float(ha)), b = double(float(hb));
    SCOPED_TRACE("a=" + std::to_string(a) + " b=" + std::to_string(b));
    auto f16 = [&](OpKind k) { return std::get<double>(*fold(k, Type(DType::F16), {a, b}, DType::F16)); };
    EXPECT_EQ(f16(OpKind::Add), double(float(ha + hb)));
    EXPECT_EQ(f16(OpKind::Sub), double(float(ha - hb)));
    EXPECT_EQ(f16(OpKind::Mul), double(float(ha * hb)));
    EXPECT_EQ(f16(OpKind::Div), double(float(ha / hb)));
    float fa = dist(rng.gen), fb = dist(rng.gen);
    auto f32 = [&](OpKind k, std::vector<Attr> v) { return std::get<double>(*fold(k, Type(DType::F32), v, DType::F32)); };
    EXPECT_EQ(f32(OpKind::Add, {double(fa), double(fb)}), double(fa + fb));
    EXPECT_EQ(f32(OpKind::Mul, {double(fa), double(fb)}), double(fa * fb));
    EXPECT_EQ(f32(OpKind::Div, {double(fa), double(fb)}), double(fa / fb));
    EXPECT_EQ(f32(OpKind::Rem, {double(fa), double(fb)}), double(std::fmod(fa, fb)));
    EXPECT_EQ(f32(OpKind::Maximum, {double(fa), double(fb)}), double(std::max(fa, fb)));
    EXPECT_EQ(f32(OpKind::Minimum, {double(fa), double(fb)}), double(std::min(fa, fb)));
    EXPECT_EQ(f32(OpKind::Abs, {double(fa)}), double(std::fabs(fa)));
    EXPECT_EQ(f32(OpKind::Neg, {double(fa)}), double(-fa));
    float pos = std::fabs(fa) + 1e-3f;
    EXPECT_NEAR(f32(OpKind::Sqrt, {double(pos)}), std::sqrt(double(pos)), 1e-6 * std::sqrt(double(pos)));
    EXPECT_NEAR(f32(OpKind::Rsqrt, {double(pos)}), 1 / std::sqrt(double(pos)), 1e-6 / std::sqrt(double(pos)));
    EXPECT_NEAR(f32(OpKind::Log, {double(pos)}), std::log(double(pos)), 1e-6 * (1 + std::fabs(std::log(double(pos)))));
    EXPECT_NEAR(f32(OpKind::Log2, {double(pos)}), std::log2(double(pos)), 1e-6 * (1 + std::fabs(std::log2(double(pos)))));
    EXPECT_NEAR(f32(OpKind::Tanh, {double(fa / 100)}), std::tanh(double(fa / 100)), 1e-6);
    double small = double(fa) / 100;
    EXPECT_NEAR(f32(OpKind::Exp, {small}), std::exp(small), 1e-6 * std::exp(small));
    EXPECT_NEAR(f32(OpKind::Exp2, {small}), std::exp2(small), 1e-6 * std::exp2(small));
    for (auto [pred, want] : std::vector<std::pair<std::string, bool>>{
             {"eq", fa == fb}, {"ne", fa != fb}, {"lt", fa < fb}, {"le", fa <= fb}, {"gt", fa > fb}, {"ge", fa >= fb}})
      EXPECT_EQ(std::get<int64_t>(*fold(OpKind::Cmp, Type(DType::F32), {double(fa), double(fb)}, DType::I1, pred)),
                int64_t(want))
          << pred;
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Comparisons are ordered, except ne.
  EXPECT_EQ(std::get<int64_t>(*fold(OpKind::Cmp, Type(DType::F32), {nan, 1.0}, DType::I1, "eq")), 0);
  EXPECT_EQ(std::get<int64_t>(*fold(OpKind::Cmp, Type(DType::F32), {nan, 1.0}, DType::I1, "lt")), 0);
  EXPECT_EQ(std::get<int64_t>(*fold(OpKind::Cmp, Type(DType::F32), {nan, 1.0}, DType::I1, "ne")), 1);
  // maximum/minimum propagate NaN and order -0 < +0.
  EXPECT_TRUE(std::isnan(std::get<double>(*fold(OpKind::Maximum, Type(DType::F32), {nan, 1.0}, DType::F32))));
  EXPECT_TRUE(std::signbit(std::get<double>(*fold(OpKind::Minimum, Type(DType::F32), {0.0, -0.0}, DType::F32))));
  EXPECT_FALSE(std::signbit(std::get<double>(*fold(OpKind::Maximum, Type(DType::F32), {-0.0, 0.0}, DType::F32))));
}

// The interpreter is the semantic oracle: a folded program must store exactly
// the bytes the unfolded one stores, for random ops, dtypes and values
// (including NaN, infinities, signed zeros and values that need rounding).
TEST(Canonicalize, FoldingAgreesWithTheInterpreterBitForBit) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  const std::vector<DType> dtypes = {DType::I1, DType::I8, DType::I32, DType::I64,
                                     DType::F16, DType::BF16, DType::F32, DType::F64};
  auto pick = [&](size_t n) { return size_t(rng.gen() % n); };
  auto randomValue = [&](DType t) -> Attr {
    if (isInteger(t)) {
      int bits = bitWidth(t);
      int64_t v = pick(3) == 0 ? int64_t(pick(9)) - 4 : int64_t(rng.gen());
      if (bits == 1) return int64_t(v & 1);
      if (bits < 64) v = int64_t(uint64_t(v) << (64 - bits)) >> (64 - bits);
      return v;
    }
    const double specials[] = {0.0, -0.0, 1.0, -1.5, std::numeric_limits<double>::infinity(),
                               -std::numeric_limits<double>::infinity(), std::nan(""), 1e-40, 65519.0, 0.1};
    switch (pick(3)) {
      case 0: return specials[pick(std::size(specials))];
      case 1: return std::uniform_real_distribution<double>(-10, 10)(rng.gen);
      default: return std::ldexp(std::uniform_real_distribution<double>(-1, 1)(rng.gen), int(pick(80)) - 40);
    }
  };
  const std::vector<OpKind> unary = {OpKind::Neg, OpKind::Not, OpKind::Abs, OpKind::Exp, OpKind::Exp2, OpKind::Log,
                                     OpKind::Log2, OpKind::Tanh, OpKind::Sqrt, OpKind::Rsqrt, OpKind::Cast};
  const std::vector<OpKind> binary = {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Rem,
                                      OpKind::Maximum, OpKind::Minimum, OpKind::And, OpKind::Or, OpKind::Xor,
                                      OpKind::Shl, OpKind::Shr, OpKind::Cmp, OpKind::Select};
  int folded = 0;
  for (int trial = 0; trial < 600; ++trial) {
    DType t = dtypes[pick(dtypes.size())];
    bool isUnary = pick(2) == 0;
    OpKind k = isUnary ? unary[pick(unary.size())] : binary[pick(binary.size())];
    const uint32_t traits = opInfo(k).traits;
    if ((traits & kFloatOnly) && !isFloat(t)) continue;
    if (((traits & kIntOnly) || k == OpKind::Not) && !isInteger(t)) continue;
    DType rt = k == OpKind::Cmp ? DType::I1 : k == OpKind::Cast ? dtypes[pick(dtypes.size())] : t;
    Shape shape = pick(2) ? Shape{} : Shape{4};
    Function f("fold");
    Value* out = f.addParam(Type::pointer(rt));
    Builder b(f);
    std::vector<Attr> values;
    std::vector<Value*> operands;
    if (k == OpKind::Select) {
      values.push_back(int64_t(pick(2)));
      operands.push_back(b.create1(OpKind::Constant, {}, Type(DType::I1, shape), {{"value", values.back()}}));
    }
    for (int i = 0; i < (isUnary ? 1 : 2); ++i) {
      values.push_back(randomValue(t));
      operands.push_back(b.create1(OpKind::Constant, {}, Type(t, shape), {{"value", values.back()}}));
    }
    if ((k == OpKind::Div || k == OpKind::Rem) && isInteger(t) && std::get<int64_t>(values.back()) == 0) continue;
    Attrs attrs;
    if (k == OpKind::Cmp) attrs["pred"] = std::string(std::vector<const char*>{"eq", "ne", "lt", "le", "gt", "ge"}[pick(6)]);
    Value* r = b.create1(k, operands, Type(rt, shape), attrs);
    b.store(shape.empty() ? out : b.splat(out, shape), r);
    b.ret();
    std::string before = printFunction(f);
    SCOPED_TRACE(before);
    ASSERT_NO_THROW(verify(f));
    auto run = [&](const Function& g) {
      std::vector<unsigned char> bytes(size_t(byteWidth(rt)), 0xAB);
      interpret(g, {InterpArg::buffer(bytes.data(), bytes.size(), "out")}, {1, 1, 1}, {.threads = 1});
      return bytes;
    };
    auto expected = run(f);
    canonicalize(f);
    ASSERT_NO_THROW(verify(f));
    Op* store = testing::firstOp(f, OpKind::Store);
    ASSERT_TRUE(store->operand(1)->definingOp()->kind() == OpKind::Constant) << "not folded:\n" << printFunction(f);
    ++folded;
    EXPECT_EQ(run(f), expected) << "folded to:\n" << printFunction(f);
  }
  EXPECT_GT(folded, 200);
}

TEST(Canonicalize, FoldsUniformTilesAndKeepsLayouts) {
  auto f = parseFunction(R"(
#L = #ft.linear<[64], reg=[[32]], lane=[[1],[2],[4],[8],[16]], warp=[]>
func @k(%p: ptr<f32>) attributes {num_warps = 1} {
  %a = constant {value = 1.5} : f32[64]#L
  %s = constant {value = 2.0} : f32
  %b = splat %s : f32[64]#L
  %c = mul %a, %b : f32[64]#L
  %ps = splat %p : ptr<f32>[64]#L
  store %ps, %c
  return
}
)");
  canonicalize(*f);
  verify(*f);
  EXPECT_EQ(printFunction(*f),
            "#L0 = #ft.linear<[64], reg=[[32]], lane=[[1], [2], [4], [8], [16]], warp=[]>\n\n"
            "func @k(%p: ptr<f32>) attributes {num_warps = 1} {\n"
            "  %0 = constant {value = 3.0} : f32[64]#L0\n"
            "  %1 = splat %p : ptr<f32>[64]#L0\n"
            "  store %1, %0\n"
            "  return\n"
            "}\n");
}

TEST(Canonicalize, AlgebraicIdentities) {
  std::string out = after(canonicalize, R"(
func @k(%x: i32, %y: f32, %p: ptr<i32>, %q: ptr<f32>) {
  %z = constant {value = 0} : i32
  %one = constant {value = 1} : i32
  %a = add %x, %z : i32
  %b = mul %one, %a : i32
  %c = sub %b, %z : i32
  %d = div %c, %one : i32
  %e = or %d, %z : i32
  %f = xor %z, %e : i32
  %g = shl %f, %z : i32
  store %p, %g
  %h = mul %x, %z : i32
  store %p, %h
  %fz = constant {value = 0.0} : f32
  %fnz = constant {value = -0.0} : f32
  %f1 = constant {value = 1.0} : f32
  %k1 = add %y, %fz : f32
  store %q, %k1
  %k2 = add %y, %fnz : f32
  %k3 = sub %k2, %fz : f32
  %k4 = mul %k3, %f1 : f32
  store %q, %k4
  %k5 = mul %y, %fz : f32
  store %q, %k5
  return
}
)");
  EXPECT_EQ(out,
            "func @k(%x: i32, %y: f32, %p: ptr<i32>, %q: ptr<f32>) {\n"
            "  %0 = constant {value = 0} : i32\n"
            "  store %p, %x\n"
            "  store %p, %0\n"
            "  %1 = constant {value = 0.0} : f32\n"
            "  %2 = add %y, %1 : f32\n"  // y + 0.0 is not y when y is -0.0
            "  store %q, %2\n"
            "  store %q, %y\n"
            "  %3 = mul %y, %1 : f32\n"  // y * 0.0 is not 0 for inf, nan or negative y
            "  store %q, %3\n"
            "  return\n"
            "}\n");
}

TEST(Canonicalize, SplatsConstantsAndShapeOps) {
  std::string out = after(canonicalize, R"(
func @k(%x: f32, %p: ptr<f32>) {
  %c = constant {value = 2.5} : f32
  %t = splat %c : f32[64, 1]
  %b = broadcast %t : f32[64, 32]
  %sx = splat %x : f32[64]
  %e = expand_dims %sx {axis = 1} : f32[64, 1]
  %eb = broadcast %e : f32[64, 32]
  %sum = add %b, %eb : f32[64, 32]
  %r = reshape %sum : f32[2048]
  %r2 = reshape %r : f32[2048]
  %tr = trans %sum {perm = [0, 1]} : f32[64, 32]
  %same = broadcast %tr : f32[64, 32]
  %ps = splat %p : ptr<f32>[2048]
  store %ps, %r2
  %ps2 = splat %p : ptr<f32>[64, 32]
  store %ps2, %same
  return
}
)");
  EXPECT_EQ(out,
            "func @k(%x: f32, %p: ptr<f32>) {\n"
            "  %0 = constant {value = 2.5} : f32[64,32]\n"
            "  %1 = splat %x : f32[64,32]\n"
            "  %2 = add %0, %1 : f32[64,32]\n"
            "  %3 = reshape %2 : f32[2048]\n"
            "  %4 = splat %p : ptr<f32>[2048]\n"
            "  store %4, %3\n"
            "  %5 = splat %p : ptr<f32>[64,32]\n"
            "  store %5, %2\n"
            "  return\n"
            "}\n");
}

TEST(Canonicalize, CastsNegNotAndSelect) {
  std::string out = after(canonicalize, R"(
func @k(%x: f32, %i: i32, %c: i1, %p: ptr<f32>, %q: ptr<i32>) {
  %a = cast %x : f32
  %n1 = neg %a : f32
  %n2 = neg %n1 : f32
  store %p, %n2
  %b1 = not %i : i32
  %b2 = not %b1 : i32
  store %q, %b2
  %t = constant {value = 1} : i1
  %f = constant {value = 0} : i1
  %s1 = select %t, %x, %n1 : f32
  store %p, %s1
  %s2 = select %f, %x, %n1 : f32
  store %p, %s2
  %s3 = select %c, %n1, %n1 : f32
  store %p, %s3
  %s4 = select %c, %x, %n1 : f32
  store %p, %s4
  return
}
)");
  EXPECT_EQ(out,
            "func @k(%x: f32, %i: i32, %c: i1, %p: ptr<f32>, %q: ptr<i32>) {\n"
            "  %0 = neg %x : f32\n"
            "  store %p, %x\n"
            "  store %q, %i\n"
            "  store %p, %x\n"
            "  store %p, %0\n"
            "  store %p, %0\n"
            "  %1 = select %c, %x, %0 : f32\n"
            "  store %p, %1\n"
            "  return\n"
            "}\n");
}

TEST(Canonicalize, RemovesLoopsThatRunZeroTimes) {
  std::string out = after(canonicalize, R"(
func @k(%n: i32, %p: ptr<i32>) {
  %lo = constant {value = 10} : i32
  %hi = constant {value = 5} : i32
  %st = constant {value = 1} : i32
  %r = for %lo, %hi, %st, %n : i32 {
  ^bb(%iv: i32, %c: i32):
    store %p, %iv
    %c2 = add %c, %iv : i32
    yield %c2
  }
  store %p, %r
  %z = constant {value = 0} : i32
  %r2 = for %lo, %hi, %z, %n : i32 {
  ^bb(%iv: i32, %c: i32):
    yield %c
  }
  store %p, %r2
  %r3 = for %hi, %n, %st, %n : i32 {
  ^bb(%iv: i32, %c: i32):
    yield %c
  }
  store %p, %r3
  return
}
)");
  // The first loop is gone (its result is the init); a zero step or an unknown bound keeps the loop.
  EXPECT_EQ(out,
            "func @k(%n: i32, %p: ptr<i32>) {\n"
            "  %0 = constant {value = 10} : i32\n"
            "  %1 = constant {value = 5} : i32\n"
            "  %2 = constant {value = 1} : i32\n"
            "  store %p, %n\n"
            "  %3 = constant {value = 0} : i32\n"
            "  %4 = for %0, %1, %3, %n : i32 {\n"
            "  ^bb(%5: i32, %6: i32):\n"
            "    yield %6\n"
            "  }\n"
            "  store %p, %4\n"
            "  %7 = for %1, %n, %2, %n : i32 {\n"
            "  ^bb(%8: i32, %9: i32):\n"
            "    yield %9\n"
            "  }\n"
            "  store %p, %7\n"
            "  return\n"
            "}\n");
}

TEST(Canonicalize, KeepsTheEveryOpProgramValid) {
  for (bool layouts : {false, true}) {
    auto f = testing::everyOpProgram();
    if (layouts) testing::assignTestLayouts(*f);
    canonicalize(*f);
    EXPECT_NO_THROW(verify(*f)) << printFunction(*f);
    EXPECT_NE(testing::firstOp(*f, OpKind::Store), nullptr);
  }
}

// ---- CSE ----

TEST(CSE, MergesEqualPureOps) {
  std::string out = after(cse, R"(
func @k(%x: i32, %y: i32, %p: ptr<i32>, %q: ptr<i64>) {
  %a = program_id {axis = 0} : i32
  %b = program_id {axis = 0} : i32
  %c = program_id {axis = 1} : i32
  %s1 = add %a, %x : i32
  %s2 = add %x, %b : i32
  %d1 = sub %a, %x : i32
  %d2 = sub %x, %a : i32
  %k1 = constant {value = 1} : i32
  %k2 = constant {value = 1} : i32
  %k3 = constant {value = 1} : i64
  %l1 = cmp %x, %y {pred = "lt"} : i1
  %l2 = cmp %x, %y {pred = "le"} : i1
  %m1 = load %p : i32
  %m2 = load %p : i32
  store %p, %s1
  store %p, %s2
  store %p, %d1
  store %p, %d2
  store %p, %c
  store %p, %k1
  store %p, %k2
  store %q, %k3
  %w1 = cast %l1 : i32
  %w2 = cast %l2 : i32
  store %p, %w1
  store %p, %w2
  store %p, %m1
  store %p, %m2
  return
}
)");
  EXPECT_EQ(out,
            "func @k(%x: i32, %y: i32, %p: ptr<i32>, %q: ptr<i64>) {\n"
            "  %0 = program_id {axis = 0} : i32\n"
            "  %1 = program_id {axis = 1} : i32\n"
            "  %2 = add %0, %x : i32\n"  // x + a merged with a + x (commutative)
            "  %3 = sub %0, %x : i32\n"
            "  %4 = sub %x, %0 : i32\n"
            "  %5 = constant {value = 1} : i32\n"
            "  %6 = constant {value = 1} : i64\n"
            "  %7 = cmp %x, %y {pred = \"lt\"} : i1\n"
            "  %8 = cmp %x, %y {pred = \"le\"} : i1\n"
            "  %9 = load %p : i32\n"
            "  %10 = load %p : i32\n"  // loads are not pure: a store may come between
            "  store %p, %2\n"
            "  store %p, %2\n"
            "  store %p, %3\n"
            "  store %p, %4\n"
            "  store %p, %1\n"
            "  store %p, %5\n"
            "  store %p, %5\n"
            "  store %q, %6\n"
            "  %11 = cast %7 : i32\n"
            "  %12 = cast %8 : i32\n"
            "  store %p, %11\n"
            "  store %p, %12\n"
            "  store %p, %9\n"
            "  store %p, %10\n"
            "  return\n"
            "}\n");
}

TEST(CSE, RespectsRegionScoping) {
  std::string out = after(cse, R"(
func @k(%x: i32, %n: i32, %p: ptr<i32>) {
  %outer = add %x, %x : i32
  %r = for %x, %n, %x, %x : i32 {
  ^bb(%iv: i32, %c: i32):
    %inner = add %x, %x : i32
    %only = mul %x, %x : i32
    %again = mul %x, %x : i32
    %s = add %inner, %again : i32
    yield %s
  }
  %after = mul %x, %x : i32
  store %p, %outer
  store %p, %r
  store %p, %after
  return
}
)");
  EXPECT_EQ(out,
            "func @k(%x: i32, %n: i32, %p: ptr<i32>) {\n"
            "  %0 = add %x, %x : i32\n"
            "  %1 = for %x, %n, %x, %x : i32 {\n"
            "  ^bb(%2: i32, %3: i32):\n"
            "    %4 = mul %x, %x : i32\n"  // reuses nothing outside, is reused inside
            "    %5 = add %0, %4 : i32\n"
            "    yield %5\n"
            "  }\n"
            "  %6 = mul %x, %x : i32\n"  // the body's mul does not dominate this one
            "  store %p, %0\n"
            "  store %p, %1\n"
            "  store %p, %6\n"
            "  return\n"
            "}\n");
}

TEST(CSE, DistinguishesLayouts) {
  auto f = parseFunction(R"(
#A = #ft.linear<[64], reg=[[32]], lane=[[1],[2],[4],[8],[16]], warp=[]>
#B = #ft.linear<[64], reg=[[1]], lane=[[2],[4],[8],[16],[32]], warp=[]>
func @k(%x: f32, %p: ptr<f32>) attributes {num_warps = 1} {
  %a = splat %x : f32[64]#A
  %b = splat %x : f32[64]#B
  %c = splat %x : f32[64]#A
  %pa = splat %p : ptr<f32>[64]#A
  %pb = splat %p : ptr<f32>[64]#B
  store %pa, %a
  store %pb, %b
  store %pa, %c
  return
}
)");
  EXPECT_TRUE(cse(*f));
  verify(*f);
  int splats = 0;
  f->walk([&](const Op& op) { splats += op.kind() == OpKind::Splat; });
  EXPECT_EQ(splats, 4);
}

// ---- DCE ----

TEST(DCE, ErasesUnusedPureOpsAndLoads) {
  std::string out = after(dce, R"(
func @k(%x: i32, %n: i32, %p: ptr<i32>) {
  %a = add %x, %x : i32
  %b = mul %a, %a : i32
  %c = program_id {axis = 0} : i32
  %l = load %p : i32
  %kept = sub %x, %c : i32
  store %p, %kept
  return
}
)");
  EXPECT_EQ(out,
            "func @k(%x: i32, %n: i32, %p: ptr<i32>) {\n"
            "  %0 = program_id {axis = 0} : i32\n"
            "  %1 = sub %x, %0 : i32\n"
            "  store %p, %1\n"
            "  return\n"
            "}\n");
}

TEST(DCE, LoopsWithoutEffectsGoLoopsWithStoresStay) {
  std::string out = after(dce, R"(
func @k(%x: i32, %n: i32, %p: ptr<i32>) {
  %dead = for %x, %n, %x, %x : i32 {
  ^bb(%iv: i32, %c: i32):
    %v = load %p : i32
    %s = add %c, %v : i32
    yield %s
  }
  %live, %unused = for %x, %n, %x, %x, %x : i32, i32 {
  ^bb(%iv: i32, %c: i32, %u: i32):
    %waste = mul %iv, %iv : i32
    store %p, %c
    %u2 = add %u, %iv : i32
    yield %c, %u2
  }
  return
}
)");
  // The second loop stays whole, with its unused carried value.
  EXPECT_EQ(out,
            "func @k(%x: i32, %n: i32, %p: ptr<i32>) {\n"
            "  %0, %1 = for %x, %n, %x, %x, %x : i32, i32 {\n"
            "  ^bb(%2: i32, %3: i32, %4: i32):\n"
            "    store %p, %3\n"
            "    %5 = add %4, %2 : i32\n"
            "    yield %3, %5\n"
            "  }\n"
            "  return\n"
            "}\n");
}

TEST(Passes, AtomicAddsAreEffectsNeverMergedOrDropped) {
  // Two equal atomics add twice; unused results still add; a loop whose
  // only effect is an atomic stays.
  const std::string text = R"(
func @k(%x: f32, %n: i32, %p: ptr<f32>) {
  %a = atomic_add %p, %x : f32
  %b = atomic_add %p, %x : f32
  %zero = constant {value = 0} : i32
  %one = constant {value = 1} : i32
  %r = for %zero, %n, %one, %x : f32 {
  ^bb(%iv: i32, %c: f32):
    %o = atomic_add %p, %c : f32
    yield %c
  }
  return
}
)";
  const std::string expected =
      "func @k(%x: f32, %n: i32, %p: ptr<f32>) {\n"
      "  %0 = atomic_add %p, %x : f32\n"
      "  %1 = atomic_add %p, %x : f32\n"
      "  %2 = constant {value = 0} : i32\n"
      "  %3 = constant {value = 1} : i32\n"
      "  %4 = for %2, %n, %3, %x : f32 {\n"
      "  ^bb(%5: i32, %6: f32):\n"
      "    %7 = atomic_add %p, %6 : f32\n"
      "    yield %6\n"
      "  }\n"
      "  return\n"
      "}\n";
  EXPECT_EQ(after(cse, text), expected);
  EXPECT_EQ(after(dce, text), expected);
  EXPECT_EQ(after(canonicalize, text), expected);
}

TEST(DCE, ReturnsWhetherItChangedAnything) {
  auto f = testing::everyOpProgram();
  EXPECT_FALSE(dce(*f)) << "every value of the every-op program is used";
  EXPECT_TRUE(cse(*f)) << "it has two arange(0, 32) and two i32 zeros";
  EXPECT_FALSE(cse(*f));
  EXPECT_NO_THROW(verify(*f));
  Builder b(*f);
  b.setInsertionPointBefore(f->body().terminator());
  b.programId(2);
  EXPECT_TRUE(dce(*f));
  EXPECT_FALSE(dce(*f));
}


// ---- fold-scales and regroup-sums: values kept on random programs ----

// Random sums, differences, negations and products of f32 tiles, by uniform factors (splatted
// scalars, constants) and of broadcasts of rows and columns (some converted from integer
// positions, base + arange), some through a row maximum or minimum:
// the shapes both passes rewrite. Interpreted before and after the passes (with cse and dce) on
// random inputs, the results must agree within f32 reassociation error, and most programs must
// have been rewritten (so the check is not vacuous).
TEST(ReassociatePasses, RandomSumsAndProductsKeepTheirValues) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  auto pick = [&](size_t n) { return size_t(rng.gen() % n); };
  std::uniform_real_distribution<double> uniform(-2, 2);
  const int64_t M = 4, N = 8;
  int rewritten = 0, trials = 0;
  for (int trial = 0; trial < 300; ++trial) {
    Function f("sums");
    f.attrs()["reassociate"] = int64_t(1);
    Value* in = f.addParam(Type::pointer(DType::F32));
    Value* rowIn = f.addParam(Type::pointer(DType::F32));
    Value* colIn = f.addParam(Type::pointer(DType::F32));
    Value* a = f.addParam(Type(DType::F32));
    Value* c = f.addParam(Type(DType::F32));
    Value* base = f.addParam(Type(DType::I32));
    Value* out = f.addParam(Type::pointer(DType::F32));
    Builder b(f);
    const Shape full{M, N};
    Value* rowsIdx = b.expandDims(b.arange(0, M), 1);
    Value* colsIdx = b.expandDims(b.arange(0, N), 0);
    Value* offsets = b.binary(OpKind::Add, b.broadcast(b.binary(OpKind::Mul, rowsIdx, b.constantInt(Type(DType::I32, {M, 1}), N)), full),
                              b.broadcast(colsIdx, full));
    Value* x = b.load(b.addptr(b.splat(in, full), offsets));
    Value* row = b.load(b.addptr(b.splat(rowIn, {1, N}), colsIdx));   // [1, N]
    Value* col = b.load(b.addptr(b.splat(colIn, {M, 1}), rowsIdx));   // [M, 1]
    // A random expression of depth d over the leaves.
    std::function<Value*(int)> expr = [&](int depth) -> Value* {
      const size_t choice = depth == 0 ? pick(6) : 6 + pick(6);
      switch (choice) {
        case 0: return x;
        case 1: return b.unary(OpKind::Exp2, b.broadcast(row, full));
        case 2: return b.broadcast(pick(2) ? row : col, full);
        case 3: return b.splat(pick(2) ? a : c, full);
        case 4: return b.constant(Type(DType::F32, full), double(int(pick(7)) - 3) / 2);
        case 5: {  // positions: f32(splat(base) + arange), as a row or a column, broadcast
          const bool asRow = pick(2);
          Value* range = b.arange(0, asRow ? N : M);
          Value* pos = b.binary(OpKind::Add, b.splat(base, {asRow ? N : M}), range);
          return b.broadcast(b.cast(b.expandDims(pos, asRow ? 0 : 1), DType::F32), full);
        }
        case 6: return b.binary(OpKind::Add, expr(depth - 1), expr(depth - 1));
        case 7: return b.binary(OpKind::Sub, expr(depth - 1), expr(depth - 1));
        case 8: return b.unary(OpKind::Neg, expr(depth - 1));
        case 9: return b.binary(OpKind::Mul, expr(depth - 1), b.splat(pick(2) ? a : c, full));
        case 10: return b.binary(OpKind::Mul, b.constant(Type(DType::F32, full), 1.4426950408889634), expr(depth - 1));
        default: {  // e - bcast(max(e)) (the softmax's shape), e used twice
          Value* e = expr(depth - 1);
          Value* m = b.reduce(e, 1, pick(2) ? "max" : "min");
          return b.binary(OpKind::Sub, e, b.broadcast(b.expandDims(m, 1), full));
        }
      }
    };
    Value* result = expr(1 + int(pick(4)));
    b.store(b.addptr(b.splat(out, full), offsets), result);
    b.ret();
    ASSERT_NO_THROW(verify(f));
    const std::string before = printFunction(f);
    SCOPED_TRACE(before);

    std::vector<float> xs(static_cast<size_t>(M * N)), rows(static_cast<size_t>(N)), cols(static_cast<size_t>(M));
    for (auto& v : xs) v = float(uniform(rng.gen));
    for (auto& v : rows) v = float(uniform(rng.gen));
    for (auto& v : cols) v = float(uniform(rng.gen));
    const double av = uniform(rng.gen), cv = uniform(rng.gen);
    const int64_t basev = int64_t(pick(2001)) - 1000;
    auto run = [&](const Function& g) {
      std::vector<float> o(size_t(M * N), NAN);
      interpret(g,
                {InterpArg::buffer(xs.data(), xs.size() * 4, "in"), InterpArg::buffer(rows.data(), rows.size() * 4, "row"),
                 InterpArg::buffer(cols.data(), cols.size() * 4, "col"), InterpArg::real(av), InterpArg::real(cv),
                 InterpArg::integer(basev), InterpArg::buffer(o.data(), o.size() * 4, "out")},
                {1, 1, 1}, {.threads = 1});
      return o;
    };
    const std::vector<float> expected = run(f);
    // As the compiler's pipeline runs them; with invariant terms, fold-scales again after regroup-sums.
    const bool invariantTerms = pick(2);
    bool folded = foldScales(f, invariantTerms);
    const bool regrouped = regroupSums(f);
    if (invariantTerms) folded = foldScales(f, true) || folded;
    cse(f);
    dce(f);
    ASSERT_NO_THROW(verify(f)) << printFunction(f);
    rewritten += folded || regrouped;
    ++trials;
    const std::vector<float> got = run(f);
    double scale = 1;
    for (float v : expected) scale = std::max(scale, double(std::fabs(v)));
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], expected[i], 1e-4 * scale * 8) << "element " << i << " after:\n" << printFunction(f);
  }
  EXPECT_GT(rewritten, trials / 4) << "the passes rewrote " << rewritten << " of " << trials << " programs";
}

}  // namespace
}  // namespace flextile::ir
