#!/bin/bash
# Dumps the PTX of FlexTile's kernels, for a byte-for-byte diff of two builds (a refactor of the
# compiler or of the target descriptions must change none, or only what it means to):
#
#   scripts/ptx_dump/dump.sh /work/main /tmp/ptx-before
#   scripts/ptx_dump/dump.sh /work/wt-mine /tmp/ptx-after
#   diff -r /tmp/ptx-before /tmp/ptx-after
#
# CHECKOUT must have a built build/ (libflextile.so, tests/tools/flextile-opt). Dumped: every attention
# variant's forward, backward and decode kernels and the GEMM example at four configs
# (dump_attention_ptx.cpp) and every lit test's
# kernels (flextile-opt --emit=ptx, errors included), for sm_80, sm_86, sm_89, sm_90 and sm_90a.
# The compile cache is a fresh temporary folder, so every kernel is compiled, not read back.
set -euo pipefail
checkout=$(realpath "$1")
out=$2
targets=(sm_80 sm_86 sm_89 sm_90 sm_90a)
here=$(dirname "$(realpath "$0")")
rm -rf "$out"
mkdir -p "$out"
g++ -std=c++20 -O1 -I"$checkout" "$here/dump_attention_ptx.cpp" -L"$checkout/build" -lflextile \
  -Wl,-rpath,"$checkout/build" -o "$out/dump_attention_ptx"
FLEXTILE_CACHE_DIR=$(mktemp -d)
export FLEXTILE_CACHE_DIR
trap 'rm -rf "$FLEXTILE_CACHE_DIR"' EXIT
"$out/dump_attention_ptx" "$out" "${targets[@]}"
rm "$out/dump_attention_ptx"
out=$(realpath "$out")
cd "$checkout"  # relative file names, so that the messages of the error tests match across checkouts
for f in tests/lit/codegen/*.ftir tests/lit/ir/*.ftir; do
  for t in "${targets[@]}"; do
    build/tests/tools/flextile-opt --split-input-file --emit=ptx --sm="${t#sm_}" "$f" \
      > "$out/lit_$(basename "$(dirname "$f")")_$(basename "$f" .ftir)_${t}.ptx" 2>&1 || true
  done
done
echo "PTX of $checkout in $out"
