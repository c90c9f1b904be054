#!/usr/bin/env bash
# Writes the seed corpus of every fuzz target into OUT/<target>/: small golden files, checkpoints and
# ledgers made by the built `touchstone` with a tiny model, a safetensors file, and the checked-in
# seeds of fuzz/seeds/ and the repository's example inputs (docs/examples/). The inputs of past findings
# (fuzz/regressions/<target>/) are seeds too, so every run replays them first.
#
#   fuzz/make_seeds.sh TOUCHSTONE OUT
set -euo pipefail
touchstone=${1:?usage: make_seeds.sh TOUCHSTONE OUT}
out=${2:?usage: make_seeds.sh TOUCHSTONE OUT}
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$out"
mkdir -p "$out"/{fuzz_h5_reader,fuzz_golden_reader,fuzz_checkpoint_file,fuzz_safetensors,fuzz_jsonl,fuzz_config,fuzz_ledger,fuzz_scaling_csv,fuzz_plan_cli}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A tiny model keeps each HDF5 seed small, so that mutations spend their time in the metadata.
tiny=(--set model.vocab_size=16 --set model.hidden_size=4 --set model.ffn_hidden_size=4 --set model.num_heads=2
  --set model.num_kv_heads=1 --set model.num_layers=1 --set model.seq_length=16 --set train.global_batch_size=1
  --set train.micro_batch_size=1 --set train.steps=1)
export OPENBLAS_NUM_THREADS=1
"$touchstone" golden "${tiny[@]}" --out "$work/golden.h5" > /dev/null
"$touchstone" golden "${tiny[@]}" --set model.tie_embeddings=true --set train.steps=2 --save-optimizer-state \
  --out "$work/golden_tied.h5" > /dev/null
# Two attempts in one ledger: a run of one step, resumed for a second.
"$touchstone" train "${tiny[@]}" --checkpoint-dir "$work/run" > /dev/null
"$touchstone" train "${tiny[@]}" --set train.steps=2 --checkpoint-dir "$work/run" --resume > /dev/null
checkpoint=$(ls -d "$work"/run/step_* | tail -1)/state.h5

cp "$work/golden.h5" "$work/golden_tied.h5" "$out/fuzz_golden_reader/"
cp "$checkpoint" "$out/fuzz_checkpoint_file/state.h5"
cp "$work/golden.h5" "$out/fuzz_h5_reader/golden.h5"
cp "$checkpoint" "$out/fuzz_h5_reader/state.h5"
cp "$work/run/ledger.jsonl" "$out/fuzz_ledger/run.jsonl"
cp "$here"/seeds/ledger/* "$out/fuzz_ledger/"
cp "$here"/seeds/jsonl/* "$out/fuzz_jsonl/"
cp "$here"/seeds/config/* "$out/fuzz_config/"
"$touchstone" config "${tiny[@]}" > "$out/fuzz_config/tiny.json"
cp "$here"/seeds/scaling_csv/* "$here"/../docs/examples/*.csv "$out/fuzz_scaling_csv/"
cp "$here"/seeds/plan_cli/* "$out/fuzz_plan_cli/"
for regressions in "$here"/regressions/*/; do
  cp "$regressions"* "$out/$(basename "$regressions")/"
done

# A safetensors file of three tensors in three dtypes (the format of oracle/diff/safetensors.h).
/usr/bin/python3 - "$out/fuzz_safetensors/three.safetensors" <<'PYTHON'
import json, struct, sys
tensors = [("output_layer.weight", "F32", [2, 2], struct.pack("<4f", 1.0, -2.0, 0.5, 3.0)),
           ("decoder.final_layernorm.weight", "BF16", [2], struct.pack("<2H", 0x3F80, 0xC000)),
           ("steps", "I64", [], struct.pack("<q", 7))]
header, data = {"__metadata__": {"format": "pt"}}, b""
for name, dtype, shape, raw in tensors:
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
    data += raw
text = json.dumps(header).encode()
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + data)
PYTHON
