#!/usr/bin/env bash
# The opt-in switches built without a GPU and waiting for their measurement, as A/Bs against the
# default in one device call (each setting a process of its own: the switches are read when a
# kernel is traced or compiled, and each run gets a fresh compile cache). Run from the repo root
# with ./bundle carried; logs under $OUT, the tables on stdout. About 2 minutes.
#   device tool: run(command="scripts/gpu_pending_ab.sh", carry=["bundle"])
# Keep this list to what is pending: once a switch is measured, record it in bench/RESULTS.md,
# make it the default or leave it opt-in (docs/performance.md, "Tuning knobs"), and drop it here.
# Measured and dropped on 2026-12-05: the decode's cluster merge, exp2 off the SFU, the split last
# round's programmatic merge, the skewed and overlapped walks (bench/RESULTS.md).
set -uo pipefail
export OUT=${OUT:-./gpu-logs}

echo "== every variant: the row sum after P·V by its rule (without a score_mod) against before it"
echo "   (the rule's first run; no mask +0.5 to +1.2 % as an opt-in on 2026-12-05)"
FLEXTILE_AB_TAG=forward FLEXTILE_AB_ARGS="--quick" FLEXTILE_AB_TIMEOUT=150 scripts/gpu_ab.sh \
  "FLEXTILE_AB_BASELINE=1" "FLEXTILE_SUM_AFTER_PRODUCT=0" "FLEXTILE_AB_BASELINE=1" "FLEXTILE_SUM_AFTER_PRODUCT=0"

# The device tool brings back few files: the per-run logs travel as one archive.
tar czf "$OUT/pending_ab_logs.tgz" -C "$OUT" $(cd "$OUT" && ls forward_*.log 2>/dev/null) &&
  (cd "$OUT" && rm -f forward_*.log)
