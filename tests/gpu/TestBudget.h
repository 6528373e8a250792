// How much of each sweep a test run covers, and the seed that makes a sampled run replayable.
//
// A GPU test's cost is mostly kernel builds (one per config and shape specialization: trace, LLVM,
// the driver's PTX JIT) and float64 references of large shapes, not the GPU's time. So the GPU
// suite keeps every shape, variant and edge case and samples what multiplies builds: the configs
// (and the split counts, warps, stages, ... of the lower-level sweeps) run per shape are drawn at
// random each run, from a deck so that a sweep still visits every config. Three scopes:
//
//   (default)                  budget: a sample of the configs per shape (docs/testing.md);
//   FLEXTILE_GPU_TESTS_FULL=1  every config of every shape, and full references;
//   FLEXTILE_GPU_TEST_SMALL=1  budget, and only the small shapes, for the compute-sanitizer pass
//                              (which slows kernels 10-100x): tests made of large shapes skip.
//
// FLEXTILE_TEST_SEED=N replays a run: every SeededRandom derives its seed from N and its test's
// name, so one test replays alone (--gtest_filter) as it ran in the whole suite.
#pragma once

#include <gtest/gtest.h>

#include "codegen/Ptxas.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace flextile::testing {

enum class GpuTestScope { Budget, Full, Small };

namespace detail {

inline bool environmentFlag(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v || std::string(v) == "0") return false;
  if (std::string(v) == "1") return true;
  throw std::invalid_argument(std::string(name) + "='" + v + "': expected 1 (on) or 0 (off)");
}

inline uint64_t parseSeed(const char* text) {
  const std::string s(text);
  size_t used = 0;
  uint64_t seed = 0;
  try {
    seed = std::stoull(s, &used, 0);
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size() || s[0] == '-')
    throw std::invalid_argument("FLEXTILE_TEST_SEED='" + s + "': expected an unsigned integer (the seed a run printed)");
  return seed;
}

