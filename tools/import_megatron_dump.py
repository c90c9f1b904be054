#!/usr/bin/python3
"""Convert a Megatron-LM gradient (or parameter) dump into per-rank shards for `touchstone diff`.

Megatron-LM's --save-wgrads-interval N (Megatron-Core core_v0.16.0 on) writes every parameter's
main_grad after forward_backward_func (the data-parallel reduction, the embedding all-reduce and the
per-token scaling of finalize_model_grads) and before optimizer.step() (which removes the loss scale
and clips); --save-params-interval N (core_v0.18.0 on) writes the parameters after optimizer.step().
Both go through save_grads (megatron/training/checkpointing.py) to

    {save}/wgrads/iter_{N:07d}/mp_rank_{tp:02d}.pth                    (pipeline and expert size 1)
    {save}/wgrads/iter_{N:07d}/mp_rank_{tp:02d}_{pp:03d}.pth           (pipeline size > 1)
    {save}/wgrads/iter_{N:07d}/mp_rank_{tp:02d}[_{pp:03d}]_{ep:03d}.pth  (expert-parallel size > 1)

(params/ instead of wgrads/), each a torch.save of {"model_chunk0": {parameter name: tensor}} holding
that rank's shards in Megatron's layouts, layer numbers local to the pipeline stage. This script
renames the tensors to the contract's names (NAME_MAP below; a leading "module." is dropped), divides
gradients by --loss-scale, and writes the shard directory format that `touchstone diff` reads
(docs/diffing.md):

    OUT/shards.json               {"format": "touchstone-shards", "format_version": 1, "tp", "pp",
                                   "stage_layers", "tied_embedding_grads", ...}
    OUT/rank_tp{t}_pp{p}.h5       steps/<N>/grads/<name> (or steps/<N>/params/<name>): the shards

The shards are put back together by touchstone itself, with the same layout rules its tensor
parallelism uses (parallel/tensor/sharding.h), so that they are written down once.

16-bit parameter copies. Under --bf16 or --fp16 a params dump holds param.data, the model's bfloat16 or
float16 copy of the float32 master weights. Such tensors are written as float32 datasets (exact) with
the string attribute stored_dtype = "bfloat16" or "float16", and `touchstone diff` compares them with
the reference rounded to that type (docs/diffing.md "16-bit parameter copies"). Gradients are no
copies: 16-bit gradients are widened to float32 without the attribute.

Two dumps in one directory. Megatron-LM writes wgrads/ and params/ of one iteration as two
directories; the optimizer check needs both in one candidate. When OUT already holds shards.json, the
dump is added to it: its tp, pp and stage_layers must equal those of shards.json and none of its
datasets may already be in the rank files (else exit 2). shards.json then lists every import under
"imports" ({"source", "kind", "step", "loss_scale_removed" when one was given}). The new rank files are
built as temporaries next to the old ones and renamed into place only when all of them and shards.json
are written, so a refused or failed import leaves OUT as it was; a symbolic link, directory or other
non-regular file at a rank file's or shards.json's path is refused, never replaced.

The loss scale. A gradient dump holds main_grad before optimizer.step() unscales it, so under a loss
scale every gradient is the true one times the scale: the constant --loss-scale of the run, or under
--fp16 without it the dynamic scale (2^32 at the start, halved after overflows). The dump does not
record it. A dump with a float16 gradient comes from a --fp16 run (its gradient buffers are float16
unless --accumulate-allreduce-grads-in-fp32) and is refused without --loss-scale.

Usage:
    import_megatron_dump.py SAVE/wgrads/iter_0000001 --out shards/ [--loss-scale X]
    import_megatron_dump.py SAVE/params/iter_0000001 --out shards/      (adds the parameters)
    touchstone diff golden.h5 shards/

A dump is loaded with torch.load(weights_only=True): a pickle naming code (which torch.load would run) is
refused with one line before any of it runs. --trusted-dump loads it as it is, running that code: give it
only for a dump you trust. Every value must be a dense floating-point tensor (Transformer Engine's
*_extra_state entries aside): a sparse, meta or quantized tensor, or any other value, is refused naming it.

Exit status 0, or 2 with one line saying why the dump was refused.
Needs torch, numpy and h5py (Debian: python3-torch, python3-numpy, python3-h5py).
"""

