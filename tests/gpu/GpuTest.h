// Helpers shared by every GPU test (all in the one executable flextile_gpu_tests).
#pragma once

#include "runtime/Driver.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <random>
#include <string>

#include "TestBudget.h"

// First statement of every GPU test: skips it, with the reason, where no driver or device is
// present, so the suite passes (as skipped) on machines without a GPU.
#define FLEXTILE_REQUIRE_GPU()                                            \
  do {                                                                    \
    std::string flextileWhyNoGpu_;                                        \
    if (!::flextile::runtime::Driver::available(&flextileWhyNoGpu_))      \
      GTEST_SKIP() << "no CUDA GPU: " << flextileWhyNoGpu_;               \
  } while (0)

namespace flextile::testing {

// A generator seeded from the run's seed and the test's name (TestBudget.h: FLEXTILE_TEST_SEED
// replays a run); the seeds go into every failure message of the test (through SCOPED_TRACE).
// Usage: `flextile::testing::SeededRandom random;` in the test body (the trace lives as long).
// Sets an environment variable for a scope (unsets it where `value` is null: a default under
// test) and puts back what was there (set or not).
class ScopedSetenv {
 public:
  ScopedSetenv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? (void)::setenv(name, value, 1) : (void)::unsetenv(name);
  }
  ~ScopedSetenv() { old_ ? (void)::setenv(name_.c_str(), old_->c_str(), 1) : (void)::unsetenv(name_.c_str()); }
  ScopedSetenv(const ScopedSetenv&) = delete;
  ScopedSetenv& operator=(const ScopedSetenv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// The templates' kernels run by the interpreter after a target's tile passes
// (FLEXTILE_INTERPRET_AFTER_PASSES; tests/attention/TilePassesInterpretedTest.cpp) for a scope.
struct InterpretAfterPasses : ScopedSetenv {
  explicit InterpretAfterPasses(const char* target) : ScopedSetenv("FLEXTILE_INTERPRET_AFTER_PASSES", target) {}
};

class SeededRandom : public std::mt19937_64 {
 public:
  SeededRandom() : SeededRandom(testSeed(), "replay: FLEXTILE_TEST_SEED=" + std::to_string(runSeed())) {}
  explicit SeededRandom(uint64_t seed, const std::string& how = "")
      : std::mt19937_64(seed),
        seed_(seed),
        trace_(__FILE__, __LINE__, "random seed " + std::to_string(seed) + (how.empty() ? "" : " (" + how + ")")) {}
  uint64_t seed() const { return seed_; }

 private:
  uint64_t seed_;
  ::testing::ScopedTrace trace_;
};

}  // namespace flextile::testing
