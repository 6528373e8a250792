#!/usr/bin/env bash
# The autotune measurement on one GPU: `flextile autotune` for each yardstick variant at
# DESIGN.md's shape (from a cold compile cache when the machine is fresh), the wall time of each
# sweep, then `flextile bench`, which runs every variant with the winner the sweeps stored.
# The document variant uses the cuts in DOCUMENT_CUTS (bench/torch_document_cuts.py), the same
# documents PyTorch times. bench/compare_autotune.py turns this log and torch_reference.py's
# JSON into the tuned / default / PyTorch table.
#
# usage: bench/autotune_sweep.sh BIN_DIR DOCUMENT_CUTS [SHAPE]   (progress lines go to stderr)
set -uo pipefail
BIN=$1 CUTS=$2 SHAPE=${3:-2,16,8192,128}
VARIANTS=${FLEXTILE_AUTOTUNE_VARIANTS:-full causal sliding_window document prefix_lm alibi softcap}
status=0
for v in $VARIANTS; do
  extra=()
  [ "$v" = document ] && extra=(--document-offsets "$CUTS")
  echo "== autotune $v"
  start=$(date +%s.%N)
  "$BIN/flextile" autotune "$v" --shape "$SHAPE" "${extra[@]}" || status=1
  awk -v a="$start" -v b="$(date +%s.%N)" -v v="$v" 'BEGIN { printf "sweep %s: %.1f s\n", v, b - a }'
done
echo "== flextile bench (the stored winners)"
"$BIN/flextile" bench --shape "$SHAPE" --document-offsets "$CUTS" || status=1
exit $status
