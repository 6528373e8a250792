#!/usr/bin/env bash
# The ONE command run on the GPU machine, from the repo root, using only ./bundle (made by
# scripts/bundle.sh). Lists the GPUs, runs the GPU tests, runs the benches listed below, and
# prints a summary table last. Logs go to $OUT, or ./gpu-logs when OUT is unset.
#
# From this (GPU-less) machine, after a build:
#   scripts/bundle.sh build            # makes ./bundle (git-ignored)
#   device tool: run(command="scripts/gpu_run.sh", carry=["bundle"])
# (A helper's worktree is not what the tool sends: copy bundle/ and scripts/ into an ignored
# folder of the session's checkout, carry that folder and cd into it first.)
#
# The device tool returns at most 8 files from $OUT: gpu_tests.log, gpu_tests.xml and
# summary.txt, plus one log per bench, so keep BENCHES to five entries or fewer.
set -uo pipefail

BUNDLE=./bundle
LOGS=${OUT:-./gpu-logs}
# FLEXTILE_ALLOW_NO_GPU=1 accepts a run where every GPU test skipped (to try the script without a GPU).
TEST_TIMEOUT=${FLEXTILE_GPU_TEST_TIMEOUT:-300}
BENCH_TIMEOUT=${FLEXTILE_BENCH_TIMEOUT:-240}

# Benches: "name|command", run from the repo root; each writes to $LOGS/bench_<name>.log.
# A bench prints its own results; it fails the run only by exiting non-zero.
# FLEXTILE_BENCHES picks a subset by name (space-separated), e.g. "attention torch_attention".
ALL_BENCHES=(
  "softmax|$BUNDLE/bin/flextile_softmax_bench"
  "torch_softmax|python3 bench/torch_softmax.py"
  "gemm|$BUNDLE/bin/flextile_gemm_bench"
  "torch_gemm|python3 bench/torch_gemm.py"
  "attention|python3 bench/torch_document_cuts.py > $LOGS/document_cuts.json && $BUNDLE/bin/flextile_attention_bench --document-offsets $LOGS/document_cuts.json ${FLEXTILE_ATTENTION_ARGS:-}"
  "attention_backward|( [ -s $LOGS/document_cuts.json ] || python3 bench/torch_document_cuts.py > $LOGS/document_cuts.json ) && $BUNDLE/bin/flextile_attention_backward_bench --document-offsets $LOGS/document_cuts.json ${FLEXTILE_BACKWARD_ARGS:-}"
  "attention_slsr|FLEXTILE_LLVM_SKIP_PASSES= $BUNDLE/bin/flextile_attention_bench --document-offsets $LOGS/document_cuts.json ${FLEXTILE_ATTENTION_ARGS:-}"
  "autotune|( [ -s $LOGS/document_cuts.json ] || python3 bench/torch_document_cuts.py > $LOGS/document_cuts.json ) && bench/autotune_sweep.sh $BUNDLE/bin $LOGS/document_cuts.json 2> $LOGS/autotune_progress.txt"
  "attention_decode|$BUNDLE/bin/flextile_attention_decode_bench ${FLEXTILE_DECODE_ARGS:-}"
  "torch_decode|python3 bench/torch_decode.py --json $LOGS/torch_decode.json"
  "first_call|bench/first_call.sh $BUNDLE/bin ${FLEXTILE_FIRST_CALL_SHAPE:-}"
  "torch_first_call|python3 bench/torch_first_call.py ${FLEXTILE_FIRST_CALL_SHAPE:-}"
  "streams|$BUNDLE/bin/flextile_streams_bench"
  "torch_attention|python3 $BUNDLE/peers/torch_reference.py --variants ${FLEXTILE_TORCH_VARIANTS:-full,causal,sliding_window,document,prefix_lm,alibi,softcap} --no-sdpa --json $LOGS/torch_attention.json"
)
SELECTED=${FLEXTILE_BENCHES:-attention torch_attention}
BENCHES=()
for entry in "${ALL_BENCHES[@]}"; do
  for want in $SELECTED; do [ "${entry%%|*}" = "$want" ] && BENCHES+=("$entry"); done
