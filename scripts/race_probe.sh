#!/usr/bin/env bash
# compute-sanitizer racecheck of one forward call per setting through the CLI, on the GPU machine,
# from the repo root with ./bundle carried. Each argument is "[VAR=VALUE ...] VARIANT --shape ...
# [--config ...]" (`flextile run`'s arguments); each runs with a kernel cache of its own, and the
# SASS of the kernels it built (cuobjdump, via scripts/ftk_sass.py) goes to $OUT/sass<n>, so that
# racecheck's "kernel+0xPC" can be read. Logs: $OUT/race_<n>.log; one summary line per setting.
#   scripts/race_probe.sh "full --shape 2,8,1100,128 --config 128,128,8,2" \
#                         "FLEXTILE_SHARE_RINGS=0 full --shape 2,8,1100,128 --config 128,128,8,2,persistent"
set -u
B=./bundle/bin
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | sort -V | tail -1)
export PATH=$PATH:$(dirname "$CS")
n=0
for cfg in "$@"; do
  n=$((n+1)); d=$OUT/c$n; mkdir -p $d
  envs=(); args=()
  for w in $cfg; do
    if [ ${#args[@]} -eq 0 ] && [[ $w == *=* ]]; then envs+=("$w"); else args+=("$w"); fi
  done
  echo "== $cfg" > $OUT/race_$n.log
  env "${envs[@]}" FLEXTILE_CACHE_DIR=$d timeout 150 "$CS" --tool racecheck --print-limit 12 $B/flextile run "${args[@]}" >> $OUT/race_$n.log 2>&1
  echo "rc=$?" >> $OUT/race_$n.log
  echo "== $cfg: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' $OUT/race_$n.log | tr '\n' ' ') $(grep -c 'Race reported' $OUT/race_$n.log) reports, $(tail -1 $OUT/race_$n.log)"
  python3 scripts/ftk_sass.py $d $OUT/sass$n > /dev/null
  rm -rf $d
done
