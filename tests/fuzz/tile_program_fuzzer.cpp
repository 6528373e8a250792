// libFuzzer target: the input's bytes are the decisions of a random generator (Choices.h), and
// the property of TileProgramProperty.h must hold for what it generates; a broken property aborts
// after printing what broke, so libFuzzer keeps the input like a crash's.
//
// Built by tests/fuzz/CMakeLists.txt with clang-22 and ASan + UBSan; run by scripts/fuzz.sh
// (docs/reliability.md). Every input it has failed on lives in tests/fuzz/regressions/tile_program/,
// replayed by scripts/fuzz.sh and by the normal suite.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "TileProgramProperty.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  flextile::fuzz::Choices choices(data, size);
  auto outcome = flextile::fuzz::checkTileProgram(choices);
  if (!outcome.broken.empty()) {
    std::fprintf(stderr, "tile_program_fuzzer: %s\n", outcome.broken.c_str());
    std::abort();
  }
  return 0;
}