import argparse
import json
import math
import os
import pickle
import re
import shutil
import stat
import sys
from typing import Dict, List, Optional, Tuple

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
# Megatron-Core's MoELayer (megatron/core/transformer/moe/moe_layer.py) holds router, experts and
# shared_experts where a dense layer holds its MLP.
EXPERT_PREFIXES = ("mlp.router.", "mlp.experts.", "mlp.shared_experts.")
# save_grads: mp_rank_{tp:02d}, then _{pp:03d} when the pipeline size is > 1, then _{ep:03d} when the
# expert-parallel size is > 1. Two numbers are read as tp and pp (with pipeline size 1 and expert
# size > 1 the second number is the expert rank, which only a mixture-of-experts model has: its
# expert parameters are refused by name).
FILE_PATTERN = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?\.pth$")
EXPECTED_FILES = "mp_rank_TT.pth, mp_rank_TT_PPP.pth or mp_rank_TT_PPP_EEE.pth"
WRITTEN_BY = ("written by Megatron-LM's --save-wgrads-interval (Megatron-Core core_v0.16.0 and later) and "
              "--save-params-interval (core_v0.18.0 and later)")
LAYER_PATTERN = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
DYNAMIC_INITIAL_SCALE = 2.0 ** 32  # OptimizerConfig.initial_loss_scale (megatron/core/optimizer/optimizer_config.py)

RankKey = Tuple[int, int]  # (tp rank, pp rank)


class DumpError(Exception):
    """Bad input: reported as one line, exit status 2."""


def contract_name(name: str) -> str:
    """A Megatron parameter name -> the contract's (stage-local layer numbers are kept)."""
    while name.startswith("module."):
        name = name[len("module."):]
    match = LAYER_PATTERN.match(name)
    if match:
        layer, suffix = match.groups()
        if suffix.startswith(EXPERT_PREFIXES):
            raise DumpError(f"{name}: a mixture-of-experts parameter; Touchstone's model has no experts")
        suffix = NAME_MAP.get(suffix, suffix)
        if suffix not in CONTRACT_SUFFIXES:
            raise DumpError(f"{name}: not a parameter of the contract's model (no biases, RMSNorm, SwiGLU; "
                               "see docs/diffing.md)")
        return f"decoder.layers.{layer}.{suffix}"
    if name in WHOLE_MODEL_NAMES:
        return name
    raise DumpError(f"{name}: not a parameter of the contract's model")


def describe_other_layout(dump: str, entries: List[str]) -> str:
    """What the directory holds instead of dump files, as a hint for the refusal."""
    if any(re.match(r"^iter_\d+$", e) and os.path.isdir(os.path.join(dump, e)) for e in entries):
        return "; it holds iter_NNNNNNN directories: give one of them"
    if (any(e.endswith(".distcp") for e in entries) or "metadata.json" in entries or "common.pt" in entries
            or any(re.match(r"^mp_rank_\d+(_\d+)*$", e) and os.path.isdir(os.path.join(dump, e)) for e in entries)):
        return "; it looks like a checkpoint written by --save, not a dump"
    if not entries:
        return "; it is empty"
    shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
    return f"; it holds {shown}"


