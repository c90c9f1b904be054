#!/usr/bin/env bash
# Installs the Debian packages Touchstone builds and tests with (run as root, or with sudo available).
set -euo pipefail
packages=(
  build-essential cmake git strace
  libopenblas-dev libhdf5-dev hdf5-tools nlohmann-json3-dev libcli11-dev libgtest-dev
  libopenmpi-dev openmpi-bin
  python3-torch python3-h5py python3-numpy
  clang libclang-rt-14-dev  # the fuzz targets (fuzz/): clang and its libFuzzer runtime
)
run_as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  run_as_root apt-get update -qq
  run_as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
