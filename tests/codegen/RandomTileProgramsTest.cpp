// Random tile programs (tests/fuzz/TileProgramGenerator.h) through every tile-level pass and the
// PTX lowering, with the property of the tile_program fuzzer (tests/fuzz/TileProgramProperty.h):
// the passes never change what the interpreter computes, and every program compiles. The same
// seeds run every time (a failure names its seed); FLEXTILE_FUZZ_SEEDS=<count> runs more. Every
// input the fuzzer has failed on (tests/fuzz/regressions/tile_program/) and every seed of its
// corpus is replayed too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/FuzzInputs.h"
#include "fuzz/TileProgramGenerator.h"
#include "fuzz/TileProgramProperty.h"
#include "ir/Printer.h"
#include "tests/gpu/TestBudget.h"

namespace flextile::fuzz {
namespace {

namespace fs = std::filesystem;

TEST(RandomTilePrograms, PassesKeepWhatTheInterpreterComputesAndEveryProgramCompiles) {
  // 14 in the sanitizer build, whose tile_program fuzzer checks the same property afterwards
  // (scripts/fuzz.sh), where 40 were 28 CPU-seconds.
  const int seeds = fuzzSeedCount(flextile::testing::kSanitizedBuild ? 14 : 40);
  int64_t ops = 0, writers = 0, compiled = 0, tma = 0, panels = 0, producers = 0, shared = 0, turns = 0, boxed = 0;
  for (int seed = 0; seed < seeds; ++seed) {
    Choices choices{uint64_t(seed)};
    TileProgramOutcome outcome = checkTileProgram(choices);
    ASSERT_TRUE(outcome.broken.empty()) << "seed " << seed << ": " << outcome.broken;
    ops += outcome.ops;
    writers += outcome.changedBytes > 0;
    compiled += outcome.compiled;
    tma += outcome.tmaRings;
    panels += outcome.panelRings;
    producers += outcome.producer;
    shared += outcome.sharedRings;
    turns += outcome.turns;
    boxed += outcome.bulkTensor;
  }
  std::cout << seeds << " random programs, " << ops << " ops in all; " << writers << " changed memory, " << compiled
            << " were lowered to PTX; on sm_90a " << tma << " had TMA rings, " << panels << " in 128-byte panels, "
            << producers << " a producer warpgroup, " << shared << " rings shared by loops, " << turns
            << " warpgroup turns, " << boxed << " atomic tiles added by TMA\n";
  // A property over programs that do nothing, or that are never lowered, would prove nothing.
  // About 4 in 5 programs are lowerable (not those with f64 or i8 dots, or f64 exp and the like):
  // half is a floor the fixed seeds keep when the generator changes (3 in 4 was not, at 14).
  EXPECT_GE(writers, seeds * 3 / 4);
  EXPECT_GE(compiled, seeds / 2);
  EXPECT_GE(tma, std::max(1, seeds / 20)) << "the streamed dots must reach the TMA rings";
  EXPECT_GE(boxed, std::max(1, seeds / 40)) << "the boxed atomics must reach the TMA reductions";
}

// CI runs the seeds in the gcc build and again in the clang build (sanitized): they must be the
// same programs, or a failing seed of one build is not a program the other can replay. They were
// not, while the generator drew two choices inside one call's arguments, whose order C++ leaves
// to the compiler. The fingerprint is of the first programs' printed IR; a deliberate change of
// the generator updates it (the failure prints the new one).
TEST(RandomTilePrograms, ASeedIsTheSameProgramOnEveryCompiler) {
  constexpr uint64_t kFingerprint = 0xa56b1503ceaa5df5;
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (int seed = 0; seed < 8; ++seed) {
    Choices choices{uint64_t(seed)};
    const GeneratedProgram g = TileProgramGenerator(choices).generate();
    for (char c : ir::printFunction(*g.f)) h = (h ^ uint8_t(c)) * 1099511628211ull;
  }
  EXPECT_EQ(h, kFingerprint) << "the generator's programs changed: if on purpose, the new fingerprint is 0x" << std::hex
                             << h;
}

void replay(const fs::path& dir, size_t atLeast) {
  auto files = fuzzInputFiles(dir);
  ASSERT_GE(files.size(), atLeast) << dir;
  for (const auto& p : files) {
    const std::vector<uint8_t> bytes = readFuzzInput(p);
    Choices choices(bytes.data(), bytes.size());
    const std::string broken = checkTileProgram(choices).broken;
    EXPECT_TRUE(broken.empty()) << p.filename() << ": " << broken;
  }
}

TEST(RandomTilePrograms, EveryInputTheFuzzerFailedOnIsHandled) {
  replay(FLEXTILE_SOURCE_DIR "/tests/fuzz/regressions/tile_program", 1);
}

TEST(RandomTilePrograms, EverySeedOfTheFuzzerKeepsItsProperty) {
  replay(FLEXTILE_SOURCE_DIR "/tests/fuzz/corpus/tile_program", 8);
}

}  // namespace
}  // namespace flextile::fuzz