done

mkdir -p "$LOGS"
if [ ! -x "$BUNDLE/bin/flextile_gpu_tests" ]; then
  echo "gpu_run.sh: $BUNDLE/bin/flextile_gpu_tests is missing: run scripts/bundle.sh and carry bundle/" >&2
  exit 2
fi
[ -f "$BUNDLE/MANIFEST.txt" ] && cat "$BUNDLE/MANIFEST.txt"

echo "== GPUs"
nvidia-smi -L 2>&1 || echo "(nvidia-smi failed)"

SUMMARY=()   # rows: step|status|seconds|detail
FAILED=0

now() { date +%s.%N; }
seconds_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# Status of a finished command from its exit code (124: killed by timeout).
status_of() { case "$1" in 0) echo ok ;; 124) echo TIMEOUT ;; *) echo "FAIL($1)" ;; esac; }

echo "== flextile_gpu_tests + attention_gpu_tests (forward, backward) + autotune_gpu_tests"
start=$(now)
(
  timeout "$TEST_TIMEOUT" "$BUNDLE/bin/flextile_gpu_tests" ${FLEXTILE_GPU_TEST_FILTER:+--gtest_filter=$FLEXTILE_GPU_TEST_FILTER} 2>&1
  rc1=$?
  # The forward, backward and serving (decode, paged K/V) parts of attention_gpu_tests each get
  # their own timeout (together they run past one: about 280 s, 110 s and 150 s on the H200).
  if [ -n "${FLEXTILE_ATTN_TEST_FILTER:-}" ]; then
    timeout "$TEST_TIMEOUT" "$BUNDLE/bin/attention_gpu_tests" --gtest_filter="$FLEXTILE_ATTN_TEST_FILTER" 2>&1
    rc2=$?
  else
    serving='FlexDecodeGpu.*:DecodeListsGpu.*:PagedKVGpu.*:PagedKVCacheGpu.*:FlexAttentionStreamsGpu.*'
    timeout "$TEST_TIMEOUT" "$BUNDLE/bin/attention_gpu_tests" --gtest_filter="-FlexAttentionBackwardGpu.*:$serving" 2>&1
    rc2=$?
    timeout "$TEST_TIMEOUT" "$BUNDLE/bin/attention_gpu_tests" --gtest_filter='FlexAttentionBackwardGpu.*' 2>&1
    rc=$?
    [ "$rc2" = 0 ] && rc2=$rc
    # Decode, paged K/V, decode lists and calls on streams (the serving half).
    timeout "$TEST_TIMEOUT" "$BUNDLE/bin/attention_gpu_tests" --gtest_filter="$serving" 2>&1
    rc=$?
    [ "$rc2" = 0 ] && rc2=$rc
  fi
  timeout "$TEST_TIMEOUT" "$BUNDLE/bin/autotune_gpu_tests" ${FLEXTILE_AUTOTUNE_TEST_FILTER:+--gtest_filter=$FLEXTILE_AUTOTUNE_TEST_FILTER} 2>&1
  rc3=$?
  exit $(( rc1 != 0 ? rc1 : rc2 != 0 ? rc2 : rc3 ))
) > "$LOGS/gpu_tests.log"
rc=$?
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|error" "$LOGS/gpu_tests.log" | head -40
log="$LOGS/gpu_tests.log"
count_of() { sed -n "s/^\[  $1 *\] \([0-9][0-9]*\) tests\?[.,].*/\1/p" "$log" | awk '{ s += $1 } END { print s + 0 }'; }
passed=$(count_of PASSED); failed=$(count_of FAILED); skipped=$(count_of SKIPPED)
detail="${passed:-0} passed, ${failed:-0} failed, ${skipped:-0} skipped"
if [ "${failed:-0}" != 0 ]; then
  detail+=": $(sed -n 's/^\[  FAILED  \] \([A-Za-z0-9_./]*\)\( (.*)\)\?$/\1/p' "$log" | sort -u | head -5 | tr '\n' ' ')"
