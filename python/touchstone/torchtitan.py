"""torchtitan 0.3.0's own Llama 3 model (`Llama3Model`): the golden config as its model config, names and
layouts both ways, and the three changes its instance needs to compute the golden model on the CPU.

| torchtitan Llama3Model                             | contract                                              |
|----------------------------------------------------|-------------------------------------------------------|
| tok_embeddings.weight                              | embedding.word_embeddings.weight                      |
| layers.{i}.attention_norm.weight                   | decoder.layers.{i}.input_layernorm.weight             |
| layers.{i}.attention.qkv_linear.wqkv.weight        | decoder.layers.{i}.self_attention.linear_qkv.weight   |
| layers.{i}.attention.wo.weight                     | decoder.layers.{i}.self_attention.linear_proj.weight  |
| layers.{i}.ffn_norm.weight                         | decoder.layers.{i}.pre_mlp_layernorm.weight           |
| layers.{i}.feed_forward.{w1,w3}.weight             | decoder.layers.{i}.mlp.linear_fc1.weight = [w1; w3]   |
| layers.{i}.feed_forward.w2.weight                  | decoder.layers.{i}.mlp.linear_fc2.weight              |
| norm.weight                                        | decoder.final_layernorm.weight                        |
| lm_head.weight (untied models only)                | output_layer.weight                                   |

torchtitan's fused `wqkv` already groups its rows per KV group, [q heads of g; k_g; v_g] (FusedQKVLinear
views its output as [n_kv, G + 2, head_dim]), as the golden file does. What differs is RoPE: torchtitan's
ComplexRoPE rotates adjacent pairs (2i, 2i+1), the golden model rotates halves (i, i + D/2), so the rows
of every q and k head are permuted on the way in (`pair_order`) and back on the way out (`half_order`);
v rows are not rotated and keep their order.

On the instance: `exact_fp64` replaces each layer's float32 ComplexRoPE by `Float64PairRoPE`, and
`install_document_attention` replaces the inner attention (none of torchtitan's trains on a CPU with a
document mask) by `DocumentMaskAttention`, which takes the golden boolean mask as `attention_masks`.
Convert a model with `model.double()`, never `model.to(torch.float64)`: the latter casts the complex64
RoPE cache to a real tensor (dropping its imaginary part with a UserWarning).
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterator, Mapping, Tuple

import numpy as np

from touchstone.candidate import Tensors, named_items
from touchstone.golden import GoldenFile, parameter_names, parameter_shape
from touchstone.golden_config import check_config, check_model
from touchstone.torch_modules import check_module, named_gradients

_LAYER_RENAMES = {  # torchtitan suffix after "layers.{i}." -> contract suffix after "decoder.layers.{i}."
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "pre_mlp_layernorm.weight",
    "attention.qkv_linear.wqkv.weight": "self_attention.linear_qkv.weight",
    "attention.wo.weight": "self_attention.linear_proj.weight",
    "feed_forward.w2.weight": "mlp.linear_fc2.weight",
}
_MODEL_RENAMES = {
    "tok_embeddings.weight": "embedding.word_embeddings.weight",
    "norm.weight": "decoder.final_layernorm.weight",
    "lm_head.weight": "output_layer.weight",
}
_FC1 = ("feed_forward.w1.weight", "feed_forward.w3.weight")  # gate, up
_TITAN_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_CONTRACT_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


# -- config ----------------------------------------------------------------------------------------

def model_config(config: Mapping[str, Any]) -> Any:
    """A `Llama3Model.Config` computing the golden model (`config`: GoldenFile.config). Its inner attention
    is FlexAttention's config (only so that it builds; `install_document_attention` replaces the module)."""
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.llama3 import Llama3Model, _build_llama3_layers

    check_config(config)
    model = config["model"]
    for key in ("hidden_dropout", "attention_dropout"):
        if float(model.get(key, 0.0)) > 0:
            raise ValueError(f"model.{key} is {model[key]}, and torchtitan's Llama 3 has no dropout")
    H, NH, NKV, D, F = _dims(model)
    V, eps = int(model["vocab_size"]), float(model["norm_eps"])
    layers = _build_llama3_layers(
        n_layers=int(model["num_layers"]), dim=H, n_heads=NH, n_kv_heads=NKV, hidden_dim=F, fuse_qkv=True,
        rope=ComplexRoPE.Config(dim=D, max_seq_len=int(model["seq_length"]), theta=float(model["rope_theta"]),
                                scaling="none"),
        attn_backend="flex")
    for layer in layers:  # _build_llama3_layers leaves torchtitan's default eps (1e-5)
        layer.attention_norm.eps = eps
        layer.ffn_norm.eps = eps
    return Llama3Model.Config(
        dim=H, vocab_size=V, enable_weight_tying=bool(model["tie_embeddings"]),
        tok_embeddings=Embedding.Config(num_embeddings=V, embedding_dim=H),
        norm=RMSNorm.Config(normalized_shape=H, eps=eps),
        lm_head=Linear.Config(in_features=H, out_features=V), layers=layers)


