"""Makes a float64 Hugging Face Llama compute in float64 everywhere: `exact_fp64(model)`.

A `LlamaForCausalLM` (or `LlamaModel`) converted with `.to(torch.float64)` still rounds to float32
at four places (docs/frameworks/hf-float32-sites.md lists them with file and line for 4.47.1 and
5.23.0; transformers/models/llama/modeling_llama.py unless named):

- "rope": `LlamaRotaryEmbedding`. Its `inv_freq` buffer is built in float32
  (`_compute_default_rope_parameters` in modeling_rope_utils.py in 4.47,
  `LlamaRotaryEmbedding.compute_default_rope_parameters` in 5.x), so it holds float32-rounded values
  even after `.to(torch.float64)`; its `forward` casts `inv_freq` and the positions with `.float()`
  and computes the angles, cos and sin in float32, casting only the result back to the input dtype.
- "rmsnorm": `LlamaRMSNorm.forward` does `hidden_states.to(torch.float32)` before the mean of squares
  and the rsqrt, then casts back.
- "softmax": eager attention calls `softmax(attn_weights, dim=-1, dtype=torch.float32)
  .to(query_states.dtype)`: inside `LlamaAttention.forward` in 4.47, inside the module function
  `eager_attention_forward` in 5.x. SDPA (`attn_implementation="sdpa"`, the default of 5.x) calls
  `torch.nn.functional.scaled_dot_product_attention` in the inputs' dtype: no float32 site.
- "loss": with `labels=`, `LlamaForCausalLM.forward` uses `ForCausalLMLoss` (loss/loss_utils.py),
  which starts with `logits = logits.float()`, so the loss and the gradient of the logits are float32.

With any of them left, logits and gradients differ from a float64 computation by about 1e-8..1e-6
relative; with all four replaced, by about 1e-15.

`exact_fp64` patches the given model instance only: it replaces the `forward` of each rotary
embedding and RMSNorm module by a float64 one (and recomputes `inv_freq` in float64), the `forward` of
each eager attention module by HF's with the softmax in the scores' dtype (an SDPA one is left as it
is), and gives the model a subclass of its own class whose `loss_function` is HF's `ForCausalLMLoss`
without the cast (with 5.x's `shift_labels=`). Nothing global (torch, the transformers module, other
models) changes. Everything else of HF's forward is kept: `apply_rotary_pos_emb`, `repeat_kv`, its
mask handling (a 4-D `attention_mask` is used as given: added to the scores by eager attention,
passed to SDPA, where a boolean one means "may attend"), cache and dropout. The replacements compute
what docs/contract.md states:

- RoPE: inv_freq[i] = rope_theta ** (-2 i / D) in float64 (as the C++ reference's `std::pow`),
  angle = position * inv_freq in float64, cos and sin in float64, rotate-half convention (HF's).
- RMSNorm: weight * (x * rsqrt(mean(x^2) + eps)) in the input dtype.
- softmax of the scores in the scores' dtype; cross entropy in the logits' dtype.

Before returning, it runs the patched modules of this model (and an SDPA attention, unpatched) on
small deterministic float64 inputs and compares them with an independent float64 computation
(touchstone/hf_fp64_check.py).

The version policy: for a transformers version in `KNOWN_VERSIONS` (its source was read for these
sites) a self-check failure is a RuntimeError. Any other version is patched by the API generation
its modules show (the 4.47 attention or the 5.x `eager_attention_forward`) and accepted only if every
site passes the self-check, with one warning naming the version; otherwise it is refused with a
ValueError naming the failing site. Refused (ValueError) too: a model that is not a float64 Llama, an
attention implementation other than "eager" and "sdpa", and RoPE scaling.

torch and transformers are imported inside the functions, so `import touchstone` works without them.
"""

from __future__ import annotations

import functools
import inspect
import math
import warnings
from typing import TYPE_CHECKING, Any, Dict, List, NoReturn, Optional, Sequence, Tuple

