#!/usr/bin/env bash
# The schedules that are built but not yet default, measured in one GPU call (run from the repo
# root with ./bundle carried, like scripts/gpu_run.sh; logs under $OUT, a short table last):
#   * the forward's loop schedules from the config (FlexAttentionConfig::turns, ::defer) on the
#     warp-specialized 128 x 128 tile, next to that tile alone;
#   * the backward with FlashAttention-3's atomic dQ in the specialized dkdv
#     (FLEXTILE_TMA_IN_STAGING_LOOPS=1, --atomic-dq --dkdv 64,128,8,2,ws) next to the default
#     (a separate dq kernel);
#   * the decode bench with and without programmatic dependent launch (FLEXTILE_PROGRAMMATIC_LAUNCH);
#   * PyTorch FlexAttention's forward and backward in the same call (bundle/peers/torch_reference.py).
# FLEXTILE_SCHEDULE_VARIANTS (default full,causal,document,alibi) picks the variants.
set -uo pipefail
BUNDLE=./bundle
LOGS=${OUT:-./gpu-logs}
VARIANTS=${FLEXTILE_SCHEDULE_VARIANTS:-full,causal,document,alibi}
TIMEOUT=${FLEXTILE_SCHEDULE_TIMEOUT:-200}
mkdir -p "$LOGS"
python3 bench/torch_document_cuts.py > "$LOGS/document_cuts.json" 2>/dev/null || rm -f "$LOGS/document_cuts.json"
doc=()
[ -s "$LOGS/document_cuts.json" ] && doc=(--document-offsets "$LOGS/document_cuts.json")
run() {  # name, then the command; its output goes to $LOGS/<name>.log
  local name=$1
  shift
  echo "== $*" > "$LOGS/$name.log"
  FLEXTILE_CACHE_DIR="$(mktemp -d)" timeout "$TIMEOUT" "$@" >> "$LOGS/$name.log" 2>&1
  echo "rc=$?" >> "$LOGS/$name.log"
}
run schedules_forward "$BUNDLE/bin/flextile_attention_bench" "${doc[@]}" --quick --variants "$VARIANTS" \
  --config 128,128,8,2,ws --config 128,128,8,2,ws,defer --config 128,128,8,2,ws,turns --config 128,128,8,2,ws,turns,defer
run schedules_backward_separate "$BUNDLE/bin/flextile_attention_backward_bench" "${doc[@]}" --quick --variants "$VARIANTS"
run schedules_backward_atomic env FLEXTILE_TMA_IN_STAGING_LOOPS=1 "$BUNDLE/bin/flextile_attention_backward_bench" "${doc[@]}" \
  --quick --variants "$VARIANTS" --atomic-dq --dkdv 64,128,8,2,ws
run schedules_decode_plain env FLEXTILE_PROGRAMMATIC_LAUNCH=0 "$BUNDLE/bin/flextile_attention_decode_bench"
run schedules_decode_programmatic env FLEXTILE_PROGRAMMATIC_LAUNCH=1 "$BUNDLE/bin/flextile_attention_decode_bench"
run schedules_torch python3 "$BUNDLE/peers/torch_reference.py" --variants "$VARIANTS" --json "$LOGS/schedules_torch.json"
for name in schedules_forward schedules_backward_separate schedules_backward_atomic schedules_decode_plain \
  schedules_decode_programmatic schedules_torch; do
  echo
  tail -n 30 "$LOGS/$name.log"
done