def build_model(golden: GoldenFile) -> Any:
    """The `Llama3Model` of a golden file, in float32 with torchtitan's own modules (load, then convert)."""
    from torchtitan.models.llama3 import Llama3Model

    if not isinstance(golden, GoldenFile):
        raise ValueError(f"golden is of type {type(golden).__name__}, not GoldenFile")
    try:
        return Llama3Model(model_config(golden.config))
    except ValueError as e:
        raise ValueError(f"{golden.path}: {e}") from None


# -- names and layouts -----------------------------------------------------------------------------

def _dims(model: Mapping[str, Any]) -> Tuple[int, int, int, int, int]:
    check_model(model)
    H, NH, NKV = int(model["hidden_size"]), int(model["num_heads"]), int(model["num_kv_heads"])
    if (H // NH) % 2:
        raise ValueError(f"model.hidden_size / model.num_heads is {H // NH}: RoPE needs an even head size")
    return H, NH, NKV, H // NH, int(model["ffn_hidden_size"])


def pair_order(head_dim: int) -> np.ndarray:
    """Row i of a torchtitan head is row pair_order[i] of the golden head: (0, D/2, 1, D/2 + 1, ...)."""
    half = head_dim // 2
    return np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)


def half_order(head_dim: int) -> np.ndarray:
    """The inverse of pair_order: row i of a golden head is row half_order[i] of the torchtitan head."""
    return np.argsort(pair_order(head_dim))


def _permute_qk(tensor: Any, model: Mapping[str, Any], order: np.ndarray) -> Any:
    """The rows of every q and k head of a linear_qkv/wqkv tensor reordered by `order`; v rows kept."""
    H, NH, NKV, D, _ = _dims(model)
    G = NH // NKV
    rows = np.arange((NH + 2 * NKV) * D).reshape(NKV, G + 2, D)
    rows[:, :G + 1] = rows[:, :G + 1][..., order]  # q heads and k; index G + 1 is v
    rows = rows.reshape(-1)
    if hasattr(tensor, "detach"):
        import torch

        return tensor[torch.from_numpy(rows).to(tensor.device)]
    return tensor[rows]


def _check_shape(name: str, tensor: Any, shape: Tuple[int, ...]) -> None:
    if not hasattr(tensor, "shape"):
        raise ValueError(f"{name}: a value of type {type(tensor).__name__}, not a numpy array or torch tensor")
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name}: shape {list(tensor.shape)}, the golden model's is {list(shape)}")


def iter_titan_tensors(params: Tensors, model: Mapping[str, Any]) -> Iterator[Tuple[str, Any]]:
    """Contract tensors -> (torchtitan name, tensor), q/k rows in pair order. A tied model yields no lm_head."""
    F = _dims(model)[4]
    for name, tensor in named_items(params):
        if name not in parameter_names(model):
            raise ValueError(f"{name}: not a parameter of the golden model")
        _check_shape(name, tensor, parameter_shape(model, name))
        layer = _CONTRACT_LAYER.match(name)
        if layer is None:
            yield {v: k for k, v in _MODEL_RENAMES.items()}[name], tensor
            continue
        prefix, suffix = f"layers.{layer.group(1)}.", layer.group(2)
        if suffix == "mlp.linear_fc1.weight":
            yield prefix + _FC1[0], tensor[:F]
            yield prefix + _FC1[1], tensor[F:]
        elif suffix == "self_attention.linear_qkv.weight":
            yield prefix + "attention.qkv_linear.wqkv.weight", _permute_qk(tensor, model, pair_order(_dims(model)[3]))
        else:
            yield prefix + {v: k for k, v in _LAYER_RENAMES.items()}[suffix], tensor


