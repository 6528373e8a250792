// One test per verifier rule: each builds (or parses) a program that breaks
// exactly that rule and checks that the error names the op and the problem.
#include <gtest/gtest.h>

#include "TestPrograms.h"
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"

namespace flextile::ir {
namespace {

using testing::firstOp;

std::string verifyError(const Function& f) {
  try {
    verify(f);
  } catch (const Error& e) {
    return e.what();
  }
  return "(valid)";
}

// Parses a function body given as ops; the parameters are fixed.
std::string bodyError(const std::string& ops,
                      const std::string& params = "%x: f32, %i: i32, %p: ptr<f32>, %q: ptr<f16>, %n: i32") {
  auto f = parseFunction("func @v(" + params + ") {\n" + ops + "  return\n}\n", "v.ftir");
  return verifyError(*f);
}

#define EXPECT_HAS(msg, ...)                                                                          \
  do {                                                                                                \
    std::string m_ = (msg);                                                                           \
    for (std::string piece_ : {__VA_ARGS__})                                                          \
      EXPECT_NE(m_.find(piece_), std::string::npos) << "missing '" << piece_ << "' in:\n" << m_;      \
  } while (0)

TEST(Verifier, ValidProgramsPass) {
  auto f = testing::everyOpProgram();
  EXPECT_EQ(verifyError(*f), "(valid)");
  testing::assignTestLayouts(*f);
  EXPECT_EQ(verifyError(*f), "(valid)") << printFunction(*f);
  EXPECT_TRUE(verificationProblems(*f).empty());
}

TEST(Verifier, OperandAndResultCountsComeFromTheOpTable) {
  Function f("v");
  Value* x = f.addParam(Type(DType::F32));
  Builder b(f);
  b.create(OpKind::Add, {x}, {Type(DType::F32)});
  b.create(OpKind::Neg, {x}, {Type(DType::F32), Type(DType::F32)});
  b.ret();
  EXPECT_HAS(verifyError(f), "op 'add': expects 2 operands, got 1", "op 'neg': expects 1 results, got 2");
}

TEST(Verifier, ElementwiseShapesMustAgree) {
  EXPECT_HAS(bodyError("  %a = splat %x : f32[64]\n  %b = splat %x : f32[32]\n  %c = add %a, %b : f32[64]\n"),
             "op 'add'", "one shape", "operand #1 is f32[32]");
  // A scalar does not mix with a tile: the DSL splats explicitly.
  EXPECT_HAS(bodyError("  %a = splat %x : f32[64]\n  %c = mul %a, %x : f32[64]\n"), "op 'mul'", "operand #1 is f32,");
}

TEST(Verifier, ElementwiseDtypesMustAgree) {
  EXPECT_HAS(bodyError("  %c = add %x, %i : f32\n"), "op 'add'", "one dtype", "operand #1 is i32");
  EXPECT_HAS(bodyError("  %c = neg %x : f16\n"), "op 'neg'", "operand #0 is f32, result is f16");
}

TEST(Verifier, FloatOnlyAndIntOnlyOps) {
  EXPECT_HAS(bodyError("  %c = exp %i : i32\n"), "op 'exp'", "needs a float dtype, got i32");
  EXPECT_HAS(bodyError("  %c = rsqrt %i : i32\n"), "op 'rsqrt'", "needs a float dtype");
  EXPECT_HAS(bodyError("  %c = xor %x, %x : f32\n"), "op 'xor'", "needs an integer dtype, got f32");
  EXPECT_HAS(bodyError("  %c = not %x : f32\n"), "op 'not'", "needs an integer dtype");
  EXPECT_HAS(bodyError("  %c = add %p, %p : ptr<f32>\n"), "op 'add'", "does not apply to pointers");
}

TEST(Verifier, CmpPredicateAndResult) {
  EXPECT_HAS(bodyError("  %c = cmp %x, %x {pred = \"less\"} : i1\n"), "op 'cmp'", "pred \"less\" is not one of: eq ne lt le gt ge");
  EXPECT_HAS(bodyError("  %c = cmp %x, %x : i1\n"), "op 'cmp'", "needs a string attribute 'pred'");
  EXPECT_HAS(bodyError("  %c = cmp %x, %x {pred = \"lt\"} : i32\n"), "op 'cmp'", "result must be i1, got i32");
  EXPECT_HAS(bodyError("  %c = cmp %x, %i {pred = \"lt\"} : i1\n"), "op 'cmp'", "compares f32 with i32");
}

TEST(Verifier, SelectConditionIsI1) {
  EXPECT_HAS(bodyError("  %c = select %i, %x, %x : f32\n"), "op 'select'", "condition must be i1, got i32");
  EXPECT_HAS(bodyError("  %t = cmp %x, %x {pred = \"eq\"} : i1\n  %c = select %t, %x, %i : f32\n"), "op 'select'",
             "both choices must have the result's dtype f32");
}

TEST(Verifier, AddPtrTakesAPointerAndAnIntegerOffset) {
  EXPECT_HAS(bodyError("  %c = addptr %i, %i : i32\n"), "op 'addptr'", "first operand must be a pointer, got i32");
  EXPECT_HAS(bodyError("  %c = addptr %p, %x : ptr<f32>\n"), "op 'addptr'", "offset must be i32 or i64, got f32");
  EXPECT_HAS(bodyError("  %c = addptr %p, %i : ptr<f16>\n"), "op 'addptr'", "result ptr<f16> must have the pointer type");
}

TEST(Verifier, CastHasNoPointers) {
  EXPECT_HAS(bodyError("  %c = cast %p : i64\n"), "op 'cast'", "no pointer casts");
}

TEST(Verifier, PointersCompareOnlyForEquality) {
  EXPECT_EQ(bodyError("  %c = cmp %p, %p {pred = \"eq\"} : i1\n  %d = cmp %p, %p {pred = \"ne\"} : i1\n"), "(valid)");
  for (const char* pred : {"lt", "le", "gt", "ge"})
    EXPECT_HAS(bodyError("  %c = cmp %p, %p {pred = \"" + std::string(pred) + "\"} : i1\n"), std::string("op 'cmp'"),
               "pointers compare only with eq or ne, got pred \"" + std::string(pred) + "\"");
}

TEST(Verifier, PointersAreNeverLoadedOrStored) {
  // ptr<ptr> has no text form: built directly.
  Function f("v");
  Value* pp = f.addParam(Type::pointer(DType::Ptr), "pp");
  Value* p = f.addParam(Type::pointer(DType::F32), "p");
  Builder b(f);
  b.create1(OpKind::Load, {pp}, Type::pointer(DType::F32));
  b.create(OpKind::Store, {pp, p}, {});
  b.ret();
  std::string msg = verifyError(f);
  EXPECT_HAS(msg, "2 problems", "op 'load': cannot load or store pointers (address ptr<", "op 'store': cannot load or store pointers");
}

TEST(Verifier, LoadMatchesItsPointee) {
  EXPECT_HAS(bodyError("  %c = load %p : f16\n"), "op 'load'", "result must be f32 to match address ptr<f32>, got f16");
  EXPECT_HAS(bodyError("  %c = load %x : f32\n"), "op 'load'", "address must be a pointer, got f32");
  EXPECT_HAS(bodyError("  %ps = splat %p : ptr<f32>[64]\n  %c = load %ps, %i : f32[64]\n"), "op 'load'",
             "mask must be i1[64], got i32");
  EXPECT_HAS(bodyError("  %ps = splat %p : ptr<f32>[64]\n  %m = constant {value = 1} : i1[64]\n"
                       "  %c = load %ps, %m, %x : f32[64]\n"),
             "op 'load'", "'other' must be f32[64], got f32");
  EXPECT_HAS(bodyError("  %ps = splat %p : ptr<f32>[64]\n  %c = load %ps : f32[32]\n"), "op 'load'", "result must be f32[64]");
}

TEST(Verifier, StoreMatchesItsPointee) {
  EXPECT_HAS(bodyError("  store %p, %i\n"), "op 'store'", "stored value must be f32 to match address ptr<f32>, got i32");
  EXPECT_HAS(bodyError("  store %p\n"), "op 'store'", "takes 2 to 3 operands, got 1");
  EXPECT_HAS(bodyError("  %ps = splat %p : ptr<f32>[64]\n  %v = splat %x : f32[64]\n  store %ps, %v, %x\n"), "op 'store'",
             "mask must be i1[64], got f32");
}

TEST(Verifier, AtomicAddTakesF32I32OrI64) {
  const std::string params = "%x: f32, %i: i32, %p: ptr<f32>, %q: ptr<f16>, %c: ptr<i32>, %w: ptr<i64>, %d: ptr<f64>";
  EXPECT_EQ(bodyError("  %a = atomic_add %p, %x : f32\n  %b = atomic_add %c, %i : i32\n"
                      "  %one = constant {value = 1} : i64\n  %e = atomic_add %w, %one : i64\n",
                      params),
            "(valid)");
  EXPECT_HAS(bodyError("  %v = constant {value = 1.0} : f16\n  %a = atomic_add %q, %v : f16\n", params),
             "op 'atomic_add'", "adds f32, i32 or i64 atomically, not f16 (address ptr<f16>)");
  EXPECT_HAS(bodyError("  %v = constant {value = 1.0} : f64\n  %a = atomic_add %d, %v : f64\n", params),
             "op 'atomic_add'", "not f64");
  EXPECT_HAS(bodyError("  %a = atomic_add %x, %x : f32\n", params), "op 'atomic_add'",
             "address must be a pointer, got f32");
}

// fence means acq_rel at GPU scope and nothing else: an attribute (a scope, an ordering) that
// would be ignored is an error, as are operands.
TEST(Verifier, FenceTakesNothing) {
  EXPECT_EQ(bodyError("  store %p, %x\n  fence\n  %y = load %p : f32\n"), "(valid)");
  EXPECT_HAS(bodyError("  fence {scope = \"cta\"}\n"), "op 'fence'", "takes no attributes (it is acq_rel at GPU scope), got 'scope'");
  std::string parseError = "(parsed)";  // the parser already counts operands against ir/Ops.def
  try {
    bodyError("  fence %x\n");
  } catch (const std::exception& e) {
    parseError = e.what();
  }
  EXPECT_HAS(parseError, "v.ftir:2:3", "op 'fence' expects 0 operands, got 1");
}

// A close may hand the end of the turns back (codegen/passes/Pingpong.cpp); no other step may.
TEST(Verifier, OnlyACloseTurnTakesAHandshake) {
  EXPECT_EQ(bodyError("  warpgroup_turn {step = \"open\"}\n  warpgroup_turn {handshake = 1, step = \"close\"}\n"), "(valid)");
  EXPECT_HAS(bodyError("  warpgroup_turn {handshake = 1, step = \"begin\"}\n"), "op 'warpgroup_turn'",
             "takes 'handshake = 1' on its close step only");
  EXPECT_HAS(bodyError("  warpgroup_turn {handshake = 2, step = \"close\"}\n"), "op 'warpgroup_turn'",
             "takes 'handshake = 1' on its close step only");
  EXPECT_HAS(bodyError("  warpgroup_turn {step = \"close\", turns = 1}\n"), "op 'warpgroup_turn'",
             "takes only the attributes 'step' and (on a close) 'handshake'");
}

TEST(Verifier, AtomicAddValueMaskAndResultMatchTheAddress) {
  EXPECT_HAS(bodyError("  %a = atomic_add %p, %i : f32\n"), "op 'atomic_add'",
             "added value must be f32 to match address ptr<f32>, got i32");
  EXPECT_HAS(bodyError("  %ps = splat %p : ptr<f32>[64]\n  %v = splat %x : f32[32]\n  %a = atomic_add %ps, %v : f32[64]\n"),
             "op 'atomic_add'", "added value must be f32[64]", "got f32[32]");
  EXPECT_HAS(bodyError("  %ps = splat %p : ptr<f32>[64]\n  %v = splat %x : f32[64]\n  %a = atomic_add %ps, %v, %x : f32[64]\n"),
             "op 'atomic_add'", "mask must be i1[64], got f32");
  EXPECT_HAS(bodyError("  %ps = splat %p : ptr<f32>[64]\n  %v = splat %x : f32[64]\n"
                       "  %m = constant {value = 1} : i1[32]\n  %a = atomic_add %ps, %v, %m : f32[64]\n"),
             "op 'atomic_add'", "mask must be i1[64], got i1[32]");
  EXPECT_HAS(bodyError("  %ps = splat %p : ptr<f32>[64]\n  %v = splat %x : f32[64]\n  %a = atomic_add %ps, %v : i32[64]\n"),
             "op 'atomic_add'", "result (the old values) must be f32[64], got i32[64]");
  EXPECT_HAS(bodyError("  %a = atomic_add %p : f32\n"), "op 'atomic_add'", "takes 2 to 3 operands (ptr, value [, mask]), got 1");
}

TEST(Verifier, ReduceAxisKindAndShape) {
  const std::string tile = "  %t = constant {value = 1.0} : f32[64, 32]\n";
  EXPECT_HAS(bodyError(tile + "  %r = reduce %t {axis = 2, kind = \"sum\"} : f32[64]\n"), "op 'reduce'",
             "attribute axis = 2 is outside [0, 1]");
  EXPECT_HAS(bodyError(tile + "  %r = reduce %t {axis = 1, kind = \"mean\"} : f32[64]\n"), "op 'reduce'",
             "kind \"mean\" is not one of: sum max min");
  EXPECT_HAS(bodyError(tile + "  %r = reduce %t {axis = 1, kind = \"max\"} : f32[32]\n"), "op 'reduce'",
             "result must be f32[64], got f32[32]");
  EXPECT_HAS(bodyError("  %r = reduce %x {axis = 0, kind = \"max\"} : f32\n"), "op 'reduce'", "operand must be a tile");
}

TEST(Verifier, DotShapes) {
  const std::string tiles =
      "  %a = constant {value = 1.0} : f16[64, 32]\n  %b = constant {value = 1.0} : f16[16, 16]\n"
      "  %b2 = constant {value = 1.0} : f16[32, 16]\n  %c = constant {value = 0.0} : f32[64, 16]\n"
      "  %c2 = constant {value = 0.0} : f32[32, 16]\n  %bf = constant {value = 1.0} : f32[32, 16]\n";
  EXPECT_HAS(bodyError(tiles + "  %d = dot %a, %b, %c : f32[64, 16]\n"), "op 'dot'",
             "needs a[M,K] b[K,N] acc[M,N], got f16[64,32], f16[16,16], f32[64,16]");
  EXPECT_HAS(bodyError(tiles + "  %d = dot %a, %b2, %c2 : f32[32, 16]\n"), "op 'dot'", "needs a[M,K] b[K,N] acc[M,N]");
  EXPECT_HAS(bodyError(tiles + "  %d = dot %a, %b2, %c : f16[64, 16]\n"), "op 'dot'", "result must be the accumulator's type");
  EXPECT_HAS(bodyError(tiles + "  %d = dot %a, %bf, %c : f32[64, 16]\n"), "op 'dot'", "a and b must have one dtype");
  EXPECT_EQ(bodyError(tiles + "  %d = dot %a, %b2, %c : f32[64, 16]\n"), "(valid)");
}

TEST(Verifier, ForBoundsAreIntegerScalars) {
  EXPECT_HAS(bodyError("  for %x, %x, %x {\n  ^bb(%iv: f32):\n    yield\n  }\n"), "op 'for'",
             "bounds and step must be integer scalars of one dtype, got f32");
  EXPECT_HAS(bodyError("  %w = cast %i : i64\n  for %i, %w, %i {\n  ^bb(%iv: i32):\n    yield\n  }\n"), "op 'for'",
             "integer scalars of one dtype, got i32, i64, i32");
  EXPECT_HAS(bodyError("  for %i, %n, %i {\n  ^bb(%iv: i64):\n    yield\n  }\n"), "op 'for'",
             "induction variable is i64, bounds are i32");
}

TEST(Verifier, ForCarriedTypesAgree) {
  EXPECT_HAS(bodyError("  %r = for %i, %n, %i, %x : f32 {\n  ^bb(%iv: i32, %c: f16):\n    %h = cast %c : f32\n"
                       "    yield %h\n  }\n"),
             "op 'for'", "carried value #0: region argument f16 differs from init f32");
  EXPECT_HAS(bodyError("  %r = for %i, %n, %i, %x : f32 {\n  ^bb(%iv: i32, %c: f32):\n    yield %iv\n  }\n"), "op 'for'",
             "carried value #0: yielded value i32 differs from init f32");
  EXPECT_HAS(bodyError("  %r = for %i, %n, %i, %x : i32 {\n  ^bb(%iv: i32, %c: f32):\n    yield %c\n  }\n"), "op 'for'",
             "carried value #0: result i32 differs from init f32");
  EXPECT_HAS(bodyError("  %r = for %i, %n, %i, %x : f32 {\n  ^bb(%iv: i32, %c: f32):\n    yield %c, %c\n  }\n"),
             "op 'for'", "body yields 2 values for 1 carried values");
  EXPECT_HAS(bodyError("  %r = for %i, %n, %i, %x : f32 {\n  ^bb(%iv: i32):\n    yield %x\n  }\n"), "op 'for'",
             "body must have 2 arguments (iv, carried...), got 1");
}

TEST(Verifier, Terminators) {
  Function f("v");
  Builder b(f);
  b.programId(0);
  EXPECT_HAS(verifyError(f), "function @v: body does not end with 'return'");
  b.ret();
  b.programId(1);
  b.ret();
  EXPECT_HAS(verifyError(f), "op 'return': is a terminator but is not the last op of its block");

  EXPECT_HAS(bodyError("  for %i, %n, %i {\n  ^bb(%iv: i32):\n    %y = neg %x : f32\n  }\n"),
             "op 'for': body does not end with 'yield'");
  EXPECT_HAS(bodyError("  for %i, %n, %i {\n  ^bb(%iv: i32):\n    return\n  }\n"), "op 'return'",
             "'return' may only end the function body");
  auto g = parseFunction("func @v() {\n  yield\n}\n");
  EXPECT_HAS(verifyError(*g), "op 'yield'", "'yield' may only end the body of a 'for'",
             "function @v: body does not end with 'return'");
}

TEST(Verifier, UseBeforeDefinition) {
  Function f("v");
  Value* x = f.addParam(Type(DType::F32));
  Builder b(f);
  Op* first = b.create(OpKind::Neg, {x}, {Type(DType::F32)});
  Value* later = b.unary(OpKind::Exp, x);
  first->setOperand(0, later);
  b.ret();
  EXPECT_HAS(verifyError(f), "op 'neg'", "operand #0 (f32) is not defined before this use", "SSA dominance");
}

TEST(Verifier, LoopBodyValuesAreNotVisibleAfterTheLoop) {
  Function f("v");
  Value* n = f.addParam(Type(DType::I32));
  Builder b(f);
  Value* inner = nullptr;
  b.forLoop(n, n, n, {}, [&](Value* iv, std::vector<Value*>) -> std::vector<Value*> {
    inner = b.binary(OpKind::Add, iv, iv);
    return {};
  });
  b.setLoc({"user.cpp", 77});
  b.binary(OpKind::Mul, inner, n);
  b.ret();
  EXPECT_HAS(verifyError(f), "op 'mul' (user.cpp:77): operand #0 (i32) is not defined before this use");
  // Outer values are visible inside the body.
  EXPECT_EQ(bodyError("  for %i, %n, %i {\n  ^bb(%iv: i32):\n    %y = neg %x : f32\n    yield\n  }\n"), "(valid)");
}

TEST(Verifier, TileDimensionsArePowersOfTwo) {
  EXPECT_HAS(bodyError("  %r = arange {end = 48, start = 0} : i32[48]\n"), "op 'arange': result #0 has shape [48]",
             "powers of two");
  EXPECT_HAS(bodyError("  %r = constant {value = 1.0} : f32[3, 4]\n"), "op 'constant': result #0 has shape [3, 4]");
}

TEST(Verifier, ParametersAreScalars) {
  auto f = parseFunction("func @v(%t: f32[64]) {\n  return\n}\n");
  EXPECT_HAS(verifyError(*f), "function @v: parameter #0 is a tile (f32[64])");
}

TEST(Verifier, ProgramIdAxis) {
  EXPECT_HAS(bodyError("  %a = program_id {axis = 3} : i32\n"), "op 'program_id'", "axis = 3 is outside [0, 2]");
  EXPECT_HAS(bodyError("  %a = num_programs {axis = 0} : i64\n"), "op 'num_programs'", "result must be a scalar i32");
}

TEST(Verifier, ConstantValueFitsTheType) {
  EXPECT_HAS(bodyError("  %a = constant {value = 300} : i8\n"), "op 'constant'", "value 300 does not fit in i8");
  EXPECT_HAS(bodyError("  %a = constant {value = 2} : i1\n"), "op 'constant'", "value 2 does not fit in i1");
  EXPECT_HAS(bodyError("  %a = constant {value = 1.5} : i32\n"), "op 'constant'", "must be an integer");
  EXPECT_HAS(bodyError("  %a = constant : f32\n"), "op 'constant'", "needs a 'value' attribute");
  EXPECT_HAS(bodyError("  %a = constant {value = \"x\"} : f32\n"), "op 'constant'", "must be a number");
}

TEST(Verifier, ShapeOps) {
  EXPECT_HAS(bodyError("  %a = splat %x : f32\n"), "op 'splat'", "result must be a tile");
  EXPECT_HAS(bodyError("  %a = splat %i : f32[4]\n"), "op 'splat'", "result element f32 differs from operand i32");
  const std::string t = "  %t = constant {value = 1.0} : f32[64, 1]\n";
  EXPECT_HAS(bodyError(t + "  %b = broadcast %t : f32[32, 8]\n"), "op 'broadcast'", "cannot broadcast f32[64,1] to f32[32,8]");
  EXPECT_HAS(bodyError(t + "  %b = broadcast %t : f32[64]\n"), "op 'broadcast'", "needs equal rank");
  EXPECT_HAS(bodyError(t + "  %b = expand_dims %t {axis = 3} : f32[64, 1, 1]\n"), "op 'expand_dims'",
             "axis = 3 is outside [0, 2]");
  EXPECT_HAS(bodyError(t + "  %b = expand_dims %t {axis = 0} : f32[64, 1, 1]\n"), "op 'expand_dims'",
             "result must be f32[1,64,1], got f32[64,1,1]");
  EXPECT_HAS(bodyError(t + "  %b = reshape %t : f32[32]\n"), "op 'reshape'", "cannot reshape f32[64,1] to f32[32]");
  EXPECT_HAS(bodyError(t + "  %b = trans %t {perm = [0, 0]} : f32[64, 1]\n"), "op 'trans'",
             "perm [0, 0] is not a permutation");
  EXPECT_HAS(bodyError(t + "  %b = trans %t {perm = [1, 0]} : f32[64, 1]\n"), "op 'trans'", "result must be f32[1,64]");
  EXPECT_HAS(bodyError("  %a = arange {end = 64, start = 0} : i32[32]\n"), "op 'arange'", "result must be i32[64]");
  EXPECT_HAS(bodyError("  %a = arange {end = 0, start = 64} : i32[64]\n"), "op 'arange'", "end 0 must be greater than start 64");
}

TEST(Verifier, ConvertLayoutOnlyAfterLayoutAssignment) {
  EXPECT_HAS(bodyError("  %t = splat %x : f32[64]\n  %c = convert_layout %t : f32[64]\n"), "op 'convert_layout'",
             "appears before layout assignment");
}

TEST(Verifier, ReportsEveryProblemAtOnce) {
  std::string msg = bodyError("  %a = exp %i : i32\n  %b = add %x, %i : f32\n  %c = program_id {axis = 5} : i32\n");
  EXPECT_HAS(msg, "invalid IR in function @v (3 problems):", "op 'exp'", "op 'add'", "op 'program_id'");
}

// ---- layout rules ----

std::unique_ptr<Function> layoutProgram() {
  auto f = testing::everyOpProgram();
  testing::assignTestLayouts(*f);
  return f;
}

// Replaces the layout of `op`'s result with another valid one of its shape.
void perturb(Op* op, size_t result = 0) {
  ASSERT_TRUE(op);
  Value* r = op->result(result);
  auto other = testing::otherLayout(*r->type().layout());
  ASSERT_TRUE(other) << "no other layout for " << r->type().str();
  r->setType(r->type().withLayout(other));
}

TEST(VerifierLayouts, EitherAllTilesHaveLayoutsOrNone) {
  auto f = layoutProgram();
  Op* arange = firstOp(*f, OpKind::Arange);
  arange->result()->setType(arange->result()->type().withLayout(nullptr));
  EXPECT_HAS(verifyError(*f), "op 'arange' (every_op.cpp:10): result #0 (i32[64]) has no layout, but other tiles do");
}

TEST(VerifierLayouts, ScalarsNeverHaveLayouts) {
  auto f = layoutProgram();
  Op* pid = firstOp(*f, OpKind::ProgramId);
  pid->result()->setType(pid->result()->type().withLayout(makeLayout(Layout::defaultBlocked({32}, 4))));
  EXPECT_HAS(verifyError(*f), "op 'program_id' (every_op.cpp:10): result #0 is a scalar (i32) but has a layout");
}

TEST(VerifierLayouts, LayoutFitsItsValue) {
  auto f = layoutProgram();
  Op* arange = firstOp(*f, OpKind::Arange);
  arange->result()->setType(arange->result()->type().withLayout(makeLayout(Layout::defaultBlocked({32}, 4))));
  EXPECT_HAS(verifyError(*f), "op 'arange'", "has a layout of shape [32]");

  auto g = layoutProgram();
  Op* a2 = firstOp(*g, OpKind::Arange);
  a2->result()->setType(a2->result()->type().withLayout(makeLayout(Layout({64}, {}, {{1}, {2}, {4}, {8}, {16}}, {{32}}))));
  EXPECT_HAS(verifyError(*g), "op 'arange'", "layout over 2 warps, but the function has num_warps = 4");

  auto h = layoutProgram();
  Op* a3 = firstOp(*h, OpKind::Arange);
  a3->result()->setType(a3->result()->type().withLayout(makeLayout(Layout({64}, {{1}}, {{1}, {2}, {4}, {8}, {16}}, {{32}, {0}}))));
  EXPECT_HAS(verifyError(*h), "op 'arange'", "has an invalid layout", "lane/warp basis [[1]] is dependent");
}

// The verifier checks each layout object once a run and reuses the verdict: an invalid layout
// that two values share is reported at both.
TEST(VerifierLayouts, AnInvalidLayoutSharedByTwoValuesIsReportedAtEach) {
  auto f = layoutProgram();
  const auto invalid = makeLayout(Layout({64}, {{1}}, {{1}, {2}, {4}, {8}, {16}}, {{32}, {0}}));
  Op* arange = firstOp(*f, OpKind::Arange);
  Op* other = nullptr;
  f->walk([&](Op& op) {
    if (!other && &op != arange && op.numResults() == 1 && op.result()->type().isTile() &&
        op.result()->type().shape() == Shape{64})
      other = &op;
  });
  ASSERT_TRUE(other) << "the program has no other [64] tile";
  for (Op* op : {arange, other}) op->result()->setType(op->result()->type().withLayout(invalid));
  int reports = 0;
  for (const std::string& p : verificationProblems(*f))
    if (p.find("has an invalid layout") != std::string::npos) {
      ++reports;
      EXPECT_TRUE(p.find("op 'arange'") != std::string::npos || p.find("op '" + std::string(other->name()) + "'") != std::string::npos) << p;
    }
  EXPECT_EQ(reports, 2);
}

TEST(VerifierLayouts, ElementwiseOperandsShareTheResultLayout) {
  auto f = layoutProgram();
  perturb(firstOp(*f, OpKind::Exp));  // its user 'exp2' now sees a different operand layout
  EXPECT_HAS(verifyError(*f), "op 'exp'", "op 'exp2'", "layout of operand #0", "must equal the result");
}

TEST(VerifierLayouts, BroadcastOperandIsTheProjectedResultLayout) {
  auto f = layoutProgram();
  perturb(firstOp(*f, OpKind::Broadcast));
  EXPECT_HAS(verifyError(*f), "op 'broadcast'", "must equal the result's layout projected");
}

TEST(VerifierLayouts, ExpandDimsOperandIsTheSlicedResultLayout) {
  auto f = layoutProgram();
  perturb(firstOp(*f, OpKind::ExpandDims));
  EXPECT_HAS(verifyError(*f), "op 'expand_dims'", "must equal the result's layout sliced at the axis");
}

TEST(VerifierLayouts, ReshapeAndTransDeriveTheirResultLayouts) {
  auto f = layoutProgram();
  perturb(firstOp(*f, OpKind::Reshape));
  EXPECT_HAS(verifyError(*f), "op 'reshape'", "must equal the operand's layout reshaped");
  auto g = layoutProgram();
  perturb(firstOp(*g, OpKind::Trans));
  EXPECT_HAS(verifyError(*g), "op 'trans'", "must equal the operand's layout transposed");
}

TEST(VerifierLayouts, ReduceResultIsTheSlicedOperandLayout) {
  auto f = layoutProgram();
  perturb(firstOp(*f, OpKind::Reduce));
  EXPECT_HAS(verifyError(*f), "op 'reduce'", "must equal the operand's layout sliced at the axis");
}

// The memory/async level: shared buffers only where the async ops take them, and each op's rules.
TEST(Verifier, SharedBuffersAndAsyncOps) {
  const std::string ring =
      "  %buf = local_alloc : smem<2 x f16[4,8], #ft.shared<[4, 8], order=[1,0], vec=8, perPhase=1, maxPhase=1, bytes=2>>\n"
      "  %s = constant {value = 0} : i32\n"
      "  %ps = splat %q : ptr<f16>[4,8]\n";
  EXPECT_EQ(bodyError(ring + "  async_copy %buf, %s, %ps {vec = 2}\n  async_commit\n  async_wait {pending = 0}\n"
                             "  barrier\n  %t = local_load %buf, %s : f16[4,8]\n"),
            "(valid)");
  EXPECT_HAS(bodyError(ring + "  %t = local_load %buf, %x : f16[4,8]\n"), "op 'local_load'", "the slot must be a scalar i32");
  EXPECT_HAS(bodyError(ring + "  %pp = splat %p : ptr<f32>[4,8]\n  async_copy %buf, %s, %pp {vec = 2}\n"), "op 'async_copy'",
             "address must be a ptr<f16>[4, 8]");
  EXPECT_HAS(bodyError(ring + "  %m = splat %n : i32[4,8]\n  async_copy %buf, %s, %ps, %m {vec = 2}\n"), "op 'async_copy'",
             "mask must be i1[4,8]");
  EXPECT_HAS(bodyError(ring + "  async_copy %buf, %s, %ps {vec = 32}\n"), "op 'async_copy'", "vec");
  EXPECT_HAS(bodyError(ring + "  %u = add %buf, %buf : smem<2 x f16[4,8], #ft.shared<[4, 8], order=[1,0], vec=8, perPhase=1, maxPhase=1, bytes=2>>\n"),
             "op 'add'", "only local_alloc makes one", "only operand 0 of async_copy, local_load, local_store and the mbarrier ops");
  EXPECT_HAS(bodyError("  barrier {scope = 1}\n"), "op 'barrier'", "takes no attributes");
  // mbarrier_expect_tx's only_on (shared rings: no arrival where the stage does not exist) is 0 or 1.
  const std::string bars =
      "  %bars = local_alloc : smem<2 x i64[1], #ft.shared<[1], order=[0], vec=1, perPhase=1, maxPhase=1, bytes=8>>\n"
      "  %s = constant {value = 0} : i32\n  %on = constant {value = 0} : i1\n";
  EXPECT_EQ(bodyError(bars + "  mbarrier_expect_tx %bars, %s, %on {bytes = 64, only_on = 1}\n"), "(valid)");
  EXPECT_HAS(bodyError(bars + "  mbarrier_expect_tx %bars, %s, %on {bytes = 64, only_on = 2}\n"), "op 'mbarrier_expect_tx'",
             "only_on");
  EXPECT_HAS(bodyError(bars + "  mbarrier_expect_tx %bars, %s, %on {bytes = 64, every = 1}\n"), "op 'mbarrier_expect_tx'",
             "takes only the attributes 'bytes' and 'only_on'");
  EXPECT_HAS(bodyError("  async_wait\n"), "op 'async_wait'", "pending");
}

TEST(Verifier, WgmmaWaitPassesItsOperandsThrough) {
  const std::string acc = "  %a = splat %x : f32[64,16]\n  %b = splat %x : f32[64,16]\n";
  EXPECT_EQ(bodyError(acc + "  %c, %d = wgmma_wait %a, %b {pending = 1} : f32[64,16], f32[64,16]\n"), "(valid)");
  EXPECT_HAS(bodyError(acc + "  %c = wgmma_wait %a, %b {pending = 0} : f32[64,16]\n"), "op 'wgmma_wait'",
             "as many results as operands");
  EXPECT_HAS(bodyError(acc + "  %c = wgmma_wait %a {pending = 0} : f32[64,32]\n"), "op 'wgmma_wait'",
             "result #0 must be operand #0's type");
  EXPECT_HAS(bodyError(acc + "  %c = wgmma_wait %a {pending = 65} : f32[64,16]\n"), "op 'wgmma_wait'", "pending");
}

TEST(VerifierLayouts, LoadOperandsShareOneLayout) {
  auto f = layoutProgram();
  perturb(firstOp(*f, OpKind::Load));
  EXPECT_HAS(verifyError(*f), "op 'load'", "layout of result", "must equal the address");
}

TEST(VerifierLayouts, AtomicAddOperandsAndResultShareOneLayout) {
  auto f = layoutProgram();
  perturb(firstOp(*f, OpKind::AtomicAdd));
  EXPECT_HAS(verifyError(*f), "op 'atomic_add'", "layout of result", "must equal the address");
}

TEST(VerifierLayouts, DotAccumulatorAndResultShareALayout) {
  auto f = layoutProgram();
  perturb(firstOp(*f, OpKind::Dot));
  EXPECT_HAS(verifyError(*f), "op 'dot'", "must equal the accumulator");
}

TEST(VerifierLayouts, ForCarriedValuesShareLayouts) {
  auto f = layoutProgram();
  Op* loop = firstOp(*f, OpKind::For);
  Value* arg = loop->region().arg(1);
  arg->setType(arg->type().withLayout(testing::otherLayout(*arg->type().layout())));
  EXPECT_HAS(verifyError(*f), "op 'for' (every_op.cpp:30)", "carried value #0: region argument f32[64] differs from init",
             "in its layout");
}

TEST(VerifierLayouts, ConvertLayoutMayChangeAnyLayout) {
  auto f = layoutProgram();
  Op* convert = firstOp(*f, OpKind::ConvertLayout);
  ASSERT_TRUE(convert);
  Value* r = convert->result();
  // Any valid layout of the right shape is fine for convert_layout itself (its users may object).
  std::vector<std::string> problems = verificationProblems(*f);
  r->setType(r->type().withLayout(testing::otherLayout(*r->type().layout())));
  for (const auto& p : verificationProblems(*f)) EXPECT_EQ(p.find("op 'convert_layout'"), std::string::npos) << p;
}

}  // namespace

// The warp-specialization marks (codegen/passes/WarpSpecialize.cpp): `ws` names a role, and a
// loop's producer_carried names carried values it has; neither counts as an op's own attribute.
TEST(Verifier, WarpSpecializationMarks) {
  EXPECT_EQ(bodyError("  %c = constant {value = 1, ws = \"both\"} : i32\n  barrier {ws = \"both\"}\n"), "(valid)");
  EXPECT_HAS(bodyError("  barrier {ws = \"sometimes\"}\n"), "barrier", "ws \"sometimes\" is not one of: producer both");
  EXPECT_HAS(bodyError("  %lb = constant {value = 0} : i32\n"
                       "  %r = for %lb, %n, %i, %x {producer_carried = [1]} : f32 {\n"
                       "  ^bb(%t: i32, %a: f32):\n"
                       "    yield %a\n"
                       "  }\n"),
             "for", "producer_carried names carried value 1 of 1");
}

// In a warp-specialized function (producer_warps > 0) the producer's ops read only what the
// producer runs too: a parameter, a ws-marked op's result, its loops' kept arguments.
TEST(Verifier, TheProducerReadsOnlyWhatItRuns) {
  auto error = [](const std::string& ops) {
    auto f = parseFunction("func @v(%n: i32, %x: f32) attributes {producer_warps = 4} {\n" + ops +
                               "  return {ws = \"both\"}\n}\n",
                           "v.ftir");
    return verifyError(*f);
  };
  const std::string loop =
      "  %lb = constant {value = 0, ws = \"both\"} : i32\n"
      "  %one = constant {value = 1, ws = \"both\"} : i32\n"
      "  %r, %k = for %lb, %n, %one, %x, %lb {producer_carried = [1], ws = \"both\"} : f32, i32 {\n"
      "  ^bb(%t: i32, %a: f32, %c: i32):\n"
      "    %next = add %c, %one {ws = \"both\"} : i32\n"
      "    %b = add %a, %x : f32\n";
  EXPECT_EQ(error(loop + "    yield %b, %next {ws = \"both\"}\n  }\n"), "(valid)");
  EXPECT_HAS(error("  %c = constant {value = 2} : i32\n  %d = add %c, %n {ws = \"both\"} : i32\n"),
             "add", "operand #0 comes from", "which only the consumers run");
  EXPECT_HAS(error(loop + "    %s = cast %a {ws = \"both\"} : i32\n    yield %b, %next {ws = \"both\"}\n  }\n"),
             "cast", "an argument of", "does not keep");
  EXPECT_HAS(error(loop + "    yield %b, %next\n  }\n"), "for", "its yield does not");
}

}  // namespace flextile::ir