if TYPE_CHECKING:  # pragma: no cover
    import torch

# transformers versions whose source was read for the float32 sites above, with what was checked.
KNOWN_VERSIONS: Dict[str, str] = {
    "4.47.1": "models/llama/modeling_llama.py, modeling_rope_utils.py, loss/loss_utils.py read; "
              "the four sites are the only float32 computations on LlamaForCausalLM.forward (eager)",
    "4.47.0": "diffed against 4.47.1: modeling_llama.py, configuration_llama.py, modeling_rope_utils.py, "
              "loss/loss_utils.py, modeling_attn_mask_utils.py, activations.py and "
              "PreTrainedModel.loss_function identical",
    "5.23.0": "models/llama/modeling_llama.py, modeling_rope_utils.py, loss/loss_utils.py, "
              "integrations/sdpa_attention.py, masking_utils.py read; the same four sites (the softmax "
              "in eager_attention_forward), none in SDPA or in the masks (built in the embeddings' dtype)",
}

# The attention implementations exact_fp64 takes: eager (its softmax patched) and SDPA (no float32).
ATTENTION_IMPLEMENTATIONS: Tuple[str, ...] = ("eager", "sdpa")

SITES: Tuple[str, ...] = ("rope", "rmsnorm", "softmax", "loss")

# Tolerance of the self-check, relative L2 error against the independent float64 computation.
# Float64's unit roundoff is 1.1e-16; the longest reduction in a check is the hidden size (the
# q/k/v/o projections, the mean of squares) or the vocabulary (the loss), and rounding errors of a
# sum of n terms grow like sqrt(n) u in practice (n u at worst: 9e-13 for n = 8192). So a float64
# site stays below 1e-12 (measured: 2e-16 at most), while a float32 one rounds to 6e-8 and shows
# 2e-9 (the loss, averaged over tokens) to 7e-6 (RoPE at position 4000) here: three orders of
# magnitude or more on either side.
TOLERANCE = 1e-12


def _fail(message: str) -> NoReturn:
    raise ValueError(f"touchstone.hf.exact_fp64: {message}")


