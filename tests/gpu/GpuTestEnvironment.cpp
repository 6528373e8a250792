// Linked into every GPU test binary: prints the run's scope and seed first (TestBudget.h), and
// last how many kernels the run built, so a log of a sampled run says what it covered and how to
// replay it, and the compute-sanitizer pass (scripts/gpu_run.sh) can count the kernels it checked.
#include <gtest/gtest.h>

#include <cstdio>

#include "TestBudget.h"
#include "codegen/CompileCache.h"

namespace flextile::testing {
namespace {

class GpuTestRunReport : public ::testing::Environment {
 public:
  void SetUp() override {
    runSeed();  // prints the seed line
    std::printf("[  SCOPE   ] %s\n", gpuTestScopeName(gpuTestScope()));
    std::fflush(stdout);
  }
  // Every kernel FlexTile built goes through the compile cache once (a hit or a miss, then a
  // module load); hand-written PTX modules of the runtime tests are not counted.
  void TearDown() override {
    const codegen::CompileCache::Stats s = codegen::CompileCache::global().stats();
    std::printf("[ KERNELS  ] %zu kernels built (compile cache: %zu hits, %zu misses)\n", s.hits + s.misses, s.hits,
                s.misses);
    std::fflush(stdout);
  }
};

// Registered before main (gtest_main) runs the tests; gtest owns the environment.
const ::testing::Environment* const kRunReport = ::testing::AddGlobalTestEnvironment(new GpuTestRunReport);

}  // namespace
}  // namespace flextile::testing