def find_rank_files(dump: str) -> Tuple[Dict[RankKey, str], int, int]:
    """{(tp, pp): path} of a dump directory, checked to form a complete tp x pp grid of one name form."""
    try:
        entries = sorted(os.listdir(dump))
    except OSError as error:
        raise DumpError(f"{dump}: cannot read the directory ({error.strerror or error})")
    files: Dict[RankKey, str] = {}
    forms = set()
    for entry in entries:
        match = FILE_PATTERN.match(entry)
        if not match:
            continue
        tp_text, pp_text, ep_text = match.groups()
        forms.add(sum(part is not None for part in match.groups()))
        if ep_text is not None and int(ep_text) != 0:
            raise DumpError(f"{os.path.join(dump, entry)}: expert-parallel rank {int(ep_text)}: a mixture-of-experts "
                            "run (Megatron-Core allows --expert-model-parallel-size > 1 only with experts); "
                            "Touchstone's model has no experts")
        key = (int(tp_text), int(pp_text or 0))
        if key in files:
            raise DumpError(f"{dump}: {os.path.basename(files[key])} and {entry} are both tp {key[0]} pp {key[1]}")
        files[key] = os.path.join(dump, entry)
    if not files:
        raise DumpError(f"{dump}: no {EXPECTED_FILES} files, {WRITTEN_BY}{describe_other_layout(dump, entries)}")
    if len(forms) > 1:
        raise DumpError(f"{dump}: file names of different forms ({EXPECTED_FILES}) mixed in one dump")
    tp = 1 + max(t for t, _ in files)
    pp = 1 + max(p for _, p in files)
    missing = [f"tp {t} pp {p}" for t in range(tp) for p in range(pp) if (t, p) not in files]
    if missing:
        raise DumpError(f"{dump}: missing rank files for {', '.join(missing)}")
    return files, tp, pp


def load_rank(path: str, trusted: bool = False) -> Dict[str, torch.Tensor]:
    """The renamed tensors of one rank file, as saved (dtype kept).

    torch.load runs whatever code a pickle names unless weights_only=True, which unpickles tensors,
    dicts, lists and numbers only (torch 1.13 and later; the default from torch 2.6). A dump is someone
    else's file, so it is loaded that way unless `trusted` (--trusted-dump) says otherwise.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=not trusted)
    except pickle.UnpicklingError as error:
        if trusted:
            raise DumpError(f"{path}: cannot load ({type(error).__name__}: {first_line(error)})")
        # torch words it "Weights only load failed. ... WeightsUnpickler error: <what>"; <what> is the news.
        reason = str(error).rpartition("WeightsUnpickler error:")[2].strip() or first_line(error)
        raise DumpError(f"{path}: holds more than tensors, dicts and numbers ({reason.splitlines()[0][:160]}), "
                        "so it was not loaded; pass --trusted-dump if you trust it (loading it then runs any code "
                        "it names)")
    except Exception as error:  # torch reports truncated or foreign files in many ways
        raise DumpError(f"{path}: cannot load ({type(error).__name__}: {first_line(error)})")
    if not isinstance(state, dict) or not isinstance(state.get("model_chunk0"), dict):
        raise DumpError(f"{path}: expected a dict {{'model_chunk0': {{name: tensor}}}}")
    extra = [key for key in state if key != "model_chunk0"]
    if extra:
        raise DumpError(f"{path}: {', '.join(map(str, extra))}: virtual pipeline chunks are not supported")
    tensors = {}
    for name, tensor in state["model_chunk0"].items():
        if not isinstance(name, str):
            raise DumpError(f"{path}: parameter name {name!r} is not a string")
        if name.endswith("_extra_state"):
            continue  # Transformer Engine's FP8 metadata: no parameter
        check_dense(path, name, tensor)
        contract = contract_name(name)
        if contract in tensors:
            raise DumpError(f"{path}: {contract} appears twice")
        tensors[contract] = tensor.detach().cpu()
    return tensors


def check_dense(path: str, name: str, tensor: object) -> None:
    """Refuses a value that is not a dense floating-point tensor in memory (one line naming it): save_grads
    writes only those, and a sparse, meta or quantized tensor has no values to compare."""
    if not torch.is_tensor(tensor):
        raise DumpError(f"{path}: {name}: a value of type {type(tensor).__name__}, not a tensor")
    if tensor.is_meta:
        raise DumpError(f"{path}: {name}: a meta tensor, which holds no values")
    if tensor.layout != torch.strided or tensor.is_quantized:
        kind = "quantized" if tensor.is_quantized else str(tensor.layout).replace("torch.", "")
        raise DumpError(f"{path}: {name}: a {kind} tensor, not a dense one")
    if not tensor.is_floating_point():
        raise DumpError(f"{path}: {name}: holds {str(tensor.dtype).replace('torch.', '')} values, not floating-point ones")


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


STORED_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def to_array(tensor: torch.Tensor, loss_scale: Optional[float]) -> np.ndarray:
    """A tensor as numpy (bf16 and fp16 widened to float32 first, exactly), divided by the loss scale."""
    if tensor.dtype in STORED_DTYPES:
        tensor = tensor.float()
    if loss_scale is not None and tensor.is_floating_point():
        tensor = tensor / loss_scale
    return np.ascontiguousarray(tensor.numpy())


def stage_layers(rank_tensors: Dict[RankKey, Dict[str, torch.Tensor]], tp: int, pp: int) -> List[int]:
    """Layers per stage, from the local layer numbers in tp rank 0's file of each stage."""
    layers = []
    for p in range(pp):
        numbers = {int(LAYER_PATTERN.match(n).group(1)) for n in rank_tensors[(0, p)] if LAYER_PATTERN.match(n)}
        if numbers != set(range(len(numbers))) or not numbers:
            raise DumpError(f"stage {p}: local layer numbers {sorted(numbers)} are not 0..n-1")
        layers.append(len(numbers))
    return layers


