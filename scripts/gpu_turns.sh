#!/usr/bin/env bash
# One GPU call that decides whether the forward's warpgroup turns (FLEXTILE_PINGPONG=auto: the rule
# in attention_templates, detail::pingpongWanted) can become the default: the forward bench of the
# seven variants with the rule on (the "default" column) and with explicit ws / ws,turns configs,
# PyTorch FlexAttention's forward in the same call, then compute-sanitizer racecheck on the
# specialized forward and on the turns sweep, with and without hoisted ring-barrier inits.
# Run from the repo root with ./bundle carried (scripts/bundle.sh); logs under $OUT.
set -uo pipefail
BUNDLE=./bundle
LOGS=${OUT:-./gpu-logs}
mkdir -p "$LOGS"
python3 bench/torch_document_cuts.py > "$LOGS/document_cuts.json" 2>/dev/null || rm -f "$LOGS/document_cuts.json"
doc=()
[ -s "$LOGS/document_cuts.json" ] && doc=(--document-offsets "$LOGS/document_cuts.json")
variants=full,causal,sliding_window,document,prefix_lm,alibi,softcap
FLEXTILE_PINGPONG=auto FLEXTILE_CACHE_DIR="$(mktemp -d)" timeout 200 "$BUNDLE/bin/flextile_attention_bench" "${doc[@]}" \
  --quick --variants "$variants" --config 128,128,8,2,ws --config 128,128,8,2,ws,turns > "$LOGS/turns_forward.log" 2>&1
echo "rc=$?" >> "$LOGS/turns_forward.log"
timeout 200 python3 "$BUNDLE/peers/torch_reference.py" --variants "$variants" --no-sdpa --json "$LOGS/turns_torch.json" \
  > "$LOGS/turns_torch.log" 2>&1
sanitize() {  # name, then environment assignments
  local name=$1
  shift
  env "$@" FLEXTILE_PINGPONG=auto FLEXTILE_SANITIZER=racecheck FLEXTILE_GPU_TESTS=0 FLEXTILE_BENCHES=none FLEXTILE_EXAMPLES=0 \
    FLEXTILE_SANITIZER_ATTN_FILTER='FlexAttentionGpu.WarpSpecializedEveryVariant:FlexAttentionGpu.WarpgroupTurnsEveryVariant' \
    FLEXTILE_SANITIZER_CORE_FILTER='AtomicGpu.*' OUT="$LOGS/$name" scripts/gpu_run.sh > "$LOGS/$name.log" 2>&1
}
sanitize racecheck_plain FLEXTILE_HOIST_BARRIER_INITS=0 &
sanitize racecheck_hoisted FLEXTILE_HOIST_BARRIER_INITS=1 &
timeout 200 "$BUNDLE/bin/attention_gpu_tests" --gtest_filter='FlexAttentionGpu.WgmmaInLoops*' > "$LOGS/wgmma_loops.log" 2>&1
echo "rc=$?" >> "$LOGS/wgmma_loops.log"
wait
for f in turns_forward turns_torch wgmma_loops racecheck_plain racecheck_hoisted; do
  echo
  echo "#### $f"
  grep -v '^{' "$LOGS/$f.log" | tail -n 32
done
