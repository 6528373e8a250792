#!/usr/bin/env bash
# Sets up, builds and runs the main example: a fused row softmax, on the GPU
# when there is one, otherwise through the IR interpreter. Arguments go to
# the example (rows cols).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh" "$root/build"
"$root/build/examples/row_softmax" "$@"
