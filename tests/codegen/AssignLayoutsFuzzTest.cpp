// Layout assignment on random programs (the tile_program fuzzer's generator,
// tests/fuzz/TileProgramGenerator.h: every element-wise op and dtype, loads
// and stores at assorted access patterns, reductions, shape ops, dots and
// loops). Whatever the program, the result must satisfy every layout rule,
// compute the same thing (semantic fingerprint), plan its shared memory, and
// survive a second run. That the interpreted results stay the same is
// RandomTileProgramsTest's property.
#include <gtest/gtest.h>

#include <iostream>
#include <random>

#include "LayoutTestUtil.h"
#include "TileProgramGenerator.h"
#include "codegen/Passes.h"
#include "codegen/SharedMemory.h"
#include "ir/Verifier.h"

namespace flextile::codegen {
namespace {

using namespace flextile::ir;
using namespace flextile::testing;

TEST(AssignLayoutsFuzz, RandomProgramsKeepRulesAndMeaning) {
  const unsigned seed = testSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  int converts = 0, programs = 0;
  for (int trial = 0; trial < 150; ++trial) {
    fuzz::Choices choices(rng());
    fuzz::GeneratedProgram program = fuzz::TileProgramGenerator(choices).generate();
    Function& f = *program.f;
    const int nw = f.numWarps();
    auto before = semanticFingerprint(f);
    SCOPED_TRACE("trial " + std::to_string(trial) + ", num_warps " + std::to_string(nw));
    ASSERT_NO_THROW(assignLayouts(f, Target::sm80())) << dump(f);
    auto errs = layoutRuleViolations(f);
    ASSERT_TRUE(errs.empty()) << errs.front() << "\n" << dump(f);
    ASSERT_EQ(semanticFingerprint(f), before) << dump(f);
    ASSERT_NO_THROW(verify(f)) << dump(f);
    ASSERT_NO_THROW(planSharedMemory(f));
    converts += countOps(f, OpKind::ConvertLayout);
    ++programs;
    // Running again on the laid-out program (its clones are now ordinary
    // ops) must still give a valid program computing the same thing.
    ASSERT_NO_THROW(assignLayouts(f, Target::sm80())) << dump(f);
    errs = layoutRuleViolations(f);
    ASSERT_TRUE(errs.empty()) << "second run: " << errs.front() << "\n" << dump(f);
    ASSERT_EQ(semanticFingerprint(f), before) << "second run\n" << dump(f);
  }
  std::cout << programs << " random programs, " << converts << " conversions\n";
}

}  // namespace
}  // namespace flextile::codegen