def exact_fp64(model: Any, *, sites: Sequence[str] = SITES) -> Any:
    """Replaces transformers' float32 computations in the float64 Llama `model` by float64 ones
    (the module docstring lists them), checks the result numerically, and returns `model`.

    `model`: a `LlamaForCausalLM` or `LlamaModel` whose parameters and buffers are all float64, with
    `config._attn_implementation` "eager" or "sdpa" and no RoPE scaling. `sites`: the sites to patch,
    a subset of `SITES` (default all; "loss" applies to `LlamaForCausalLM` only, "softmax" to eager
    attention only); patching fewer is for tests that show what each site costs. Patches are not
    undone; calling it again is harmless.

    Raises ValueError for a model it cannot patch (the model is then unchanged) or for a transformers
    version not in `KNOWN_VERSIONS` whose patched sites fail the self-check, and RuntimeError if a
    patched site of a known version still disagrees with float64 after patching (in both cases the
    model is then not to be used). An unlisted version that passes is accepted with a warning.
    """
    try:
        import torch
        import transformers
        from transformers.models.llama import modeling_llama as ml
    except ImportError as error:
        raise ImportError(f"touchstone.hf.exact_fp64 needs torch and transformers ({error}); "
                          "tools/install-deps.sh installs transformers into build/python-deps, "
                          "for PYTHONPATH") from error

    version = transformers.__version__
    known = version in KNOWN_VERSIONS
    if isinstance(sites, str):
        _fail(f"sites must be a sequence of names, not the string {sites!r}")
    unknown = [site for site in sites if site not in SITES]
    if unknown:
        _fail(f"unknown site(s) {unknown}; the sites are {list(SITES)}")
    chosen = set(sites)

    if not isinstance(model, (ml.LlamaForCausalLM, ml.LlamaModel)):
        _fail(f"expected a transformers LlamaForCausalLM or LlamaModel, got {type(model).__name__}")
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if tensor.is_floating_point() and tensor.dtype != torch.float64:
            _fail(f"{name} is {tensor.dtype}, not torch.float64: convert the model with "
                  "model.to(torch.float64) first")
    config = model.config
    implementation = config._attn_implementation
    # The generation of the attention API: 4.47's LlamaAttention.forward computes the scores itself
    # (SDPA is another class, LlamaSdpaAttention); from 4.48 on, and in 5.x, it calls an attention
    # function chosen by the config, eager's being the module function eager_attention_forward.
    functional_attention = hasattr(ml, "eager_attention_forward")
    if not functional_attention and implementation != "eager":
        _fail(f'attention implementation is "{implementation}", not "eager": build or load the model with '
              f'attn_implementation="eager" (transformers {version}: only the eager attention is patched)')
    if implementation not in ATTENTION_IMPLEMENTATIONS:
        _fail(f'attention implementation is "{implementation}", not "eager" or "sdpa": build or load the '
              'model with attn_implementation="eager" or "sdpa" (only those are patched and checked)')
    rope = rope_parameters(config)
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        _fail(f"rope_scaling {rope} is not plain RoPE (only the contract's RoPE is patched)")
    partial = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if partial is not None and float(partial) != 1.0:
        _fail(f"partial_rotary_factor {partial} is not 1")

    rotaries = [m for m in model.modules() if isinstance(m, ml.LlamaRotaryEmbedding)]
    norms = [m for m in model.modules() if isinstance(m, ml.LlamaRMSNorm)]
    attentions = [m for m in model.modules() if isinstance(m, ml.LlamaAttention)]
    if not rotaries or not norms or not attentions:
        _fail("the model has no rotary embedding, RMSNorm or attention module to patch")
    for module in attentions:
        if type(module) is not ml.LlamaAttention:
            _fail(f"attention module {type(module).__name__} is not transformers' LlamaAttention")
    for module in rotaries:
        if module.rope_type != "default":
            _fail(f'rotary embedding of rope_type "{module.rope_type}" is not plain RoPE')
        _, dim = rope_theta_and_dim(module)
        if module.inv_freq.numel() != dim // 2:
            _fail(f"inv_freq has {module.inv_freq.numel()} entries, expected head_dim/2 = {dim // 2}")
    patch_loss = "loss" in chosen and isinstance(model, ml.LlamaForCausalLM)
    if patch_loss:
        from transformers.loss.loss_utils import ForCausalLMLoss

        if model.loss_function is not ForCausalLMLoss and model.loss_function is not _causal_lm_loss_fp64:
            _fail(f"the model's loss_function is {getattr(model.loss_function, '__name__', model.loss_function)}, "
                  "not transformers' ForCausalLMLoss (config.loss_type is set?)")
    attention_forward = _attention_forward_fp64 if functional_attention else _attention_forward_fp64_4_47

    # Everything is checked: patch (nothing above has changed the model).
    if "rope" in chosen:
        for module in rotaries:
            theta, dim = rope_theta_and_dim(module)
            inv_freq = torch.tensor(contract_inv_freq(theta, dim), dtype=torch.float64,
                                    device=module.inv_freq.device)
            module.register_buffer("inv_freq", inv_freq, persistent=False)
            module.original_inv_freq = inv_freq.clone() if "original_inv_freq" in module._buffers else inv_freq
            module.forward = functools.partial(_rotary_forward_fp64, module)
    if "rmsnorm" in chosen:
        for module in norms:
            module.forward = functools.partial(_rmsnorm_forward_fp64, module)
    if "softmax" in chosen and implementation == "eager":  # SDPA computes in its inputs' dtype
        for module in attentions:
            module.forward = functools.partial(attention_forward, module)
    if patch_loss:
        if not getattr(type(model), "_touchstone_exact_fp64_loss", False):
            model.__class__ = _fp64_loss_class(type(model))

    from touchstone.hf_fp64_check import verify  # imports this module: here, not at the top

    if known:
        verify(model, chosen, rotaries, norms, attentions)
        return model
    # An unlisted version: accepted when every patched site computes what float64 computes.
    try:
        verify(model, chosen, rotaries, norms, attentions)
    except Exception as error:  # a RuntimeError of the check, or an API the copies no longer fit
        _fail(f"transformers {version} is not in KNOWN_VERSIONS ({', '.join(sorted(KNOWN_VERSIONS))}) and "
              f"fails the self-check: {str(error).replace('touchstone.hf.exact_fp64: ', '')} "
              "(docs/frameworks/hf-float32-sites.md: a new transformers version)")
    checked = sorted(site for site in chosen if (site != "loss" or patch_loss)) + \
        (["softmax (SDPA)"] if implementation == "sdpa" else [])
    checked = [site for site in checked if not (site == "softmax" and implementation == "sdpa")]
    warnings.warn(f"touchstone.hf.exact_fp64: transformers {version} is not in KNOWN_VERSIONS; every patched "
                  f"site ({', '.join(checked)}) passed the float64 self-check, so it is accepted",
                  UnlistedVersionWarning, stacklevel=2)
    return model


