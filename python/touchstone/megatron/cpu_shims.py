"""Lets Megatron-Core run on the CPU without changing one number: `with cpu_shims(): ...`.

Megatron-Core assumes a GPU even where the arithmetic does not need one: it allocates with
`device='cuda'` or `device=torch.cuda.current_device()`, moves tensors with `.cuda()`, calls
`torch.cuda.synchronize()` and `torch.cuda.current_stream()`, and its optimizers tell dtypes apart by
`tensor.type()` strings such as 'torch.cuda.FloatTensor'. Inside `cpu_shims()`:

- `torch.cuda.current_device()` answers 0, `synchronize()` does nothing, `current_stream()` /
  `default_stream()` answer a stream object whose `wait_stream`/`synchronize`/`record_event` do nothing;
- a torch function mode rewrites every `device` argument naming CUDA (a string, a torch.device or a
  bare device index, as `torch.cuda.current_device()` returns) to the CPU, also the positional device
  of `Tensor.to`;
- `Tensor.cuda()` returns the tensor itself;
- `Tensor.type()` without an argument answers the CUDA type name ('torch.cuda.DoubleTensor' for a
  float64 CPU tensor), as on the GPU.

None of them computes anything: they only decide where tensors live and what strings say. Everything
is put back as it was when the block ends (also on an exception). The shims are process-wide while the
block runs (torch's functions are module attributes), so run one Megatron-Core model per process.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode


def _is_cuda(device: Any) -> bool:
    if isinstance(device, bool):
        return False
    if isinstance(device, int):  # torch.cuda.current_device() is an index: cuda:<index>
        return True
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


class _CudaToCpu(TorchFunctionMode):
    """Rewrites CUDA device arguments to the CPU on every torch call made inside it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func in (torch.Tensor.to,) and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu") + tuple(args[2:])
        return func(*args, **kwargs)


class _NullStream:
    """What torch.cuda.current_stream() answers on the CPU: every operation is already in order."""

    def wait_stream(self, *args: Any, **kwargs: Any) -> None:
        return None

    def wait_event(self, *args: Any, **kwargs: Any) -> None:
        return None

    def record_event(self, *args: Any, **kwargs: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None


_CUDA_TYPE_NAMES = {
    torch.float64: "torch.cuda.DoubleTensor", torch.float32: "torch.cuda.FloatTensor",
    torch.float16: "torch.cuda.HalfTensor", torch.bfloat16: "torch.cuda.BFloat16Tensor",
    torch.int64: "torch.cuda.LongTensor", torch.int32: "torch.cuda.IntTensor",
    torch.bool: "torch.cuda.BoolTensor", torch.uint8: "torch.cuda.ByteTensor",
}


@contextlib.contextmanager
def cpu_shims() -> Iterator[None]:
    """Runs the block with the shims of the module docstring, and undoes them after it."""
    original_type = torch.Tensor.type

    def cuda_type(self: torch.Tensor, dtype: Any = None, *args: Any, **kwargs: Any) -> Any:
        if dtype is None and not args and not kwargs:
            return _CUDA_TYPE_NAMES.get(self.dtype, original_type(self))
        return original_type(self, dtype, *args, **kwargs)

    stream = _NullStream()
    replaced = [
        (torch.cuda, "current_device", lambda: 0),
        (torch.cuda, "synchronize", lambda *a, **k: None),
        (torch.cuda, "current_stream", lambda *a, **k: stream),
        (torch.cuda, "default_stream", lambda *a, **k: stream),
        (torch.Tensor, "cuda", lambda self, *a, **k: self),
        (torch.Tensor, "type", cuda_type),
    ]
    saved = [(owner, name, owner.__dict__.get(name, getattr(owner, name))) for owner, name, _ in replaced]
    try:
        for owner, name, value in replaced:
            setattr(owner, name, value)
        with _CudaToCpu():
            yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
