#!/usr/bin/env bash
# The schedules that are built but not yet default, measured in one GPU call (run from the repo
# root with ./bundle carried, like scripts/gpu_run.sh; logs under $OUT, a short table last):
#   * the forward's default (warpgroup turns on specialized tiles with an arithmetic score_mod since
#     2026-12-03) next to the same tile without turns;
#   * the backward with warpgroup turns in the specialized dkdv, dq or both (config `turns`) next to
#     the default;
#   * the backward with FlashAttention-3's atomic dQ in the specialized dkdv
#     (FLEXTILE_TMA_IN_STAGING_LOOPS=1, --atomic-dq --dkdv 64,128,8,2,ws);
#   * the decode bench with and without programmatic dependent launch (FLEXTILE_PROGRAMMATIC_LAUNCH);
#   * PyTorch FlexAttention's forward and backward in the same call (bundle/peers/torch_reference.py).
# FLEXTILE_SCHEDULE_VARIANTS (default full,causal,document,alibi) picks the variants;
# FLEXTILE_SCHEDULE_PARTS (default "forward backward atomic decode torch") picks the parts.
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
PARTS=${FLEXTILE_SCHEDULE_PARTS:-forward backward atomic decode torch}
want() { [[ " $PARTS " == *" $1 "* ]]; }
names=()
if want forward; then
  run schedules_forward "$BUNDLE/bin/flextile_attention_bench" "${doc[@]}" --quick --variants "$VARIANTS" \
    --config 128,128,8,2,ws --config 128,128,8,2,ws,no-turns
  names+=(schedules_forward)
fi
if want backward; then
  run schedules_backward_separate "$BUNDLE/bin/flextile_attention_backward_bench" "${doc[@]}" --quick --variants "$VARIANTS"
  run schedules_backward_turns_dkdv "$BUNDLE/bin/flextile_attention_backward_bench" "${doc[@]}" --quick --variants "$VARIANTS" \
    --dkdv 64,128,8,2,ws,turns --dq 128,64,8,2,ws
  run schedules_backward_turns_both "$BUNDLE/bin/flextile_attention_backward_bench" "${doc[@]}" --quick --variants "$VARIANTS" \
    --dkdv 64,128,8,2,ws,turns --dq 128,64,8,2,ws,turns
  names+=(schedules_backward_separate schedules_backward_turns_dkdv schedules_backward_turns_both)
fi
if want atomic; then
  run schedules_backward_atomic env FLEXTILE_TMA_IN_STAGING_LOOPS=1 "$BUNDLE/bin/flextile_attention_backward_bench" "${doc[@]}" \
    --quick --variants "$VARIANTS" --atomic-dq --dkdv 64,128,8,2,ws
  names+=(schedules_backward_atomic)
fi
if want decode; then
  run schedules_decode_plain env FLEXTILE_PROGRAMMATIC_LAUNCH=0 "$BUNDLE/bin/flextile_attention_decode_bench"
  run schedules_decode_programmatic env FLEXTILE_PROGRAMMATIC_LAUNCH=1 "$BUNDLE/bin/flextile_attention_decode_bench"
  names+=(schedules_decode_plain schedules_decode_programmatic)
fi
if want torch; then
  run schedules_torch python3 "$BUNDLE/peers/torch_reference.py" --variants "$VARIANTS" --json "$LOGS/schedules_torch.json"
  names+=(schedules_torch)
fi
for name in "${names[@]}"; do
  echo
  grep -v '^{' "$LOGS/$name.log" | tail -n 30
done
