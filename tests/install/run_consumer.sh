#!/usr/bin/env bash
# The install test: `cmake --install` of a finished FlexTile build into an empty prefix, then the
# out-of-tree project in consumer/ configured with find_package(FlexTile), built and run (the
# interpreter path: no GPU needed). Also checks that no installed header includes an LLVM or CUDA
# header, and compiles every installed header with only the prefix on the include path.
#
# Usage: run_consumer.sh BUILD_DIR WORK_DIR [cmake options for the consumer, e.g. the compiler]
# WORK_DIR is emptied first and removed at the end (FLEXTILE_KEEP_INSTALL_TEST=1 keeps it). It must
# lie outside BUILD_DIR: scripts/bundle.sh and the RUNPATH check walk every executable there.
set -euo pipefail
build=${1:?build directory}
work=${2:?work directory}
shift 2
here="$(cd "$(dirname "$0")" && pwd)"
cmake=${CMAKE_COMMAND:-cmake}

rm -rf "$work"
mkdir -p "$work"
[ "${FLEXTILE_KEEP_INSTALL_TEST:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

step() { echo "install test: $*"; }
step "cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; exit 1; }

for f in lib/libflextile.so lib/cmake/FlexTile/FlexTileConfig.cmake lib/cmake/FlexTile/FlexTileConfigVersion.cmake \
         include/flextile/attention_templates/FlexAttention.h bin/flextile; do
  [ -e "$prefix/$f" ] || { echo "install test: $f is not installed" >&2; exit 1; }
done
if grep -rnE '^\s*#\s*include\s*[<"](llvm|llvm-c|cuda|cuda_runtime)[/.]' "$prefix/include"; then
  echo "install test: an installed header includes an LLVM or CUDA header (above)" >&2
  exit 1
fi

step "configure, build and run tests/install/consumer against the prefix"
# The prefix only: a FlexTile found anywhere else (the build tree's export, a system install) would
# not test the package.
"$cmake" -S "$here/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
  -DCMAKE_BUILD_TYPE=Release -DCONSUMER_INCLUDE_EVERY_HEADER=ON "$@" >"$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
grep -q "FlexTile_DIR:PATH=$prefix/" "$work/consumer/CMakeCache.txt" ||
  { echo "install test: find_package found FlexTile outside $prefix" >&2; grep FlexTile_DIR "$work/consumer/CMakeCache.txt"; exit 1; }
"$cmake" --build "$work/consumer" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
# Nothing points the program at libflextile.so but its RUNPATH (the prefix's lib/).
env -u LD_LIBRARY_PATH FLEXTILE_CACHE_DIR="$work/cache" "$work/consumer/consumer"
