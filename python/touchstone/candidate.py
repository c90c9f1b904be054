"""Writing a candidate: another trainer's run in the golden file's layout, for `touchstone diff`.

A candidate holds what the other trainer computed, under the golden schema's paths
(docs/golden-format.md): /params/init, and per step the loss (the differentiated objective), the
loss-token count, the gradients before clipping, the gradient norm, the learning rate, the parameters
after the update and, optionally, the AdamW moments. Everything left out is reported as not compared.

    with CandidateWriter("candidate.h5", golden=golden, generator="my trainer") as out:
        out.write_init(model_params)
        out.write_step(1, loss=loss, num_loss_tokens=n, grad_norm=norm, lr=lr, grads=grads, params=params)

Tensors may be numpy arrays or torch tensors (bfloat16 ones are widened to float32) given as a mapping or
as an iterable of (name, tensor) pairs; each is written as it comes, so nothing is held twice. A torch
bfloat16 or float16 tensor of parameters (write_init, or params= of write_step) is a 16-bit copy of the
master weights (Megatron-LM's param.data under --bf16): it is written widened, with the attribute
stored_dtype = "bfloat16" or "float16", and `touchstone diff` compares it with the reference rounded to
that type (docs/diffing.md "16-bit parameter copies"). Names are
the contract's (convert Hugging Face names with `touchstone.hf.from_hf_state_dict`). With `golden`, every
name and shape is checked against the golden model as it is written: a name that matches no parameter
is a ValueError naming it.

The file appears at `path` only when the `with` block ends without an exception: it is written to a
temporary next to it and renamed. An existing regular file at `path` is replaced then; a directory, a
symbolic link or another non-regular file there is refused before anything is written.
"""

from __future__ import annotations

import math
import os
import stat
from typing import Any, Iterable, Mapping, Optional, Set, Tuple, Union

import h5py
import numpy as np

from touchstone.golden import GoldenFile, parameter_names, parameter_shape

Tensors = Union[Mapping[str, Any], Iterable[Tuple[str, Any]]]
# torch's 16-bit float types -> the stored_dtype attribute of a parameter copy in that type.
STORED_DTYPES = {"torch.bfloat16": "bfloat16", "torch.float16": "float16"}


def to_numpy(tensor: Any) -> np.ndarray:
    """A numpy copy of a numpy array or a torch tensor (bfloat16 and float16 widened to float32)."""
    if hasattr(tensor, "detach"):  # torch, without importing it
        tensor = tensor.detach().cpu()
        if str(tensor.dtype) in ("torch.bfloat16", "torch.float16"):
            tensor = tensor.float()
        return tensor.numpy()
    return np.asarray(tensor)


def named_items(tensors: Tensors) -> Iterable[Tuple[str, Any]]:
    """(name, tensor) pairs of a mapping or of an iterable of pairs."""
    return tensors.items() if isinstance(tensors, Mapping) else tensors


