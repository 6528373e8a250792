#!/usr/bin/env bash
# Profiles flex_attention's forward kernel with Nsight Compute on the GPU machine, from the repo
# root with ./bundle (scripts/bundle.sh): one launch per variant, at the bench's shape
# (B=2 H=16 N=8192 D=128, default config), the sections that say what bounds a kernel: speed of
# light, compute and memory workload, scheduler and warp-state statistics (stall reasons),
# occupancy and launch statistics. One text report per variant in $OUT (or ./gpu-logs), and the
# lines that matter most printed at the end. ncu locks the clocks to base for its replays, so its
# durations are longer than the bench's; compare ratios, not times.
#
#   scripts/ncu_forward.sh [variants (default: full causal)]
# Environment: FLEXTILE_NCU (the executable; default PATH, then /usr/local/cuda*/bin), and any
# FLEXTILE_* switch, which the profiled bench sees.
set -uo pipefail
LOGS=${OUT:-./gpu-logs}
mkdir -p "$LOGS"
NCU=${FLEXTILE_NCU:-$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)}
if [ -z "$NCU" ]; then echo "ncu_forward.sh: no ncu found (set FLEXTILE_NCU)" >&2; exit 2; fi
[ -s "$LOGS/document_cuts.json" ] || python3 bench/torch_document_cuts.py > "$LOGS/document_cuts.json"
variants=${*:-full causal}
for v in $variants; do
  # The bench checks sampled rows before it times: the first launch of the forward kernel is a
  # full launch on random inputs.
  "$NCU" --kernel-name "regex:^flex_fwd" --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section SchedulerStats --section WarpStateStats --section Occupancy --section LaunchStats \
    ./bundle/bin/flextile_attention_bench --quick --variants "$v" --document-offsets "$LOGS/document_cuts.json" \
    > "$LOGS/ncu_fwd_$v.txt" 2>&1
  echo "== ncu, forward, $v (rc $?)"
  # The stall reasons per issued instruction, and the tensor pipe's activity (a separate run:
  # a metric name this ncu lacks fails only this one).
  stalls=""
  for r in barrier long_scoreboard short_scoreboard math_pipe_throttle mio_throttle wait dispatch_stall \
           not_selected selected no_instruction lg_throttle membar sleeping branch_resolving drain misc; do
    stalls+="smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio,"
  done
  "$NCU" --kernel-name "regex:^flex_fwd" --launch-count 1 \
    --metrics "${stalls}sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.sum,smsp__inst_executed.sum" \
    ./bundle/bin/flextile_attention_bench --quick --variants "$v" --document-offsets "$LOGS/document_cuts.json" \
    > "$LOGS/ncu_fwd_${v}_stalls.txt" 2>&1
  grep -E "stalled|gmma|inst_executed|ERR" "$LOGS/ncu_fwd_${v}_stalls.txt" | head -24
  grep -E "flex_fwd|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Eligible Warps|Executed Ipc A|Stall|L1/TEX Hit|L2 Hit|Dynamic Shared" "$LOGS/ncu_fwd_$v.txt" | head -40
done
