#!/usr/bin/env bash
# The ONE command run on the GPU machine, from the repo root, using only ./bundle (made by
# scripts/bundle.sh). Lists the GPUs, runs the GPU tests (budgeted to a few minutes), the
# compute-sanitizer pass when asked, the attention examples and the benches listed below, and
# prints a summary table last. Logs go to $OUT, or ./gpu-logs when OUT is unset.
#
# From this (GPU-less) machine, after a build:
#   scripts/bundle.sh build            # makes ./bundle (git-ignored)
#   device tool: run(command="scripts/gpu_run.sh", carry=["bundle"])
# (A helper's worktree is not what the tool sends: copy bundle/ and scripts/ into an ignored
# folder of the session's checkout, carry that folder and cd into it first.)
#
# GPU tests (docs/testing.md). Every shape, variant and edge case runs; the configs per shape are
# a random sample, drawn from FLEXTILE_TEST_SEED (printed in the summary; set it to replay a run).
#   FLEXTILE_GPU_TESTS=0              skip them (say, for a sanitizer-only call)
#   FLEXTILE_GPU_TESTS_FULL=1         every config of every shape, full references (the suite took
#                                     about 9 minutes on the H200 so, before the budget)
#   FLEXTILE_GPU_TEST_SHARDS=N        the attention parts (forward, its schedule sweeps, backward, serving) run
#                                     as N processes a part in all, shared out by each part's measured
#                                     time, its tests dealt longest first by scripts/gpu_test_seconds.txt
#                                     (default 3; their time is host compiles and float64 references,
#                                     one core each). After a suite whose tests changed:
#                                     scripts/gpu_test_shards.py seconds gpu_tests.log, into
#                                     scripts/gpu_test_seconds.txt under its header
#   FLEXTILE_GPU_TEST_JOBS=N          attention processes at once (default 4 × the shards: 12, of the
#                                     machine's 16 cores)
#   FLEXTILE_GPU_TEST_FILTER, FLEXTILE_ATTN_TEST_FILTER, FLEXTILE_AUTOTUNE_TEST_FILTER: gtest filters
#   FLEXTILE_GPU_TEST_TIMEOUT         seconds per test process (default 300); one that runs past it
#                                     is killed after its log gets what it was doing (run_limited)
#
# compute-sanitizer pass (docs/reliability.md, "GPU"): FLEXTILE_SANITIZER=memcheck|racecheck|
# synccheck|all (or a list, "memcheck racecheck") runs the GPU test binaries under each tool with
# FLEXTILE_GPU_TEST_SMALL=1 (small shapes only, sampled configs): memcheck (--leak-check full) on
# all three binaries, racecheck and synccheck on the kernels with shared memory and barriers (the
# attention templates; matmul, pipeline, reduction and atomic kernels). --error-exitcode 1: any
# finding fails the run. One log per tool (sanitizer_<tool>.log) and a summary row per tool:
# findings, leaked bytes, tests run, kernels built.
#   FLEXTILE_COMPUTE_SANITIZER        the executable (default: PATH, then /usr/local/cuda*/bin)
#   FLEXTILE_SANITIZER_JOBS=N         sanitized processes at once (default 16: all sixteen of "all")
#   FLEXTILE_SANITIZER_TIMEOUT        seconds per sanitized process (default 240)
#   FLEXTILE_SANITIZER_SASS=1         each sanitized process dumps the PTX it compiles
#                                     (FLEXTILE_DUMP=ptx, a folder a process); for every kernel a
#                                     report names, each dumped PTX of it is assembled as the
#                                     launch assembles it (ptxas -arch=sm_90a) and disassembled
#                                     with offsets (nvdisasm, else cuobjdump -sass), so a report's
#                                     "kernel+0x6910" reads as an instruction: sanitizer_sass.tgz
#   FLEXTILE_SANITIZER_ATTN_FILTER, FLEXTILE_SANITIZER_CORE_FILTER: gtest filters of
#                                     attention_gpu_tests and flextile_gpu_tests under every tool;
#                                     an attention filter of positive patterns only (A.x:B.*) runs
#                                     a process per pattern, and a core filter of `none` skips
#                                     flextile_gpu_tests
#
# The device tool returns at most 8 files from $OUT: gpu_tests.log, summary.txt, examples.log,
# tables.txt (when a side-by-side table was made), one log per sanitizer tool and one per bench:
# keep the tools plus BENCHES to four or fewer (FLEXTILE_BENCHES=none runs no bench).
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
  "attention_backward_atomic|( [ -s $LOGS/document_cuts.json ] || python3 bench/torch_document_cuts.py > $LOGS/document_cuts.json ) && $BUNDLE/bin/flextile_attention_backward_bench --document-offsets $LOGS/document_cuts.json --atomic-dq ${FLEXTILE_BACKWARD_ATOMIC_ARGS:-${FLEXTILE_BACKWARD_ARGS:-}}"
  "attention_slsr|FLEXTILE_LLVM_SKIP_PASSES= $BUNDLE/bin/flextile_attention_bench --document-offsets $LOGS/document_cuts.json ${FLEXTILE_ATTENTION_ARGS:-}"
  "autotune|( [ -s $LOGS/document_cuts.json ] || python3 bench/torch_document_cuts.py > $LOGS/document_cuts.json ) && bench/autotune_sweep.sh $BUNDLE/bin $LOGS/document_cuts.json 2> $LOGS/autotune_progress.txt"
  "attention_decode|$BUNDLE/bin/flextile_attention_decode_bench ${FLEXTILE_DECODE_ARGS:-}"
  "torch_decode|python3 bench/torch_decode.py --json $LOGS/torch_decode.json"
  "first_call|bench/first_call.sh $BUNDLE/bin ${FLEXTILE_FIRST_CALL_SHAPE:-}"
  "torch_first_call|python3 bench/torch_first_call.py ${FLEXTILE_FIRST_CALL_SHAPE:-}"
  "streams|$BUNDLE/bin/flextile_streams_bench"
  # PyTorch FlexAttention with SDPA beside it, on the two variants SDPA runs as a dense kernel.
  "torch_sdpa|python3 $BUNDLE/peers/torch_reference.py --variants full,causal --json $LOGS/torch_sdpa.json"
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

