// The text form: print(parse(print(f))) == print(f) over programs that use
// every op, layouts, locations and every attribute kind; and the parser's
// errors name the place and the token.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "TestPrograms.h"
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"

namespace flextile::ir {
namespace {

using testing::assignTestLayouts;
using testing::everyOpProgram;

std::string roundTrip(const std::string& text, const PrintOptions& o = {}) {
  return printModule(parseModule(text, "roundtrip.ftir"), o);
}

TEST(PrinterParser, EveryOpRoundTripsExactly) {
  auto f = everyOpProgram();
  ASSERT_NO_THROW(verify(*f));
  std::string text = printFunction(*f);
  auto g = parseFunction(text);
  EXPECT_NO_THROW(verify(*g));
  EXPECT_EQ(printFunction(*g), text);
}

TEST(PrinterParser, EveryOpWithLayoutsRoundTripsAndCoversOpsDef) {
  auto f = everyOpProgram();
  assignTestLayouts(*f);
  ASSERT_NO_THROW(verify(*f)) << printFunction(*f);
  std::string text = printFunction(*f);
  EXPECT_EQ(text.rfind("#L0 = #ft.linear<", 0), 0u) << "layout aliases come first:\n" << text;
  auto g = parseFunction(text);
  EXPECT_NO_THROW(verify(*g));
  EXPECT_EQ(printFunction(*g), text);
  // Every tile of the parsed function has a layout equal to the original's.
  std::vector<Type> before, after;
  f->walk([&](const Op& op) {
    for (Value* r : op.results()) before.push_back(r->type());
  });
  g->walk([&](const Op& op) {
    for (Value* r : op.results()) after.push_back(r->type());
  });
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(before[i], after[i]) << i;

  std::set<std::string_view> used, all;
  g->walk([&](const Op& op) { used.insert(op.name()); });
#define FT_OP(Enum, name, nops, nres, traits) all.insert(name);
#include "ir/Ops.def"
  EXPECT_EQ(used, all) << "the round-trip program must use every op in Ops.def";
}

TEST(PrinterParser, LocationsRoundTripWhenAsked) {
  auto f = everyOpProgram();
  std::string plain = printFunction(*f);
  std::string located = printFunction(*f, {.locations = true});
  EXPECT_EQ(plain.find("loc("), std::string::npos);
  EXPECT_NE(located.find(" loc(\"every_op.cpp\":20)\n"), std::string::npos) << located;
  EXPECT_NE(located.find("} loc(\"every_op.cpp\":30)\n"), std::string::npos) << "a for loop's location follows its region";
  auto g = parseFunction(located);
  EXPECT_EQ(printFunction(*g, {.locations = true}), located);
  EXPECT_EQ(printFunction(*g), plain);
  Op* load = testing::firstOp(*g, OpKind::Load);
  ASSERT_TRUE(load);
  EXPECT_EQ(load->describe(), "op 'load' (every_op.cpp:20)");
}

TEST(PrinterParser, TheDocumentedFormat) {
  Function f("add");
  f.attrs()["num_warps"] = int64_t(4);
  Value* x = f.addParam(Type::pointer(DType::F32), "x");
  f.addParam(Type::pointer(DType::F32), "y");
  Value* n = f.addParam(Type(DType::I32), "n");
  Builder b(f);
  // One op per statement: C++ leaves the order of evaluating arguments open.
  Value* pid = b.programId(0);
  Value* block = b.constantInt(Type(DType::I32), 64);
  Value* off = b.binary(OpKind::Mul, pid, block);
  Value* offs = b.splat(off, {64});
  Value* range = b.arange(0, 64);
  Value* idx = b.binary(OpKind::Add, offs, range);
  Value* ns = b.splat(n, {64});
  Value* mask = b.cmp("lt", idx, ns);
  Value* xs = b.splat(x, {64});
  Value* v = b.load(b.addptr(xs, idx), mask);
  Value* zero = b.constantInt(Type(DType::I32), 0);
  Value* one = b.constantInt(Type(DType::I32), 1);
  auto r = b.forLoop(zero, n, one, {v},
                     [&](Value*, std::vector<Value*> c) -> std::vector<Value*> { return {b.binary(OpKind::Add, c[0], v)}; });
  Value* xs2 = b.splat(x, {64});
  b.store(b.addptr(xs2, idx), r[0], mask);
  b.ret();
  EXPECT_EQ(printFunction(f),
            "func @add(%x: ptr<f32>, %y: ptr<f32>, %n: i32) attributes {num_warps = 4} {\n"
            "  %0 = program_id {axis = 0} : i32\n"
            "  %1 = constant {value = 64} : i32\n"
            "  %2 = mul %0, %1 : i32\n"
            "  %3 = splat %2 : i32[64]\n"
            "  %4 = arange {end = 64, start = 0} : i32[64]\n"
            "  %5 = add %3, %4 : i32[64]\n"
            "  %6 = splat %n : i32[64]\n"
            "  %7 = cmp %5, %6 {pred = \"lt\"} : i1[64]\n"
            "  %8 = splat %x : ptr<f32>[64]\n"
            "  %9 = addptr %8, %5 : ptr<f32>[64]\n"
            "  %10 = load %9, %7 : f32[64]\n"
            "  %11 = constant {value = 0} : i32\n"
            "  %12 = constant {value = 1} : i32\n"
            "  %13 = for %11, %n, %12, %10 : f32[64] {\n"
            "  ^bb(%14: i32, %15: f32[64]):\n"
            "    %16 = add %15, %10 : f32[64]\n"
            "    yield %16\n"
            "  }\n"
            "  %17 = splat %x : ptr<f32>[64]\n"
            "  %18 = addptr %17, %5 : ptr<f32>[64]\n"
            "  store %18, %13, %7\n"
            "  return\n"
            "}\n");
}

TEST(PrinterParser, ParameterNames) {
  Function f("names");
  f.addParam(Type(DType::I32), "dup");
  f.addParam(Type(DType::I32), "dup");
  f.addParam(Type(DType::I32), "");
  f.addParam(Type(DType::I32), "7up");
  f.addParam(Type(DType::I32), "has space");
  f.addParam(Type(DType::I32), "ok_name2");
  Builder(f).ret();
  std::string text = printFunction(f);
  EXPECT_EQ(text, "func @names(%0: i32, %1: i32, %2: i32, %3: i32, %4: i32, %ok_name2: i32) {\n  return\n}\n");
  EXPECT_EQ(roundTrip(text), text);
}

TEST(PrinterParser, OddFunctionNamesAreQuoted) {
  Function f("my kernel \"v2\"");
  Builder(f).ret();
  std::string text = printFunction(f);
  EXPECT_EQ(text, "func @\"my kernel \\\"v2\\\"\"() {\n  return\n}\n");
  EXPECT_EQ(parseFunction(text)->name(), f.name());
}

TEST(PrinterParser, AttributeValuesRoundTripBitExactly) {
  testing::Random rng;
  SCOPED_TRACE(rng.trace());
  std::vector<double> doubles = {0.5, 1.0, -0.0, 0.0, 0.1, 1e300, -2.5e-300, 5e-324, 1.7976931348623157e308,
                                 std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                                 3.0e10, 123456789.0};
  std::vector<int64_t> ints = {0, -1, 42, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  for (int i = 0; i < 200; ++i) {
    uint64_t bitsValue = rng.gen();
    double d;
    std::memcpy(&d, &bitsValue, sizeof d);
    if (!std::isnan(d)) doubles.push_back(d);
    ints.push_back(int64_t(rng.gen()));
  }
  Function f("attrs");
  Builder b(f);
  for (double d : doubles) b.constant(Type(DType::F64), d);
  for (int64_t v : ints) b.constantInt(Type(DType::I64), v);
  Op* s = b.create(OpKind::Constant, {}, {Type(DType::I32)}, {});
  s->setAttr("text", std::string("quote \" backslash \\ newline \n tab \t bell \x07 end"));
  s->setAttr("empty", std::vector<int64_t>{});
  s->setAttr("list", std::vector<int64_t>{3, -1, std::numeric_limits<int64_t>::min()});
  s->setAttr("nan", std::numeric_limits<double>::quiet_NaN());
  b.ret();
  std::string text = printFunction(f);
  auto g = parseFunction(text);
  EXPECT_EQ(printFunction(*g), text);
  size_t i = 0;
  for (const auto& op : g->body().ops()) {
    if (i < doubles.size()) {
      double got = std::get<double>(op->attrs().at("value"));
      EXPECT_EQ(std::memcmp(&got, &doubles[i], sizeof got), 0) << doubles[i] << " came back as " << got;
    } else if (i < doubles.size() + ints.size()) {
      EXPECT_EQ(std::get<int64_t>(op->attrs().at("value")), ints[i - doubles.size()]);
    } else if (op->kind() == OpKind::Constant) {
      EXPECT_EQ(op->strAttr("text"), s->strAttr("text"));
      EXPECT_EQ(op->intsAttr("empty"), s->intsAttr("empty"));
      EXPECT_EQ(op->intsAttr("list"), s->intsAttr("list"));
      EXPECT_TRUE(std::isnan(op->floatAttr("nan")));
    }
    ++i;
  }
  // Floats always print as floats; ints never do.
  EXPECT_NE(text.find("{value = 1.0}"), std::string::npos);
  EXPECT_NE(text.find("{value = -0.0}"), std::string::npos);
  EXPECT_NE(text.find("{value = inf}"), std::string::npos);
  EXPECT_NE(text.find("{value = -inf}"), std::string::npos);
  EXPECT_NE(text.find("{value = 0.1}"), std::string::npos) << "shortest round-trip digits";
  EXPECT_NE(text.find("{value = 42}"), std::string::npos);
}

TEST(PrinterParser, ModulesShareOneAliasTable) {
  Module m;
  for (std::string name : {"first", "second"}) {
    auto f = testing::everyOpProgram();
    f->setName(name);
    assignTestLayouts(*f);
    m.functions.push_back(std::move(f));
  }
  std::string text = printModule(m);
  EXPECT_EQ(roundTrip(text), text);
  Module back = parseModule(text);
  ASSERT_EQ(back.functions.size(), 2u);
  EXPECT_TRUE(back.lookup("second"));
  // The second function's layouts are all equal to the first's: no new aliases after the first function.
  size_t secondFunc = text.find("func @second");
  EXPECT_EQ(text.find("#L", secondFunc) != std::string::npos, true);
  EXPECT_EQ(text.find(" = #ft.linear", secondFunc), std::string::npos);
}

TEST(PrinterParser, HandWrittenTextWithCommentsNamesAndInlineLayouts) {
  const char* text = R"(
// A comment line.
#blocked = #ft.linear<[32], reg=[], lane=[[1],[2],[4],[8],[16]], warp=[]>
func @k(%p: ptr<f32>) attributes {num_warps = 1} {   // trailing comment
  %idx = arange {start = 0, end = 32} : i32[32]#blocked
  %ptrs = splat %p : ptr<f32>[32] #ft.linear<[32], reg=[], lane=[[1],[2],[4],[8],[16]], warp=[]>
  %q = addptr %ptrs, %idx : ptr<f32>[32]#blocked
  %v = load %q : f32[32]#blocked
  store %q, %v
  return
}
)";
  auto f = parseFunction(text, "hand.ftir");
  EXPECT_NO_THROW(verify(*f));
  EXPECT_EQ(f->params()[0]->nameHint(), "p");
  std::string printed = printFunction(*f);
  EXPECT_EQ(printed.rfind("#L0 = #ft.linear<[32], reg=[], lane=[[1], [2], [4], [8], [16]], warp=[]>\n", 0), 0u) << printed;
  EXPECT_NE(printed.find("%0 = arange {end = 32, start = 0} : i32[32]#L0"), std::string::npos) << printed;
  EXPECT_EQ(roundTrip(printed), printed);
}

TEST(PrinterParser, ForLoopWithoutCarriedValues) {
  const char* text =
      "func @k(%n: i32, %p: ptr<i32>) {\n"
      "  %0 = constant {value = 0} : i32\n"
      "  %1 = constant {value = 1} : i32\n"
      "  for %0, %n, %1 {\n"
      "  ^bb(%2: i32):\n"
      "    store %p, %2\n"
      "    yield\n"
      "  }\n"
      "  return\n"
      "}\n";
  EXPECT_EQ(roundTrip(text), text);
  EXPECT_NO_THROW(verify(*parseFunction(text)));
}

// ---- parser errors ----

std::string parseError(const std::string& text) {
  try {
    parseModule(text, "t.ftir");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_PARSE_ERROR(text, ...)                                                   \
  do {                                                                                  \
    std::string msg_ = parseError(text);                                                \
    for (std::string piece_ : {__VA_ARGS__})                                            \
      EXPECT_NE(msg_.find(piece_), std::string::npos) << "missing '" << piece_ << "' in: " << msg_; \
  } while (0)

TEST(ParserErrors, UndefinedValue) {
  EXPECT_PARSE_ERROR("func @f(%x: f32) {\n  %0 = add %x, %y : f32\n  return\n}", "t.ftir:2:16:",
                     "use of undefined value %y");
}

TEST(ParserErrors, ValueFromALoopBodyIsNotVisibleAfterIt) {
  EXPECT_PARSE_ERROR(
      "func @f(%n: i32) {\n"
      "  %0 = for %n, %n, %n, %n : i32 {\n"
      "  ^bb(%i: i32, %c: i32):\n"
      "    %inner = add %c, %i : i32\n"
      "    yield %inner\n"
      "  }\n"
      "  %1 = add %inner, %0 : i32\n"
      "  return\n"
      "}",
      "t.ftir:7:12:", "undefined value %inner");
}

TEST(ParserErrors, UnknownOp) {
  EXPECT_PARSE_ERROR("func @f(%x: f32) {\n  %0 = frobnicate %x : f32\n  return\n}", "t.ftir:2:8:",
                     "unknown op 'frobnicate'");
}

TEST(ParserErrors, WrongOperandCount) {
  EXPECT_PARSE_ERROR("func @f(%x: f32) {\n  %0 = add %x : f32\n  return\n}", "t.ftir:2:8:",
                     "op 'add' expects 2 operands, got 1");
  EXPECT_PARSE_ERROR("func @f(%x: f32) {\n  return %x\n}", "op 'return' expects 0 operands, got 1");
}

TEST(ParserErrors, ResultCountsAndTypes) {
  EXPECT_PARSE_ERROR("func @f(%x: f32) {\n  %0 = add %x, %x\n  return\n}", "names 1 result but lists 0 result types");
  EXPECT_PARSE_ERROR("func @f(%x: f32) {\n  %0, %1 = add %x, %x : f32, f32\n  return\n}",
                     "op 'add' has 1 result, got 2 result names");
  EXPECT_PARSE_ERROR("func @f(%p: ptr<f32>, %x: f32) {\n  %0 = store %p, %x : f32\n  return\n}",
                     "op 'store' has 0 results");
}

TEST(ParserErrors, Redefinition) {
  EXPECT_PARSE_ERROR("func @f(%x: f32) {\n  %x = neg %x : f32\n  return\n}", "t.ftir:2:3:", "redefinition of value %x");
  EXPECT_PARSE_ERROR("func @f() {\n  return\n}\nfunc @f() {\n  return\n}", "t.ftir:4:6:", "redefinition of function @f");
}

TEST(ParserErrors, BadTypes) {
  EXPECT_PARSE_ERROR("func @f(%x: f33) {\n  return\n}", "t.ftir:1:13:", "expected a type, got 'f33'");
  EXPECT_PARSE_ERROR("func @f(%x: f32[64,0]) {\n  return\n}", "tile dimension 0 is not positive");
  EXPECT_PARSE_ERROR("func @f(%x: ptr<q8>) {\n  return\n}", "unknown pointee dtype 'q8'");
  EXPECT_PARSE_ERROR("func @f(%x: f32[64]#L3) {\n  return\n}", "t.ftir:1:20:", "undefined layout alias #L3");
}

TEST(ParserErrors, BadLayouts) {
  EXPECT_PARSE_ERROR("#L0 = #ft.linear<[64], reg=[], lane=[[1],[2],[4],[8],[16]], warp=[]>\nfunc @f() {\n  return\n}",
                     "t.ftir:1:7:", "does not cover the whole tile");
  EXPECT_PARSE_ERROR("#L0 = #ft.linear<[32], reg=[], lane=[[1],[2],[4],[8],[16]], warp=[]>\n"
                     "#L0 = #ft.linear<[32], reg=[], lane=[[1],[2],[4],[8],[16]], warp=[]>\n",
                     "t.ftir:2:1:", "redefinition of layout alias #L0");
  EXPECT_PARSE_ERROR("#L0 = 5\n", "expected a layout '#ft.linear<...>', got '5'");
}

TEST(ParserErrors, RegionsAndStructure) {
  EXPECT_PARSE_ERROR("func @f(%n: i32) {\n  for %n, %n, %n\n  return\n}", "t.ftir:3:3:", "expected a region",
                     "for op 'for'", "got 'return'");
  EXPECT_PARSE_ERROR("func @f(%x: f32) {\n  %0 = neg %x : f32 {\n  ^bb():\n  }\n  return\n}",
                     "op 'neg' takes no region");
  EXPECT_PARSE_ERROR("func @f(%x: f32) {\n  %0 = neg %x : f32\n", "t.ftir:3:1:", "expected '}', got end of input");
  EXPECT_PARSE_ERROR("func f() {}", "t.ftir:1:6:", "expected a function name '@name', got 'f'");
  EXPECT_PARSE_ERROR("module {}", "t.ftir:1:1:", "expected 'func' or a layout alias definition, got 'module'");
}

TEST(ParserErrors, Attributes) {
  EXPECT_PARSE_ERROR("func @f() {\n  %0 = program_id {axis = } : i32\n  return\n}", "t.ftir:2:27:",
                     "expected an attribute value", "got '}'");
  EXPECT_PARSE_ERROR("func @f() {\n  %0 = program_id {axis = 0, axis = 1} : i32\n  return\n}", "duplicate attribute 'axis'");
  EXPECT_PARSE_ERROR("func @f() {\n  %0 = program_id {axis = 99999999999999999999} : i32\n  return\n}",
                     "integer 99999999999999999999 is out of range");
  EXPECT_PARSE_ERROR("func @f() {\n  %0 = program_id {s = \"open} : i32\n  return\n}", "t.ftir:2:", "unterminated string");
}

TEST(ParserErrors, Lexing) {
  EXPECT_PARSE_ERROR("func @f() {\n  $\n}", "t.ftir:2:3:", "unexpected character '$'");
  EXPECT_PARSE_ERROR("func @f() {\n  %0 = program_id {axis = 0} : i32 loc(\"x.cpp\" 3)\n  return\n}",
                     "expected ':', got '3'");
}

TEST(ParserErrors, ParseFunctionNeedsExactlyOne) {
  EXPECT_THROW(parseFunction("", "empty.ftir"), Error);
  try {
    parseFunction("func @a() {\n return\n}\nfunc @b() {\n return\n}", "two.ftir");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("two.ftir: expected exactly one function, found 2"), std::string::npos);
  }
}

}  // namespace
}  // namespace flextile::ir
