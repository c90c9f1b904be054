#!/usr/bin/env bash
# Installs the Debian packages Touchstone builds and tests with (run as root, or with sudo available),
# then the Python packages Debian lacks (tools/python-requirements.txt: Hugging Face transformers and
# what it imports) into one folder, $TOUCHSTONE_PYTHON_DEPS (default build/python-deps), for
# PYTHONPATH, and today's PyTorch stack (tools/venv-requirements.txt: torch 2.15, numpy and h5py from
# PyPI, transformers 5.x, torchtitan) into a venv of Debian's python, $TOUCHSTONE_VENV (default
# build/venv), and Megatron-Core 0.19.2 and 0.16.1 (tools/megatron-requirements.txt) unpacked into
# $TOUCHSTONE_MEGATRON_DIR (default build/megatron-core). Nothing outside those three folders is changed
# by pip; each is reinstalled only when its requirements file changes (a stamp in the folder holds the
# file's sha256).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
packages=(
  build-essential cmake git strace
  libopenblas-dev libhdf5-dev hdf5-tools nlohmann-json3-dev libcli11-dev libgtest-dev
  libopenmpi-dev openmpi-bin
  python3-torch python3-h5py python3-numpy
  python3-pip python3-pytest python3-venv
  # what transformers needs that Debian packages: yaml and regex are compiled; typing-extensions is
  # huggingface-hub's; charset-normalizer is requests' (pure Python here, compiled on PyPI)
  python3-yaml python3-regex python3-typing-extensions python3-charset-normalizer
  clang libclang-rt-14-dev  # the fuzz targets (fuzz/): clang and its libFuzzer runtime
)
run_as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
# is_current FOLDER SHA256: whether FOLDER was installed from a file of that sha256 (its stamp says so).
is_current() { [ -f "$1/$stamp_name" ] && [ "$(cat "$1/$stamp_name")" = "$2" ]; }
# fresh_beside FINAL: sets $fresh to a new empty folder beside FINAL (the same file system, so that
# publish renames it), removed by an EXIT trap if the install fails before publish.
fresh_beside() {
  mkdir -p "$(dirname "$1")"
  fresh="$(mktemp -d "$(dirname "$1")/.$(basename "$1").XXXXXX")"
  trap 'rm -rf "$fresh"' EXIT
}
# publish FRESH FINAL SHA256: stamps the complete, verified folder FRESH with the sha256 of the file it was
# installed from and puts it in FINAL's place (the old FINAL, if any, is moved aside first and removed
# after), so that an interrupted install leaves the previous folder as it was; clears the EXIT trap
# that removes FRESH on failure.
publish() {
  echo "$3" > "$1/$stamp_name"
  if [ -e "$2" ]; then
    local old
    old="$(mktemp -d "$(dirname "$2")/.$(basename "$2")-old.XXXXXX")"
    mv "$2" "$old/"
    mv "$1" "$2"
    rm -rf "$old"
  else
    mv "$1" "$2"
  fi
  trap - EXIT
}
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
if is_current "$deps" "$want"; then
  echo "python packages up to date in $deps"
else
  echo "installing the python packages of $requirements into $deps"
  # A fresh folder beside the final one (same file system), renamed into place once it is complete
  # and verified: a failed or interrupted install leaves the previous folder as it was.
  fresh_beside "$deps"
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
  publish "$fresh" "$deps" "$want"
  echo "python packages installed in $deps (use PYTHONPATH=$deps)"
fi

# Today's stack in a venv of Debian's python: every package pinned, --no-deps so nothing is resolved at
# install time, wheels only. Built in a fresh folder beside the final one and renamed into place once
# its imports are verified; the venv is always run as $venv/bin/python (its pyvenv.cfg and the
# interpreter link do not name the folder, so the rename keeps it working), never through the scripts
# pip writes into bin/.
venv_requirements="$repo/tools/venv-requirements.txt"
venv="$(realpath -m "${TOUCHSTONE_VENV:-$repo/build/venv}")"
venv_want="$(sha256sum "$venv_requirements" | cut -d' ' -f1)"
verify_venv() {  # $1: the venv; fails unless today's stack imports from it, not from Debian's
  "$1/bin/python" -c "
import sys
import importlib.metadata
import numpy, torch, h5py, transformers, torchtitan, pytest
for module in (numpy, torch, h5py, transformers, torchtitan, pytest):
    if not module.__file__.startswith(sys.argv[1] + '/'):
        sys.exit(f'{module.__name__} comes from {module.__file__}, not from {sys.argv[1]}')
print(', '.join(name + ' ' + importlib.metadata.version(name)
                for name in ('torch', 'numpy', 'h5py', 'transformers', 'torchtitan', 'pytest')))
" "$1"
}
if is_current "$venv" "$venv_want"; then
  echo "venv up to date in $venv"
else
  echo "installing today's stack ($venv_requirements) into the venv $venv (about 5.4 GB)"
  fresh_beside "$venv"
  "$python" -m venv "$fresh"
  "$fresh/bin/python" -m pip install --quiet --no-deps --only-binary=:all: --no-input --disable-pip-version-check \
    --root-user-action=ignore -r "$venv_requirements"
  if ! verify_venv "$fresh"; then
    echo "error: today's stack does not import from the venv $fresh (see above)" >&2
    exit 1
  fi
  publish "$fresh" "$venv" "$venv_want"
  echo "today's stack installed in $venv (run $venv/bin/python)"
fi

# Megatron-Core, each version unpacked into its own folder of $TOUCHSTONE_MEGATRON_DIR (default
# build/megatron-core), chosen by PYTHONPATH at run time. The wheels are downloaded with the venv's pip
# for the Python tag the line names and checked against the listed sha256 before they are unpacked.
megatron_requirements="$repo/tools/megatron-requirements.txt"
megatron="$(realpath -m "${TOUCHSTONE_MEGATRON_DIR:-$repo/build/megatron-core}")"
megatron_want="$(sha256sum "$megatron_requirements" | cut -d' ' -f1)"
if is_current "$megatron" "$megatron_want"; then
  echo "megatron-core up to date in $megatron"
else
  echo "installing the megatron-core versions of $megatron_requirements into $megatron"
  fresh_beside "$megatron"
  while read -r version tag sha; do
    case "$version" in ''|'#'*) continue ;; esac
    "$venv/bin/python" -m pip download --quiet --no-deps --only-binary=:all: --disable-pip-version-check \
      --python-version "$tag" -d "$fresh/wheels" "megatron-core==$version"
    wheel="$(ls "$fresh/wheels"/megatron_core-"$version"-*.whl)"
    if [ "$(sha256sum "$wheel" | cut -d' ' -f1)" != "$sha" ]; then
      echo "error: $wheel does not have the sha256 $sha that $megatron_requirements lists" >&2
      exit 1
    fi
    "$venv/bin/python" -m zipfile -e "$wheel" "$fresh/$version"
    PYTHONPATH="$fresh/$version" "$venv/bin/python" -W ignore -c "
import sys, importlib.metadata, megatron.core
if not megatron.core.__file__.startswith(sys.argv[1] + '/'):
    sys.exit(f'megatron.core comes from {megatron.core.__file__}, not from {sys.argv[1]}')
version = importlib.metadata.version('megatron-core')
print(f'megatron-core {version} in {sys.argv[1]}')
" "$fresh/$version"
  done < "$megatron_requirements"
  rm -rf "$fresh/wheels"
  publish "$fresh" "$megatron" "$megatron_want"
  echo "megatron-core installed in $megatron (PYTHONPATH=$megatron/<version>)"
fi
