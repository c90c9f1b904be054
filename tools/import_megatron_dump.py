#!/usr/bin/python3
"""Convert a Megatron-LM gradient (or parameter) dump into per-rank shards for `touchstone diff`.

Megatron-LM's --save-wgrads-interval N writes, after the data-parallel reduction and the loss
scaling and before clipping, every parameter's main_grad to

    {save}/wgrads/iter_{N:07d}/mp_rank_{tp:02d}.pth            (pipeline size 1)
    {save}/wgrads/iter_{N:07d}/mp_rank_{tp:02d}_{pp:03d}.pth   (pipeline size > 1)

each a dict {"model_chunk0": {parameter name: tensor}} holding that rank's shards in Megatron's
layouts with layer numbers local to the pipeline stage (--save-params-interval writes the
parameters after the update the same way, under params/). This script renames the tensors to the
contract's names (the table NAME_MAP below; a leading "module." is dropped) and writes the shard
directory format that `touchstone diff` reads (docs/diffing.md):

    OUT/shards.json               {"format": "touchstone-shards", "format_version": 1, "tp", "pp",
                                   "stage_layers", "tied_embedding_grads", ...}
    OUT/rank_tp{t}_pp{p}.h5       steps/<N>/grads/<name> (or steps/<N>/params/<name>): the shards

The shards are put back together by touchstone itself, with the same layout rules its tensor
parallelism uses (parallel/tensor/sharding.h), so that they are written down once.

Usage:
    import_megatron_dump.py SAVE/wgrads/iter_0000001 --out shards/ [--tie-embeddings true|false]
    touchstone diff golden.h5 shards/

Needs torch, numpy and h5py (Debian: python3-torch, python3-numpy, python3-h5py).
"""

import argparse
import json
import os
import re
import sys

import h5py
import numpy as np
import torch

# Megatron-LM / Transformer Engine names -> the contract's. Transformer Engine fuses the norms into
# the following linear layer; their weights are the contract's norm weights. Every other name of a
# Llama-style Megatron-Core model is already the contract's.
NAME_MAP = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}
CONTRACT_SUFFIXES = (
    "input_layernorm.weight", "self_attention.linear_qkv.weight", "self_attention.linear_proj.weight",
    "pre_mlp_layernorm.weight", "mlp.linear_fc1.weight", "mlp.linear_fc2.weight",
)
WHOLE_MODEL_NAMES = ("embedding.word_embeddings.weight", "decoder.final_layernorm.weight", "output_layer.weight")
FILE_PATTERN = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?\.pth$")
LAYER_PATTERN = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


class DumpError(Exception):
    """Bad input: reported as one line, exit status 2."""


def contract_name(name):
    """A Megatron parameter name -> the contract's (stage-local layer numbers are kept)."""
    while name.startswith("module."):
        name = name[len("module."):]
    match = LAYER_PATTERN.match(name)
    if match:
        layer, suffix = match.groups()
        suffix = NAME_MAP.get(suffix, suffix)
        if suffix not in CONTRACT_SUFFIXES:
            raise DumpError(f"{name}: not a parameter of the contract's model (no biases, RMSNorm, SwiGLU; "
                               "see docs/diffing.md)")
        return f"decoder.layers.{layer}.{suffix}"
    if name in WHOLE_MODEL_NAMES:
        return name
    raise DumpError(f"{name}: not a parameter of the contract's model")


def find_rank_files(dump):
    """{(tp, pp): path} of a dump directory, checked to form a complete tp x pp grid."""
    files = {}
    for entry in sorted(os.listdir(dump)):
        match = FILE_PATTERN.match(entry)
        if match:
            files[(int(match.group(1)), int(match.group(2) or 0))] = os.path.join(dump, entry)
    if not files:
        raise DumpError(f"{dump}: no mp_rank_TT[_PPP].pth files")
    tp = 1 + max(t for t, _ in files)
    pp = 1 + max(p for _, p in files)
    missing = [f"tp {t} pp {p}" for t in range(tp) for p in range(pp) if (t, p) not in files]
    if missing:
        raise DumpError(f"{dump}: missing rank files for {', '.join(missing)}")
    return files, tp, pp


