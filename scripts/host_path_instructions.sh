#!/usr/bin/env bash
# Instructions a flex_attention decode call costs the host (bench/host_path.cpp), counted by
# callgrind against the recording stand-in driver (kernels do not run, so this is the host's work
# alone; the stand-in's own launch logging is in the count, a few thousand instructions). The
# count is exact from run to run, where wall time on a shared host is not: the figure to compare
# before and after a change of the launch path.
#
#   scripts/host_path_instructions.sh [build-dir] [case...]   (default: build, every case)
#
# Valgrind cannot read the debug info of the statically linked LLVM, so the library and the bench
# are copied without it (strip --strip-debug) into a temporary folder first.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
shift $(( $# > 0 ? 1 : 0 ))
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(decode decode_causal window_devlists)
command -v valgrind > /dev/null || { echo "host_path_instructions.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }
driver="$build/tests/runtime/libflextile_recording_cuda.so"
[ -f "$driver" ] || { echo "host_path_instructions.sh: $driver is missing (build the tests)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/lib"
strip --strip-debug -o "$work/lib/libflextile.so" "$build/libflextile.so"
strip --strip-debug -o "$work/bin/flextile_host_path_bench" "$build/bench/flextile_host_path_bench"
calls=1000
for c in "${cases[@]}"; do
  out="$work/callgrind.$c"
  FLEXTILE_CUDA_LIBRARY="$driver" LD_LIBRARY_PATH="$work/lib" \
    valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*timedCalls*' --callgrind-out-file="$out" \
    "$work/bin/flextile_host_path_bench" --calls "$calls" --only "$c" > "$work/log.$c" 2>&1 ||
    { cat "$work/log.$c" >&2; exit 1; }
  total=$(awk '/^summary:/ { print $2 }' "$out")
  awk -v c="$c" -v t="$total" -v n="$calls" 'BEGIN { printf "%-16s %6.1f thousand instructions a call\n", c, t / n / 1000 }'
done