def parse_dump_path(dump: str) -> Tuple[Optional[str], Optional[int]]:
    """('grads' or 'params', step) from .../wgrads/iter_0000001, when the path says so."""
    parent, leaf = os.path.split(os.path.normpath(dump))
    match = re.match(r"^iter_(\d+)$", leaf)
    kind = {"wgrads": "grads", "params": "params"}.get(os.path.basename(parent))
    return kind, int(match.group(1)) if match else None


def check_loss_scale_option(kind: str, loss_scale: Optional[float]) -> None:
    """Refuses a loss scale that is not a positive number, or one given for a parameter dump."""
    if loss_scale is not None and not (math.isfinite(loss_scale) and loss_scale > 0):
        raise DumpError(f"--loss-scale {loss_scale:g}: must be a finite number > 0")
    if kind == "params" and loss_scale is not None:
        raise DumpError("--loss-scale is for gradient dumps: parameters are dumped after optimizer.step() "
                        "and carry no loss scale")


def check_fp16_loss_scale(kind: str, loss_scale: Optional[float], rank_tensors: Dict[RankKey, Dict[str, torch.Tensor]],
                          files: Dict[RankKey, str]) -> None:
    """Refuses the gradients of an --fp16 run without --loss-scale. Megatron-Core's gradient buffers
    (main_grad) are float32 with --accumulate-allreduce-grads-in-fp32 (which --bf16 sets unless
    --grad-reduce-in-bf16) and of the parameter's dtype otherwise (group_params_for_buffers,
    megatron/core/distributed/param_and_grad_buffer.py), so a float16 gradient is an --fp16 run's."""
    if kind != "grads" or loss_scale is not None:
        return
    for key, tensors in sorted(rank_tensors.items()):
        for name, tensor in tensors.items():
            if tensor.dtype == torch.float16:
                raise DumpError(
                    f"{files[key]}: {name} is float16: a --fp16 run, whose gradients are dumped before "
                    "optimizer.step() removes the loss scale; pass --loss-scale X (the run's --loss-scale, else "
                    "the dynamic scale Megatron-LM logged as 'loss scale' at the iteration before; it starts at "
                    f"{DYNAMIC_INITIAL_SCALE:.0f} = 2^32)")


