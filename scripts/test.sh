#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (unit, golden lit/FileCheck,
# interpreter numerics, ptxas; GPU tests run where a CUDA GPU is present and
# skip with a message elsewhere). Extra arguments go to ctest (e.g. -L gpu).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh" "$root/build"
ctest --test-dir "$root/build" --output-on-failure -j "$(nproc)" "$@"
