#!/usr/bin/env bash
# Configures the sanitizer build folder that scripts/sanitize.sh and scripts/fuzz.sh share: clang-22,
# -DFLEXTILE_SANITIZE=address,undefined, and -DFLEXTILE_FUZZERS=ON (the libFuzzer targets, with
# fuzzer coverage on the library), without the GPU test binaries and the benchmarks (never run
# there). One folder for both means CI compiles the library twice (normal and sanitized), not
# three times. A folder configured otherwise (GCC, or without the fuzzers) is configured afresh.
#
#   scripts/sanitizer_build.sh configure [build-dir]    (default build-asan)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[ "${1:-}" = configure ] || { echo "usage: scripts/sanitizer_build.sh configure [build-dir]" >&2; exit 2; }
build="${2:-$root/build-asan}"
cxx="${SANITIZER_CXX:-clang++-22}"
if ! command -v "$cxx" >/dev/null; then
  echo "sanitizer build: $cxx not found (scripts/setup.sh installs clang-22 and libfuzzer-22-dev)" >&2
  exit 1
fi
cache="$build/CMakeCache.txt"
if [ -f "$build/build.ninja" ] && grep -q "^FLEXTILE_FUZZERS:BOOL=ON" "$cache" &&
   grep -q "^CMAKE_CXX_COMPILER:[A-Z]*=$(command -v "$cxx")$" "$cache"; then
  exit 0
fi
[ -f "$cache" ] && echo "sanitizer build: $build was configured otherwise; configuring it afresh"
rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" \
  -DFLEXTILE_SANITIZE=address,undefined -DFLEXTILE_FUZZERS=ON -DFLEXTILE_GPU_TESTS=OFF -DFLEXTILE_BUILD_BENCHMARKS=OFF