def check_output_path(path: str) -> None:
    """Refuses an output path whose parent is missing or whose existing entry is not a regular file."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"{path}: the directory {parent} does not exist")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path}: exists and is not a regular file (a directory, link or device is never "
                         "replaced)")


class CandidateWriter:
    """Writes a candidate HDF5 file in the golden layout; use as a context manager."""

    def __init__(self, path: "os.PathLike[str] | str", golden: Optional[GoldenFile] = None,
                 generator: str = "", dtype: Any = None):
        self.path = os.fspath(path)
        self._model = golden.model if golden is not None else None
        if dtype is None:
            dtype = golden.param_dtype if golden is not None else np.float64
        self._dtype = np.dtype(dtype)
        if self._dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
            raise ValueError(f"{self.path}: tensors are stored as float64 or float32, not {self._dtype}")
        check_output_path(self.path)
        self._temporary = f"{self.path}.tmp.{os.getpid()}"
        self._file: Optional[h5py.File] = h5py.File(self._temporary, "w")
        self._written: Set[str] = set()
        if generator:
            self._file.attrs["generator"] = generator

    # -- what a candidate holds -----------------------------------------------------------------------

    def write_init(self, params: Tensors) -> None:
        """The parameters the run started from (diff them with `touchstone diff --step 0` first)."""
        self._write_tensors("params/init", params)

    def write_step(self, step: int, *, loss: Optional[float] = None, num_loss_tokens: Any = None,
                   grad_norm: Optional[float] = None, lr: Optional[float] = None,
                   grads: Optional[Tensors] = None, params: Optional[Tensors] = None,
                   token_losses: Any = None, exp_avg: Optional[Tensors] = None,
                   exp_avg_sq: Optional[Tensors] = None) -> None:
        """Step `step` (1-based): any subset of what the golden file records for it."""
        if int(step) != step or step < 1:
            raise ValueError(f"{self.path}: step {step} is not a step number (1, 2, ...)")
        group = f"steps/{int(step)}"
        for key, value in (("loss", loss), ("grad_norm", grad_norm), ("lr", lr)):
            if value is not None:
                self._write(f"{group}/{key}", np.float64(float(to_numpy(value))))
        if num_loss_tokens is not None:
            count = float(to_numpy(num_loss_tokens))
            if not math.isfinite(count) or count != int(count):
                raise ValueError(f"{self.path}: {group}/num_loss_tokens {count} is not a whole number")
            self._write(f"{group}/num_loss_tokens", np.int64(int(count)))
        if token_losses is not None:
            self._write(f"{group}/token_losses", to_numpy(token_losses).astype(np.float64))
        for sub, tensors in (("grads", grads), ("params", params), ("optimizer/exp_avg", exp_avg),
                             ("optimizer/exp_avg_sq", exp_avg_sq)):
            if tensors is not None:
                self._write_tensors(f"{group}/{sub}", tensors)

    # -- writing --------------------------------------------------------------------------------------

    def _write_tensors(self, group: str, tensors: Tensors) -> None:
        parameters = group == "params/init" or group.endswith("/params")
        for name, tensor in named_items(tensors):
            stored = STORED_DTYPES.get(str(getattr(tensor, "dtype", ""))) if hasattr(tensor, "detach") else None
            array = to_numpy(tensor)
            if self._model is not None:
                if name not in parameter_names(self._model):
                    raise ValueError(
                        f"{self.path}: candidate tensor {group}/{name} matches no parameter of the golden model "
                        f"(names are the contract's, e.g. {parameter_names(self._model)[1]}; convert Hugging "
                        "Face names with touchstone.hf.from_hf_state_dict)")
                shape = parameter_shape(self._model, name)
                if tuple(array.shape) != shape:
                    raise ValueError(f"{self.path}: candidate tensor {group}/{name} has shape "
                                     f"{list(array.shape)}, the golden tensor is {list(shape)}")
            dataset = self._write(f"{group}/{name}", array.astype(self._dtype, copy=False))
            if parameters and stored:
                dataset.attrs["stored_dtype"] = stored

    def _write(self, key: str, value: Any) -> h5py.Dataset:
        if self._file is None:
            raise ValueError(f"{self.path}: the candidate is already closed")
        if key in self._written:
            raise ValueError(f"{self.path}: {key} is written twice")
        self._written.add(key)
        return self._file.create_dataset(key, data=value)

    def close(self) -> None:
        """Finishes the file and moves it to `path` (re-checking that nothing non-regular appeared)."""
        if self._file is None:
            return
        self._file.close()
        self._file = None
        try:
            check_output_path(self.path)
            os.replace(self._temporary, self.path)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Drops the file: nothing appears at `path`, an existing file there is left as it was."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if os.path.lexists(self._temporary):
            os.remove(self._temporary)

    def __enter__(self) -> "CandidateWriter":
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()
