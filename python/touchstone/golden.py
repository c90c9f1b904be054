"""Reading a golden file (docs/golden-format.md): config, initial parameters, batches, expected values.

A golden file records a short FP64 training run: the batches, the parameters before step 1, and for
every step the loss, the loss-token count, the gradients, the gradient norm, the learning rate and the
parameters after the update. `GoldenFile` reads it lazily: every tensor is read from HDF5 when asked
for, one at a time, so a 1B-parameter file is never held in memory whole.

    with GoldenFile("golden.h5") as golden:
        for micro in golden.micro_batches(step=1):          # Megatron-LM's order, dp = 1
            logits = model(micro.tokens, micro.position_ids, ...)
            loss = token_loss_sum(logits, micro.targets) * micro.loss_weight
        expected = golden.expected(1)
        print(expected.loss, expected.num_loss_tokens, expected.grad("output_layer.weight"))

Bad input (not a golden file, another format version, a root attribute, config key or dataset of the
wrong type, shape or range, a step or tensor the file does not hold, a file damaged so that the HDF5
library would crash on it) is a `ValueError` whose one-line message names the file and the key. Every
file is first read whole once in a child process (touchstone/h5_walk.py, python/README.md "Damaged
files"), so that a crash of the library is the child's, not the caller's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import h5py
import numpy as np

from touchstone.golden_config import check_model, parse_golden_config
from touchstone.h5_walk import check_in_child_process

FORMAT = "touchstone-golden"
FORMAT_VERSION = 1
BATCH_KEYS = ("tokens", "targets", "position_ids", "document_ids")
IGNORE_INDEX = -100  # a target without loss (Megatron-LM's loss_mask 0)
PRECISIONS = ("fp64", "fp32", "bf16")
# What h5py raises for a file, object or value it cannot read; each becomes a ValueError naming it.
_H5PY_REFUSALS = (OSError, KeyError, ValueError, TypeError, RuntimeError, NotImplementedError)


def parameter_names(model: Mapping[str, Any]) -> List[str]:
    """The contract's parameter names in data-flow order (docs/golden-format.md "Parameters")."""
    check_model(model)
    names = ["embedding.word_embeddings.weight"]
    for layer in range(int(model["num_layers"])):
        prefix = f"decoder.layers.{layer}."
        names += [prefix + suffix for suffix in (
            "input_layernorm.weight", "self_attention.linear_qkv.weight",
            "self_attention.linear_proj.weight", "pre_mlp_layernorm.weight",
            "mlp.linear_fc1.weight", "mlp.linear_fc2.weight")]
    names.append("decoder.final_layernorm.weight")
    if not model["tie_embeddings"]:
        names.append("output_layer.weight")
    return names


def parameter_shape(model: Mapping[str, Any], name: str) -> Tuple[int, ...]:
    """The full shape of the contract parameter `name` (ValueError for a name the model lacks)."""
    check_model(model)
    V, H, F = int(model["vocab_size"]), int(model["hidden_size"]), int(model["ffn_hidden_size"])
    NH, NKV = int(model["num_heads"]), int(model["num_kv_heads"])
    D = H // NH
    if name not in parameter_names(model):
        raise ValueError(f"{name}: not a parameter of the golden model")
    suffix = name.split(".", 3)[-1] if name.startswith("decoder.layers.") else name
    shapes = {
        "embedding.word_embeddings.weight": (V, H), "output_layer.weight": (V, H),
        "decoder.final_layernorm.weight": (H,), "input_layernorm.weight": (H,),
        "pre_mlp_layernorm.weight": (H,), "self_attention.linear_qkv.weight": ((NH + 2 * NKV) * D, H),
        "self_attention.linear_proj.weight": (H, NH * D), "mlp.linear_fc1.weight": (2 * F, H),
        "mlp.linear_fc2.weight": (H, F)}
    return shapes[suffix]


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of a step's global batch, as one data-parallel rank runs it.

    Arrays are int64 [mbs, T]. `rows` are the global sample rows of /batch (Megatron-LM's order:
    micro-batch j of dp rank r holds rows j*mbs*dp + r*mbs ... + mbs - 1). `loss_weight` is what the sum
    of this micro-batch's per-token cross entropies is multiplied by so that the accumulated gradient
    is the golden objective's: 1/N_global for global_token_mean, 1/(N_micro * B/mbs) for
    per_microbatch_mean (docs/contract.md "Objective").
    """

    step: int
    index: int          # j: the micro-batch's place on its data-parallel rank
    dp_rank: int
    rows: range
    tokens: np.ndarray
    targets: np.ndarray         # already shifted: position i is trained to predict targets[i]
    position_ids: np.ndarray
    document_ids: np.ndarray    # -1 marks padding
    num_loss_tokens: int        # this micro-batch's positions with a target other than -100
    loss_weight: float


@dataclass(frozen=True)
class Batch:
    """A step's whole global batch: int64 arrays [B, T] in global sample order."""

    step: int
    tokens: np.ndarray
    targets: np.ndarray
    position_ids: np.ndarray
    document_ids: np.ndarray

    @property
    def num_loss_tokens(self) -> int:
        return int((self.targets != IGNORE_INDEX).sum())


