// Every element-wise op of the op table (ir/Ops.def), walked from the table
// itself: constant folding (canonicalize) must give exactly what the
// interpreter computes, bit for bit, on random and edge-case scalars of every
// dtype the op allows, and must leave alone exactly what the interpreter
// rejects at run time (an integer division by zero).
#include <set>

#include "ir/Elementwise.h"
#include "ir/Passes.h"
#include "ir/Verifier.h"
#include "tests/gpu/TestBudget.h"
#include "tests/interpreter/TestUtil.h"

namespace flextile::test {
namespace {

const DType kAllDTypes[] = {DType::I1, DType::I8, DType::I32, DType::I64, DType::F16, DType::BF16, DType::F32, DType::F64};

// Edge cases first, then random values; every value is one of dtype t.
std::vector<double> floatValues(std::mt19937_64& rng, DType t, int randomCount) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> v = {0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 3.0, -7.25, inf, -inf, std::nan(""),
                           1e-30, -1e-30, 1e30, 65504.0, 70000.0, 1e-6, 1e300, -2.5e9, 3e9, 1e20};
  for (int i = 0; i < randomCount; ++i) {
    double x = uniform(rng, -1, 1) * std::ldexp(1.0, int(uniformInt(rng, -20, 40)));
    v.push_back(x);
  }
  for (double& x : v) x = toFloatDType(x, t);
  return v;
}

std::vector<int64_t> intValues(std::mt19937_64& rng, DType t, int randomCount) {
  const int bits = bitWidth(t);
  const int64_t maxV = bits == 64 ? std::numeric_limits<int64_t>::max() : (int64_t(1) << (bits - 1)) - 1;
  const int64_t minV = bits == 64 ? std::numeric_limits<int64_t>::min() : -(int64_t(1) << (bits - 1));
  std::vector<int64_t> v = {0, 1, -1, 2, 3, -7, maxV, minV, minV + 1, bits - 1, bits, bits + 1, 63, 64, 100};
  for (int i = 0; i < randomCount; ++i) v.push_back(uniformInt(rng, minV, maxV));
  for (int64_t& x : v) x = wrapToWidth(x, t);
  return v;
}

struct Operand {
  double f = 0;
  int64_t i = 0;
};

Value* constantOf(Builder& b, DType t, const Operand& v) {
  return isFloat(t) ? b.constant(Type(t), v.f) : b.constantInt(Type(t), v.i);
}

// out[0] = op(constants); `attrs` carries cmp's pred.
std::unique_ptr<Function> scalarKernel(OpKind k, DType in, DType out, const std::vector<Operand>& operands,
                                       const Attrs& attrs) {
  auto f = std::make_unique<Function>("fold_" + std::string(opName(k)));
  Value* p = f->addParam(Type::pointer(out), "out");
  Builder b(*f);
  std::vector<Value*> vs;
  for (size_t i = 0; i < operands.size(); ++i)
    vs.push_back(constantOf(b, k == OpKind::Select && i == 0 ? DType::I1 : in, operands[i]));
  Value* r = b.create1(k, vs, Type(out), attrs);
  b.store(p, r);
  b.ret();
  return f;
}

// What the kernel stores, as raw bytes, or the interpreter's error.
struct Outcome {
  bool failed = false;
  std::string error;
  uint64_t bits = 0;
};

Outcome run(const Function& f, DType out) {
  // Run under two poisons: bytes the kernel stores are the same in both runs,
  // and a kernel that stores nothing shows its poison.
  const uint64_t mask = byteWidth(out) == 8 ? ~uint64_t(0) : (uint64_t(1) << (8 * byteWidth(out))) - 1;
  Outcome o;
  uint64_t results[2];
  const uint64_t poisons[2] = {0xA5A5A5A5A5A5A5A5ull, 0x5A5A5A5A5A5A5A5Aull};
  for (int i = 0; i < 2; ++i) {
    uint64_t buffer = poisons[i];
    try {
      InterpOptions options;
      options.threads = 1;
      interpret(f, {InterpArg::buffer(&buffer, size_t(byteWidth(out)), "out")}, {1, 1, 1}, options);
    } catch (const Error& e) {
      o.failed = true;
      o.error = e.what();
      return o;
    }
    EXPECT_EQ(buffer & ~mask, poisons[i] & ~mask) << "stored past the element";
    results[i] = buffer & mask;
  }
  EXPECT_EQ(results[0], results[1]) << "the result was not stored";
  o.bits = results[0];
  return o;
}

bool isNaNBits(uint64_t bits, DType t) {
  switch (t) {
    case DType::F16: return (bits & 0x7C00) == 0x7C00 && (bits & 0x03FF) != 0;
    case DType::BF16: return (bits & 0x7F80) == 0x7F80 && (bits & 0x007F) != 0;
    case DType::F32: return (bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu) != 0;
    case DType::F64: return std::isnan(std::bit_cast<double>(bits));
    default: return false;
  }
}

bool hasOp(const Function& f, OpKind k) {
  bool found = false;
  f.walk([&](const Op& op) { found |= op.kind() == k; });
  return found;
}

std::string describe(OpKind k, DType in, const Attrs& attrs, const std::vector<Operand>& operands) {
  std::string s = std::string(opName(k)) + " " + std::string(dtypeName(in));
  for (const auto& [name, a] : attrs) s += " " + name + "=" + attrString(a);
  s += " on";
  for (const Operand& o : operands) s += " " + (isFloat(in) ? std::to_string(o.f) : std::to_string(o.i));
  return s;
}

// Folds the kernel and compares its stored value with the unfolded kernel's.
// Returns whether it folded.
bool checkFolding(OpKind k, DType in, DType out, const std::vector<Operand>& operands, const Attrs& attrs = {}) {
  SCOPED_TRACE(describe(k, in, attrs, operands));
  auto f = scalarKernel(k, in, out, operands, attrs);
  verify(*f);
  Outcome interpreted = run(*f, out);
  auto folded = f->clone();
  canonicalize(*folded);
  verify(*folded);
  Outcome afterFolding = run(*folded, out);
  if (interpreted.failed) {
    // Only a run-time error of the program itself: the fold must not hide it.
    EXPECT_NE(interpreted.error.find("division by zero"), std::string::npos) << interpreted.error;
    EXPECT_TRUE(hasOp(*folded, k)) << "canonicalize folded away an op the interpreter rejects";
    EXPECT_TRUE(afterFolding.failed);
    return false;
  }
  EXPECT_FALSE(hasOp(*folded, k)) << "every operand is a constant, yet the op was not folded";
  EXPECT_FALSE(afterFolding.failed) << afterFolding.error;
  if (isNaNBits(interpreted.bits, out))
    EXPECT_TRUE(isNaNBits(afterFolding.bits, out)) << std::hex << afterFolding.bits;
  else
    EXPECT_EQ(afterFolding.bits, interpreted.bits) << std::hex << "interpreted " << interpreted.bits << ", folded "
                                                   << afterFolding.bits;
  return true;
}

// The values of an operand of dtype t to try, as Operands.
std::vector<Operand> operandValues(std::mt19937_64& rng, DType t, int randomCount) {
  std::vector<Operand> v;
  if (isFloat(t))
    for (double x : floatValues(rng, t, randomCount)) v.push_back({x, 0});
  else
    for (int64_t x : intValues(rng, t, randomCount)) v.push_back({0, x});
  return v;
}

TEST(ElementwiseTable, FoldingComputesWhatTheInterpreterComputes) {
  FT_SEEDED_RNG(rng);
  // Random operands beside the fixed edge values: fewer in the sanitizer build, where the pairs of
  // every binary op made this test 27 CPU-seconds (2026-12-07).
  const int randomOperands = flextile::testing::kSanitizedBuild ? 2 : 12;
  std::set<OpKind> checked;
  int folds = 0, refusals = 0;
  auto tally = [&](bool folded) { folded ? ++folds : ++refusals; };

  auto checkArithmetic = [&](OpKind k, int nops, uint32_t traits) {
    for (DType t : kAllDTypes) {
      if ((traits & kIntOnly) && !isInteger(t)) continue;
      if ((traits & kFloatOnly) && !isFloat(t)) continue;
      std::vector<Operand> as = operandValues(rng, t, randomOperands);
      for (size_t i = 0; i < as.size(); ++i) {
        if (nops == 1) {
          tally(checkFolding(k, t, t, {as[i]}));
          continue;
        }
        std::vector<Operand> bs = operandValues(rng, t, randomOperands);
        for (size_t j = 0; j < bs.size(); ++j) tally(checkFolding(k, t, t, {as[i], bs[j]}));
      }
    }
  };

  // Walks the table: an element-wise op this test does not know fails below.
#define FT_OP(Enum, name, nops, nres, traits)                                                          \
  if ((traits) & kElementwise) {                                                                      \
    constexpr OpKind k = OpKind::Enum;                                                                 \
    if ((traits) & kArithmetic) {                                                                      \
      checkArithmetic(k, nops, traits);                                                                \
      checked.insert(k);                                                                               \
    } else if (k == OpKind::Cmp) {                                                                     \
      for (DType t : kAllDTypes) {                                                                     \
        std::vector<Operand> as = operandValues(rng, t, 8), bs = operandValues(rng, t, 8);             \
        for (const char* pred : {"eq", "ne", "lt", "le", "gt", "ge"})                                  \
          for (const Operand& a : as)                                                                  \
            for (const Operand& b : bs) tally(checkFolding(k, t, DType::I1, {a, b}, {{"pred", std::string(pred)}})); \
      }                                                                                                \
      checked.insert(k);                                                                               \
    } else if (k == OpKind::Cast) {                                                                    \
      for (DType from : kAllDTypes)                                                                    \
        for (DType to : kAllDTypes)                                                                    \
          for (const Operand& a : operandValues(rng, from, 16)) tally(checkFolding(k, from, to, {a}));  \
      checked.insert(k);                                                                               \
    } else if (k == OpKind::Select) {                                                                  \
      for (DType t : kAllDTypes) {                                                                     \
        std::vector<Operand> as = operandValues(rng, t, 4), bs = operandValues(rng, t, 4);             \
        for (int64_t c : {0, 1})                                                                       \
          for (size_t i = 0; i < as.size(); ++i) tally(checkFolding(k, t, t, {{0, c}, as[i], bs[i]})); \
      }                                                                                                \
      checked.insert(k);                                                                               \
    } else if (k == OpKind::AddPtr) {                                                                  \
      checked.insert(k); /* no pointer constants exist: there is nothing to fold */                   \
    } else {                                                                                           \
      ADD_FAILURE() << "element-wise op '" << name << "' is not checked here: add it";                \
    }                                                                                                  \
  }
#include "ir/Ops.def"

  size_t elementwiseOps = 0;
#define FT_OP(Enum, name, nops, nres, traits) elementwiseOps += ((traits) & kElementwise) ? 1 : 0;
#include "ir/Ops.def"
  EXPECT_EQ(checked.size(), elementwiseOps);
  EXPECT_GT(folds, 10000);
  EXPECT_GT(refusals, 0) << "integer division by zero was never tried";
}

// The one-element evaluation is the interpreter's loop body: spot checks of
// the documented edge cases (ir/Interpreter.h), so that a change of semantics
// shows up here and not only as agreement between two consumers.
TEST(ElementwiseTable, DocumentedEdgeCases) {
  const int64_t i32Min = std::numeric_limits<int32_t>::min();
  EXPECT_EQ(evaluateIntArithmetic(OpKind::Div, DType::I32, i32Min, -1), i32Min);
  EXPECT_EQ(evaluateIntArithmetic(OpKind::Rem, DType::I32, i32Min, -1), 0);
  EXPECT_EQ(evaluateIntArithmetic(OpKind::Div, DType::I32, -7, 2), -3);
  EXPECT_EQ(evaluateIntArithmetic(OpKind::Rem, DType::I32, -7, 2), -1);
  EXPECT_EQ(evaluateIntArithmetic(OpKind::Div, DType::I32, 5, 0), std::nullopt);
  EXPECT_EQ(evaluateIntArithmetic(OpKind::Abs, DType::I32, i32Min), i32Min);
  EXPECT_EQ(evaluateIntArithmetic(OpKind::Add, DType::I8, 127, 1), -128);
  EXPECT_EQ(evaluateIntArithmetic(OpKind::Shl, DType::I32, 1, 32), 0);
  EXPECT_EQ(evaluateIntArithmetic(OpKind::Shl, DType::I32, 1, -1), 0);  // the amount is unsigned
  EXPECT_EQ(evaluateIntArithmetic(OpKind::Shr, DType::I32, -8, 40), -1);
  EXPECT_EQ(evaluateIntArithmetic(OpKind::Shr, DType::I32, -8, 1), -4);
  EXPECT_EQ(evaluateIntArithmetic(OpKind::Not, DType::I1, 1), 0);
  EXPECT_EQ(evaluateIntArithmetic(OpKind::Exp, DType::I32, 1), std::nullopt);
  EXPECT_EQ(evaluateFloatArithmetic(OpKind::And, DType::F32, 1, 1), std::nullopt);
  EXPECT_TRUE(std::isnan(*evaluateFloatArithmetic(OpKind::Maximum, DType::F32, std::nan(""), 1)));
  EXPECT_TRUE(std::signbit(*evaluateFloatArithmetic(OpKind::Minimum, DType::F32, 0.0, -0.0)));
  EXPECT_FALSE(std::signbit(*evaluateFloatArithmetic(OpKind::Maximum, DType::F32, -0.0, 0.0)));
  EXPECT_EQ(*evaluateFloatArithmetic(OpKind::Add, DType::F16, 2048, 1), 2048);  // ties to even
  EXPECT_EQ(*evaluateFloatArithmetic(OpKind::Add, DType::F16, 2048, 3), 2052);
  EXPECT_EQ(*evaluateFloatArithmetic(OpKind::Rem, DType::F32, -7, 2), -1);
  EXPECT_EQ(floatToInt(3e9, DType::I32), std::numeric_limits<int32_t>::max());
  EXPECT_EQ(floatToInt(-3e9, DType::I32), i32Min);
  EXPECT_EQ(floatToInt(std::nan(""), DType::I32), 0);
  EXPECT_EQ(floatToInt(-2.9, DType::I8), -2);
  EXPECT_EQ(floatToInt(std::nan(""), DType::I1), 1);
  EXPECT_EQ(intToInt(300, DType::I8), 44);
  EXPECT_EQ(intToInt(-2, DType::I1), 1);
  // Ties go to even; a value just past a tie goes up.
  EXPECT_EQ(toFloatDType(int64_t((1 << 24) + 1), DType::F32), double(1 << 24));
  EXPECT_EQ(toFloatDType(2049.0000001, DType::F16), 2050.0);
}

}  // namespace
}  // namespace flextile::test