# One seed for every test process of the run (each test mixes in its own name: TestBudget.h).
export FLEXTILE_TEST_SEED=${FLEXTILE_TEST_SEED:-$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')}
TEST_SHARDS=${FLEXTILE_GPU_TEST_SHARDS:-3}
case "$TEST_SHARDS" in ''|*[!0-9]*|0) echo "gpu_run.sh: FLEXTILE_GPU_TEST_SHARDS must be a positive integer, got '$TEST_SHARDS'" >&2; exit 2 ;; esac
TEST_JOBS=${FLEXTILE_GPU_TEST_JOBS:-$((4 * TEST_SHARDS))}
SANITIZER_JOBS=${FLEXTILE_SANITIZER_JOBS:-16}
for n in "$TEST_JOBS" "$SANITIZER_JOBS"; do
  case "$n" in ''|*[!0-9]*|0) echo "gpu_run.sh: FLEXTILE_GPU_TEST_JOBS and FLEXTILE_SANITIZER_JOBS must be positive integers, got '$n'" >&2; exit 2 ;; esac
done
PARTS=$(mktemp -d)
trap 'rm -rf "$PARTS"' EXIT

# run_limited SECONDS LOG COMMAND: runs COMMAND (bash -c) with its output to LOG. Past SECONDS it
# appends to LOG what the process was doing — each thread's state and kernel wait channel, gdb's
# backtraces where gdb is installed, the GPU's utilization by process — then kills it (TERM, then
# KILL 15 s later) and returns 124, as timeout does. A test stuck in a kernel that never ends and
# one stuck on the host (a compile, a reference) then read differently in the log.
run_limited() {
  local limit=$1 log=$2 command=$3 waited=0 p t
  bash -c "$command" > "$log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt "$limit" ]; do sleep 1; waited=$((waited + 1)); done
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid"
    return
  fi
  {
    echo "== timed out after $limit s; what it was doing:"
    for p in $pid $(pgrep -P "$pid" 2>/dev/null); do
      ps -o pid,stat,etime,time,pcpu,args -p "$p" --no-headers
      for t in /proc/"$p"/task/*; do
        # syscall: its number and arguments (16 ioctl: in the driver, 202 futex: a lock or a
        # condition, "running": in user code); stack: the kernel's frames where root may read them.
        echo "  thread ${t##*/}: state $(awk '{print $3}' "$t/stat" 2>/dev/null), wchan $(cat "$t/wchan" 2>/dev/null), cpu ticks $(awk '{print $14 + $15}' "$t/stat" 2>/dev/null), syscall $(cut -d' ' -f1-3 "$t/syscall" 2>/dev/null)"
        head -4 "$t/stack" 2>/dev/null | sed 's/^/      /'
      done
      if command -v gdb > /dev/null; then
        timeout 60 gdb -p "$p" -batch -ex "thread apply all bt 16" 2>/dev/null | grep -E "^Thread|^#" | head -120
      fi
    done
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
    timeout 20 nvidia-smi pmon -c 1 -s u 2>/dev/null
  } >> "$log" 2>&1
  pkill -TERM -P "$pid" 2>/dev/null; kill -TERM "$pid" 2>/dev/null
  for ((waited = 0; waited < 15; waited++)); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  pkill -KILL -P "$pid" 2>/dev/null; kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  return 124
}