class UnlistedVersionWarning(UserWarning):
    """exact_fp64 accepted a transformers version not in KNOWN_VERSIONS (its self-check passed)."""


# --- the float64 replacements (bound to one module instance each) -----------------------------------


def contract_inv_freq(theta: float, dim: int) -> List[float]:
    """inv_freq[i] = theta ** (-2 i / D), i = 0..D/2-1, in float64 (C's pow, as the C++ reference)."""
    return [math.pow(theta, -2.0 * i / dim) for i in range(dim // 2)]


def rope_parameters(config: Any) -> Dict[str, Any]:
    """The RoPE settings of a Llama config: 5.x's `rope_parameters` (rope_type, rope_theta, ...), or
    4.47's `rope_scaling` (None for plain RoPE) with `rope_theta` beside it."""
    parameters = config.__dict__.get("rope_parameters")  # not getattr: 4.47 has no such attribute
    if isinstance(parameters, dict):
        return dict(parameters)
    scaling = config.__dict__.get("rope_scaling") or {}
    return {**scaling, "rope_theta": config.__dict__.get("rope_theta")}


def rope_theta_and_dim(module: Any) -> Tuple[float, int]:
    if getattr(module, "config", None) is not None:
        config = module.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return float(rope_parameters(config)["rope_theta"]), int(head_dim)
    return float(module.rope_kwargs["base"]), int(module.rope_kwargs["dim"])


def _rotary_forward_fp64(self: Any, x: "torch.Tensor", position_ids: "torch.Tensor") -> Tuple[Any, Any]:
    """LlamaRotaryEmbedding.forward in float64: angle = position * inv_freq, each frequency used for
    the two halves (rotate-half), cos and sin in float64; returns them in x's dtype."""
    import torch

    with torch.no_grad():
        inv_freq = self.inv_freq.to(torch.float64)
        angles = position_ids.to(torch.float64)[:, :, None] * inv_freq[None, None, :]   # [b, s, D/2]
        emb = torch.cat((angles, angles), dim=-1)                                          # [b, s, D]
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
    return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def _rmsnorm_forward_fp64(self: Any, hidden_states: "torch.Tensor") -> "torch.Tensor":
    """LlamaRMSNorm.forward in the input dtype: weight * (x * rsqrt(mean(x^2) + eps))."""
    import torch

    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _attention_forward_fp64_4_47(
    self: Any,
    hidden_states: "torch.Tensor",
    attention_mask: Optional["torch.Tensor"] = None,
    position_ids: Optional["torch.Tensor"] = None,
    past_key_value: Optional[Any] = None,
    output_attentions: bool = False,
    use_cache: bool = False,
    cache_position: Optional["torch.Tensor"] = None,
    position_embeddings: Optional[Tuple["torch.Tensor", "torch.Tensor"]] = None,
    **kwargs: Any,
) -> Tuple[Any, Any, Any]:
    """transformers 4.47.1 LlamaAttention.forward (eager) with the softmax in the scores' dtype in
    place of `softmax(..., dtype=torch.float32).to(query_states.dtype)`; every other line as HF's."""
    import torch
    from torch import nn
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

    bsz, q_len, _ = hidden_states.size()

    query_states = self.q_proj(hidden_states)
    key_states = self.k_proj(hidden_states)
    value_states = self.v_proj(hidden_states)

    query_states = query_states.view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
    key_states = key_states.view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
    value_states = value_states.view(bsz, q_len, -1, self.head_dim).transpose(1, 2)

    if position_embeddings is None:
        cos, sin = self.rotary_emb(value_states, position_ids)
    else:
        cos, sin = position_embeddings
    query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

    if past_key_value is not None:
        cache_kwargs = {"sin": sin, "cos": cos, "cache_position": cache_position}
        key_states, value_states = past_key_value.update(key_states, value_states, self.layer_idx, cache_kwargs)

    key_states = repeat_kv(key_states, self.num_key_value_groups)
    value_states = repeat_kv(value_states, self.num_key_value_groups)
    attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(self.head_dim)

    if attention_mask is not None:  # a 4-D mask, added to the scores as given (HF's semantics)
        causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]
        attn_weights = attn_weights + causal_mask

    attn_weights = nn.functional.softmax(attn_weights, dim=-1)          # in the scores' dtype
    attn_weights = nn.functional.dropout(attn_weights, p=self.attention_dropout, training=self.training)
    attn_output = torch.matmul(attn_weights, value_states)

    if attn_output.size() != (bsz, self.num_heads, q_len, self.head_dim):
        raise ValueError(
            f"`attn_output` should be of size {(bsz, self.num_heads, q_len, self.head_dim)}, but is"
            f" {attn_output.size()}"
        )

    attn_output = attn_output.transpose(1, 2).contiguous()
    attn_output = attn_output.reshape(bsz, q_len, -1)
    attn_output = self.o_proj(attn_output)

    if not output_attentions:
        attn_weights = None

    return attn_output, attn_weights, past_key_value


def _attention_forward_fp64(
    self: Any,
    hidden_states: "torch.Tensor",
    position_embeddings: Optional[Tuple["torch.Tensor", "torch.Tensor"]] = None,
    attention_mask: Optional["torch.Tensor"] = None,
    past_key_values: Optional[Any] = None,
    **kwargs: Any,
) -> Tuple[Any, Any]:
    """transformers 5.23.0 LlamaAttention.forward with eager attention, calling `_eager_attention_fp64`
    (HF's eager_attention_forward with the softmax in the scores' dtype); every other line as HF's.
    `past_key_value` is the name of the cache up to 4.55; the self-check catches other differences."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    if past_key_values is None:
        past_key_values = kwargs.pop("past_key_value", None)
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)

    query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

    cos, sin = position_embeddings
    query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

    if past_key_values is not None:
        key_states, value_states = past_key_values.update(key_states, value_states, self.layer_idx)

    attn_output, attn_weights = _eager_attention_fp64(
        self,
        query_states,
        key_states,
        value_states,
        attention_mask,
        dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling,
        **kwargs,
    )

    attn_output = attn_output.reshape(*input_shape, -1).contiguous()
    attn_output = self.o_proj(attn_output)
    return attn_output, attn_weights


def _eager_attention_fp64(module: Any, query: "torch.Tensor", key: "torch.Tensor", value: "torch.Tensor",
                          attention_mask: Optional["torch.Tensor"], scaling: float, dropout: float = 0.0,
                          **kwargs: Any) -> Tuple[Any, Any]:
    """transformers 5.23.0 eager_attention_forward with `softmax(attn_weights, dim=-1)` in place of
    `softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)`."""
    import torch
    from torch import nn
    from transformers.models.llama.modeling_llama import repeat_kv

    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)

    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:  # a 4-D mask, added to the scores as given (HF's semantics)
        attn_weights = attn_weights + attention_mask

    attn_weights = nn.functional.softmax(attn_weights, dim=-1)          # in the scores' dtype
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous()

    return attn_output, attn_weights


def _causal_lm_loss_fp64(logits: Any, labels: Any, vocab_size: int, num_items_in_batch: Optional[Any] = None,
                         ignore_index: int = -100, **kwargs: Any) -> Any:
    """transformers' ForCausalLMLoss without its `logits = logits.float()`: the shifted cross entropy in
    the logits' dtype (HF's fixed_cross_entropy: mean, or sum / num_items_in_batch). As the installed
    version computes it: with a `shift_labels` parameter (5.x), `shift_labels=` are the targets as
    given and `labels` is not read, and without one `labels` is padded with ignore_index and shifted;
    without that parameter (4.47), logits[:-1] against labels[1:], and a `shift_labels=` reaches
    fixed_cross_entropy's **kwargs, which ignore it, as in HF."""
    from transformers.loss.loss_utils import fixed_cross_entropy

    if not _loss_takes_shift_labels():
        shift_logits = logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        shift_logits = shift_logits.view(-1, vocab_size)
        shift_labels = shift_labels.view(-1).to(shift_logits.device)
        return fixed_cross_entropy(shift_logits, shift_labels, num_items_in_batch, ignore_index, **kwargs)

    from torch import nn

    shift_labels = kwargs.pop("shift_labels", None)
    if shift_labels is None:
        # Shift so that tokens < n predict n
        labels = nn.functional.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:].contiguous()
    logits = logits.view(-1, vocab_size)
    shift_labels = shift_labels.view(-1).to(logits.device)
    return fixed_cross_entropy(logits, shift_labels, num_items_in_batch, ignore_index, **kwargs)


