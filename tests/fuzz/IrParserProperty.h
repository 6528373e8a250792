// The property that ir_parser_fuzzer checks on every input, shared with the normal test suite
// (tests/ir/FuzzRegressionTest.cpp replays tests/fuzz/regressions/ir_parser/ through it, built
// with GCC and without sanitizers, so a fixed crash stays fixed even where clang is missing).
//
// The contract (ir/Parser.h: "parse-then-verify is the way to read untrusted text"):
//   * any text either parses or throws flextile::Error — never a crash, a hang, another exception
//     type or (under the sanitizers) a report;
//   * whatever parses also prints (error messages print IR, so the printer must cope with IR that
//     fails verification), and verify() throws exactly when verificationProblems() is not empty;
//   * a module that parses and verifies round-trips: its printed text parses and verifies again,
//     prints to the same text and keeps each function's structural hash (the compile cache's key),
//     with and without source locations;
//   * the target-independent passes (canonicalize, cse, dce) keep a verified function verified,
//     and neither they nor the verifier throw on it.
#pragma once

#include <string>
#include <string_view>

#include "ir/Hash.h"
#include "ir/Parser.h"
#include "ir/Passes.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"

namespace flextile::fuzz {

struct IrTextOutcome {
  bool parsed = false, verified = false;
  std::string broken;  // empty, or which property failed and the texts involved
};

namespace detail {

inline std::string twoTexts(std::string_view what, const std::string& a, const std::string& b) {
  return std::string(what) + "\n--- first ---\n" + a + "\n--- second ---\n" + b;
}

inline bool verifies(const ir::Module& m) {
  for (const auto& f : m.functions)
    if (!ir::verificationProblems(*f).empty()) return false;
  return true;
}

// print → parse → verify → print must be a fixed point of a verified module.
inline std::string roundTrip(const ir::Module& m, const ir::PrintOptions& options) {
  std::string first = ir::printModule(m, options);
  ir::Module again;
  try {
    again = ir::parseModule(first, "<printed>");
  } catch (const Error& e) {
    return twoTexts("the printed form of a verified module does not parse", first, e.what());
  }
  if (again.functions.size() != m.functions.size()) return twoTexts("reparsing changed the function count", first, "");
  for (size_t i = 0; i < m.functions.size(); ++i) {
    auto problems = ir::verificationProblems(*again.functions[i]);
    if (!problems.empty()) return twoTexts("the printed form of a verified module does not verify", first, problems[0]);
    if (ir::structuralHash(*again.functions[i]) != ir::structuralHash(*m.functions[i]))
      return twoTexts("reparsing changed the structural hash", first, ir::printModule(again, options));
  }
  std::string second = ir::printModule(again, options);
  if (second != first) return twoTexts("print(parse(print(m))) differs from print(m)", first, second);
  return "";
}

// Each pass on a verified function must leave it verified (what PassPipeline checks after every
// pass in a real compile) and must not throw: a verified function is one the compiler accepts.
inline std::string passesKeepItVerified(const ir::Function& original) {
  std::string text = ir::printFunction(original);
  auto f = ir::parseFunction(text, "<printed>");  // round-tripped already: cannot throw
  for (auto [name, pass] : {std::pair{"canonicalize", &ir::canonicalize}, {"cse", &ir::cse}, {"dce", &ir::dce}}) {
    try {
      pass(*f);
    } catch (const Error& e) {
      return twoTexts(std::string(name) + " threw on a verified function", text, e.what());
    }
    auto problems = ir::verificationProblems(*f);
    if (!problems.empty())
      return twoTexts(std::string(name) + " broke a verified function", text, ir::printFunction(*f) + "\n" + problems[0]);
  }
  return "";
}

}  // namespace detail

// Only flextile::Error is caught: any other exception escapes, which the fuzzer reports as a
// crash and a test as an error.
inline IrTextOutcome checkIrText(std::string_view text) {
  IrTextOutcome out;
  ir::Module m;
  try {
    m = ir::parseModule(text, "<fuzz>");
  } catch (const Error&) {
    return out;  // rejected with a message: the expected outcome for most inputs
  }
  out.parsed = true;
  (void)ir::printModule(m, {.locations = true});
  bool threw = false;
  for (const auto& f : m.functions) {
    try {
      ir::verify(*f);
    } catch (const Error&) {
      threw = true;
    }
  }
  out.verified = detail::verifies(m);
  if (threw == out.verified) {
    out.broken = "verify() and verificationProblems() disagree\n" + ir::printModule(m);
    return out;
  }
  if (!out.verified) return out;
  out.broken = detail::roundTrip(m, {});
  if (out.broken.empty()) out.broken = detail::roundTrip(m, {.locations = true});
  for (size_t i = 0; out.broken.empty() && i < m.functions.size(); ++i)
    out.broken = detail::passesKeepItVerified(*m.functions[i]);
  return out;
}

}  // namespace flextile::fuzz
