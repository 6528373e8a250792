#!/usr/bin/env bash
# The opt-in switches built without a GPU and waiting for their measurement, as A/Bs against the
# default in one device call (each setting a process of its own: the switches are read when a
# kernel is traced or compiled, and each run gets a fresh compile cache). Run from the repo root
# with ./bundle carried; logs under $OUT, the tables on stdout. About 5 minutes.
#   device tool: run(command="scripts/gpu_pending_ab.sh", carry=["bundle"])
# Keep this list to what is pending: once a switch is measured, record it in bench/RESULTS.md,
# make it the default or leave it opt-in (docs/performance.md, "Tuning knobs"), and drop it here.
# Measured and dropped on 2026-12-05: the decode's cluster merge, exp2 off the SFU, the split last
# round's programmatic merge, the skewed and overlapped walks, the row sum after P·V, exp2's ftz
# form on the forward and backward, the row max as four chains; on 2026-12-05 (H100) the peeled
# skewed walks (made the default) and the decode's producer warpgroup (left opt-in); on 2026-12-05 the
# acq_rel ticket (made the default); on 2026-12-05 (H100) the tagged merge, rebuilt, and a merge
# without a ticket (both removed: level or slower on every shape); on 2026-12-05 (H100, seventeenth
# session) the split count again and the live runs (-0.4 to -1.5 % on the window); on 2026-12-06
# (H200) the live runs again (-1.5 to -1.8 % on the window: removed) (bench/RESULTS.md).
# FLEXTILE_PENDING="order ..." runs only the sections named (decode, splits, canonical, alibi, bwdturns, order, tune),
# to fit beside the GPU suite in one call:
#   scripts/gpu_run.sh; FLEXTILE_PENDING=order scripts/gpu_pending_ab.sh
set -uo pipefail
export OUT=${OUT:-./gpu-logs}
wanted() { [ -z "${FLEXTILE_PENDING:-}" ] || [[ " $FLEXTILE_PENDING " == *" $1 "* ]]; }

if wanted decode; then
echo "== the decode with exp2's ftz form (its default since 533707f) against without"
FLEXTILE_AB_TAG=decode FLEXTILE_AB_BENCH=flextile_attention_decode_bench FLEXTILE_AB_TIMEOUT=150 \
  FLEXTILE_AB_ARGS="--only decode --only decode_window4096 --only decode_b1_s2048" \
  scripts/gpu_ab.sh "FLEXTILE_AB_BASELINE=1" "FLEXTILE_EXP2_FTZ=0"
fi

if wanted splits; then
echo "== the decode's split count aimed at two programs an SM (the default since 2026-12-05: H100 -0.6 to"
echo "   -3.3 % on every shape) against every slot of the ring (FLEXTILE_DECODE_FILL_SLOTS=1, the counts"
echo "   before), twice: not yet measured on an H200, where #12's goals are set"
FLEXTILE_AB_TAG=splits FLEXTILE_AB_BENCH=flextile_attention_decode_bench FLEXTILE_AB_TIMEOUT=150 \
  FLEXTILE_AB_ARGS="--only decode_window4096 --only decode_b1 --only decode --only decode_s2048 --only decode_l4" \
  scripts/gpu_ab.sh "FLEXTILE_AB_BASELINE=1" "FLEXTILE_DECODE_FILL_SLOTS=1" "FLEXTILE_AB_BASELINE=1" \
  "FLEXTILE_DECODE_FILL_SLOTS=1"
fi

if wanted canonical; then
echo "== traced IR in canonical order (FLEXTILE_CANONICAL_ORDER=1: the same kernels whatever compiler"
echo "   built FlexTile; offline ptxas: ALiBi's spill 28 -> 0 bytes, no mask's producer 152 -> 176)"
echo "   against the default, every forward variant, then the backward and the decode (the forward"
echo "   measured once, H200 2026-12-05: -1.4 % no mask and window, +1.4 % ALiBi)"
FLEXTILE_AB_TAG=canonical FLEXTILE_AB_ARGS="--quick" FLEXTILE_AB_TIMEOUT=90 scripts/gpu_ab.sh \
  "FLEXTILE_AB_BASELINE=1" "FLEXTILE_CANONICAL_ORDER=1" "FLEXTILE_AB_BASELINE=1" "FLEXTILE_CANONICAL_ORDER=1"