class Expected:
    """What the golden file records for one step; each tensor is read when asked for."""

    def __init__(self, golden: "GoldenFile", step: int):
        self._golden, self.step = golden, step
        self._group = f"steps/{step}"

    def _scalar(self, key: str, kinds: str = "fiu") -> Any:
        return self._golden._scalar(f"{self._group}/{key}", kinds)

    @property
    def loss(self) -> float:
        """The objective whose gradient `grad` is (for per_microbatch_mean, not Megatron's "lm loss")."""
        return float(self._scalar("loss"))

    @property
    def num_loss_tokens(self) -> int:
        count = self._scalar("num_loss_tokens")
        if not (np.isfinite(count) and count == int(count) and count >= 0):
            raise ValueError(f"{self._golden.path}: /{self._group}/num_loss_tokens: {count} is not a count")
        return int(count)

    @property
    def grad_norm(self) -> float:
        return float(self._scalar("grad_norm"))

    @property
    def lr(self) -> float:
        """The learning rate update `step` used."""
        return float(self._scalar("lr"))

    def token_losses(self) -> np.ndarray:
        """[B, T] cross entropy of every position (0 where the target is -100)."""
        key = f"{self._group}/token_losses"
        dataset = self._golden._read(key, "f")
        batch = (self._golden.global_batch_size, self._golden.model["seq_length"])
        if tuple(dataset.shape) != batch:
            raise ValueError(f"{self._golden.path}: /{key} has shape {list(dataset.shape)}, the batch's is "
                             f"{list(batch)}")
        return self._golden._values(key, dataset)

    def grad(self, name: str) -> np.ndarray:
        """The gradient of `name` before clipping, after the data-parallel reduction."""
        return self._golden._tensor(f"{self._group}/grads", name)

    def param(self, name: str) -> np.ndarray:
        """`name` after update `step`."""
        return self._golden._tensor(f"{self._group}/params", name)

    def grads(self) -> Iterator[Tuple[str, np.ndarray]]:
        for name in self._golden.parameter_names():
            yield name, self.grad(name)

    def params(self) -> Iterator[Tuple[str, np.ndarray]]:
        for name in self._golden.parameter_names():
            yield name, self.param(name)


