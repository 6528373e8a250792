#!/usr/bin/env bash
# Chases the stall of the backward's warpgroup turns (opt-in; the test then
# FlexAttentionBackwardGpu.WarpgroupTurnsEveryVariant), which ran past its limit three times under
# the parallel GPU suite, each time in the document variant, and never alone (bench/RESULTS.md,
# 2026-12-05 and 2026-12-06; the close's handshake of 5a7348d is the fix to confirm). Runs
# COPIES processes of that test at once, each with its own seed, ROUNDS times; a process past LIMIT
# seconds leaves in its log what it was doing (gpu_run.sh's run_limited: threads' states and wait
# channels, the GPU's use by process) and is killed. Prints one line a process and the seeds of any
# that stalled, to replay with FLEXTILE_TEST_SEED. Logs under $OUT. From the repo root with
# ./bundle carried:
#   device tool: run(command="scripts/gpu_stress_turns.sh", carry=["bundle"])
#   COPIES=8 ROUNDS=2 LIMIT=150 FILTER='EveryVariant/FlexAttentionBackwardGpuTurns.EachVariant/document'
set -uo pipefail
OUT=${OUT:-./gpu-logs}
mkdir -p "$OUT"
COPIES=${COPIES:-8} ROUNDS=${ROUNDS:-2} LIMIT=${LIMIT:-150}
FILTER=${FILTER:-EveryVariant/FlexAttentionBackwardGpuTurns.EachVariant/document}
eval "$(sed -n '/^run_limited() {/,/^}/p' scripts/gpu_run.sh)"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
sed -n 2p bundle/MANIFEST.txt
stalled=()
for ((round = 0; round < ROUNDS; round++)); do
  pids=() seeds=()
  for ((i = 0; i < COPIES; i++)); do
    seed=$RANDOM$RANDOM$RANDOM
    seeds+=("$seed")
    log="$OUT/stress_r${round}_$i.log"
    ( run_limited "$LIMIT" "$log" "FLEXTILE_TEST_SEED=$seed FLEXTILE_CACHE_DIR=/tmp/ftc-stress$i ./bundle/bin/attention_gpu_tests --gtest_filter='$FILTER'"
      echo $? > "$log.rc" ) &
    pids+=($!)
  done
  wait "${pids[@]}"
  for ((i = 0; i < COPIES; i++)); do
    log="$OUT/stress_r${round}_$i.log"
    rc=$(cat "$log.rc")
    echo "round $round copy $i seed ${seeds[$i]}: exit $rc, $(grep -c '^\[ CASE' "$log") cases, last: $(grep '^\[ CASE' "$log" | tail -1 | cut -c1-110)"
    [ "$rc" = 124 ] && stalled+=("${seeds[$i]}")
  done
done
echo "stalled: ${#stalled[@]} of $((COPIES * ROUNDS))${stalled[*]:+ (seeds ${stalled[*]})}"
