#!/usr/bin/env bash
# Installs the Debian packages Touchstone builds and tests with (run as root, or with sudo available),
# then the Python packages Debian lacks (tools/python-requirements.txt: Hugging Face transformers and
# what it imports) into one folder, $TOUCHSTONE_PYTHON_DEPS (default build/python-deps), for
# PYTHONPATH. Nothing outside that folder is changed by pip; it is reinstalled only when the
# requirements file changes (a stamp in the folder holds the file's sha256).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
packages=(
  build-essential cmake git strace
  libopenblas-dev libhdf5-dev hdf5-tools nlohmann-json3-dev libcli11-dev libgtest-dev
  libopenmpi-dev openmpi-bin
  python3-torch python3-h5py python3-numpy
  python3-pip python3-pytest
  # what transformers needs that Debian packages: yaml and regex are compiled; typing-extensions is
  # huggingface-hub's; charset-normalizer is requests' (pure Python here, compiled on PyPI)
  python3-yaml python3-regex python3-typing-extensions python3-charset-normalizer
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

# Python packages from PyPI, pinned, into one folder. --no-deps: only what the requirements file
# names, so pip never brings a numpy that would shadow Debian's (torch and h5py are built against it);
# --only-binary: wheels only, nothing compiled here; --target: nothing outside the folder.
python=/usr/bin/python3
requirements="$repo/tools/python-requirements.txt"
deps="$(realpath -m "${TOUCHSTONE_PYTHON_DEPS:-$repo/build/python-deps}")"
stamp_name=.touchstone-requirements.sha256
want="$(sha256sum "$requirements" | cut -d' ' -f1)"
verify_imports() {  # $1: the folder; fails unless transformers imports from it over Debian's torch/numpy/h5py
  PYTHONPATH="$1" "$python" -c "
import sys
import numpy, torch, h5py
import transformers, safetensors
from transformers import LlamaForCausalLM
for module in (numpy, torch, h5py):
    if not module.__file__.startswith('/usr/lib/python3/dist-packages/'):
        sys.exit(f'{module.__name__} comes from {module.__file__}, not from Debian')
if not transformers.__file__.startswith(sys.argv[1] + '/'):
    sys.exit(f'transformers comes from {transformers.__file__}, not from {sys.argv[1]}')
print(f'transformers {transformers.__version__}, safetensors {safetensors.__version__}, torch {torch.__version__}, numpy {numpy.__version__}')
" "$1"
}
if [ -f "$deps/$stamp_name" ] && [ "$(cat "$deps/$stamp_name")" = "$want" ]; then
  echo "python packages up to date in $deps"
else
  echo "installing the python packages of $requirements into $deps"
  mkdir -p "$(dirname "$deps")"
  # A fresh folder beside the final one (same file system), renamed into place once it is complete
  # and verified: a failed or interrupted install leaves the previous folder as it was.
  fresh="$(mktemp -d "$(dirname "$deps")/.python-deps.XXXXXX")"
  trap 'rm -rf "$fresh"' EXIT
  "$python" -m pip install --quiet --no-deps --only-binary=:all: --no-input --disable-pip-version-check \
    --root-user-action=ignore --target "$fresh" -r "$requirements"
  shadowing="$(find "$fresh" -mindepth 1 -maxdepth 1 \( -iname 'numpy*' -o -iname 'torch*' -o -iname 'h5py*' \) -printf '%f ')"
  if [ -n "$shadowing" ]; then
    echo "error: pip installed $shadowing into $fresh; it would shadow Debian's numpy/torch/h5py" >&2
    exit 1
  fi
  if ! verify_imports "$fresh"; then
    echo "error: transformers does not import from $fresh (see above)" >&2
    exit 1
  fi
  echo "$want" > "$fresh/$stamp_name"
  if [ -e "$deps" ]; then
    old="$(mktemp -d "$(dirname "$deps")/.python-deps-old.XXXXXX")"
    mv "$deps" "$old/"
    mv "$fresh" "$deps"
    rm -rf "$old"
  else
    mv "$fresh" "$deps"
  fi
  trap - EXIT
  echo "python packages installed in $deps (use PYTHONPATH=$deps)"
fi
