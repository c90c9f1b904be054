#!/usr/bin/env bash
# `touchstone golden --backend cuda` against the CPU backend, end to end through the command line and
# `touchstone diff` (tools/gpu-check's comparisons, on a small config with dropout on):
#   FP64: every tensor of every step within relative L2 and max-abs 1e-12 of the CPU golden file;
#   BF16: the GPU run passes the CPU's BF16 envelope (golden --envelope).
# Exits 77 (CTest: Skipped) when no CUDA device is usable.
# Usage: golden_vs_cpu.sh PATH_TO_TOUCHSTONE
set -euo pipefail
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
small=(--set model.hidden_size=32 --set model.ffn_hidden_size=64 --set model.seq_length=32 --set train.steps=2
       --set model.attention_dropout=0.1 --set model.hidden_dropout=0.1)

if ! "$bin" golden "${small[@]}" --backend cuda --out "$dir/gpu_fp64.h5" > "$dir/gpu_fp64.txt" 2>&1; then
  if grep -q "no CUDA device" "$dir/gpu_fp64.txt"; then
    echo "SKIPPED: $(cat "$dir/gpu_fp64.txt")"
    exit 77
  fi
  cat "$dir/gpu_fp64.txt"
  exit 1
fi
"$bin" golden "${small[@]}" --out "$dir/cpu_fp64.h5" > /dev/null
echo "FP64: --backend cuda against the CPU golden file, tolerance 1e-12"
"$bin" diff "$dir/cpu_fp64.h5" "$dir/gpu_fp64.h5" --tolerance 1e-12 --no-recompute | tail -3

"$bin" golden "${small[@]}" --set precision=bf16 --envelope --out "$dir/cpu_bf16.h5" > /dev/null
"$bin" golden "${small[@]}" --set precision=bf16 --backend cuda --out "$dir/gpu_bf16.h5" > /dev/null
echo "BF16: --backend cuda against the CPU's BF16 envelope"
"$bin" diff "$dir/cpu_bf16.h5" "$dir/gpu_bf16.h5" --no-recompute | tail -3