# run_parts JOBS ENTRY...: runs each "name|timeout|command" with at most JOBS at once, the output
# of each to $PARTS/<name>.log and its exit status to $PARTS/<name>.rc, its seconds to .secs.
run_parts() {
  local jobs=$1 entry name limit command
  shift
  for entry in "$@"; do
    name=${entry%%|*}; entry=${entry#*|}; limit=${entry%%|*}; command=${entry#*|}
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    (
      begin=$(now)
      run_limited "$limit" "$PARTS/$name.log" "$command"
      echo $? > "$PARTS/$name.rc"
      seconds_since "$begin" > "$PARTS/$name.secs"
    ) &
  done
  wait
}

# count_in WORD LOG...: the tests gtest counted as WORD (PASSED, FAILED, SKIPPED) in the logs.
count_in() { local word=$1; shift; sed -n "s/^\[  $word *\] \([0-9][0-9]*\) tests\?[.,].*/\1/p" "$@" | awk '{ s += $1 } END { print s + 0 }'; }
failed_names() { sed -n 's/^\[  FAILED  \] \([A-Za-z0-9_./]*\)\( (.*)\)\?$/\1/p' "$@" | sort -u | head -5 | tr '\n' ' '; }
kernels_in() { sed -n 's/^\[ KERNELS  \] \([0-9][0-9]*\) kernels built.*/\1/p' "$@" | awk '{ s += $1 } END { print s + 0 }'; }

# The serving part of attention_gpu_tests: decode, paged K/V, decode lists and calls on user streams.
decode='FlexDecodeGpu.*:*/FlexDecodeGpuVariant.*'
serving="$decode:DecodeListsGpu.*:PagedKVGpu.*:PagedKVCacheGpu.*:FlexAttentionStreamsGpu.*"
# The backward: its tests, and its warpgroup turns one test a variant.
backward='FlexAttentionBackwardGpu.*:*/FlexAttentionBackwardGpuTurns.*:*/FlexAttentionBackwardGpuSchedule.*'

if [ "${FLEXTILE_GPU_TESTS:-1}" != 0 ]; then
  echo "== GPU tests (seed $FLEXTILE_TEST_SEED; $([ "${FLEXTILE_GPU_TESTS_FULL:-0}" = 1 ] && echo "every config" || echo "sampled configs"); attention parts in $TEST_SHARDS shards each, $TEST_JOBS processes at once)"
  start=$(now)
  parts=()  # "name|gtest filter"
  if [ -n "${FLEXTILE_ATTN_TEST_FILTER:-}" ]; then
    parts=("attention|$FLEXTILE_ATTN_TEST_FILTER")
  else
    # The forward's schedule sweeps (every variant under each schedule switch) are a part of their
    # own: with the offline ptxas assembling the specialized kernels the forward outgrew 240 s.
    sweeps='FlexAttentionGpu.*EveryVariant:EveryVariant/FlexAttentionGpuSchedule.*'
    parts=("attention_forward_sweeps|$sweeps"
           "attention_forward|-$backward:$serving:$sweeps"
           "attention_backward|$backward"
           "attention_serving|$serving")
  fi
  # TEST_SHARDS processes a part in all, shared out in proportion to each part's measured time and
  # its tests dealt longest first to the shard with the least time so far, by the seconds of an
  # earlier run (scripts/gpu_test_shards.py, gpu_test_seconds.txt; 10 s for a test not listed): the
  # parts then end together, where equal gtest round-robin shards waited on the forward's sweeps
  # (2026-12-06 times, 16 processes: the slowest shard 131.5 s round-robin, 90.6 s so). Without
  # python3, gtest's own shards, TEST_SHARDS a part.
  declare -A part_shards=()
  attention=() plan_args=()
  for entry in "${parts[@]}"; do plan_args+=("${entry%%|*}=${entry#*|}"); done
  plan=$(python3 scripts/gpu_test_shards.py plan "$BUNDLE/bin/attention_gpu_tests" $((TEST_SHARDS * ${#parts[@]})) \
           scripts/gpu_test_seconds.txt "${plan_args[@]}" 2>/dev/null) || plan=""
  if [ -n "$plan" ]; then
    while IFS=$'\t' read -r name index filter; do
      attention+=("$name.$index|$TEST_TIMEOUT|$BUNDLE/bin/attention_gpu_tests --gtest_filter='$filter'")
      part_shards[$name]=$((index + 1))
    done <<< "$plan"
  else
    for entry in "${parts[@]}"; do
      for ((i = 0; i < TEST_SHARDS; i++)); do
        attention+=("${entry%%|*}.$i|$TEST_TIMEOUT|GTEST_TOTAL_SHARDS=$TEST_SHARDS GTEST_SHARD_INDEX=$i $BUNDLE/bin/attention_gpu_tests --gtest_filter='${entry#*|}'")
      done
      part_shards[${entry%%|*}]=$TEST_SHARDS
    done
  fi
  # flextile_gpu_tests and autotune_gpu_tests time kernels (events, the tuner's ranking): each
  # runs alone, before and after the attention parts.
  run_parts 1 "core|$TEST_TIMEOUT|$BUNDLE/bin/flextile_gpu_tests ${FLEXTILE_GPU_TEST_FILTER:+--gtest_filter='$FLEXTILE_GPU_TEST_FILTER'}"
  run_parts "$TEST_JOBS" "${attention[@]}"
  run_parts 1 "autotune|$TEST_TIMEOUT|$BUNDLE/bin/autotune_gpu_tests ${FLEXTILE_AUTOTUNE_TEST_FILTER:+--gtest_filter='$FLEXTILE_AUTOTUNE_TEST_FILTER'}"
  log="$LOGS/gpu_tests.log"
  : > "$log"
  rc=0; part_rows=()
  # One summary row per part: its shards' counts summed, its slowest shard's seconds, its first
  # failing shard's status.
  for part in core "${parts[@]%%|*}" autotune; do
    shards=("$part")
    [ "$part" != core ] && [ "$part" != autotune ] && shards=($(for ((i = 0; i < ${part_shards[$part]}; i++)); do echo "$part.$i"; done))
    part_rc=0; part_secs=0; part_logs=()
    for shard in "${shards[@]}"; do
      shard_rc=$(cat "$PARTS/$shard.rc"); shard_secs=$(cat "$PARTS/$shard.secs")
      { echo "== part $shard: exit $shard_rc, $shard_secs s"; cat "$PARTS/$shard.log"; } >> "$log"
      [ "$shard_rc" != 0 ] && [ "$part_rc" = 0 ] && part_rc=$shard_rc
      part_secs=$(awk -v a="$part_secs" -v b="$shard_secs" 'BEGIN { printf "%.1f", (b > a) ? b : a }')
      part_logs+=("$PARTS/$shard.log")
    done
    [ "$part_rc" != 0 ] && [ "$rc" = 0 ] && rc=$part_rc  # the first failing part's status
    part_rows+=("  $part|$(status_of "$part_rc")|$part_secs|$(count_in PASSED "${part_logs[@]}") passed, $(count_in FAILED "${part_logs[@]}") failed, $(count_in SKIPPED "${part_logs[@]}") skipped, $(kernels_in "${part_logs[@]}") kernels built")
  done
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|error" "$log" | head -40
  passed=$(count_in PASSED "$log"); failed=$(count_in FAILED "$log"); skipped=$(count_in SKIPPED "$log")
  detail="$passed passed, $failed failed, $skipped skipped, seed $FLEXTILE_TEST_SEED"
  [ "$failed" != 0 ] && detail+=": $(failed_names "$log")"
  status=$(status_of "$rc")
  # On the GPU machine a run in which nothing ran is a failure (the driver was not found, say).
  if [ "$rc" = 0 ] && [ "$passed" = 0 ] && [ "${FLEXTILE_ALLOW_NO_GPU:-0}" != 1 ]; then
    status="NO-GPU"
    rc=1
  fi
  [ "$rc" = 0 ] || FAILED=1
  SUMMARY+=("gpu tests|$status|$(seconds_since "$start")|$detail" "${part_rows[@]}")
fi

# The compute-sanitizer pass: the tools asked for, each over its binaries, in small scope.
if [ -n "${FLEXTILE_SANITIZER:-}" ]; then
  tools=$(echo "$FLEXTILE_SANITIZER" | tr ',' ' ')
  [ "$tools" = all ] && tools="memcheck racecheck synccheck"
  for tool in $tools; do
    case "$tool" in memcheck|racecheck|synccheck) ;;
      *) echo "gpu_run.sh: FLEXTILE_SANITIZER='$FLEXTILE_SANITIZER': '$tool' is not memcheck, racecheck, synccheck or all" >&2; exit 2 ;;
    esac
  done
  sanitizer=${FLEXTILE_COMPUTE_SANITIZER:-$(command -v compute-sanitizer || ls -d /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer /opt/nvidia/cuda/bin/compute-sanitizer 2>/dev/null | sort -V | tail -1)}
  if [ -z "$sanitizer" ] || [ ! -x "$sanitizer" ]; then
    where=${FLEXTILE_COMPUTE_SANITIZER:+"'$FLEXTILE_COMPUTE_SANITIZER' (FLEXTILE_COMPUTE_SANITIZER) is not an executable"}
    where=${where:-"compute-sanitizer is not on PATH nor in /usr/local/cuda*/bin: set FLEXTILE_COMPUTE_SANITIZER"}
    echo "gpu_run.sh: $where" >&2
    FAILED=1
    SUMMARY+=("sanitizer|MISSING|0|$where")
  else
    echo "== compute-sanitizer ($sanitizer: $("$sanitizer" --version 2>&1 | grep -i version | head -1)) tools: $tools"
    SANITIZER_TIMEOUT=${FLEXTILE_SANITIZER_TIMEOUT:-240}
    attn_filter=${FLEXTILE_SANITIZER_ATTN_FILTER:-*}
    # Kernels with shared memory and barriers: matmuls (ldmatrix, cp.async rings), reductions
    # across warps, atomics; the runtime tests' hand-written PTX has none.
    core_smem='MmaGpu.*:PipelineGpu.*:CompiledGpu.*:AtomicGpu.*'
    env="FLEXTILE_GPU_TEST_SMALL=1 FLEXTILE_TEST_SEED=$FLEXTILE_TEST_SEED"
    runs=()
    for tool in $tools; do
      flags="--tool $tool --error-exitcode 1"
      [ "$tool" = memcheck ] && flags+=" --leak-check full"
      # Under memcheck, the runtime tests that provoke driver errors on purpose (an allocation past
      # the card, a missing symbol, bad PTX, a refused cubin: each an API error the tool reports) and
      # the free-memory test (the tool's own allocations move the figure) are left out; the first
      # run (2026-12-01) reported exactly those five and nothing in a kernel.
      core_memcheck='-RuntimeGpu.AllocationShowsInFreeMemory:RuntimeGpu.HandWrittenPtxLaunchesOverARaggedSize:RuntimeGpu.BadPtxReportsTheJitLog:RuntimeGpu.CubinLoadsAsItIsAndFallsBackToPtx'
      core_filter=${FLEXTILE_SANITIZER_CORE_FILTER:-$([ "$tool" = memcheck ] && echo "$core_memcheck" || echo "$core_smem")}
      # Longest first: the attention binary, in four processes (under racecheck the whole binary
      # took longer than 420 s on the H200). Tests that time overlap are left out: a tool that
      # serializes kernels makes them meaningless.
      if [ -n "${FLEXTILE_SANITIZER_ATTN_FILTER:-}" ] && [[ $attn_filter == *-* ]]; then
        runs+=("${tool}_attention|$SANITIZER_TIMEOUT|env $env '$sanitizer' $flags $BUNDLE/bin/attention_gpu_tests --gtest_filter='$attn_filter'")
      elif [ -n "${FLEXTILE_SANITIZER_ATTN_FILTER:-}" ]; then
        # A list of patterns (no negative part): a process each, so that one slow test does not
        # keep the others' reports from the summary (2026-12-04: three tests in one process ran
        # past the timeout under racecheck, and the finished ones' summary was lost with it).
        part=0
        IFS=':' read -r -a patterns <<< "$attn_filter"
        for pattern in "${patterns[@]}"; do
          part=$((part + 1))
          runs+=("${tool}_attention_$part|$SANITIZER_TIMEOUT|env $env '$sanitizer' $flags $BUNDLE/bin/attention_gpu_tests --gtest_filter='$pattern'")
        done
      else
        timed='FlexAttentionStreamsGpu.*OverlapInTime*'
        attn_parts=("forward|*-$backward:$serving"
                    "backward|$backward"
                    "decode|$decode"
                    "serving|${serving#"$decode:"}-$timed")
        for attn_part in "${attn_parts[@]}"; do
          runs+=("${tool}_attention_${attn_part%%|*}|$SANITIZER_TIMEOUT|env $env '$sanitizer' $flags $BUNDLE/bin/attention_gpu_tests --gtest_filter='${attn_part#*|}'")
        done
      fi
      [ "$core_filter" = none ] ||
        runs+=("${tool}_core|$SANITIZER_TIMEOUT|env $env '$sanitizer' $flags $BUNDLE/bin/flextile_gpu_tests --gtest_filter='$core_filter'")
      [ "$tool" = memcheck ] && runs+=("${tool}_autotune|$SANITIZER_TIMEOUT|env $env '$sanitizer' $flags $BUNDLE/bin/autotune_gpu_tests")
    done
    if [ "${FLEXTILE_SANITIZER_SASS:-0}" = 1 ]; then
      # A dump folder a process (the dumps' sequence numbers count per process), and no compile
      # cache: a kernel found there is not compiled, so not dumped.
      dumped=()
      for run in "${runs[@]}"; do
        name=${run%%|*}; rest=${run#*|}
        mkdir -p "$LOGS/sanitizer_ptx/$name"
        dumped+=("$name|${rest%%|*}|FLEXTILE_CACHE=0 FLEXTILE_DUMP=ptx FLEXTILE_DUMP_DIR='$LOGS/sanitizer_ptx/$name' ${rest#*|}")
      done
      runs=("${dumped[@]}")
    fi
    start=$(now)
    run_parts "$SANITIZER_JOBS" "${runs[@]}"
    if [ "${FLEXTILE_SANITIZER_SASS:-0}" = 1 ]; then
      sass_dir="$LOGS/sanitizer_sass"
      mkdir -p "$sass_dir"
      ptxas_bin=$(command -v ptxas || ls -d /usr/local/cuda/bin/ptxas 2>/dev/null | head -1)
      disasm=$(command -v nvdisasm || ls -d /usr/local/cuda/bin/nvdisasm 2>/dev/null | head -1)
      cuobjdump_bin=$(command -v cuobjdump || ls -d /usr/local/cuda/bin/cuobjdump 2>/dev/null | head -1)
      kernels=$(cat "$PARTS"/*.log 2>/dev/null | sed -n 's/.* at \([A-Za-z_][A-Za-z0-9_]*\)+0x[0-9a-f]*.*/\1/p' | sort -u)
      for kernel in $kernels; do
        grep -l -r --include='*.ptx' "\.entry $kernel(" "$LOGS/sanitizer_ptx" 2>/dev/null | while read -r ptx; do
          base="$sass_dir/$(basename "$(dirname "$ptx")")-$(basename "$ptx" .ptx)"
          cp "$ptx" "$base.ptx"
          if [ -n "$ptxas_bin" ] && "$ptxas_bin" -arch=sm_90a "$ptx" -o "$base.cubin" 2> "$base.ptxas.log"; then
            if [ -n "$disasm" ]; then "$disasm" -c "$base.cubin" > "$base.sass" 2>&1
            elif [ -n "$cuobjdump_bin" ]; then "$cuobjdump_bin" -sass "$base.cubin" > "$base.sass" 2>&1
            fi
            rm -f "$base.cubin"
          fi
        done
      done
      (cd "$LOGS" && tar czf sanitizer_sass.tgz sanitizer_sass && rm -rf sanitizer_sass sanitizer_ptx)
      echo "== sanitizer SASS: $(echo $kernels | wc -w) kernels named in reports, sanitizer_sass.tgz"
    fi
    for tool in $tools; do
      tool_log="$LOGS/sanitizer_$tool.log"
      : > "$tool_log"
      worst=0; secs=0; findings=0; leaked=0; incomplete=""
      for part in "$PARTS/${tool}"_*.log; do
        name=$(basename "$part" .log)
        part_rc=$(cat "$PARTS/$name.rc")
        { echo "== $name: exit $part_rc, $(cat "$PARTS/$name.secs") s"; cat "$part"; } >> "$tool_log"
        secs=$(awk -v a="$secs" -v b="$(cat "$PARTS/$name.secs")" 'BEGIN { print (b > a ? b : a) }')
        [ "$part_rc" = 0 ] || worst=$part_rc
        # memcheck and synccheck end with "ERROR SUMMARY: N errors", racecheck with
        # "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)" (the errors count: a
        # warning is a hazard racecheck could not prove harmful or harmful); none: it did not finish.
        summary_line=$(grep -E "(ERROR|RACECHECK) SUMMARY:" "$part" | tail -1)
        if [ -z "$summary_line" ]; then incomplete+="${name#"${tool}_"} "; continue; fi
        n=$(echo "$summary_line" | sed -n 's/.*ERROR SUMMARY: \([0-9][0-9]*\) error.*/\1/p; s/.*RACECHECK SUMMARY: .*(\([0-9][0-9]*\) errors\{0,1\}.*/\1/p')
        findings=$((findings + ${n:-0}))
        bytes=$(sed -n 's/.*LEAK SUMMARY: \([0-9][0-9]*\) bytes leaked.*/\1/p' "$part" | tail -1)
        leaked=$((leaked + ${bytes:-0}))
      done
      tests="$(count_in PASSED "$tool_log") passed, $(count_in FAILED "$tool_log") failed, $(count_in SKIPPED "$tool_log") skipped"
      detail="$findings findings$([ "$tool" = memcheck ] && echo ", $leaked bytes leaked"), $tests, $(kernels_in "$tool_log") kernels built"
      [ -n "$incomplete" ] && detail+=", no sanitizer summary from: $incomplete"
      status=$(status_of "$worst")
      [ "$worst" = 0 ] && { [ "$findings" != 0 ] || [ -n "$incomplete" ]; } && status=FAIL
      if [ "$status" = ok ] && [ "$(count_in PASSED "$tool_log")" = 0 ] && [ "${FLEXTILE_ALLOW_NO_GPU:-0}" != 1 ]; then status=NO-GPU; fi
      [ "$status" = ok ] || FAILED=1
      SUMMARY+=("sanitizer $tool|$status|$secs|$detail; log: sanitizer_$tool.log")
      grep -E "^=========" "$tool_log" | grep -v "^========= *$" | head -20
    done
    SUMMARY+=("  sanitizer pass|-|$(seconds_since "$start")|wall time, $SANITIZER_JOBS processes at once")
  fi
fi

# The attention examples at the yardstick shape, each checking itself against float64
# (FLEXTILE_EXAMPLES=0 skips them).
if [ "${FLEXTILE_EXAMPLES:-1}" != 0 ]; then
  echo "== examples (--require-gpu)"
  start=$(now)
  ran=0; bad=""
  # One a source in examples/attention (the bundle's attention_* also holds test binaries, and a
  # glob over it once counted attention_random_mask_tests as an eleventh example); a missing binary fails.
  for source in examples/attention/*.cpp; do
    name=attention_$(basename "$source" .cpp)
    example="$BUNDLE/bin/$name"
    ran=$((ran + 1))
    if [ ! -x "$example" ]; then echo "$name: not in the bundle" > "$LOGS/example_$name.txt"; bad+="$name "; continue; fi
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
side_by_side attention_backward_atomic torch_attention compare_backward.py \
  "flex_attention backward with atomic dQ (dq_accumulation = Atomic), side by side"
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
[ -s "$LOGS/tables.txt" ] || rm -f "$LOGS/tables.txt"  # the device tool returns 8 files at most
exit "$FAILED"
