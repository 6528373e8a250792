#!/usr/bin/env bash
# Issue #12's proof in one device call: the decode bench beside PyTorch's decode (bench/
# torch_decode.py: SDPA and FlexDecoding in the same call; both also as steps replayed from a CUDA
# graph, --graph), the serving part of the GPU tests and
# the autotune GPU tests and the decode tuner's sweep on the window and B=1 S=2048, with the window's
# timeline (the kernel's own clock at each program's phases). On an H200, where #12's goals are set,
# the benches run first; elsewhere the tests do. About 3-6 minutes; logs under $OUT. Run from the
# repo root with ./bundle carried:
#   device tool: run(command="scripts/gpu_decode_goal.sh", carry=["bundle"])
# FLEXTILE_GOAL_BENCHES_ONLY=1 runs the two benches alone (about 4 minutes), for a short device budget.
set -uo pipefail
export OUT=${OUT:-./gpu-logs}
mkdir -p "$OUT"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU; $(sed -n 2p bundle/MANIFEST.txt)"
export FLEXTILE_TEST_SEED=${FLEXTILE_TEST_SEED:-$RANDOM$RANDOM}
echo "seed $FLEXTILE_TEST_SEED"
serving='FlexDecodeGpu.*:*/FlexDecodeGpuVariant.*:DecodeListsGpu.*:PagedKVGpu.*:PagedKVCacheGpu.*:FlexAttentionStreamsGpu.*'
t0=$SECONDS

benches() {
  FLEXTILE_CACHE_DIR=/tmp/ftcache-bench timeout 170 ./bundle/bin/flextile_attention_decode_bench --graph > "$OUT/decode.log" 2>&1
  echo "decode bench rc=$? ($((SECONDS - t0)) s)"
  sed -n '/^shape  *MB read/,$p' "$OUT/decode.log"
  grep -E "graph of" "$OUT/decode.log"
  timeout 150 python3 bench/torch_decode.py --graph --json "$OUT/torch_decode.json" > "$OUT/torch_decode.log" 2>&1
  echo "torch_decode rc=$? ($((SECONDS - t0)) s)"
  sed -n '/^shape  *flex us/,$p' "$OUT/torch_decode.log"
}

tests() {
  # The core tests alone first: RuntimeGpu.AllocationShowsInFreeMemory reads the card's free memory,
  # which other processes' allocations move.
  FLEXTILE_CACHE_DIR=/tmp/ftcache-core timeout 150 ./bundle/bin/flextile_gpu_tests > "$OUT/core.log" 2>&1
  echo "flextile_gpu_tests rc=$?"
  # Three processes, the tests dealt longest first (scripts/gpu_test_shards.py, as gpu_run.sh does).
  local filters=()
  mapfile -t filters < <(python3 scripts/gpu_test_shards.py deal ./bundle/bin/attention_gpu_tests "$serving" 3 \
                           scripts/gpu_test_seconds.txt 2>/dev/null)
  for i in 0 1 2; do
    if [ "${#filters[@]}" -eq 3 ]; then
      FLEXTILE_CACHE_DIR=/tmp/ftcache-serving$i timeout 170 \
        ./bundle/bin/attention_gpu_tests --gtest_filter="${filters[$i]}" > "$OUT/serving$i.log" 2>&1 &
    else
      FLEXTILE_CACHE_DIR=/tmp/ftcache-serving$i GTEST_TOTAL_SHARDS=3 GTEST_SHARD_INDEX=$i timeout 170 \
        ./bundle/bin/attention_gpu_tests --gtest_filter="$serving" > "$OUT/serving$i.log" 2>&1 &
    fi
  done
  wait
  FLEXTILE_CACHE_DIR=/tmp/ftcache-tune timeout 100 ./bundle/bin/autotune_gpu_tests > "$OUT/autotune.log" 2>&1
  echo "autotune_gpu_tests rc=$?"
  grep -hE "^\[  PASSED|^\[  FAILED" "$OUT/core.log" "$OUT"/serving*.log "$OUT/autotune.log"
  echo "tests done ($((SECONDS - t0)) s)"
}

if [[ "${FLEXTILE_GOAL_BENCHES_ONLY:-0}" == 1 ]]; then
  benches
  echo "total $((SECONDS - t0)) s"
  exit 0
fi
if [[ "$GPU" == *H200* ]]; then benches; tests; else tests; benches; fi
FLEXTILE_CACHE_DIR=/tmp/ftcache-bench timeout 70 ./bundle/bin/flextile_attention_decode_bench --tune \
  --only decode_window4096 --only decode_b1_s2048 > "$OUT/decode_tune.log" 2>&1
echo "decode --tune rc=$?"
grep -E "tuned over" "$OUT/decode_tune.log"
FLEXTILE_CACHE_DIR=/tmp/ftcache-bench timeout 60 ./bundle/bin/flextile_attention_decode_bench --timeline \
  --only decode_window4096 > "$OUT/decode_timeline.log" 2>&1
echo "decode --timeline rc=$?"
grep -E "timeline call|walk end|SMs of|between calls|empty kernel" "$OUT/decode_timeline.log"
echo "total $((SECONDS - t0)) s"
