// What the IR parser fuzzer (tests/fuzz/ir_parser_fuzzer.cpp) found, kept fixed in the normal
// suite: every input in tests/fuzz/regressions/ir_parser/ (and every seed of its corpus) goes
// through the fuzzer's own property, checkIrText, here built with GCC and without libFuzzer; and
// each finding has a test of the behaviour that replaced the crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz/FuzzInputs.h"
#include "fuzz/IrParserProperty.h"
#include "ir/Parser.h"
#include "ir/Verifier.h"

namespace flextile::ir {
namespace {

namespace fs = std::filesystem;

std::string text(const fs::path& p) {
  const std::vector<uint8_t> bytes = fuzz::readFuzzInput(p);
  return std::string(bytes.begin(), bytes.end());
}

void replay(const fs::path& dir, size_t atLeast) {
  auto files = fuzz::fuzzInputFiles(dir);
  ASSERT_GE(files.size(), atLeast) << dir;
  for (const auto& p : files) {
    SCOPED_TRACE(p.filename().string());
    fuzz::IrTextOutcome outcome;
    ASSERT_NO_THROW(outcome = fuzz::checkIrText(text(p)));
    EXPECT_EQ(outcome.broken, "");
  }
}

TEST(FuzzRegressions, EveryCrashInputOfTheParserFuzzerIsHandled) {
  replay(FLEXTILE_SOURCE_DIR "/tests/fuzz/regressions/ir_parser", 3);
}

// The seeds are real programs (the lit tests' inputs, traced kernels): most parse and verify, so
// this is the fuzzer's round-trip property over the whole lit suite.
TEST(FuzzRegressions, EverySeedOfTheParserFuzzerKeepsItsProperty) {
  replay(FLEXTILE_SOURCE_DIR "/tests/fuzz/corpus/ir_parser", 50);
}

std::string nestedLoops(int depth) {
  std::string s = "func @f(%n: i32) {\n";
  for (int k = 0; k < depth; ++k) s += "for %n, %n, %n {\n^bb(%i" + std::to_string(k) + ": i32):\n";
  for (int k = 0; k < depth; ++k) s += "yield\n}\n";
  return s + "return\n}\n";
}

// Found: 20,000 nested "for { ^bb(...):" (600 kB of text) overflowed the stack in the parser's
// recursion (ASan: stack-overflow in Parser::ops). Now nesting is limited with a message.
TEST(FuzzRegressions, DeeplyNestedRegionsAreAnErrorNotAStackOverflow) {
  try {
    parseModule(nestedLoops(100000), "deep.ftir");
    FAIL() << "parsed 100000 nested regions";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("regions nested more than 64 deep"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("deep.ftir:", 0), 0u) << "the error names the place: " << e.what();
  }
  EXPECT_THROW(parseModule(nestedLoops(kMaxRegionDepth + 1)), Error);
  auto m = parseModule(nestedLoops(kMaxRegionDepth));  // the limit itself is fine
  EXPECT_NO_THROW(verify(*m.functions.at(0)));
}

// Found: a tile type whose dims multiply past int64 (f32[2^62, 4]) made numElements overflow
// (UBSan: signed integer overflow in Types.cpp) when the verifier checked a reshape of it. Now the
// count saturates and the verifier refuses tiles of more than 2^31 elements.
TEST(FuzzRegressions, TilesPastTwoToThe31ElementsAreRefusedWithoutOverflow) {
  EXPECT_EQ(numElements({int64_t(1) << 62, 4}), INT64_MAX);
  EXPECT_EQ(numElements({int64_t(1) << 31, int64_t(1) << 31, 4}), INT64_MAX);
  EXPECT_EQ(numElements({64, 32}), 2048);
  auto m = parseModule(
      "func @f() {\n"
      "  %0 = constant {value = 0.0} : f32[4611686018427387904,4]\n"
      "  %1 = reshape %0 : f32[4]\n"
      "  return\n"
      "}\n");
  auto problems = verificationProblems(*m.functions.at(0));
  ASSERT_FALSE(problems.empty());
  EXPECT_NE(problems[0].find("more than 2^31 elements"), std::string::npos) << problems[0];
  auto ok = parseModule("func @f() {\n  %0 = constant {value = 0.0} : f32[65536,32768]\n  return\n}\n");
  EXPECT_TRUE(verificationProblems(*ok.functions.at(0)).empty()) << "2^31 elements is the limit, not past it";
}

// Found by review while fuzzing: loc("f":N) with N past INT32_MAX became another line silently.
TEST(FuzzRegressions, LocationLinesOutsideIntAreAnError) {
  EXPECT_THROW(parseModule("func @f() {\n  return loc(\"k.cpp\":4294967297)\n}\n"), Error);
  EXPECT_THROW(parseModule("func @f() {\n  return loc(\"k.cpp\":-1)\n}\n"), Error);
  auto m = parseModule("func @f() {\n  return loc(\"k.cpp\":2147483647)\n}\n");
  EXPECT_EQ(m.functions.at(0)->body().ops().back()->loc().line, 2147483647);
}

}  // namespace
}  // namespace flextile::ir