@functools.lru_cache(maxsize=None)
def _loss_takes_shift_labels() -> bool:
    from transformers.loss.loss_utils import ForCausalLMLoss

    return "shift_labels" in inspect.signature(ForCausalLMLoss).parameters


_LOSS_CLASSES: Dict[type, type] = {}
_LOSS_CLASS_PREFIX = "_ExactFP64_"


def _loss_function_fp64(self: Any) -> Any:
    return _causal_lm_loss_fp64


def _fp64_loss_class(cls: type) -> type:
    """A subclass of `cls` whose `loss_function` is the float64 ForCausalLMLoss, assigned to one
    instance's __class__. Its __name__ stays cls's (save_pretrained writes `architectures` from it);
    its __qualname__ is found by the module's __getattr__, so that torch.save(model) pickles."""
    if cls not in _LOSS_CLASSES:
        _LOSS_CLASSES[cls] = type(cls.__name__, (cls,), {
            "__doc__": f"{cls.__name__} whose loss with labels= is computed in the logits' dtype "
                       "(touchstone.hf_fp64.exact_fp64).",
            "__module__": __name__,
            "__qualname__": _LOSS_CLASS_PREFIX + cls.__name__,
            "loss_function": property(_loss_function_fp64),
            "_touchstone_exact_fp64_loss": True,
        })
    return _LOSS_CLASSES[cls]


def __getattr__(name: str) -> Any:
    """The patched class of a transformers Llama class, by its __qualname__ (for unpickling)."""
    if name.startswith(_LOSS_CLASS_PREFIX):
        from transformers.models.llama import modeling_llama as ml

        base = getattr(ml, name[len(_LOSS_CLASS_PREFIX):], None)
        if isinstance(base, type):
            return _fp64_loss_class(base)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["exact_fp64", "KNOWN_VERSIONS", "SITES", "TOLERANCE", "ATTENTION_IMPLEMENTATIONS",
           "UnlistedVersionWarning"]
