#!/usr/bin/env bash
# Attention sinks (FlexAttentionOptions::sinks) on a GPU in one call of about 250 s: their GPU tests
# and the example, then the forward and the backward at B=2 H=16 N=8192 D=128 bf16 without and with
# sinks (full, causal, sliding window) and the decode (its main shape and the window), around PyTorch's FlexAttention with its sinks applied
# outside the kernel (bench/torch_sinks.py: out * sigmoid(lse - sink), compiled with the call) in
# the same call. Logs under $OUT; the table last.
# Run from the repo root with ./bundle carried: run(command="scripts/gpu_sinks.sh", carry=["bundle"]).
OUT=${OUT:-./gpu-logs}; mkdir -p "$OUT"; export OUT=$(cd "$OUT" && pwd)  # absolute: the benches run from bench/
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $GPU; $(sed -n 2p bundle/MANIFEST.txt)"
export LD_LIBRARY_PATH=$PWD/bundle/lib FLEXTILE_CACHE_DIR=/tmp/ft-cache
t0=$SECONDS
timeout 120 bundle/bin/attention_gpu_tests --gtest_filter='SinksGpu.*' > $OUT/t_sinks.log 2>&1
echo "SinksGpu rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/t_sinks.log | tr '\n' ' ')"
grep -h -A6 "Failure" $OUT/t_sinks.log | head -20
timeout 60 bundle/bin/attention_sinks --require-gpu > $OUT/example.log 2>&1
echo "example rc=$? $(tail -1 $OUT/example.log)"
echo "tests t=$((SECONDS-t0))"
V=full,causal,sliding_window
cd bench
for s in "" --sinks; do
  timeout 40 ../bundle/bin/flextile_attention_bench --variants $V --quick $s > $OUT/fwd${s:+_sinks}.log 2>&1
  timeout 60 ../bundle/bin/flextile_attention_backward_bench --variants $V --quick $s > $OUT/bwd${s:+_sinks}.log 2>&1
  timeout 40 ../bundle/bin/flextile_attention_decode_bench --only decode --only decode_window4096 --only decode_paged128 $s \
    > $OUT/decode${s:+_sinks}.log 2>&1
done
timeout 120 python3 torch_sinks.py --backward --variants $V > $OUT/torch.log 2>&1
cd ..
echo "t=$((SECONDS-t0))"
echo "TFLOP/s, B=2 H=16 N=8192 D=128 bf16 (backward: 2.5 x the forward's FLOPs)"
for f in fwd fwd_sinks bwd bwd_sinks; do
  grep -v "^{" $OUT/$f.log | grep -E "^(full|causal|sliding_window) .*TFLOP/s" | awk -v r=$f '{print r, $1, $(NF-3)}'
done
for f in decode decode_sinks; do grep -E "^decode" $OUT/$f.log | sed "s/^/$f: /" | head -6; done
grep -h "fwd_tflops" $OUT/torch.log | python3 -c '
import sys, json
for l in sys.stdin:
    try: d = json.loads(l)
    except Exception: continue
    print(d["impl"], d["variant"], "fwd", round(d["fwd_tflops"], 1), "bwd", round(d.get("bwd_tflops", 0), 1))'
