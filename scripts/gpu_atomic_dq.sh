#!/usr/bin/env bash
# The atomic dQ (DqAccumulation::Atomic: FlashAttention-3's five products, dQ's tiles added by TMA
# tensor reductions from the specialized dkdv at D = 128; FLEXTILE_BULK_TENSOR=0: row reductions) on a GPU in one call of about 250 s: its GPU tests
# (the bulk reductions, and the atomic dQ on every variant), then the backward at D = 128 with the
# separate dq (the default) and with the atomic dQ, twice each alternating, around PyTorch's
# FlexAttention and SDPA in the same call (bench/torch_value_dim.py --backward), then ncu's source
# page of the atomic dkdv if time is left. Logs under $OUT; the table last.
# Run from the repo root with ./bundle carried: run(command="scripts/gpu_atomic_dq.sh", carry=["bundle"]).
export OUT=${OUT:-./gpu-logs}; mkdir -p "$OUT"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $GPU; $(sed -n 2p bundle/MANIFEST.txt)"
export LD_LIBRARY_PATH=$PWD/bundle/lib
t0=$SECONDS; LIMIT=${CALL_SECONDS:-300}
FLEXTILE_CACHE_DIR=/tmp/ft-cache timeout 60 bundle/bin/flextile_gpu_tests --gtest_filter='AtomicGpu.*' > $OUT/t_atomic.log 2>&1
echo "AtomicGpu rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/t_atomic.log | tr '\n' ' ')"
FLEXTILE_CACHE_DIR=/tmp/ft-cache timeout 150 bundle/bin/attention_gpu_tests --gtest_filter='*AtomicDq*' > $OUT/t_atomic_dq.log 2>&1
echo "*AtomicDq* rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/t_atomic_dq.log | tr '\n' ' ')"
grep -h -A6 "Failure" $OUT/t_atomic*.log | head -30
echo "tests t=$((SECONDS-t0))"
cd bench
B=../bundle/bin/flextile_attention_backward_bench
for run in separate atomic; do
  timeout 50 $B --variants full,causal --quick $([ $run = atomic ] && echo --atomic-dq) > $OUT/${run}_1.log 2>&1
done
timeout 80 python3 torch_value_dim.py --backward --variants full,causal --d 128 --dv 128 > $OUT/torch.log 2>&1
for run in separate atomic; do
  timeout 50 $B --variants full,causal --quick $([ $run = atomic ] && echo --atomic-dq) > $OUT/${run}_2.log 2>&1
done
cd ..
if [ $((SECONDS - t0)) -lt $((LIMIT - 60)) ]; then
  timeout 60 scripts/ncu_source.sh atomic_dkdv dkdv bundle/bin/flextile_attention_backward_bench --quick --variants full \
    --atomic-dq 2>&1 | head -34
fi
echo "t=$((SECONDS-t0))"
echo "backward TFLOP/s, B=2 H=16 N=8192 D=128 bf16 (2.5 x the forward's FLOPs)"
for f in separate_1 atomic_1 separate_2 atomic_2; do
  grep -v "^{" $OUT/$f.log | grep -E "^(full|causal) .*TFLOP/s" | awk -v r=$f '{print r, $1, $(NF-3)}'
done
grep -h "bwd_tflops" $OUT/torch.log | python3 -c '
import sys, json
for l in sys.stdin:
    try: d = json.loads(l)
    except Exception: continue
    print(d["impl"], d["variant"], round(d["bwd_tflops"], 1))'
