#!/usr/bin/env bash
# The host test suite under AddressSanitizer (with LeakSanitizer) and UndefinedBehaviorSanitizer:
# configures a second build folder with -DFLEXTILE_SANITIZE=address,undefined (CMakeLists.txt),
# builds it and runs every host test (ctest -LE gpu) with options that make any report fatal.
# scripts/test.sh runs it, so CI does; docs/reliability.md says what it covers and how to read a
# report. Usage:
#
#   scripts/sanitize.sh [build-dir] [ctest arguments...]   (default build-dir: build-asan)
#   scripts/sanitize.sh --thread [build-dir] [ctest arguments...]   (default build-dir: build-tsan)
#
# --thread: ThreadSanitizer instead (it cannot be combined with ASan). It builds only the library
# and the threaded test binary (tests/concurrency, label `threads`) and runs those tests: the rest
# of the suite is single-threaded or covered by them, and the whole build would not fit CI.
#
# Expects the packages of scripts/setup.sh. LLVM is linked statically from llvm-22-dev and is not
# instrumented; everything of FlexTile's own (library, tests, tools, the fake libcuda) is. The ASan
# build is clang-22's and holds the fuzz targets too (scripts/sanitizer_build.sh): scripts/fuzz.sh
# runs them from the same folder, so the library is compiled once for both.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
supp="$root/scripts/sanitizers"
sym=""
[ -x /usr/lib/llvm-22/bin/llvm-symbolizer ] && sym=":external_symbolizer_path=/usr/lib/llvm-22/bin/llvm-symbolizer"

if [ "${1:-}" = "--thread" ]; then
  shift
  build="${1:-$root/build-tsan}"
  shift $(( $# > 0 ? 1 : 0 ))
  if [ ! -f "$build/build.ninja" ]; then
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXTILE_SANITIZE=thread \
      -DFLEXTILE_GPU_TESTS=OFF -DFLEXTILE_BUILD_BENCHMARKS=OFF
  fi
  cmake --build "$build" -j "$(nproc)" --target flextile concurrency_tests
  # halt_on_error + abort_on_error: the first race ends the process with SIGABRT (the test fails);
  # second_deadlock_stack: both stacks of a lock-order inversion. Suppressions: third-party only.
  export TSAN_OPTIONS="halt_on_error=1:abort_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp$sym"
  start=$(date +%s)
  ctest --test-dir "$build" -L threads --output-on-failure -j "$(nproc)" "$@"
  echo "sanitize: the threaded tests passed under ThreadSanitizer in $(( $(date +%s) - start )) s"
  exit 0
fi

build="${1:-$root/build-asan}"
shift $(( $# > 0 ? 1 : 0 ))
"$root/scripts/sanitizer_build.sh" configure "$build"
cmake --build "$build" -j "$(nproc)"

# halt_on_error / -fno-sanitize-recover: the first report ends the process, so the test fails.
# abort_on_error: end it with SIGABRT rather than exit(1), so that a test expecting a failing
# exit status (lit's `not flextile-opt`, ctest's WILL_FAIL) cannot mistake a report for the
# expected error. detect_leaks: LeakSanitizer at exit. Suppressions (third-party code only, each
# with its reason) live in scripts/sanitizers/.
# llvm-symbolizer (sym, above) names file:line in reports much faster than the addr2line fallback.
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=1$sym"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:abort_on_error=1:suppressions=$supp/ubsan.supp$sym"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"

# Left out here (the normal suite runs them): the ptxas sweeps, whose time is ptxas itself (not
# instrumented) assembling kernels that other tests compile under the sanitizers too, and the
# examples, which repeat at example scale flows the unit tests cover (this build does not even
# build them: examples/CMakeLists.txt). Together they were 310 of
# the suite's 880 CPU-seconds under ASan (2026-12-02).
uninstrumented_time='^example_|EveryVariantAssembles|EveryExampleAssembles|PtxasAssemblesAGrid'
# An empty compile cache each run: with the user's cache (~/.cache/flextile) a second run of the
# same library found every kernel compiled and ran none of the compiler under the sanitizers (a
# rebuilt library changes the cache key, so only runs after a test-only change were hit), and CI
# starts empty. Tests that name their own cache folder keep it.
export FLEXTILE_CACHE_DIR="$build/sanitized-suite-cache"
rm -rf "$FLEXTILE_CACHE_DIR"
# The longest tests first in a fresh folder too (scripts/test.sh says why).
costs="$build/Testing/Temporary/CTestCostData.txt"
[ -f "$costs" ] || install -D -m 644 "$root/scripts/ctest-costs/sanitized.txt" "$costs"
start=$(date +%s)
ctest --test-dir "$build" -LE gpu -E "$uninstrumented_time" --output-on-failure -j "$(nproc)" "$@"
echo "sanitize: the host suite passed under ASan+UBSan in $(( $(date +%s) - start )) s"
