// Random mask_mods from the mask algebra over random structural pieces and captured tables
// (tests/fuzz/MaskModProperty.h): the BlockMask is exact against the dense reference and
// flex_attention through the interpreter matches the float64 reference. The same seeds run every
// time (a failure names its seed); FLEXTILE_FUZZ_SEEDS=<count> runs more. Every input the
// mask_mod fuzzer has failed on (tests/fuzz/regressions/mask_mod/) and every seed of its corpus is
// replayed too.
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
#include "fuzz/MaskModProperty.h"

namespace flextile::fuzz {
namespace {

namespace fs = std::filesystem;

TEST(RandomMaskMods, BlockMaskIsExactAndAttentionMatchesTheReference) {
  const int seeds = fuzzSeedCount(30);
  int64_t empty = 0, partial = 0, full = 0;
  int packed = 0;
  for (int seed = 0; seed < seeds; ++seed) {
    Choices choices{uint64_t(seed)};
    MaskModOutcome outcome = checkMaskMod(choices);
    ASSERT_TRUE(outcome.broken.empty()) << "seed " << seed << ", " << outcome.description << ": " << outcome.broken;
    empty += outcome.emptyBlocks;
    partial += outcome.partialBlocks;
    full += outcome.fullBlocks;
    packed += outcome.packed;
  }
  std::cout << seeds << " random masks (" << packed << " of packed sequences): " << empty << " empty, " << partial
            << " partial, " << full << " full blocks\n";
  EXPECT_GT(packed, 0) << "no seed packed sequences";
  // The seeds must reach every block state, or exactness would be checked for only some of them.
  EXPECT_GT(empty, 0);
  EXPECT_GT(partial, 0);
  EXPECT_GT(full, 0);
}

void replay(const fs::path& dir, size_t atLeast) {
  auto files = fuzzInputFiles(dir);
  ASSERT_GE(files.size(), atLeast) << dir;
  for (const auto& p : files) {
    const std::vector<uint8_t> bytes = readFuzzInput(p);
    Choices choices(bytes.data(), bytes.size());
    MaskModOutcome outcome = checkMaskMod(choices);
    EXPECT_TRUE(outcome.broken.empty()) << p.filename() << ", " << outcome.description << ": " << outcome.broken;
  }
}

TEST(RandomMaskMods, EveryInputTheFuzzerFailedOnIsHandled) {
  replay(FLEXTILE_SOURCE_DIR "/tests/fuzz/regressions/mask_mod", 0);
}

TEST(RandomMaskMods, EverySeedOfTheFuzzerKeepsItsProperty) {
  replay(FLEXTILE_SOURCE_DIR "/tests/fuzz/corpus/mask_mod", 8);
}

}  // namespace
}  // namespace flextile::fuzz
