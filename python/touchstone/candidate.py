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
temporary next to it (`<path>.tmp.<pid>`, created exclusively, so that nothing planted there is followed),
synced and renamed. An existing regular file at `path` is replaced then; an empty path, a directory, a
symbolic link or another non-regular file there is refused before anything is written (the C++
outputs' policy, common/text_output.h). Every argument is checked before it is written: a value that is
not one number, a tensor that is not a dense array of real numbers (a sparse or meta torch tensor,
strings), a name that is not a single HDF5 name, and every error of the file system (a read-only
directory, a full disk) are ValueErrors naming the path and the key.
"""

from __future__ import annotations

import math
import os
import stat
from typing import Any, Iterable, Mapping, Optional, Set, Tuple, Union

import h5py
import numpy as np

from touchstone.golden import GoldenFile, _first_line, parameter_names, parameter_shape

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


def numeric_array(tensor: Any, what: str) -> np.ndarray:
    """`tensor` as a numpy array of real numbers; ValueError naming `what` for anything else (a sparse,
    meta or quantized torch tensor, strings, objects, complex numbers)."""
    layout = str(getattr(tensor, "layout", "torch.strided"))
    if hasattr(tensor, "detach") and (layout != "torch.strided" or getattr(tensor, "is_meta", False)):
        raise ValueError(f"{what}: a {'meta' if getattr(tensor, 'is_meta', False) else layout} tensor, not a dense "
                         "one")
    try:
        array = to_numpy(tensor)
    except (TypeError, ValueError, RuntimeError, NotImplementedError) as e:
        raise ValueError(f"{what}: is not an array of numbers ({_first_line(e)})") from None
    if array.dtype.kind not in "iuf":
        raise ValueError(f"{what}: holds {array.dtype} values, not real numbers")
    return array


def scalar(value: Any, what: str) -> float:
    """One real number (a Python number, a numpy or torch scalar or one-element array) as a float."""
    array = numeric_array(value, what)
    if array.size != 1:
        raise ValueError(f"{what}: is not a single number (shape {list(array.shape)})")
    return float(array.reshape(-1)[0])


def named_items(tensors: Tensors) -> Iterable[Tuple[str, Any]]:
    """(name, tensor) pairs of a mapping or of an iterable of pairs."""
    return tensors.items() if isinstance(tensors, Mapping) else tensors


def check_output_path(path: str) -> None:
    """Refuses an output path that is empty or names a directory, whose parent is missing, or whose
    existing entry is not a regular file (common/text_output.h: the same policy as the C++ outputs)."""
    if not path:
        raise ValueError("the candidate's output path is empty")
    if path.endswith(os.sep) or (os.altsep and path.endswith(os.altsep)):
        raise ValueError(f"{path}: names a directory, not a file")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"{path}: the directory {parent} does not exist")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise ValueError(f"{path}: cannot be written ({e.strerror})") from None
    if mode is not None and not stat.S_ISREG(mode):
        raise ValueError(f"{path}: exists and is not a regular file (a directory, link or device is never "
                         "replaced)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{path}: cannot be written (the directory {parent} is not writable)")


class CandidateWriter:
    """Writes a candidate HDF5 file in the golden layout; use as a context manager."""

    def __init__(self, path: "os.PathLike[str] | str", golden: Optional[GoldenFile] = None,
                 generator: str = "", dtype: Any = None):
        # Every argument is checked before anything is written.
        try:
            self.path = os.fspath(path)
        except TypeError:
            raise ValueError(f"{path!r}: not a file path") from None
        if not isinstance(self.path, str):
            self.path = os.fsdecode(self.path)
        if golden is not None and not isinstance(golden, GoldenFile):
            raise ValueError(f"{self.path}: golden is of type {type(golden).__name__}, not GoldenFile")
        if not isinstance(generator, str):
            raise ValueError(f"{self.path}: generator is of type {type(generator).__name__}, not str")
        self._model = golden.model if golden is not None else None
        if dtype is None:
            dtype = golden.param_dtype if golden is not None else np.float64
        try:
            self._dtype = np.dtype(dtype)
        except TypeError:
            raise ValueError(f"{self.path}: dtype {dtype!r} is not a numpy dtype (float64 or float32)") from None
        if self._dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
            raise ValueError(f"{self.path}: tensors are stored as float64 or float32, not {self._dtype}")
        check_output_path(self.path)
        self._temporary = f"{self.path}.tmp.{os.getpid()}"
        self._written: Set[str] = set()
        self._file: Optional[h5py.File] = None
        try:
            # O_EXCL: a link or a file planted at the temporary's name is never followed or truncated.
            os.close(os.open(self._temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            self._file = h5py.File(self._temporary, "w")
            if generator:
                self._file.attrs["generator"] = generator
        except FileExistsError:
            raise ValueError(f"{self.path}: the temporary {self._temporary} exists already (another writer of "
                             "this path in this process, or one killed outright: then delete it)") from None
        except OSError as e:
            self.abort()
            raise ValueError(f"{self.path}: cannot be written ({_first_line(e)})") from None

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
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 1:
            raise ValueError(f"{self.path}: step {step!r} is not a step number (1, 2, ...)")
        group = f"steps/{int(step)}"
        # Every argument is checked before any of them is written (tensors as they come, below).
        scalars = {key: scalar(value, f"{self.path}: {group}/{key}")
                   for key, value in (("loss", loss), ("grad_norm", grad_norm), ("lr", lr)) if value is not None}
        count = None
        if num_loss_tokens is not None:
            count = scalar(num_loss_tokens, f"{self.path}: {group}/num_loss_tokens")
            if not math.isfinite(count) or count != int(count) or count < 0:
                raise ValueError(f"{self.path}: {group}/num_loss_tokens {count} is not a whole number")
        losses = None
        if token_losses is not None:
            losses = numeric_array(token_losses, f"{self.path}: {group}/token_losses")
            if losses.ndim != 2:
                raise ValueError(f"{self.path}: {group}/token_losses has shape {list(losses.shape)}, not [B, T]")
        for key, value in scalars.items():
            self._write(f"{group}/{key}", np.float64(value))
        if count is not None:
            self._write(f"{group}/num_loss_tokens", np.int64(int(count)))
        if losses is not None:
            self._write(f"{group}/token_losses", losses.astype(np.float64))
        for sub, tensors in (("grads", grads), ("params", params), ("optimizer/exp_avg", exp_avg),
                             ("optimizer/exp_avg_sq", exp_avg_sq)):
            if tensors is not None:
                self._write_tensors(f"{group}/{sub}", tensors)

    # -- writing --------------------------------------------------------------------------------------

    def _write_tensors(self, group: str, tensors: Tensors) -> None:
        parameters = group == "params/init" or group.endswith("/params")
        if isinstance(tensors, (str, bytes)) or not isinstance(tensors, (Mapping, Iterable)):
            raise ValueError(f"{self.path}: {group}: is of type {type(tensors).__name__}, not a mapping or pairs of "
                             "(name, tensor)")
        for item in named_items(tensors):
            if not isinstance(item, tuple) or len(item) != 2:
                raise ValueError(f"{self.path}: {group}: holds a {type(item).__name__}, not a (name, tensor) pair")
            name, tensor = item
            if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
                raise ValueError(f"{self.path}: {group}: tensor name {name!r} is not a parameter name")
            stored = STORED_DTYPES.get(str(getattr(tensor, "dtype", ""))) if hasattr(tensor, "detach") else None
            array = numeric_array(tensor, f"{self.path}: candidate tensor {group}/{name}")
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
        try:
            return self._file.create_dataset(key, data=value)
        except (OSError, RuntimeError) as e:  # a full disk, an I/O error
            raise ValueError(f"{self.path}: cannot write {key} ({_first_line(e)})") from None

    def close(self) -> None:
        """Finishes the file and moves it to `path` (re-checking that nothing non-regular appeared)."""
        if self._file is None:
            return
        try:
            self._file.close()
            self._file = None
            # Synced before the rename, and the rename synced after, as the C++ writers do: a crash
            # leaves the old file or the new one at `path`, never a part of the new one.
            descriptor = os.open(self._temporary, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
            check_output_path(self.path)
            os.replace(self._temporary, self.path)
            _sync_directory(os.path.dirname(os.path.abspath(self.path)))
        except OSError as e:
            self.abort()
            raise ValueError(f"{self.path}: cannot be written ({_first_line(e)})") from None
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Drops the file: nothing appears at `path`, an existing file there is left as it was."""
        if self._file is not None:
            try:
                self._file.close()
            except (OSError, RuntimeError):
                pass  # the temporary is removed below whatever state it is in
            self._file = None
        try:
            os.remove(self._temporary)
        except FileNotFoundError:
            pass

    def __enter__(self) -> "CandidateWriter":
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


def _sync_directory(directory: str) -> None:
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # a platform without directory descriptors: the rename itself is still atomic
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)