class GoldenFile:
    """A golden file opened read-only. Use as a context manager, or call close()."""

    def __init__(self, path: "os.PathLike[str] | str"):
        try:
            self.path = os.fsdecode(os.fspath(path))
        except TypeError:
            raise ValueError(f"{path!r}: not a file path") from None
        # A damaged file can crash the HDF5 library itself: read it whole in a child process first.
        check_in_child_process(self.path)
        try:
            self._file = h5py.File(self.path, "r")
        except _H5PY_REFUSALS as e:
            raise ValueError(f"{self.path}: cannot be read as a golden file ({_first_line(e)})") from None
        try:
            self._check_format()
            self.config: Dict[str, Any] = parse_golden_config(self._attr("config"), self.path)
            if self._has_attr("precision"):
                self._check_precision()
            _ = self.tolerance_model
        except BaseException:
            self._file.close()
            raise

    # -- the file and its attributes ---------------------------------------------------------------

    def _attr(self, key: str, kind: str = "string") -> Any:
        """Root attribute `key`: one value, a str for kind "string", an int for kind "integer"."""
        if not self._has_attr(key):
            raise ValueError(f"{self.path}: no root attribute '{key}'")
        try:
            stored = self._file.attrs.get_id(key)
            dtype, shape = stored.dtype, stored.shape
            value = self._file.attrs[key]
        except _H5PY_REFUSALS as e:
            raise ValueError(f"{self.path}: root attribute {key}: cannot be read ({_first_line(e)})") from None
        # One value: a scalar, or a one-element array as some writers produce (the C++ reader's rule).
        if shape is None or int(np.prod(shape)) != 1:
            raise ValueError(f"{self.path}: root attribute {key}: is not a single value (shape "
                             f"{'null' if shape is None else list(shape)})")
        if shape:
            value = np.asarray(value).reshape(-1)[0]
        if kind == "integer":
            if dtype.kind not in "iu":
                raise ValueError(f"{self.path}: root attribute {key}: is not an integer ({_type_name(dtype)})")
            return int(value)
        if h5py.check_string_dtype(dtype) is None or not isinstance(value, (str, bytes)):
            raise ValueError(f"{self.path}: root attribute {key}: is not a string ({_type_name(dtype)})")
        try:
            return value.decode() if isinstance(value, bytes) else value
        except UnicodeDecodeError:
            raise ValueError(f"{self.path}: root attribute {key}: is not UTF-8 text") from None

    def _check_format(self) -> None:
        # The same words and the same rule as the C++ reader (oracle/golden/golden_reader.cpp): format is
        # the string "touchstone-golden", format_version an integer (of any width) equal to 1.
        if not self._has_attr("format") or self._attr_or_none("format") != FORMAT:
            raise ValueError(f'{self.path}: not a golden file (root attribute format is not "{FORMAT}")')
        version = self._attr("format_version", "integer")
        if version != FORMAT_VERSION:
            raise ValueError(f"{self.path}: golden format_version {version} is not supported ({FORMAT_VERSION} is)")

    def _has_attr(self, key: str) -> bool:
        try:
            return key in self._file.attrs
        except _H5PY_REFUSALS as e:
            raise ValueError(f"{self.path}: root attribute {key}: cannot be read ({_first_line(e)})") from None

    def _attr_or_none(self, key: str) -> Optional[str]:
        """String attribute `key`, or None when it is not one string."""
        try:
            return self._attr(key)
        except ValueError:
            return None

    def _check_precision(self) -> None:
        precision = self._attr("precision")
        if precision not in PRECISIONS:
            raise ValueError(f'{self.path}: root attribute precision: is "{precision[:40]}", not one of '
                             + ", ".join(f'"{p}"' for p in PRECISIONS))

    def _read(self, key: str, kinds: str = "fiu") -> h5py.Dataset:
        """Dataset /`key`, whose dtype is of one of numpy's `kinds` ("f" float, "i" and "u" integers)."""
        try:
            item = self._file.get(key)
        except _H5PY_REFUSALS as e:
            raise ValueError(f"{self.path}: /{key}: cannot be read ({_first_line(e)})") from None
        if not isinstance(item, h5py.Dataset):
            raise ValueError(f"{self.path}: no dataset /{key}")
        try:
            dtype, shape = item.dtype, item.shape
        except _H5PY_REFUSALS as e:
            raise ValueError(f"{self.path}: /{key}: cannot be read ({_first_line(e)})") from None
        if dtype.kind not in kinds or shape is None:
            what = {"f": "floating-point", "iu": "integer"}.get(kinds, "numeric")
            raise ValueError(f"{self.path}: /{key}: holds {dtype} values {'null' if shape is None else list(shape)}, "
                             f"not {what} ones")
        return item

    def _values(self, key: str, dataset: h5py.Dataset, selection: Any = ()) -> np.ndarray:
        try:
            return dataset[selection]
        except _H5PY_REFUSALS as e:
            raise ValueError(f"{self.path}: /{key}: cannot be read ({_first_line(e)})") from None

    def _scalar(self, key: str, kinds: str = "fiu") -> Any:
        dataset = self._read(key, kinds)
        if dataset.shape not in ((), (1,)):
            raise ValueError(f"{self.path}: /{key}: has shape {list(dataset.shape)}, not a single value")
        return np.asarray(self._values(key, dataset)).reshape(-1)[0]

    def _tensor(self, group: str, name: str) -> np.ndarray:
        expected = parameter_shape(self.model, name)
        key = f"{group}/{name}"
        dataset = self._read(key, "f")
        if tuple(dataset.shape) != expected:
            raise ValueError(f"{self.path}: /{group}/{name} has shape {list(dataset.shape)}, the model's "
                             f"is {list(expected)}")
        return self._values(key, dataset)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "GoldenFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the run ------------------------------------------------------------------------------------

    @property
    def model(self) -> Dict[str, Any]:
        return self.config["model"]

    @property
    def precision(self) -> str:
        self._check_precision()
        return self._attr("precision")

    @property
    def loss_normalization(self) -> str:
        return str(self.config["train"]["loss_normalization"])

    @property
    def micro_batch_size(self) -> int:
        return int(self.config["train"]["micro_batch_size"])

    @property
    def global_batch_size(self) -> int:
        return int(self.config["train"]["global_batch_size"])

    @property
    def document_masking(self) -> bool:
        return bool(self.config["data"]["document_masking"])

    @property
    def param_dtype(self) -> np.dtype:
        """float64 for FP64 golden files, float32 for FP32 and BF16 ones (their master weights)."""
        return np.dtype(np.float64 if self.precision == "fp64" else np.float32)

    @property
    def tolerance_model(self) -> Dict[str, Any]:
        if not self._has_attr("tolerance_model"):
            return {"kind": "fp64", "relative_l2": 1e-10}
        text = self._attr("tolerance_model")
        try:
            model = json.loads(text)
        except (ValueError, RecursionError):
            raise ValueError(f"{self.path}: root attribute tolerance_model: is not valid JSON") from None
        if not isinstance(model, dict) or not isinstance(model.get("kind"), str):
            raise ValueError(f"{self.path}: root attribute tolerance_model: is not a JSON object with a "
                             "string \"kind\"")
        return model

    @property
    def steps(self) -> List[int]:
        """The recorded step numbers, in numeric order."""
        try:
            group = self._file.get("steps")
            names = list(group) if isinstance(group, h5py.Group) else []
        except _H5PY_REFUSALS as e:
            raise ValueError(f"{self.path}: /steps: cannot be listed ({_first_line(e)})") from None
        # As the C++ reader: a name that is not a step number (1, 2, ...) is ignored.
        return sorted(int(k) for k in names if k.isascii() and k.isdigit() and int(k) > 0)

    def parameter_names(self) -> List[str]:
        return parameter_names(self.model)

    def _check_step(self, step: int, allow_zero: bool = False) -> None:
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise ValueError(f"{self.path}: step {step!r} is not a step number (1, 2, ...)")
        if not (allow_zero and step == 0) and step not in self.steps:
            recorded = self.steps
            raise ValueError(f"{self.path}: step {step} is not recorded (steps "
                             f"{recorded[0] if recorded else '-'}..{recorded[-1] if recorded else '-'})")

    # -- parameters ---------------------------------------------------------------------------------

    def init_param(self, name: str) -> np.ndarray:
        return self._tensor("params/init", name)

    def init_params(self) -> Iterator[Tuple[str, np.ndarray]]:
        """Every parameter before step 1, one at a time, in data-flow order."""
        for name in self.parameter_names():
            yield name, self.init_param(name)

    def params(self, step: int) -> Iterator[Tuple[str, np.ndarray]]:
        """The parameters after update `step`, one at a time; step 0 is /params/init."""
        self._check_step(step, allow_zero=True)
        if step == 0:
            return self.init_params()
        return self.expected(step).params()

    # -- batches ------------------------------------------------------------------------------------

    def batch(self, step: int) -> Batch:
        """Step `step`'s global batch (row step-1 of every /batch dataset)."""
        self._check_step(step)
        arrays = {}
        B, T = self.global_batch_size, int(self.model["seq_length"])
        for key in BATCH_KEYS:
            dataset = self._read(f"batch/{key}", "iu")
            if dataset.ndim != 3 or dataset.shape[0] < step or dataset.shape[1:] != (B, T):
                raise ValueError(f"{self.path}: /batch/{key} has shape {list(dataset.shape)}, which holds no "
                                 f"batch for step {step} of [{B}, {T}]")
            arrays[key] = np.asarray(self._values(f"batch/{key}", dataset, step - 1), dtype=np.int64)
        # Values a trainer would index with (an embedding row, a RoPE position) must be in range.
        V = int(self.model["vocab_size"])
        for key, low, high, extra in (("tokens", 0, V, None), ("targets", 0, V, IGNORE_INDEX),
                                      ("position_ids", 0, T, None), ("document_ids", -1, 2**63 - 1, None)):
            values = arrays[key]
            bad = (values < low) | (values >= high)
            if extra is not None:
                bad &= values != extra
            if bad.any():
                raise ValueError(f"{self.path}: /batch/{key}: step {step} holds {int(values[bad][0])}, outside "
                                 f"[{low}, {high})" + (f" (and not {extra})" if extra is not None else ""))
        return Batch(step=step, **arrays)

    def micro_batches(self, step: int, dp: int = 1, dp_rank: Optional[int] = None) -> List[MicroBatch]:
        """Step `step`'s batch cut into micro-batches of train.micro_batch_size windows.

        With `dp_rank`, the micro-batches data-parallel rank `dp_rank` of `dp` runs, in its order;
        without, every rank's, in global order (micro-batch j of rank r is number j*dp + r).
        """
        batch, mbs = self.batch(step), self.micro_batch_size
        B = batch.tokens.shape[0]
        if isinstance(dp, bool) or not isinstance(dp, (int, np.integer)) or dp < 1 or B % (mbs * dp) != 0:
            raise ValueError(f"{self.path}: a global batch of {B} windows does not split into micro-batches of "
                             f"{mbs} on {dp} data-parallel ranks")
        if dp_rank is not None and (isinstance(dp_rank, bool) or not isinstance(dp_rank, (int, np.integer))
                                    or not 0 <= dp_rank < dp):
            raise ValueError(f"dp_rank {dp_rank} is not in 0..{dp - 1}")
        per_rank = B // (mbs * dp)
        total = batch.num_loss_tokens
        out = []
        for j in range(per_rank):
            for r in range(dp) if dp_rank is None else (dp_rank,):
                rows = range(j * mbs * dp + r * mbs, j * mbs * dp + (r + 1) * mbs)
                sl = slice(rows.start, rows.stop)
                targets = batch.targets[sl]
                count = int((targets != IGNORE_INDEX).sum())
                if self.loss_normalization == "global_token_mean":
                    weight = 1.0 / max(total, 1)
                else:  # each micro-batch's own mean, averaged over all B/mbs micro-batches
                    weight = 1.0 / (max(count, 1) * (B // mbs))
                out.append(MicroBatch(step=step, index=j, dp_rank=r, rows=rows, tokens=batch.tokens[sl],
                                      targets=targets, position_ids=batch.position_ids[sl],
                                      document_ids=batch.document_ids[sl], num_loss_tokens=count,
                                      loss_weight=weight))
        return out

    # -- expected values ----------------------------------------------------------------------------

    def expected(self, step: int) -> Expected:
        self._check_step(step)
        return Expected(self, step)


def _type_name(dtype: np.dtype) -> str:
    return "a string" if h5py.check_string_dtype(dtype) is not None else str(dtype)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