// splitmix64's finalizer: nearby inputs (a seed and a hash) give unrelated outputs.
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t hashName(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace detail

// The run's seed: FLEXTILE_TEST_SEED, or a fresh random one; the same for the whole process.
inline uint64_t runSeed() {
  static const uint64_t seed = [] {
    const char* fixed = std::getenv("FLEXTILE_TEST_SEED");
    uint64_t s = 0;
    if (fixed && *fixed) {
      s = detail::parseSeed(fixed);
    } else {
      std::random_device device;
      s = (uint64_t(device()) << 32) ^ uint64_t(device());
    }
    // Once per process, so a log always holds what replays it.
    std::printf("[   SEED   ] FLEXTILE_TEST_SEED=%llu%s\n", static_cast<unsigned long long>(s),
                fixed && *fixed ? " (from the environment)" : " (set it to replay this run)");
    std::fflush(stdout);
    return s;
  }();
  return seed;
}

// The seed of the running test: the run's seed mixed with the test's full name.
inline uint64_t testSeed() {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = test ? std::string(test->test_suite_name()) + "." + test->name() : std::string();
  return detail::mix(runSeed() ^ detail::hashName(name));
}

inline GpuTestScope gpuTestScope() {
  static const GpuTestScope scope = [] {
    const bool full = detail::environmentFlag("FLEXTILE_GPU_TESTS_FULL");
    const bool small = detail::environmentFlag("FLEXTILE_GPU_TEST_SMALL");
    if (full && small)
      throw std::invalid_argument("FLEXTILE_GPU_TESTS_FULL=1 and FLEXTILE_GPU_TEST_SMALL=1 exclude each other");
    return full ? GpuTestScope::Full : small ? GpuTestScope::Small : GpuTestScope::Budget;
  }();
  return scope;
}

inline const char* gpuTestScopeName(GpuTestScope s) {
  return s == GpuTestScope::Full ? "full (FLEXTILE_GPU_TESTS_FULL=1: every config)"
         : s == GpuTestScope::Small ? "small (FLEXTILE_GPU_TEST_SMALL=1: small shapes, sampled configs)"
                                    : "budget (sampled configs; FLEXTILE_GPU_TESTS_FULL=1 runs every config)";
}

inline bool fullSweeps() { return gpuTestScope() == GpuTestScope::Full; }

// Under FLEXTILE_GPU_TEST_SMALL=1, false for a problem of more than `kSmallProblemWork`
// score elements (B * H * L * S, or M * N * K): a shape the sanitizer pass leaves out.
inline constexpr int64_t kSmallProblemWork = int64_t(1) << 21;
inline bool inScope(int64_t work) { return gpuTestScope() != GpuTestScope::Small || work <= kSmallProblemWork; }

// The sanitizer build (scripts/sanitize.sh; tests/CMakeLists.txt defines FLEXTILE_SANITIZED_BUILD
// there) runs the interpreter ~15x slower, and CI's two cores run the whole host suite under it:
// the heaviest interpreted sweeps run a share of their cases there (the normal build runs all).
#ifndef FLEXTILE_SANITIZED_BUILD
#define FLEXTILE_SANITIZED_BUILD 0
#endif
inline constexpr bool kSanitizedBuild = FLEXTILE_SANITIZED_BUILD != 0;

// Whether a test that assembles kernels at scale runs ptxas: not in the sanitizer build, where
// ptxas (a separate program, not instrumented) took 90 % of such a test's time, as much as in the
// normal build, which runs it and asserts on its report. There the test still plans and compiles
// the kernels, our code under the sanitizers.
inline bool assemblesInThisBuild() { return !kSanitizedBuild && codegen::findPtxas().has_value(); }

// Whether case `index` of a sweep runs: always in the normal build; in the sanitizer build one case
// in `share`, the offset drawn from `seed` (a SeededRandom's), so successive runs cover them all.
inline bool runsInThisBuild(uint64_t seed, size_t index, size_t share) {
  return !kSanitizedBuild || share <= 1 || (index + detail::mix(seed)) % share == 0;
}

// First statement after FLEXTILE_REQUIRE_GPU() of a test made only of large shapes.
#define FLEXTILE_SKIP_WHEN_SMALL(why)                                                                     \
  do {                                                                                                   \
    if (::flextile::testing::gpuTestScope() == ::flextile::testing::GpuTestScope::Small)                 \
      GTEST_SKIP() << "FLEXTILE_GPU_TEST_SMALL=1: " << (why);                                            \
  } while (0)

// The choices (configs, split counts, ...) each shape of a sweep runs: all of them in the full
// scope; otherwise `perShape` drawn from a deck that the generator shuffles and deals in turn, so
// every choice runs once before any runs twice, and a sweep of n shapes covers all the choices
// when n * perShape >= their number. The first choice of `all` (the default config, by
// convention) can be pinned to run for every shape.
template <class T>
class ConfigSample {
 public:
  ConfigSample(std::vector<T> all, size_t perShape, std::mt19937_64& rng, bool alwaysFirst = false)
      : all_(std::move(all)), perShape_(perShape), alwaysFirst_(alwaysFirst && !all_.empty()), rng_(rng) {
    if (all_.empty() || perShape_ == 0) throw std::invalid_argument("ConfigSample: nothing to sample");
  }

  // The next shape's choices, in the order of `all`.
  std::vector<T> next() {
    if (fullSweeps()) return all_;
    std::vector<size_t> picked;
    if (alwaysFirst_) picked.push_back(0);
    const size_t pool = all_.size() - (alwaysFirst_ ? 1 : 0);
    const size_t draw = std::min(pool, perShape_ - std::min(perShape_, picked.size()));
    while (picked.size() < (alwaysFirst_ ? 1 : 0) + draw) {
      if (deck_.empty()) {
        for (size_t i = alwaysFirst_ ? 1 : 0; i < all_.size(); ++i) deck_.push_back(i);
        std::shuffle(deck_.begin(), deck_.end(), rng_);
      }
      const size_t i = deck_.back();
      deck_.pop_back();
      if (std::find(picked.begin(), picked.end(), i) == picked.end()) picked.push_back(i);
    }
    std::sort(picked.begin(), picked.end());
    std::vector<T> out;
    for (size_t i : picked) out.push_back(all_[i]);
    return out;
  }

  const std::vector<T>& all() const { return all_; }

 private:
  std::vector<T> all_;
  size_t perShape_;
  bool alwaysFirst_;
  std::mt19937_64& rng_;
  std::vector<size_t> deck_;
};

}  // namespace flextile::testing
