#!/usr/bin/env bash
# Packed sequences (attention_templates/Varlen.h) on a GPU in one call of about 2 minutes: the
# VarlenGpu tests, the example, and the forward and backward of 'document' beside 'varlen' on the
# same work. The benches' varlen variant packs batch 0's cuts into every batch row, so the cuts
# file given to both is PyTorch's batch-0 cuts twice (on 2026-12-08 the two variants ran PyTorch's
# own two lists, different work: 0.871 against 0.789 sparsity). Logs under $OUT; the table last.
# Run from the repo root with ./bundle carried: run(command="scripts/gpu_varlen.sh", carry=["bundle"]).
OUT=${OUT:-./gpu-logs}; mkdir -p "$OUT"; export OUT=$(cd "$OUT" && pwd)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $GPU; $(sed -n 2p bundle/MANIFEST.txt)"
export LD_LIBRARY_PATH=$PWD/bundle/lib FLEXTILE_CACHE_DIR=/tmp/ft-varlen
t0=$SECONDS
timeout 90 bundle/bin/attention_gpu_tests --gtest_filter='VarlenGpu.*' > $OUT/tests.log 2>&1
echo "VarlenGpu rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/tests.log | tr '\n' ' ')"
grep -h -A6 "Failure" $OUT/tests.log | head -20
timeout 60 bundle/bin/attention_varlen --require-gpu > $OUT/example.log 2>&1
echo "example rc=$? $(tail -1 $OUT/example.log)"
python3 bench/torch_document_cuts.py --b 1 | python3 -c '
import json, sys; d = json.load(sys.stdin); d["offsets"] = d["offsets"] * 2; print(json.dumps(d))' > $OUT/cuts.json
cd bench
timeout 50 ../bundle/bin/flextile_attention_bench --variants document,varlen --quick --document-offsets $OUT/cuts.json \
  > $OUT/fwd.log 2>&1; echo "forward rc=$?"
timeout 60 ../bundle/bin/flextile_attention_backward_bench --variants document,varlen --quick \
  --document-offsets $OUT/cuts.json > $OUT/bwd.log 2>&1; echo "backward rc=$?"
cd ..
echo "t=$((SECONDS-t0)); TFLOP/s, B=2 H=16 N=8192 D=128 bf16, both variants on batch 0's cuts (backward: 2.5 x forward FLOPs)"
for f in fwd bwd; do grep -v "^{" $OUT/$f.log | grep -E "^(document|varlen) .*TFLOP/s" | awk -v r=$f '{print r, $1, $(NF-3)}'; done
