"""The six places where a float64 Megatron-Core GPTModel still computes in float32, and their fixes.

docs/frameworks/megatron-float32-sites.md lists them with file and function. Read in Megatron-Core
0.16.1 and 0.19.2 (`KNOWN_VERSIONS`); any other version is refused by `check_version`, since a site
moved or added there would silently round the run to float32 again.

| Site | What is float32 | Fix |
|---|---|---|
| `norm` | `WrappedTorchNorm` builds `torch.nn.RMSNorm` weights in float32 whatever `params_dtype` is | `fix_norms`: the weights of this model's norms made float64 before they are loaded |
| `rope` | `RotaryEmbedding.inv_freq` is built with `dtype=torch.float32`, so the angles, cos, sin are | `fix_rope`: this model's `inv_freq` replaced by `rope_theta ** (-2i / D)` in float64 |
| `cross_entropy` | `VocabParallelCrossEntropy.calculate_logits_max` casts the logits `.float()` | `fp64_cross_entropy()`: the same function without the cast, while the block runs |
| `loss_func` | Megatron-LM's `loss_func` (pretrain_gpt.py) takes `output_tensor.view(-1).float()` | `run.loss_func` keeps the dtype (with the site kept, it casts as Megatron-LM does) |
| `num_tokens` | `finalize_model_grads` scales by `1.0 / num_tokens` of an integer tensor: a float32 1/N | `fp64_finalize_model_grads`: the token count handed over as a float64 tensor |
| `grad_norm` | `get_grad_norm_fp32` accumulates the norm in a float32 tensor (`local_multi_tensor_l2_norm` returns float32) | `fp64_grad_norm()`: replaced in megatron.core.optimizer.optimizer by a float64 version while the block runs |

Not a float32 site but a refusal: `clip_grad_by_total_norm_fp32` asserts `param.grad.type() ==
'torch.cuda.FloatTensor'`, so a float64 run cannot clip at all. `fp64_clipping()` (always applied by
`process_fixes`) replaces it, in megatron.core.optimizer.optimizer only, by the same scaling (coefficient
`max_norm / (total_norm + 1e-6)`, applied when < 1, in the gradients' dtype) without the assertion.

`sites` arguments name the fixes to apply (`SITES`, all by default); leaving one out runs Megatron-Core's
float32 code there, which the tests use to show each fix is needed. Every fix is checked against a
float64 formula by `check_fixes` (RuntimeError when a fixed site still rounds).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import runpy
from typing import Any, Callable, Iterable, Iterator, List, Optional

import torch

SITES = ("norm", "rope", "cross_entropy", "loss_func", "num_tokens", "grad_norm")

# Megatron-Core versions whose source was read for the sites above.
KNOWN_VERSIONS = {
    "0.16.1": "transformer/torch_norm.py, models/common/embeddings/rotary_pos_embedding.py, "
              "tensor_parallel/cross_entropy.py, distributed/finalize_model_grads.py, "
              "optimizer/clip_grads.py, utils.py read",
    "0.19.2": "the same files read; the sites are where 0.16.1 has them",
}


def megatron_version() -> str:
    """megatron.core's version, read from its package_info.py without importing megatron.core (which
    takes seconds: the launcher checks the version before it spawns the ranks)."""
    spec = importlib.util.find_spec("megatron.core")
    if spec is None or not spec.origin:
        raise ValueError("megatron.core cannot be imported: put Megatron-Core on PYTHONPATH")
    # From VERSION, not __version__: 0.19.2's __version__ appends "+<commit>" of whatever git repository
    # holds the installed files (a checkout they were unpacked into, like build/megatron-core here).
    info = runpy.run_path(os.path.join(os.path.dirname(spec.origin), "package_info.py"))
    version = info.get("VERSION")
    if not isinstance(version, tuple) or len(version) < 3:
        raise ValueError(f"{spec.origin}: package_info.py has no VERSION (major, minor, patch, pre-release)")
    return ".".join(map(str, version[:3])) + "".join(map(str, version[3:]))


def check_version() -> str:
    """The installed Megatron-Core version; ValueError for one whose float32 sites were not read."""
    version = megatron_version()
    if version not in KNOWN_VERSIONS:
        raise ValueError(f"megatron.core {version}: its float32 sites have not been read (read: "
                         f"{', '.join(sorted(KNOWN_VERSIONS))}); see docs/frameworks/megatron-float32-sites.md")
    return version


def check_sites(sites: Iterable[str]) -> List[str]:
    sites = list(sites)
    for site in sites:
        if site not in SITES:
            raise ValueError(f"float32 site '{site}' is not one of {', '.join(SITES)}")
    return sites


# -- norm -------------------------------------------------------------------------------------------


def norm_modules(model: Any) -> List[torch.nn.Module]:
    return [m for m in model.modules() if isinstance(m, torch.nn.RMSNorm)]


def fix_norms(model: Any, dtype: torch.dtype = torch.float64) -> int:
    """Makes this model's RMSNorm weights `dtype` (before loading and before DDP); returns how many."""
    modules = norm_modules(model)
    for module in modules:
        module.to(dtype)
    return len(modules)


