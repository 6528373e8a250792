#!/usr/bin/env bash
# First-call latency of flex_attention in fresh processes, three cache states in order:
#   cold        an empty compile cache: trace, LLVM, the driver's JIT (its cubin is then kept)
#   warm_ptx    the same cache with driver cubins off (FLEXTILE_DRIVER_CUBINS=0): a compile-cache
#               hit, then the driver JIT-compiles the PTX (the path before cubins were kept)
#   warm_cubin  the same cache as it is: a hit whose cubin for this GPU and driver loads as it is
#
#   bench/first_call.sh BIN_DIR [B,H,L,D]      (BIN_DIR holds flextile_first_call_bench)
set -euo pipefail
BIN=${1:?usage: bench/first_call.sh BIN_DIR [B,H,L,D]}
SHAPE=${2:-1,16,4096,128}
CACHE=$(mktemp -d)
trap 'rm -rf "$CACHE"' EXIT
export FLEXTILE_CACHE_DIR=$CACHE
"$BIN/flextile_first_call_bench" cold "$SHAPE"
FLEXTILE_DRIVER_CUBINS=0 "$BIN/flextile_first_call_bench" warm_ptx "$SHAPE"
"$BIN/flextile_first_call_bench" warm_cubin "$SHAPE"
"$BIN/flextile_first_call_bench" warm_cubin_again "$SHAPE"
