#!/usr/bin/env bash
# A/B of codegen switches on the GPU machine, in one call: one bench (the forward's unless
# FLEXTILE_AB_BENCH names another in bundle/bin, e.g. flextile_attention_backward_bench; --quick, the
# default config) once per setting, side by side. Run from the repo root with ./bundle carried.
#   scripts/gpu_ab.sh "FLEXTILE_WARP_SPECIALIZE=0" "FLEXTILE_WARP_SPECIALIZE=1" ...
# Each argument is a list of VAR=VALUE words applied to that run (quote it). Extra bench arguments:
# FLEXTILE_AB_ARGS (default --quick; set it, even empty, for a bench without --quick, e.g.
# FLEXTILE_AB_BENCH=flextile_attention_decode_bench FLEXTILE_AB_ARGS="--only decode_window4096").
# Logs: $OUT/<FLEXTILE_AB_TAG or ab>_<n>.log; the table goes to stdout. Each run stops after
# FLEXTILE_AB_TIMEOUT seconds (default 90; the quick benches take 15-40 s), so a schedule that hangs
# costs one run, not the call.
set -uo pipefail
BUNDLE=./bundle
LOGS=${OUT:-./gpu-logs}
TAG=${FLEXTILE_AB_TAG:-ab}
mkdir -p "$LOGS"
BENCH=${FLEXTILE_AB_BENCH:-flextile_attention_bench}
doc=()
# The forward and backward benches take PyTorch's document lengths; the others (decode) do not.
case "$BENCH" in
  flextile_attention_bench | flextile_attention_backward_bench)
    [ -s "$LOGS/document_cuts.json" ] || python3 bench/torch_document_cuts.py > "$LOGS/document_cuts.json" 2>/dev/null ||
      rm -f "$LOGS/document_cuts.json"
    [ -s "$LOGS/document_cuts.json" ] && doc=(--document-offsets "$LOGS/document_cuts.json") ;;
esac
n=0
for setting in "$@"; do
  n=$((n + 1))
  echo "== $setting" > "$LOGS/${TAG}_$n.log"
  # shellcheck disable=SC2086
  env $setting FLEXTILE_CACHE_DIR="$(mktemp -d)" timeout "${FLEXTILE_AB_TIMEOUT:-90}" \
    "$BUNDLE/bin/$BENCH" "${doc[@]}" ${FLEXTILE_AB_ARGS---quick} >> "$LOGS/${TAG}_$n.log" 2>&1
  echo "rc=$?" >> "$LOGS/${TAG}_$n.log"
done
# Each run's setting, then its result lines (every timed row, refusals, wrong results, the exit code).
for i in $(seq 1 $n); do
  echo
  head -1 "$LOGS/${TAG}_$i.log"
  grep -E 'TFLOP/s|TB/s|WRONG|refused|rc=' "$LOGS/${TAG}_$i.log" | grep -v '^{'
done
# Last, one table: a row per timed line's name (its first word; the first such line of each run), a
# column per setting, each figure (TFLOP/s or TB/s) with its ratio to the first setting's.
echo
awk -v runs="$n" '
  FNR == 1 { run++; setting[run] = substr($0, 4) }
  /^\{/ { next }
  {
    for (k = 2; k <= NF; k++)
      if (($k == "TFLOP/s" || $k == "TB/s") && $(k - 1) ~ /^[0-9.]+$/) {
        key = $1
        if (!((key, run) in value)) {
          value[key, run] = $(k - 1)
          if (!(key in seen)) { seen[key] = 1; order[++keys] = key }
        }
        break
      }
  }
  END {
    for (r = 1; r <= runs; r++) printf "%-3s %s\n", r ":", setting[r]
    printf "%-18s", "figure"
    for (r = 1; r <= runs; r++) printf " %15s", r
    printf "\n"
    for (i = 1; i <= keys; i++) {
      key = order[i]
      printf "%-18s", key
      for (r = 1; r <= runs; r++) {
        if (!((key, r) in value)) { printf " %15s", "-"; continue }
        base = ((key, 1) in value) ? value[key, 1] + 0 : 0
        printf " %8.2f %6s", value[key, r], (base > 0 ? sprintf("%.3f", value[key, r] / base) : "")
      }
      printf "\n"
    }
  }' $(for i in $(seq 1 $n); do echo "$LOGS/${TAG}_$i.log"; done)