# -- rope -------------------------------------------------------------------------------------------


def contract_inv_freq(theta: float, dim: int) -> torch.Tensor:
    """inv_freq[i] = theta ** (-2 i / D) in float64, as the C++ reference's std::pow."""
    return torch.tensor([math.pow(theta, -2.0 * i / dim) for i in range(dim // 2)], dtype=torch.float64)


def fix_rope(model: Any, theta: float) -> None:
    rope = getattr(model, "rotary_pos_emb", None)
    if rope is None:
        raise ValueError("the model has no rotary_pos_emb: not a RoPE GPTModel")
    dim = 2 * rope.inv_freq.numel()
    rope.inv_freq = contract_inv_freq(theta, dim)
    rope.forward.cache_clear() if hasattr(rope.forward, "cache_clear") else None


# -- cross_entropy ----------------------------------------------------------------------------------


@contextlib.contextmanager
def fp64_cross_entropy() -> Iterator[None]:
    """VocabParallelCrossEntropy's logits maximum without the `.float()`, while the block runs."""
    from megatron.core.tensor_parallel.cross_entropy import VocabParallelCrossEntropy

    original = VocabParallelCrossEntropy.__dict__["calculate_logits_max"]

    def calculate_logits_max(vocab_parallel_logits: torch.Tensor):
        # Megatron-Core's lines but the cast; the logits stay in their own dtype.
        return vocab_parallel_logits, torch.max(vocab_parallel_logits, dim=-1)[0]

    VocabParallelCrossEntropy.calculate_logits_max = staticmethod(calculate_logits_max)
    try:
        yield
    finally:
        VocabParallelCrossEntropy.calculate_logits_max = original


# -- num_tokens -------------------------------------------------------------------------------------


def fp64_num_tokens(num_tokens: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The token count as float64: `1.0 / num_tokens` is then float64 (an integer count is exact)."""
    return None if num_tokens is None else num_tokens.to(torch.float64)


def fp64_finalize_model_grads(finalize: Callable) -> Callable:
    """`finalize` (Megatron-Core's finalize_model_grads) given the token count in float64."""

    def finalize_model_grads(model, num_tokens=None, *args, **kwargs):
        return finalize(model, fp64_num_tokens(num_tokens), *args, **kwargs)

    return finalize_model_grads


# -- grad_norm --------------------------------------------------------------------------------------


def grad_norm_fp64(grads_for_norm, norm_type=2, grad_stats_parallel_group=None) -> float:
    """get_grad_norm_fp32's L2 norm in float64: squares summed per rank, all-reduced, square root."""
    if float(norm_type) != 2.0:
        raise ValueError(f"grad norm type {norm_type}: only the L2 norm is computed in float64")
    if isinstance(grads_for_norm, torch.Tensor):
        grads_for_norm = [grads_for_norm]
    total = torch.zeros(1, dtype=torch.float64)
    for grad in grads_for_norm:
        total += grad.detach().to(torch.float64).pow(2).sum()
    torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM, group=grad_stats_parallel_group)
    return math.sqrt(float(total.item()))


def clip_by_total_norm_fp64(parameters, max_norm, total_norm, use_decoupled_grad=False) -> None:
    """clip_grad_by_total_norm_fp32's scaling (coefficient max_norm / (norm + 1e-6), applied when < 1)
    in the gradients' own dtype, without its float32 assertion."""
    if use_decoupled_grad:
        raise ValueError("decoupled gradients (precision-aware optimizer) are not clipped in float64")
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    clip_coeff = float(max_norm) / (float(total_norm) + 1.0e-6)
    if clip_coeff < 1.0:
        for param in parameters:
            if param.grad is not None:
                param.grad.detach().mul_(clip_coeff)


@contextlib.contextmanager
def _replaced(name: str, value: Callable) -> Iterator[None]:
    """megatron.core.optimizer.optimizer.<name> (the name its optimizers call) is `value` in the block."""
    from megatron.core.optimizer import optimizer as module

    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


def fp64_grad_norm():
    """The optimizers' gradient norm in float64, while the block runs."""
    return _replaced("get_grad_norm_fp32", grad_norm_fp64)


def fp64_clipping():
    """The optimizers' clipping without its float32 assertion, while the block runs."""
    return _replaced("clip_grad_by_total_norm_fp32", clip_by_total_norm_fp64)


# -- the fixes applied, and checked ------------------------------------------------------------------


@contextlib.contextmanager
def process_fixes(sites: Iterable[str]) -> Iterator[None]:
    """The process-wide fixes among `sites` (cross_entropy, grad_norm) and `fp64_clipping`, undone
    when the block ends."""
    sites = check_sites(sites)
    with contextlib.ExitStack() as stack:
        stack.enter_context(fp64_clipping())
        if "cross_entropy" in sites:
            stack.enter_context(fp64_cross_entropy())
        if "grad_norm" in sites:
            stack.enter_context(fp64_grad_norm())
        yield


def _close(name: str, got: torch.Tensor, want: torch.Tensor, bound: float = 1e-13) -> float:
    if got.dtype != torch.float64:
        raise RuntimeError(f"float32 site {name}: computes in {got.dtype}, not float64")
    err = float((got - want).abs().max() / want.abs().max().clamp_min(1e-300))
    if not err <= bound:
        raise RuntimeError(f"float32 site {name}: differs from the float64 formula by {err:.3g} relative")
    return err


def check_fixes(model: Any, theta: float, sites: Iterable[str], tp_group: Any = None,
                finalize: Optional[Callable] = None, ddp_model: Any = None) -> dict:
    """Runs each fixed site of `model` on deterministic float64 inputs against a float64 formula.

    Returns {site: relative error}; RuntimeError when a fixed site computes otherwise. Call it inside
    `process_fixes(sites)`. The cross entropy is checked with this rank's vocabulary shard of logits
    over `tp_group`. With `finalize` (the finalize_model_grads_func to be installed) and `ddp_model`
    on a single rank, num_tokens is checked through it: every gradient 1, 3 tokens, must give 1/3 in
    float64 (the DDP buffer is left holding 1/3: zero it before training).
    """
    sites = check_sites(sites)
    g = torch.Generator().manual_seed(7)
    errors = {}
    with torch.no_grad():
        if "norm" in sites:
            for i, module in enumerate(norm_modules(model)):
                if module.weight.dtype != torch.float64:  # the loaded golden weights would be rounded
                    raise RuntimeError(f"float32 site norm: RMSNorm weight ({i}) is {module.weight.dtype}")
                x = torch.randn(3, 2, module.weight.numel(), dtype=torch.float64, generator=g)
                w = module.weight.detach().to(torch.float64)
                eps = module.eps
                want = w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))
                errors["norm"] = max(errors.get("norm", 0.0), _close(f"norm ({i})", module(x), want))
        if "rope" in sites and getattr(model, "rotary_pos_emb", None) is not None:
            rope = model.rotary_pos_emb
            dim = 2 * rope.inv_freq.numel()
            got = rope(8)  # [S, 1, 1, D]: angles position * inv_freq, both halves
            pos = torch.arange(8, dtype=torch.float64)[:, None]
            half = pos * contract_inv_freq(theta, dim)[None, :]
            want = torch.cat([half, half], dim=-1)[:, None, None, :]
            errors["rope"] = _close("rope", got, want, bound=0.0 if torch.equal(got, want) else 1e-15)
    if "cross_entropy" in sites:
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        world = torch.distributed.get_world_size(tp_group)
        rank = torch.distributed.get_rank(tp_group)
        full = 10.0 * torch.randn(2, 3, 8 * world, dtype=torch.float64, generator=g)
        target = torch.randint(0, 8 * world, (2, 3), generator=g)
        local = full[..., rank * 8:(rank + 1) * 8].clone()
        got = vocab_parallel_cross_entropy(local, target)
        want = torch.logsumexp(full, -1) - full.gather(-1, target[..., None])[..., 0]
        errors["cross_entropy"] = _close("cross_entropy", got, want)
    if "num_tokens" in sites and finalize is not None:
        if torch.distributed.get_world_size() != 1:
            raise ValueError("the num_tokens site is checked through finalize_model_grads on one rank only")
        params = [p for p in ddp_model.parameters() if p.requires_grad]
        for p in params:
            p.main_grad.fill_(1.0)
        finalize([ddp_model], torch.tensor(3, dtype=torch.int))
        got = torch.stack([p.main_grad.flatten()[0] for p in params])
        errors["num_tokens"] = _close("num_tokens", got, torch.full_like(got, 1.0 / 3.0), 0.0)
    elif "num_tokens" in sites:
        count = torch.tensor(12345, dtype=torch.int)
        got = 1.0 / torch.clamp(fp64_num_tokens(count), min=1)
        errors["num_tokens"] = _close("num_tokens", got, torch.tensor(1.0 / 12345, dtype=torch.float64), 0.0)
    if "grad_norm" in sites:
        from megatron.core.optimizer import optimizer as module

        grads = [torch.randn(5, 7, dtype=torch.float64, generator=g) * 1e-3 for _ in range(3)]
        local = sum(float((x * x).sum()) for x in grads)
        total = torch.tensor([local], dtype=torch.float64)
        torch.distributed.all_reduce(total)
        got = torch.tensor(module.get_grad_norm_fp32(grads, grad_stats_parallel_group=None),
                           dtype=torch.float64)
        errors["grad_norm"] = _close("grad_norm", got, torch.sqrt(total)[0])
    return errors