fi
status=$(status_of "$rc")
# On the GPU machine a run in which nothing ran is a failure (the driver was not found, say).
if [ "$rc" = 0 ] && [ "${passed:-0}" = 0 ] && [ "${FLEXTILE_ALLOW_NO_GPU:-0}" != 1 ]; then
  status="NO-GPU"
  rc=1
fi
[ "$rc" = 0 ] || FAILED=1
SUMMARY+=("gpu tests|$status|$(seconds_since "$start")|$detail")

# The attention examples at the yardstick shape, each checking itself against float64
# (FLEXTILE_EXAMPLES=0 skips them).
if [ "${FLEXTILE_EXAMPLES:-1}" != 0 ]; then
  echo "== examples (--require-gpu)"
  start=$(now)
  ran=0; bad=""
  for example in "$BUNDLE"/bin/attention_*; do
    name=$(basename "$example")
    case "$name" in attention_tests|attention_gpu_tests) continue ;; esac
    ran=$((ran + 1))
    timeout 120 "$example" --require-gpu > "$LOGS/example_$name.txt" 2>&1 || bad+="$name "
    tail -2 "$LOGS/example_$name.txt"
  done
  cat "$LOGS"/example_*.txt > "$LOGS/examples.log"; rm -f "$LOGS"/example_*.txt
  if [ -z "$bad" ]; then SUMMARY+=("examples|ok|$(seconds_since "$start")|$ran ran, log: examples.log")
  else FAILED=1; SUMMARY+=("examples|FAIL|$(seconds_since "$start")|failed: $bad"); fi
fi

for entry in "${BENCHES[@]}"; do
  name=${entry%%|*}
  command=${entry#*|}
  echo "== bench $name: $command"
  start=$(now)
  timeout "$BENCH_TIMEOUT" bash -c "$command" 2>&1 | tee "$LOGS/bench_$name.log"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || FAILED=1
  SUMMARY+=("bench $name|$(status_of "$rc")|$(seconds_since "$start")|log: bench_$name.log")
done

# One side-by-side table when both benches ran: side_by_side OURS PEERS COMPARE_SCRIPT TITLE.
: > "$LOGS/tables.txt"
side_by_side() {
  [ -f "$LOGS/bench_$1.log" ] && [ -f "$LOGS/bench_$2.log" ] || return 0
  echo; echo "== $4"
  python3 "bench/$3" "$LOGS/bench_$1.log" "$LOGS/bench_$2.log" | tee -a "$LOGS/tables.txt"
}
side_by_side softmax torch_softmax compare_softmax.py "row softmax, side by side"
side_by_side gemm torch_gemm compare_gemm.py "bf16 GEMM, side by side"
side_by_side attention torch_attention compare_attention.py "flex_attention forward, side by side"
side_by_side attention_backward torch_attention compare_backward.py "flex_attention backward and training step, side by side"
side_by_side attention_slsr torch_attention compare_attention.py \
  "flex_attention forward with every LLVM pass (FLEXTILE_LLVM_SKIP_PASSES=, SLSR on), side by side"
side_by_side autotune torch_attention compare_autotune.py "flextile autotune: tuned, default and PyTorch FlexAttention"

{
  echo
  echo "== summary"
  printf '%-24s %-10s %8s  %s\n' step status seconds detail
  for row in "${SUMMARY[@]}"; do
    IFS='|' read -r step status secs detail <<< "$row"
    printf '%-24s %-10s %8s  %s\n' "$step" "$status" "$secs" "$detail"
  done
} | tee "$LOGS/summary.txt"
exit "$FAILED"