def regular_or_absent(path: str) -> bool:
    """True when a regular file is at `path`, False when nothing is; refuses anything else."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as error:
        raise DumpError(f"{path}: cannot be read ({error.strerror or error})")
    if not stat.S_ISREG(mode):
        raise DumpError(f"{path}: exists and is not a regular file (a link, directory or other file is never "
                        "replaced)")
    return True


def existing_layout(out: str, layout: dict) -> Optional[dict]:
    """shards.json of OUT when there is one, checked to describe the same layout as `layout`."""
    path = os.path.join(out, "shards.json")
    if not regular_or_absent(path):
        return None
    try:
        with open(path) as f:
            existing = json.load(f)
    except (OSError, ValueError) as error:
        raise DumpError(f"{path}: cannot be read as JSON ({error}); remove it or write to another --out")
    if not isinstance(existing, dict) or existing.get("format") != "touchstone-shards":
        raise DumpError(f"{path}: not a touchstone-shards file")
    for key in ("tp", "pp", "stage_layers"):
        if existing.get(key) != layout[key]:
            raise DumpError(f"{path}: {key} {json.dumps(existing.get(key))}, but the dump has {key} "
                            f"{json.dumps(layout[key])}: it is another layout than the shards already there")
    for key in ("tied_embedding_grads", "tie_embeddings"):
        if key in existing and key in layout and existing[key] != layout[key]:
            raise DumpError(f"{path}: {key} {json.dumps(existing[key])}, but this import has {key} "
                            f"{json.dumps(layout[key])}")
    return existing


def write_rank_files(out: str, rank_tensors, files, kind: str, step: int, loss_scale: Optional[float],
                     appending: bool, temporaries: List[Tuple[str, str]]) -> set:
    """Writes every rank file as a temporary next to its final path (a copy of the existing file with the
    new datasets added when appending); returns the names of tensors holding inf or NaN."""
    non_finite = set()
    for (t, p), tensors in sorted(rank_tensors.items()):
        final = os.path.join(out, f"rank_tp{t}_pp{p}.h5")
        present = regular_or_absent(final)
        if appending and not present:
            raise DumpError(f"{final}: missing, though {os.path.join(out, 'shards.json')} lists tp x pp ranks")
        temporary = os.path.join(out, f".rank_tp{t}_pp{p}.h5.tmp.{os.getpid()}")
        temporaries.append((temporary, final))
        if appending:
            shutil.copyfile(final, temporary)
        try:
            with h5py.File(temporary, "a" if appending else "w") as h5:
                if not appending:
                    h5.attrs["generator"] = f"import_megatron_dump.py ({files[(t, p)]})"
                for name, tensor in sorted(tensors.items()):
                    dataset = f"steps/{step}/{kind}/{name}"
                    if dataset in h5:
                        raise DumpError(f"{final}: {dataset} is already there (imported before?); nothing was "
                                        "added")
                    array = to_array(tensor, loss_scale)
                    if array.dtype.kind == "f" and not np.isfinite(array).all():
                        non_finite.add(name)
                    written = h5.create_dataset(dataset, data=array)
                    if kind == "params" and tensor.dtype in STORED_DTYPES:
                        written.attrs["stored_dtype"] = STORED_DTYPES[tensor.dtype]
        except OSError as error:
            raise DumpError(f"{final}: cannot be {'extended' if appending else 'written'} ({error})")
    return non_finite


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump", help="a dump directory such as SAVE/wgrads/iter_0000001")
    parser.add_argument("--out", required=True,
                        help="shard directory to write (created if missing); one holding shards.json already "
                             "gets this dump added (the same tp, pp and stage layers, no dataset twice)")
    parser.add_argument("--kind", choices=("grads", "params"), help="default: from the dump path (wgrads/params)")
    parser.add_argument("--step", type=int, help="golden step the dump belongs to (default: N of iter_N)")
    parser.add_argument("--loss-scale", type=float, metavar="X",
                        help="divide every gradient by X: the loss scale the run's backward pass used (its "
                             "--loss-scale, or the dynamic scale of an --fp16 run); required for an fp16 dump")
    parser.add_argument("--tie-embeddings", choices=("true", "false"),
                        help="whether the run tied embeddings (default: as the golden file says)")
    parser.add_argument("--tied-embedding-grads", choices=("summed", "partial"), default="summed",
                        help="summed: both stages' copies already hold the sum (Megatron-LM dumps after the "
                             "embedding all-reduce); partial: each holds its own part")
    parser.add_argument("--trusted-dump", action="store_true",
                        help="load the dump with torch.load(weights_only=False): only for a dump you trust, as "
                             "loading it then runs any code its pickles name (without it, a dump holding more "
                             "than tensors, dicts and numbers is refused)")
    args = parser.parse_args()
    temporaries: List[Tuple[str, str]] = []
    created = succeeded = False
    try:
        path_kind, path_step = parse_dump_path(args.dump)
        kind, step = args.kind or path_kind, args.step if args.step is not None else path_step
        if kind is None or step is None:
            raise DumpError(f"{args.dump}: cannot tell the kind and step from the path; give --kind and --step")
        check_loss_scale_option(kind, args.loss_scale)
        files, tp, pp = find_rank_files(args.dump)
        rank_tensors = {key: load_rank(path, args.trusted_dump) for key, path in files.items()}
        layout = {"format": "touchstone-shards", "format_version": 1, "tp": tp, "pp": pp,
                  "stage_layers": stage_layers(rank_tensors, tp, pp),
                  "tied_embedding_grads": args.tied_embedding_grads}
        check_fp16_loss_scale(kind, args.loss_scale, rank_tensors, files)
        if args.tie_embeddings:
            layout["tie_embeddings"] = args.tie_embeddings == "true"
        this_import = {"source": os.path.abspath(args.dump), "kind": kind, "step": step}
        if args.loss_scale is not None:
            this_import["loss_scale_removed"] = args.loss_scale  # of these gradients only
        if os.path.lexists(args.out) and not (os.path.isdir(args.out) and not os.path.islink(args.out)):
            raise DumpError(f"{args.out}: exists and is not a directory")
        existing = existing_layout(args.out, layout) if os.path.isdir(args.out) else None
        if existing is not None:
            if "imports" not in existing and "source" in existing:  # written before imports were listed
                first = {"source": existing.pop("source")}
                if "loss_scale_removed" in existing:
                    first.update(kind="grads", loss_scale_removed=existing.pop("loss_scale_removed"))
                existing["imports"] = [first]
            layout = dict(existing, **{k: v for k, v in layout.items() if k not in existing})
        layout["imports"] = list(existing.get("imports", []) if existing else []) + [this_import]
        if not os.path.isdir(args.out):
            os.makedirs(args.out)
            created = True
        non_finite = write_rank_files(args.out, rank_tensors, files, kind, step, args.loss_scale,
                                      existing is not None, temporaries)
        layout_path = os.path.join(args.out, "shards.json")
        regular_or_absent(layout_path)
        temporary = os.path.join(args.out, f".shards.json.tmp.{os.getpid()}")
        temporaries.append((temporary, layout_path))
        with open(temporary, "w") as f:
            json.dump(layout, f, indent=2)
        for temporary, final in temporaries:  # everything is written: into place
            regular_or_absent(final)
            os.replace(temporary, final)
        temporaries.clear()
        succeeded = True
        scaled = f", divided by loss scale {args.loss_scale:g}" if args.loss_scale is not None else ""
        copies = sorted({STORED_DTYPES[t.dtype] for ts in rank_tensors.values() for t in ts.values()
                         if kind == "params" and t.dtype in STORED_DTYPES})
        stored = f" ({' and '.join(copies)} copies, stored_dtype set)" if copies else ""
        print(f"{'added to' if existing is not None else 'wrote'} {args.out}: tp {tp}, pp {pp}, stage layers "
              f"{layout['stage_layers']}, {kind} of step {step}{scaled}{stored}")
        if non_finite and kind == "grads":
            print(f"note: {len(non_finite)} gradients hold inf or NaN ({sorted(non_finite)[0]}, ...): under a loss "
                  "scale, an iteration that overflowed, whose update Megatron-LM's optimizer skips "
                  "(MixedPrecisionOptimizer.prepare_grads); dump one that did not")
    except (DumpError, OSError) as error:
        message = str(error) if isinstance(error, DumpError) else f"{args.out}: cannot be written ({error})"
        print(f"import_megatron_dump.py: error: {message}", file=sys.stderr)
        return 2
    finally:  # a refused or failed import leaves OUT as it was
        for temporary, _ in temporaries:
            if os.path.lexists(temporary):
                os.remove(temporary)
        if created and not succeeded:
            try:
                os.rmdir(args.out)
            except OSError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