FLEXTILE_AB_TAG=canonicalbwd FLEXTILE_AB_BENCH=flextile_attention_backward_bench FLEXTILE_AB_TIMEOUT=150 scripts/gpu_ab.sh \
  "FLEXTILE_AB_BASELINE=1" "FLEXTILE_CANONICAL_ORDER=1"
FLEXTILE_AB_TAG=canonicaldec FLEXTILE_AB_BENCH=flextile_attention_decode_bench FLEXTILE_AB_TIMEOUT=150 \
  FLEXTILE_AB_ARGS="--only decode --only decode_window4096 --only decode_b1" \
  scripts/gpu_ab.sh "FLEXTILE_AB_BASELINE=1" "FLEXTILE_CANONICAL_ORDER=1"
fi

if wanted alibi; then
echo "== ALiBi's overlapped default spills 44 bytes (offline ptxas); each of these switches removes the"
echo "   spill: does any of them pay now? (each was a gain before the overlap)"
FLEXTILE_AB_TAG=alibi FLEXTILE_AB_ARGS="--quick --variants alibi" FLEXTILE_AB_TIMEOUT=60 scripts/gpu_ab.sh \
  "FLEXTILE_AB_BASELINE=1" "FLEXTILE_REGROUP_SUMS=0" "FLEXTILE_HOIST_INVARIANT_LOADS=0" "FLEXTILE_EXP2_FTZ=0" \
  "FLEXTILE_SKEW_OVERLAP=0" "FLEXTILE_AB_BASELINE=1"
fi

if wanted bwdturns; then
echo "== the backward's warpgroup turns (off by default: -0.5 to +1.6 % on 2026-12-03, before ftz"
echo "   shortened its softmax) against its default"
FLEXTILE_AB_TAG=bwdturns FLEXTILE_AB_BENCH=flextile_attention_backward_bench FLEXTILE_AB_TIMEOUT=150 scripts/gpu_ab.sh \
  "FLEXTILE_AB_BASELINE=1" "FLEXTILE_PINGPONG=1"
fi

if wanted order; then
echo "== the tiles handed out heaviest first (a model of the document grid: the default order 9 %"
echo "   behind longest-first); and persistent with that order (persistent lost 14 % on the document"
echo "   mask in its default order)"
FLEXTILE_AB_TAG=order FLEXTILE_AB_ARGS="--quick" FLEXTILE_AB_TIMEOUT=90 scripts/gpu_ab.sh \
  "FLEXTILE_AB_BASELINE=1" "FLEXTILE_TILE_ORDER=1" "FLEXTILE_TILE_ORDER=1 FLEXTILE_FORWARD_PERSISTENT=1" \
  "FLEXTILE_AB_BASELINE=1" "FLEXTILE_TILE_ORDER=1"
echo "== the backward's tiles heaviest first (dkdv's key tiles, dq's query tiles)"
FLEXTILE_AB_TAG=bwdorder FLEXTILE_AB_BENCH=flextile_attention_backward_bench FLEXTILE_AB_TIMEOUT=150 scripts/gpu_ab.sh \
  "FLEXTILE_AB_BASELINE=1" "FLEXTILE_TILE_ORDER=1"
fi

if wanted tune; then
echo "== the decode's autotuner, never run on a GPU (built 2026-12-05, seventeenth session): its GPU"
echo "   test, then the decode bench's --tune (each shape's winner timed beside the default)"
FLEXTILE_CACHE_DIR=$(mktemp -d) timeout 120 ./bundle/bin/autotune_gpu_tests > "$OUT/tune_gpu_tests.log" 2>&1
echo "autotune_gpu_tests rc=$?"; grep -E "^\[  (PASSED|FAILED)|Failure" "$OUT/tune_gpu_tests.log"
timeout 240 ./bundle/bin/flextile_attention_decode_bench --tune > "$OUT/tune_decode.log" 2>&1
echo "decode bench --tune rc=$?"; grep -E "tuned over" "$OUT/tune_decode.log"; sed -n '/^shape  *MB read/,$p' "$OUT/tune_decode.log"
fi

# The device tool brings back few files: the per-run logs travel as one archive.
logs=$(cd "$OUT" && ls decode_*.log splits_*.log tune_*.log canonical*.log alibi_*.log bwdturns_*.log order_*.log bwdorder_*.log 2>/dev/null)
if [ -n "$logs" ]; then
  tar czf "$OUT/pending_ab_logs.tgz" -C "$OUT" $logs && (cd "$OUT" && rm -f $logs)
fi
