#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz in the sanitizer build (clang-22, ASan + UBSan, the
# folder scripts/sanitize.sh uses; scripts/sanitizer_build.sh) and runs each for a bounded time:
# first on every input it has ever crashed on (tests/fuzz/regressions/<target>/), then from
# its seed corpus (tests/fuzz/corpus/<target>/). scripts/test.sh runs it for 30 s a target, so CI
# does; docs/reliability.md says how to fuzz for longer and what to do with a crash. Usage:
#
#   scripts/fuzz.sh [seconds per target] [build-dir]     (defaults: 60, build-asan)
#   FUZZ_JOBS=2 scripts/fuzz.sh 3600                     (an hour, two processes)
#   FUZZ_TARGETS="mask_mod" scripts/fuzz.sh 600          (one target; default: all three)
#
# The targets: ir_parser (arbitrary text into the IR parser and verifier), tile_program (random
# tile programs through the passes and the PTX lowering) and mask_mod (random mask_mods through
# the BlockMask builder and flex_attention); docs/reliability.md says what each checks.
#
# New inputs that reach new code go to <build-dir>/corpus/<target>/, never into the repository;
# a crash, hang (-timeout), out-of-memory (-rss_limit_mb) or sanitizer report stops the run with a
# non-zero status and leaves the input in <build-dir>/artifacts/<target>/.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-60}"
build="${2:-$root/build-asan}"
mkdir -p "$build" && build="$(cd "$build" && pwd)"  # absolute: the fuzzers run from inside it
jobs="${FUZZ_JOBS:-1}"
targets="${FUZZ_TARGETS:-ir_parser tile_program mask_mod}"
"$root/scripts/sanitizer_build.sh" configure "$build"
cmake --build "$build" -j "$(nproc)" --target $(for t in $targets; do printf '%s_fuzzer ' "$t"; done)

# Fuzzer reports are fatal and symbolized (file:line) like the sanitizer suite's.
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:strict_string_checks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:abort_on_error=1"

# Per target: how long one input may run before it counts as a hang, and the longest input. A
# parser input is text (5 s is a hang); a generator input is decisions, and one input is a whole
# program compiled to PTX, or a mask built and attention run through the interpreter, under the
# sanitizers (seconds on a loaded machine; 60 s is a hang).
declare -A timeout=([ir_parser]=5 [tile_program]=60 [mask_mod]=60)
declare -A max_len=([ir_parser]=8192 [tile_program]=4096 [mask_mod]=1024)

for target in $targets; do
  bin="$build/${target}_fuzzer"
  seeds="$root/tests/fuzz/corpus/$target"
  regressions="$root/tests/fuzz/regressions/$target"
  work="$build/corpus/$target"
  artifacts="$build/artifacts/$target/"
  mkdir -p "$work" "$artifacts"
  dict=()
  [ -f "$root/tests/fuzz/$target.dict" ] && dict=(-dict="$root/tests/fuzz/$target.dict")

  # Every input that once crashed must pass (the normal suite replays them too, without sanitizers).
  mapfile -t old < <(find "$regressions" -type f ! -name '*.md' 2>/dev/null | sort)
  if ((${#old[@]})); then
    echo "fuzz: $target: replaying ${#old[@]} regression inputs"
    "$bin" "${dict[@]}" -timeout="${timeout[$target]}" -rss_limit_mb=2048 "${old[@]}" > "$build/$target-regressions.log" 2>&1 ||
      { cat "$build/$target-regressions.log" >&2; echo "fuzz: $target: a regression input fails again" >&2; exit 1; }
  fi

  echo "fuzz: $target: ${seconds} s from $(find "$seeds" -type f | wc -l) seeds (${jobs} job(s))"
  # -timeout: see above. -rss_limit_mb: 2 GB for a few kilobytes of input is a bug. -max_len: longer
  # than the largest seed (libFuzzer's default stops there), so nesting and long programs get explored.
  # More than one job: libFuzzer forks workers that share the corpus folder, each logging to
  # fuzz-N.log in the current folder (hence the cd).
  parallel=()
  ((jobs > 1)) && parallel=(-jobs="$jobs" -workers="$jobs")
  status=0
  (cd "$build" && "$bin" "${dict[@]}" -max_total_time="$seconds" -timeout="${timeout[$target]}" -rss_limit_mb=2048 \
    -max_len="${max_len[$target]}" \
    -artifact_prefix="$artifacts" -print_final_stats=1 "${parallel[@]}" \
    "$work" "$seeds") > "$build/$target.log" 2>&1 || status=$?
  tail -n 25 "$build/$target.log"
  if ((status)); then
    echo "fuzz: $target FAILED (status $status); the input is in $artifacts:" >&2
    ls -l "$artifacts" >&2
    echo "fuzz: fix it, then keep the input in tests/fuzz/regressions/$target/ and add a test (docs/reliability.md)" >&2
    exit 1
  fi
done
echo "fuzz: every target ran ${seconds} s without a finding"
