#!/usr/bin/env bash
# Why does ex2's ftz form lose where the forward's warpgroups take turns? A matrix of settings on
# the no-mask and causal forwards (one device call, about 2 minutes): the rule's non-ftz kernels,
# ftz alone, and ftz with the sum before P·V, with trees for every reduction, with the overlapped
# skewed walks, and the row max as four chains (FLEXTILE_REDUCE_TREE=chains4). Run from the repo root with ./bundle carried.
set -uo pipefail
export OUT=${OUT:-./gpu-logs}
FLEXTILE_AB_TAG=ftz FLEXTILE_AB_ARGS="--quick --variants full,causal" FLEXTILE_AB_TIMEOUT=60 scripts/gpu_ab.sh \
  "FLEXTILE_AB_BASELINE=1" "FLEXTILE_EXP2_FTZ=1" "FLEXTILE_EXP2_FTZ=1 FLEXTILE_SUM_AFTER_PRODUCT=0" \
  "FLEXTILE_EXP2_FTZ=1 FLEXTILE_REDUCE_TREE=1" "FLEXTILE_EXP2_FTZ=1 FLEXTILE_SKEW=1 FLEXTILE_SKEW_OVERLAP=1" \
  "FLEXTILE_SKEW=1 FLEXTILE_SKEW_OVERLAP=1" "FLEXTILE_REDUCE_TREE=chains4" "FLEXTILE_EXP2_FTZ=1 FLEXTILE_REDUCE_TREE=chains4" \
  "FLEXTILE_AB_BASELINE=1"
tar czf "$OUT/ftz_logs.tgz" -C "$OUT" $(cd "$OUT" && ls ftz_*.log 2>/dev/null) && (cd "$OUT" && rm -f ftz_*.log)
