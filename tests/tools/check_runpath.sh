#!/usr/bin/env bash
# Every executable of the build must find libflextile through $ORIGIN/../lib, where
# scripts/bundle.sh puts it: a target defined before CMAKE_BUILD_RPATH was set (the
# `flextile` tool once was) broke the GPU bundle.
set -euo pipefail
build=${1:?build directory}
bad=0
while IFS= read -r -d '' file; do
  readelf -l "$file" 2>/dev/null | grep -q 'Requesting program interpreter' || continue
  readelf -d "$file" | grep -q 'libflextile.so' || continue
  if ! readelf -d "$file" | grep -E '(RUNPATH|RPATH)' | grep -q '\$ORIGIN/../lib'; then
    echo "check_runpath: $file lacks \$ORIGIN/../lib in its RUNPATH" >&2
    bad=1
  fi
done < <(find "$build" -type f -perm -u+x ! -path '*/CMakeFiles/*' ! -name '*.so*' -print0)
exit $bad