def load_rank(path):
    """The renamed tensors of one rank file, as numpy arrays (bf16 widened to float32)."""
    try:
        state = torch.load(path, map_location="cpu")
    except Exception as error:  # torch reports truncated or foreign files in many ways
        raise DumpError(f"{path}: cannot load ({type(error).__name__}: {error})")
    if not isinstance(state, dict) or not isinstance(state.get("model_chunk0"), dict):
        raise DumpError(f"{path}: expected a dict {{'model_chunk0': {{name: tensor}}}}")
    extra = [key for key in state if key != "model_chunk0"]
    if extra:
        raise DumpError(f"{path}: {', '.join(map(str, extra))}: virtual pipeline chunks are not supported")
    tensors = {}
    for name, tensor in state["model_chunk0"].items():
        if not isinstance(name, str):
            raise DumpError(f"{path}: parameter name {name!r} is not a string")
        if name.endswith("_extra_state") or not torch.is_tensor(tensor):
            continue
        contract = contract_name(name)
        if contract in tensors:
            raise DumpError(f"{path}: {contract} appears twice")
        tensor = tensor.detach().cpu()
        if tensor.dtype in (torch.bfloat16, torch.float16):
            tensor = tensor.float()
        tensors[contract] = tensor.numpy()
    return tensors


def stage_layers(rank_tensors, tp, pp):
    """Layers per stage, from the local layer numbers in tp rank 0's file of each stage."""
    layers = []
    for p in range(pp):
        numbers = {int(LAYER_PATTERN.match(n).group(1)) for n in rank_tensors[(0, p)] if LAYER_PATTERN.match(n)}
        if numbers != set(range(len(numbers))) or not numbers:
            raise DumpError(f"stage {p}: local layer numbers {sorted(numbers)} are not 0..n-1")
        layers.append(len(numbers))
    return layers


def parse_dump_path(dump):
    """('grads' or 'params', step) from .../wgrads/iter_0000001, when the path says so."""
    parent, leaf = os.path.split(os.path.normpath(dump))
    match = re.match(r"^iter_(\d+)$", leaf)
    kind = {"wgrads": "grads", "params": "params"}.get(os.path.basename(parent))
    return kind, int(match.group(1)) if match else None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump", help="a dump directory such as SAVE/wgrads/iter_0000001")
    parser.add_argument("--out", required=True, help="shard directory to write (created if missing)")
    parser.add_argument("--kind", choices=("grads", "params"), help="default: from the dump path (wgrads/params)")
    parser.add_argument("--step", type=int, help="golden step the dump belongs to (default: N of iter_N)")
    parser.add_argument("--tie-embeddings", choices=("true", "false"),
                        help="whether the run tied embeddings (default: as the golden file says)")
    parser.add_argument("--tied-embedding-grads", choices=("summed", "partial"), default="summed",
                        help="summed: both stages' copies already hold the sum (Megatron-LM dumps after the "
                             "embedding all-reduce); partial: each holds its own part")
    args = parser.parse_args()
    try:
        path_kind, path_step = parse_dump_path(args.dump)
        kind, step = args.kind or path_kind, args.step if args.step is not None else path_step
        if kind is None or step is None:
            raise DumpError(f"{args.dump}: cannot tell the kind and step from the path; give --kind and --step")
        files, tp, pp = find_rank_files(args.dump)
        rank_tensors = {key: load_rank(path) for key, path in files.items()}
        layout = {"format": "touchstone-shards", "format_version": 1, "tp": tp, "pp": pp,
                  "stage_layers": stage_layers(rank_tensors, tp, pp),
                  "tied_embedding_grads": args.tied_embedding_grads, "source": os.path.abspath(args.dump)}
        if args.tie_embeddings:
            layout["tie_embeddings"] = args.tie_embeddings == "true"
        os.makedirs(args.out, exist_ok=True)
        for (t, p), tensors in rank_tensors.items():
            with h5py.File(os.path.join(args.out, f"rank_tp{t}_pp{p}.h5"), "w") as out:
                out.attrs["generator"] = f"import_megatron_dump.py ({files[(t, p)]})"
                for name, array in tensors.items():
                    out.create_dataset(f"steps/{step}/{kind}/{name}", data=np.ascontiguousarray(array))
        with open(os.path.join(args.out, "shards.json"), "w") as f:
            json.dump(layout, f, indent=2)
        print(f"wrote {args.out}: tp {tp}, pp {pp}, stage layers {layout['stage_layers']}, {kind} of step {step}")
    except DumpError as error:
        print(f"import_megatron_dump.py: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
