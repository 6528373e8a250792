#!/usr/bin/env bash
# Cold and warm compile times of the yardstick variants' kernels (no GPU needed), each in a fresh
# process: "cold" over an empty compile-cache folder (trace + passes + LLVM + PTX), "warm" over
# the folder the cold run filled (trace + hash + read the entry), and the repeated call in one
# process. Median of REPS runs per variant.
#
# usage: bench/compile_time.sh BENCH_BINARY [REPS]      e.g. bench/compile_time.sh build/bench/flextile_compile_bench 5
set -euo pipefail
BIN=$1 REPS=${2:-5}
VARIANTS=${FLEXTILE_COMPILE_VARIANTS:-full causal sliding_window document prefix_lm alibi softcap}
field() { sed -n "s/.*\"$1\": \([0-9.]*\).*/\1/p"; }
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
printf '%-16s %10s %10s %12s   (median of %s; %s cores, load %s)\n' variant "cold ms" "warm ms" "in-process ms" \
  "$REPS" "$(nproc)" "$(cut -d' ' -f1 /proc/loadavg)"
for v in $VARIANTS; do
  cold=() warm=() again=()
  for _ in $(seq "$REPS"); do
    dir=$(mktemp -d)
    cold+=("$(FLEXTILE_CACHE_DIR=$dir "$BIN" "$v" | field first_ms)")
    line=$(FLEXTILE_CACHE_DIR=$dir "$BIN" "$v")
    grep -q '"from_disk_cache": true' <<< "$line" || { echo "compile_time.sh: $v: the second process missed the cache" >&2; exit 1; }
    warm+=("$(field first_ms <<< "$line")")
    again+=("$(field again_in_process_ms <<< "$line")")
    rm -rf "$dir"
  done
  printf '%-16s %10.1f %10.2f %12.2f\n' "$v" "$(printf '%s\n' "${cold[@]}" | median)" \
    "$(printf '%s\n' "${warm[@]}" | median)" "$(printf '%s\n' "${again[@]}" | median)"
done
