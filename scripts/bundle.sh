#!/usr/bin/env bash
# Packs a finished build into ./bundle/ for a GPU machine that has only the NVIDIA driver:
#   bundle/lib/libflextile.so   (+ any shared library the binaries need that a stock Ubuntu lacks)
#   bundle/bin/*                every executable of the build (GPU tests, benches, examples, the CLI);
#                               host-only test binaries (named *_tests without "gpu") only with
#                               FLEXTILE_BUNDLE_HOST_TESTS=1: they run here, and with them the bundle
#                               plus the tree came to 64 MiB, all a device run may carry
# all stripped, executables finding ../lib through their RUNPATH. Prints the size; fails over 60 MiB.
#
# Usage (from the repo root): scripts/bundle.sh [build-dir]   (default: build/)
set -euo pipefail

BUILD=${1:-build}
BUNDLE=bundle
LIMIT_MIB=60
# Libraries a stock Ubuntu with the NVIDIA driver has; anything else that is needed gets copied.
SYSTEM_LIBS='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libz|libzstd|libtinfo|libcuda)\.so'

die() { echo "bundle.sh: $*" >&2; exit 1; }

[ -d "$BUILD" ] || die "no build directory '$BUILD' (give it as the first argument)"
[ -f "$BUILD/libflextile.so" ] || die "'$BUILD/libflextile.so' is missing: build first (ninja -C $BUILD)"
command -v readelf >/dev/null || die "readelf (binutils) is needed"

is_executable_elf() {  # an ELF file with a program interpreter: an executable, not a library
  readelf -l "$1" 2>/dev/null | grep -q 'Requesting program interpreter'
}

runpath_of() { readelf -d "$1" 2>/dev/null | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p'; }

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"

cp "$BUILD/libflextile.so" "$BUNDLE/lib/"
strip --strip-unneeded "$BUNDLE/lib/libflextile.so"

# Every executable the build made, wherever CMake put it (CMake's own probes excluded).
count=0
skipped=0
while IFS= read -r -d '' file; do
  is_executable_elf "$file" || continue
  name=$(basename "$file")
  if [[ "$name" == *_tests && "$name" != *gpu* && "${FLEXTILE_BUNDLE_HOST_TESTS:-0}" != 1 ]]; then
    skipped=$((skipped + 1)); continue
  fi
  [ -e "$BUNDLE/bin/$name" ] && die "two executables named '$name' ($file and another)"
  cp "$file" "$BUNDLE/bin/$name"
  strip "$BUNDLE/bin/$name"
  count=$((count + 1))
done < <(find "$BUILD" -type f -perm -u+x ! -path '*/CMakeFiles/*' ! -name '*.so' ! -name '*.so.*' -print0)
[ "$count" -gt 0 ] || die "no executables found in '$BUILD'"
[ -x "$BUNDLE/bin/flextile_gpu_tests" ] || echo "bundle.sh: warning: flextile_gpu_tests was not built" >&2

# Executables must find ../lib. The build already puts $ORIGIN/../lib in their RUNPATH; with
# patchelf the build directory is also dropped from it.
for file in "$BUNDLE"/bin/*; do
  if command -v patchelf >/dev/null; then
    patchelf --set-rpath '$ORIGIN/../lib' "$file"
  else
    runpath_of "$file" | tr ':' '\n' | grep -qx '\$ORIGIN/../lib' ||
      die "$(basename "$file") has RUNPATH '$(runpath_of "$file")' without \$ORIGIN/../lib (rebuild, or install patchelf)"
  fi
done
if command -v patchelf >/dev/null; then patchelf --set-rpath '$ORIGIN' "$BUNDLE/lib/libflextile.so"; fi

# Copy what the binaries need beyond a stock system, until nothing new appears.
changed=1
while [ "$changed" = 1 ]; do
  changed=0
  for file in "$BUNDLE"/bin/* "$BUNDLE"/lib/*; do
    while read -r soname arrow path _; do
      [ "$arrow" = "=>" ] || continue
      [ "$path" = "not" ] && die "$(basename "$file") needs $soname, which is not found"
      echo "$soname" | grep -Eq "$SYSTEM_LIBS" && continue
      [ -e "$BUNDLE/lib/$soname" ] && continue
      echo "bundle.sh: adding $soname (from $path)"
      cp -L "$path" "$BUNDLE/lib/$soname"
      strip --strip-unneeded "$BUNDLE/lib/$soname"
      changed=1
    done < <(ldd "$file" 2>/dev/null || true)
  done
done

# Every binary must resolve libflextile from the bundle itself, not from the build directory.
for file in "$BUNDLE"/bin/*; do
  if readelf -d "$file" | grep -q 'libflextile.so'; then
    where=$(ldd "$file" | awk '$1 == "libflextile.so" { print $3 }')
    [ -n "$where" ] && [ "$(realpath "$where")" = "$(realpath "$BUNDLE/lib/libflextile.so")" ] ||
      die "$(basename "$file") resolves libflextile.so to '$where', not the bundle's lib/"
  fi
done

# The peers' timing script lives outside the repository (../shared does not travel with a run).
PEER_SCRIPT=${FLEXTILE_TORCH_REFERENCE:-../shared/bench/torch_reference.py}
mkdir -p "$BUNDLE/peers"
if [ -f "$PEER_SCRIPT" ]; then
  cp "$PEER_SCRIPT" "$BUNDLE/peers/torch_reference.py"
else
  echo "bundle.sh: warning: $PEER_SCRIPT not found: the attention comparison will lack PyTorch's figures" >&2
fi

{
  echo "FlexTile bundle"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) from $BUILD"
  echo "bin: $(cd "$BUNDLE/bin" && ls | tr '\n' ' ')"
  echo "lib: $(cd "$BUNDLE/lib" && ls | tr '\n' ' ')"
} > "$BUNDLE/MANIFEST.txt"

bytes=$(du -sb "$BUNDLE" | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "bundle: $count executables ($skipped host-only test binaries left out), $(ls "$BUNDLE/lib" | wc -l) libraries, $mib MiB in $BUNDLE/"
[ "$bytes" -le $((LIMIT_MIB * 1048576)) ] || die "the bundle is $mib MiB, over the $LIMIT_MIB MiB limit"
