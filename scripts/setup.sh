#!/usr/bin/env bash
# Installs what FlexTile needs (Debian 12 packages), configures and builds.
# Safe to run again: it installs only missing packages and rebuilds only what
# changed. Usage: scripts/setup.sh [build-dir]   (default: build)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"

# clang-22, libfuzzer-22-dev and libclang-rt-22-dev (clang's sanitizer runtimes) build the sanitizer
# suite and the fuzz targets (scripts/sanitizer_build.sh); GCC's TSan runtime comes with
# build-essential.
packages=(build-essential cmake ninja-build ccache python3 llvm-22-dev llvm-22-tools libzstd-dev zlib1g-dev
          libboost-dev libeigen3-dev libgtest-dev libpng-dev clang-22 libfuzzer-22-dev libclang-rt-22-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  # llvm-22 comes from bookworm-security; make sure the package lists are fresh.
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
jobs="$(nproc)"
cmake --build "$build" -j "$jobs"