def from_titan_state(state: Tensors, model: Mapping[str, Any], strict: bool = True) -> Dict[str, Any]:
    """torchtitan names (a state dict, named parameters or named gradients) -> contract names and layouts:
    w1/w3 fused into linear_fc1, wqkv's q/k rows put back in half order. lm_head of a tied model is skipped."""
    import torch

    F = _dims(model)[4]
    out: Dict[str, Any] = {}
    pending: Dict[str, Dict[str, Any]] = {}
    for name, tensor in named_items(state):
        layer = _TITAN_LAYER.match(name) if isinstance(name, str) else None
        if layer is not None and int(layer.group(1)) < int(model["num_layers"]):
            prefix, suffix = f"decoder.layers.{layer.group(1)}.", layer.group(2)
            if suffix in _FC1:
                parts = pending.setdefault(prefix + "mlp.linear_fc1.weight", {})
                parts[suffix] = tensor
                if len(parts) == 2:
                    fused = prefix + "mlp.linear_fc1.weight"
                    for part in _FC1:
                        _check_shape(f"{name[:-len(suffix)]}{part}", parts[part], (F, int(model["hidden_size"])))
                    out[fused] = torch.cat([parts[p] for p in _FC1]) if hasattr(tensor, "detach") else \
                        np.concatenate([parts[p] for p in _FC1])
                    del pending[fused]
                continue
            if suffix in _LAYER_RENAMES:
                contract = prefix + _LAYER_RENAMES[suffix]
                _check_shape(name, tensor, parameter_shape(model, contract))
                if suffix == "attention.qkv_linear.wqkv.weight":
                    tensor = _permute_qk(tensor, model, half_order(_dims(model)[3]))
                out[contract] = tensor
                continue
        elif name in _MODEL_RENAMES:
            if name == "lm_head.weight" and model["tie_embeddings"]:
                continue  # the embedding matrix itself
            _check_shape(name, tensor, parameter_shape(model, _MODEL_RENAMES[name]))
            out[_MODEL_RENAMES[name]] = tensor
            continue
        raise ValueError(f"{name}: matches no torchtitan Llama3Model name of the golden model "
                         f"({int(model['num_layers'])} layers; e.g. layers.0.attention.qkv_linear.wqkv.weight)")
    for fused, parts in pending.items():
        raise ValueError(f"layers.{fused.split('.')[2]}.{[p for p in _FC1 if p not in parts][0]}: missing "
                         f"(the other part of {fused} is there)")
    if strict:
        for contract in parameter_names(model):
            if contract not in out:
                raise ValueError(f"{contract}: no torchtitan tensor gives it")
    return out


def titan_grads(titan_model: Any) -> Iterator[Tuple[str, Any]]:
    """(torchtitan name, gradient) of every parameter (after backward); a tied weight once."""
    return named_gradients(titan_model, "titan_model")


def load_golden_into(titan_model: Any, golden: GoldenFile, step: int = 0) -> None:
    """Copies the golden parameters (step 0: /params/init) into a Llama3Model, q/k rows permuted to
    torchtitan's pair order. Every parameter of the model must receive one."""
    import torch

    check_module(titan_model, "titan_model")
    if not isinstance(golden, GoldenFile):
        raise ValueError(f"golden is of type {type(golden).__name__}, not GoldenFile")
    _check_fused_layout(titan_model, golden.model)
    targets = dict(titan_model.named_parameters())
    filled = set()
    with torch.no_grad():
        for name, tensor in iter_titan_tensors(golden.params(step), golden.model):
            if name not in targets:
                raise ValueError(f"{name}: the torchtitan model has no such parameter")
            _check_shape(name, targets[name], tuple(tensor.shape))
            targets[name].copy_(torch.from_numpy(np.ascontiguousarray(tensor)))
            filled.add(name)
    for name in targets:
        if name not in filled:
            raise ValueError(f"{name}: the golden file gives this torchtitan parameter no value")


def _check_fused_layout(titan_model: Any, model: Mapping[str, Any]) -> None:
    """The wqkv layout this module assumes is FusedQKVLinear's of torchtitan 0.3.0 ([n_kv, G + 2, D] rows);
    another torchtitan whose module splits differently is refused here rather than trained wrongly."""
    _, NH, NKV, D, _ = _dims(model)
    for attention in _attention_layers(titan_model):
        qkv = getattr(attention, "qkv_linear", None)
        if type(qkv).__name__ != "FusedQKVLinear" or getattr(qkv, "r_dim", None) != NH // NKV + 2 \
                or getattr(qkv, "head_dim", None) != D:
            raise ValueError(f"attention.qkv_linear is {type(qkv).__name__} (r_dim {getattr(qkv, 'r_dim', None)}), "
                             f"not torchtitan 0.3.0's FusedQKVLinear with r_dim {NH // NKV + 2}")


# -- modules installed on the instance -------------------------------------------------------------

