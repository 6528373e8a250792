#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (unit, golden lit/FileCheck,
# interpreter numerics, ptxas; GPU tests run where a CUDA GPU is present and
# skip with a message elsewhere), then the reliability checks of
# docs/reliability.md: the host suite again under ASan+UBSan
# (scripts/sanitize.sh, build folder build-asan), each fuzzer for a bounded time
# (scripts/fuzz.sh, from the same folder: one clang build holds both) and, with FLEXTILE_TSAN=1, the threaded tests under
# ThreadSanitizer (scripts/sanitize.sh --thread, build-tsan).
#
# Extra arguments go to ctest (e.g. -L gpu) and run the normal suite only.
# FLEXTILE_RELIABILITY=0 skips the sanitizer suite and the fuzzers;
# FLEXTILE_FUZZ_SECONDS sets the fuzzing time per target (default 30, to keep CI under 30 minutes).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh" "$root/build"
# A fresh build folder has no test times, and ctest then starts the tests in their order: the
# longest could start last, with one core idle meanwhile. The tracked times (scripts/ctest-costs/)
# let it start the longest first; after a run ctest keeps its own.
costs="$root/build/Testing/Temporary/CTestCostData.txt"
[ -f "$costs" ] || install -D -m 644 "$root/scripts/ctest-costs/normal.txt" "$costs"
ctest --test-dir "$root/build" --output-on-failure -j "$(nproc)" "$@"

if (($#)) || [ "${FLEXTILE_RELIABILITY:-1}" = 0 ]; then
  exit 0
fi
t0=$(date +%s)
"$root/scripts/sanitize.sh" "$root/build-asan"
t1a=$(date +%s)
# ThreadSanitizer: a fourth build of the library, past CI's budget on 2 cores (docs/reliability.md).
if [ "${FLEXTILE_TSAN:-0}" = 1 ]; then
  "$root/scripts/sanitize.sh" --thread "$root/build-tsan"
fi
t1=$(date +%s)
"$root/scripts/fuzz.sh" "${FLEXTILE_FUZZ_SECONDS:-30}" "$root/build-asan"
t2=$(date +%s)
echo "test: ASan+UBSan suite $((t1a - t0)) s, TSan threaded tests $((t1 - t1a)) s, fuzzers $((t2 - t1)) s (each build + run)"
