#!/usr/bin/env bash
# Builds Touchstone and runs every test: the Release build's full CTest suite (unit, command line,
# PyTorch cross-checks; the GPU tests skip without a GPU), the GPU tests on the CPU emulation of CUDA,
# then the unit and command-line tests again under ASan and UBSan, and runs every fuzz target (fuzz/)
# for a fixed number of inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
jobs=$(nproc)

# The CUDA backend must compile and link wherever the toolkit is installed, GPU or not (docs/cuda.md);
# its GPU tests then report Skipped without a GPU.
cuda=AUTO
if command -v nvcc > /dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then cuda=ON; fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTOUCHSTONE_CUDA=$cuda
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

# The CUDA backend's kernels once more, compiled as C++ against the CPU emulation of the CUDA runtime
# and cuBLAS, so the GPU tests run here too (docs/cuda.md "Emulation"); only what they need is built.
cmake -S . -B build-emulation -DCMAKE_BUILD_TYPE=Release -DTOUCHSTONE_CUDA=OFF -DTOUCHSTONE_CUDA_EMULATION=ON
cmake --build build-emulation -j"$jobs" --target test_gpu touchstone
ctest --test-dir build-emulation --output-on-failure -L emulation

# CPU only: AddressSanitizer does not instrument device code (docs/cuda.md).
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTOUCHSTONE_SANITIZE=ON -DTOUCHSTONE_CUDA=OFF
cmake --build build-sanitize -j"$jobs"
# The exhaustive BF16 rounding test (all 2^32 FP32 patterns, integer arithmetic only) ran in the Release
# build above; under the sanitizers it alone would take many minutes.
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir build-sanitize --output-on-failure -j"$jobs" -L unit -E "Bf16Rounding"
# The command-line tests start MPI (a singleton). Open MPI keeps allocations of its dynamically loaded
# components until exit, which LeakSanitizer reports as leaks in unnamed modules that a suppression
# file cannot match, so leak detection is off for these; every other ASan and UBSan check stays on.
ASAN_OPTIONS=detect_leaks=0 ctest --test-dir build-sanitize --output-on-failure -j"$jobs" -L cli

# Every reader under libFuzzer (clang, ASan, UBSan; docs/testing.md "Fuzzing"): each target for a fixed
# number of inputs from its seeds, which the Release build's touchstone writes; any finding fails.
TOUCHSTONE=build/tools/touchstone bash tools/fuzz.sh ci