def _modules():
    import torch
    import torch.nn.functional as F

    class Float64PairRoPE(torch.nn.Module):
        """torchtitan's adjacent-pair RoPE with angles, cos and sin in float64 and applied in the query's
        dtype (ComplexRoPE builds a complex64 cache and rotates in float32)."""

        def __init__(self, head_dim: int, theta: float):
            super().__init__()
            self.head_dim, self.theta = head_dim, theta

        def cos_sin(self, positions: Any) -> Tuple[Any, Any]:
            exponent = torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim
            inv_freq = 1.0 / (self.theta ** exponent)
            angles = positions.to(torch.float64)[..., None] * inv_freq  # [B, L, D/2]
            return angles.cos()[:, :, None], angles.sin()[:, :, None]   # [B, L, 1, D/2]

        def forward(self, query: Any, key: Any, positions: Any = None) -> Tuple[Any, Any]:
            if positions is None:
                positions = torch.arange(query.shape[1])[None].expand(query.shape[0], -1)
            cos, sin = self.cos_sin(positions)

            def rotate(x):
                pairs = x.reshape(*x.shape[:-1], -1, 2)
                even, odd = pairs[..., 0], pairs[..., 1]
                c, s = cos.to(x.dtype), sin.to(x.dtype)
                return torch.stack([even * c - odd * s, odd * c + even * s], dim=-1).flatten(3)

            return rotate(query), rotate(key)

    class DocumentMaskAttention(torch.nn.Module):
        """Inner attention taking the golden mask as `attention_masks`: a boolean [B, 1, L, L] tensor,
        True where a query may attend (causal within documents), through plain SDPA in the inputs' dtype."""

        def forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks=None, scale=None, enable_gqa=False,
                    **kwargs):
            if not isinstance(attention_masks, torch.Tensor) or attention_masks.dtype != torch.bool:
                raise ValueError("DocumentMaskAttention: attention_masks must be the boolean [B, 1, L, L] "
                                 "document mask (touchstone.attention_allowed), got "
                                 f"{type(attention_masks).__name__}")
            q, k, v = (t.transpose(1, 2) for t in (q_BLNH, k_BLNH, v_BLNH))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_masks, scale=scale,
                                                 enable_gqa=enable_gqa)
            return out.transpose(1, 2)

    return Float64PairRoPE, DocumentMaskAttention


def _attention_layers(titan_model: Any):
    layers = getattr(titan_model, "layers", None)
    if layers is None or not hasattr(layers, "values"):
        raise ValueError(f"titan_model is of type {type(titan_model).__name__}, not a torchtitan Llama3Model")
    return [layer.attention for layer in layers.values()]


def exact_fp64(titan_model: Any, theta: float) -> Any:
    """Replaces every layer's ComplexRoPE (complex64 cache, float32 rotation) by Float64PairRoPE."""
    Float64PairRoPE, _ = _modules()
    for attention in _attention_layers(titan_model):
        attention.rope = Float64PairRoPE(attention.head_dim, float(theta))
    return titan_model


def install_document_attention(titan_model: Any) -> Any:
    """Replaces every layer's inner attention by DocumentMaskAttention (forward then takes the boolean
    document mask as `attention_masks`)."""
    _, DocumentMaskAttention = _modules()
    for attention in _attention_layers(titan_model):
        attention.inner_attention = DocumentMaskAttention()
    return titan_model


def document_mask(micro: Any, golden: GoldenFile) -> Any:
    """The boolean [B, 1, L, L] mask DocumentMaskAttention takes, from a golden micro-batch."""
    import torch

    from touchstone.masks import attention_allowed

    return torch.from_numpy(attention_allowed(micro.document_ids, golden.document_masking))[:, None]


def flex_mask_mod(micro: Any, golden: GoldenFile, device: Any = None) -> Any:
    """A FlexAttention mask_mod of the golden mask (causal within documents, from the golden document
    ids rather than from positions restarting at 0), for `create_attention_mask(mod, B, None, L, L)` on
    a GPU."""
    import torch

    documents = torch.from_numpy(micro.document_ids).to(device)
    masking = bool(golden.document_masking)

    def same_document_causal(b, h, q_idx, kv_idx):
        causal = kv_idx <= q_idx
        return causal & (documents[b, q_idx] == documents[b, kv_idx]) if masking else causal

    return same_document_causal


def varlen_metadata(micro: Any, golden: GoldenFile, device: Any = None) -> Any:
    """torchtitan's VarlenMetadata of the golden mask, from `touchstone.masks.cu_seqlens`."""
    import torch
    from torchtitan.models.common.attention import VarlenMetadata

    from touchstone.masks import cu_seqlens

    cu, longest = cu_seqlens(micro.document_ids, golden.document_masking)
    cu = torch.from_numpy(cu).to(device)
    return VarlenMetadata(cu_seq_q=cu, cu_seq_k=cu, max_q=int(longest), max_k=int(longest))


__all__ = ["flex_mask_mod", "varlen_metadata", "model_config", "build_model", "pair_order", "half_order", "iter_titan_tensors", "from_titan_state",
           "titan_grads", "load_golden_into", "exact_fp64", "install_document_attention", "document_mask"]
