// libFuzzer target: arbitrary text through the IR parser, the verifier and the printer. The
// property it checks is flextile::fuzz::checkIrText (IrParserProperty.h); a broken property
// aborts after printing what differs, so libFuzzer keeps the input like a crash's.
//
// Built by tests/fuzz/CMakeLists.txt with clang-22 and ASan + UBSan; run by scripts/fuzz.sh
// (docs/reliability.md). Every input it has crashed on lives in tests/fuzz/regressions/ir_parser/,
// replayed by scripts/fuzz.sh and by the normal suite (tests/ir/FuzzRegressionTest.cpp).
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "IrParserProperty.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto outcome = flextile::fuzz::checkIrText({reinterpret_cast<const char*>(data), size});
  if (!outcome.broken.empty()) {
    std::fprintf(stderr, "ir_parser_fuzzer: %s\n", outcome.broken.c_str());
    std::abort();
  }
  return 0;
}
