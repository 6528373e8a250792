#!/usr/bin/env bash
# The opt-in switches built without a GPU and waiting for their measurement, as A/Bs against the
# default in one device call (each setting a process of its own: the switches are read when a
# kernel is traced or compiled, and each run gets a fresh compile cache). Run from the repo root
# with ./bundle carried; logs under $OUT, the tables on stdout. About 6 minutes: run it in a device
# call of its own, not after the GPU suite.
#   device tool: run(command="scripts/gpu_pending_ab.sh", carry=["bundle"])
# Keep this list to what is pending: once a switch is measured, record it in bench/RESULTS.md,
# make it the default or leave it opt-in (docs/performance.md, "Tuning knobs"), and drop it here.
set -uo pipefail
export OUT=${OUT:-./gpu-logs}

echo "== decode: the merge through a thread block cluster (docs/decode.md)"
FLEXTILE_AB_TAG=decode_cluster FLEXTILE_AB_BENCH=flextile_attention_decode_bench FLEXTILE_AB_ARGS="" \
  FLEXTILE_AB_TIMEOUT=120 scripts/gpu_ab.sh \
  "FLEXTILE_DECODE_CLUSTER_MERGE=0" "FLEXTILE_DECODE_CLUSTER_MERGE=1" \
  "FLEXTILE_DECODE_CLUSTER_MERGE=0" "FLEXTILE_DECODE_CLUSTER_MERGE=1"

echo
echo "== forward without a mask and causal: exponentials off the SFU, the row sum after P·V, the"
echo "   split last round's merge as a programmatic dependent launch, skewed walks plain and overlapped"
echo "   (docs/performance.md)"
FLEXTILE_AB_TAG=forward FLEXTILE_AB_ARGS="--quick --variants full,causal" scripts/gpu_ab.sh \
  "FLEXTILE_AB_BASELINE=1" "FLEXTILE_EXP2_EMULATION=6" "FLEXTILE_SUM_AFTER_PRODUCT=1" \
  "FLEXTILE_PROGRAMMATIC_LAUNCH=1" "FLEXTILE_SUM_AFTER_PRODUCT=1 FLEXTILE_EXP2_EMULATION=6" \
  "FLEXTILE_SKEW=1" "FLEXTILE_SKEW=all" "FLEXTILE_SKEW_OVERLAP=1" "FLEXTILE_SKEW_OVERLAP=1 FLEXTILE_SKEW=all" \
  "FLEXTILE_SKEW_OVERLAP=1 FLEXTILE_EXP2_EMULATION=6" "FLEXTILE_SKEW_OVERLAP=1 FLEXTILE_SPLIT_LAST_ROUND=0" \
  "FLEXTILE_AB_BASELINE=1"

# The device tool brings back few files: the per-run logs travel as one archive.
tar czf "$OUT/pending_ab_logs.tgz" -C "$OUT" $(cd "$OUT" && ls decode_cluster_*.log forward_*.log 2>/dev/null) &&
  (cd "$OUT" && rm -f decode_cluster_*.log forward_*.log)
