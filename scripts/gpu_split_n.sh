#!/usr/bin/env bash
# The warpgroups splitting N (ir/Layout.h wgmmaAccumulator) on a GPU in one call of about 300 s:
# their GPU tests (backward and forward, every variant), then dkdv and dq at D = 256 and at MLA's
# 192 / 128 beside the current defaults in the same run (the bench checks each tile against float64
# before timing it), then PyTorch's backward at 256 if time is left. Logs under $OUT.
# Run from the repo root with ./bundle carried: run(command="scripts/gpu_split_n.sh", carry=["bundle"]).
export OUT=${OUT:-./gpu-logs}; mkdir -p "$OUT"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $GPU; $(sed -n 2p bundle/MANIFEST.txt)"
export LD_LIBRARY_PATH=$PWD/bundle/lib
t0=$SECONDS
for i in $(seq 0 11); do
  GTEST_TOTAL_SHARDS=12 GTEST_SHARD_INDEX=$i timeout 90 bundle/bin/attention_gpu_tests \
    --gtest_filter='*WarpgroupsSplittingN*' > $OUT/t$i.log 2>&1 &
done; wait
cat $OUT/t*.log | grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" | sort | uniq -c | head -20
grep -h -A6 "Failure" $OUT/t*.log | head -30
echo "tests t=$((SECONDS-t0))"
B=bundle/bin/flextile_attention_backward_bench
cd bench
timeout 80 ../$B --variants full,causal --d 256 --dkdv-sweep "16,32,4,2;64,64,8,2;64,64,8,2,ws" --dq-sweep "64,64,4,2;64,64,8,2" > $OUT/b256.log 2>&1
echo "== bwd 256 rc=$?"; grep -v "^{" $OUT/b256.log | grep -E "^(full|causal)" | cut -c1-150
echo "t=$((SECONDS-t0))"
timeout 50 ../$B --variants causal --d 192 --dv 128 --dkdv-sweep "16,64,4,2;64,64,8,2;64,64,8,2,ws" --dq-sweep "64,64,4,2;64,64,8,2" > $OUT/b192split.log 2>&1
echo "== bwd 192/128 split rc=$?"; grep -v "^{" $OUT/b192split.log | grep -E "^(full|causal)" | cut -c1-150
echo "t=$((SECONDS-t0))"
timeout $((${CALL_SECONDS:-290} - (SECONDS - t0))) python3 torch_value_dim.py --variants causal --d 256 --dv 256 --backward > $OUT/torch_bwd256.log 2>&1
echo "== torch bwd 256 rc=$?"; tail -6 $OUT/torch_bwd256.log | cut -c1-160
echo "t=$((SECONDS-t0))"
