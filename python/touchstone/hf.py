"""Hugging Face transformers: Llama names, layouts and config, both ways.

The golden file uses Megatron-Core's names and layouts (docs/golden-format.md); Hugging Face's
`LlamaForCausalLM` uses its own:

| Hugging Face Llama                                   | contract                                              |
|------------------------------------------------------|-------------------------------------------------------|
| model.embed_tokens.weight                            | embedding.word_embeddings.weight                      |
| model.layers.{i}.input_layernorm.weight              | decoder.layers.{i}.input_layernorm.weight             |
| model.layers.{i}.self_attn.{q,k,v}_proj.weight       | decoder.layers.{i}.self_attention.linear_qkv.weight,  |
|                                                      |   rows per KV group g: [q heads of g; k_g; v_g]       |
| model.layers.{i}.self_attn.o_proj.weight             | decoder.layers.{i}.self_attention.linear_proj.weight  |
| model.layers.{i}.post_attention_layernorm.weight     | decoder.layers.{i}.pre_mlp_layernorm.weight           |
| model.layers.{i}.mlp.{gate,up}_proj.weight           | decoder.layers.{i}.mlp.linear_fc1.weight = [gate; up] |
| model.layers.{i}.mlp.down_proj.weight                | decoder.layers.{i}.mlp.linear_fc2.weight              |
| model.norm.weight                                    | decoder.final_layernorm.weight                        |
| lm_head.weight (untied models only)                  | output_layer.weight                                   |

HF's q and k rows already follow the rotate-half convention, so no permutation is needed. The same
table is in C++ (oracle/hf/hf_names.cpp) for `touchstone diff` and `touchstone export hf`; the tests
check that the two agree.

Everything here works on numpy arrays and on torch tensors alike, and streams: `iter_hf_tensors` and
`iter_contract_tensors` convert one tensor (one layer's q/k/v or gate/up) at a time, and
`load_golden_into` copies a golden file into a model tensor by tensor. `exact_fp64` (touchstone/hf_fp64.py)
removes the float32 computations transformers keeps inside a float64 model.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, Iterator, Mapping, Tuple

import numpy as np

from touchstone.candidate import Tensors, named_items
from touchstone.golden import GoldenFile, parameter_names, parameter_shape
from touchstone.golden_config import check_config, check_model
from touchstone.torch_modules import check_module, named_gradients

_LAYER_RENAMES = {  # HF suffix after "model.layers.{i}." -> contract suffix after "decoder.layers.{i}."
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
}
_MODEL_RENAMES = {
    "model.embed_tokens.weight": "embedding.word_embeddings.weight",
    "model.norm.weight": "decoder.final_layernorm.weight",
    "lm_head.weight": "output_layer.weight",
}
_QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
_FC1 = ("mlp.gate_proj.weight", "mlp.up_proj.weight")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_CONTRACT_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


# -- config ----------------------------------------------------------------------------------------

def hf_config_dict(config: Mapping[str, Any], precision: str = "fp64") -> Dict[str, Any]:
    """The config.json of a `LlamaForCausalLM` that computes the golden model (`touchstone export hf`).

    `config` is the golden file's full config (GoldenFile.config). A ValueError names the key when the
    model has a feature HF's Llama cannot express: hidden dropout (Llama has none) or attention dropout
    (Touchstone's masks come from its own counter-based RNG, which no HF run reproduces).
    """
    check_config(config)
    model, data = config["model"], config["data"]
    # The same words as `touchstone export hf` (oracle/hf/export.cpp).
    if float(model.get("hidden_dropout", 0.0)) > 0:
        raise ValueError(f"model.hidden_dropout is {model['hidden_dropout']}, and Hugging Face's Llama has no "
                         "hidden dropout")
    if float(model.get("attention_dropout", 0.0)) > 0:
        raise ValueError(f"model.attention_dropout is {model['attention_dropout']}: Touchstone's dropout masks "
                         "come from its own counter-based RNG, which no Hugging Face run reproduces")
    H, NH = int(model["hidden_size"]), int(model["num_heads"])
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": int(model["vocab_size"]), "hidden_size": H,
        "intermediate_size": int(model["ffn_hidden_size"]), "num_hidden_layers": int(model["num_layers"]),
        "num_attention_heads": NH, "num_key_value_heads": int(model["num_kv_heads"]), "head_dim": H // NH,
        "max_position_embeddings": int(model["seq_length"]), "rms_norm_eps": float(model["norm_eps"]),
        "rope_theta": float(model["rope_theta"]), "rope_scaling": None,
        "tie_word_embeddings": bool(model["tie_embeddings"]), "attention_bias": False, "mlp_bias": False,
        "hidden_act": "silu", "attention_dropout": 0.0, "initializer_range": float(model["init_std"]),
        "pretraining_tp": 1, "use_cache": False, "bos_token_id": None,
        "eos_token_id": int(data["eos_token"]), "pad_token_id": int(data["pad_token"]),
        "torch_dtype": "float64" if precision == "fp64" else "float32",
    }


def llama_config(config: Mapping[str, Any], precision: str = "fp64") -> Any:
    """A transformers.LlamaConfig for the golden model, with eager attention (the only one that takes
    an arbitrary additive 4-D mask on every torch version)."""
    from transformers import LlamaConfig

    values = hf_config_dict(config, precision)
    values.pop("model_type")
    return LlamaConfig(**values, attn_implementation="eager")


# -- names and layouts -----------------------------------------------------------------------------

def _cat(parts: Iterable[Any], axis: int) -> Any:
    parts = list(parts)
    if hasattr(parts[0], "detach"):
        import torch

        return torch.cat(parts, dim=axis)
    return np.concatenate(parts, axis=axis)


def _dims(model: Mapping[str, Any]) -> Tuple[int, int, int, int, int]:
    check_model(model)
    H, NH, NKV = int(model["hidden_size"]), int(model["num_heads"]), int(model["num_kv_heads"])
    return H, NH, NKV, H // NH, int(model["ffn_hidden_size"])


def _check_shape(name: str, tensor: Any, shape: Tuple[int, ...]) -> None:
    if not isinstance(getattr(tensor, "shape", None), tuple) and not hasattr(tensor, "detach"):
        raise ValueError(f"{name}: a value of type {type(tensor).__name__}, not a numpy array or torch tensor")
    if hasattr(tensor, "detach") and (getattr(tensor, "is_meta", False) or str(tensor.layout) != "torch.strided"):
        raise ValueError(f"{name}: a {'meta' if tensor.is_meta else str(tensor.layout)} tensor, not a dense one")
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name}: shape {list(tensor.shape)}, the golden model's is {list(shape)}")


def iter_hf_tensors(params: Tensors, model: Mapping[str, Any]) -> Iterator[Tuple[str, Any]]:
    """Contract tensors -> (HF name, tensor) pairs, one at a time. A tied model yields no lm_head."""
    H, NH, NKV, D, F = _dims(model)
    G = NH // NKV
    for name, tensor in named_items(params):
        if name not in parameter_names(model):
            raise ValueError(f"{name}: not a parameter of the golden model")
        _check_shape(name, tensor, parameter_shape(model, name))
        layer = _CONTRACT_LAYER.match(name)
        if layer is None:
            yield {v: k for k, v in _MODEL_RENAMES.items()}[name], tensor
        elif layer.group(2) == "self_attention.linear_qkv.weight":
            hf = f"model.layers.{layer.group(1)}."
            blocks = tensor.reshape(NKV, G + 2, D, H)
            yield hf + _QKV[0], blocks[:, :G].reshape(NH * D, H)
            yield hf + _QKV[1], blocks[:, G].reshape(NKV * D, H)
            yield hf + _QKV[2], blocks[:, G + 1].reshape(NKV * D, H)
            del blocks
        elif layer.group(2) == "mlp.linear_fc1.weight":
            hf = f"model.layers.{layer.group(1)}."
            yield hf + _FC1[0], tensor[:F]
            yield hf + _FC1[1], tensor[F:]
        else:
            yield f"model.layers.{layer.group(1)}." + {v: k for k, v in _LAYER_RENAMES.items()}[layer.group(2)], tensor
        del tensor  # before the next one is read: one golden tensor alive at a time


def to_hf_state_dict(params: Tensors, model: Mapping[str, Any]) -> Dict[str, Any]:
    """Contract tensors -> a Hugging Face Llama state dict (`model.load_state_dict(..., strict=False)`
    of a tied model then reports only lm_head.weight missing, which is the embedding itself)."""
    return dict(iter_hf_tensors(params, model))


def iter_contract_tensors(state: Tensors, model: Mapping[str, Any],
                          strict: bool = True) -> Iterator[Tuple[str, Any]]:
    """(HF name, tensor) pairs -> (contract name, tensor), fusing each layer's q/k/v and gate/up.

    Accepts `LlamaForCausalLM` names and a bare `LlamaModel`'s (without the "model." prefix). lm_head.weight
    of a tied model is the embedding and is skipped. A name that matches nothing, a wrong shape or
    (with `strict`) a parameter left out is a ValueError naming the tensor.
    """
    H, NH, NKV, D, F = _dims(model)
    G = NH // NKV
    pending: Dict[str, Dict[str, Any]] = {}
    produced = set()
    for name, tensor in named_items(state):
        if not isinstance(name, str):
            raise ValueError(f"{name!r}: a tensor name must be a str")
        hf = name if name.startswith("model.") or name == "lm_head.weight" else "model." + name
        layer = _HF_LAYER.match(hf)
        if layer is not None and int(layer.group(1)) < int(model["num_layers"]):
            prefix, suffix = f"decoder.layers.{layer.group(1)}.", layer.group(2)
            if suffix in _LAYER_RENAMES:
                out = prefix + _LAYER_RENAMES[suffix]
                _check_shape(name, tensor, parameter_shape(model, out))
                produced.add(out)
                yield out, tensor
                continue
            fused = "self_attention.linear_qkv.weight" if suffix in _QKV else \
                "mlp.linear_fc1.weight" if suffix in _FC1 else None
            if fused is not None:
                parts = pending.setdefault(prefix + fused, {})
                parts[suffix] = tensor
                order = _QKV if suffix in _QKV else _FC1
                if all(p in parts for p in order):
                    out = prefix + fused
                    del pending[out]
                    produced.add(out)
                    yield out, _fuse(out, [parts[p] for p in order], suffix in _QKV, H, NH, NKV, D, F, G)
                continue
        elif hf in _MODEL_RENAMES:
            if hf == "lm_head.weight" and model["tie_embeddings"]:
                continue  # the embedding matrix itself
            out = _MODEL_RENAMES[hf]
            _check_shape(name, tensor, parameter_shape(model, out))
            produced.add(out)
            yield out, tensor
            continue
        raise ValueError(f"{name}: matches no Hugging Face Llama name of the golden model "
                         f"({int(model['num_layers'])} layers; e.g. model.layers.0.self_attn.q_proj.weight)")
    for out, parts in pending.items():
        order = _QKV if out.endswith("linear_qkv.weight") else _FC1
        missing = [p for p in order if p not in parts]
        layer = out.split(".")[2]
        raise ValueError(f"model.layers.{layer}.{missing[0]}: missing (the other parts of {out} are there)")
    if strict:
        for name in parameter_names(model):
            if name not in produced:
                raise ValueError(f"{name}: no Hugging Face tensor gives it")


def _fuse(name: str, parts: list, is_qkv: bool, H: int, NH: int, NKV: int, D: int, F: int, G: int) -> Any:
    if not is_qkv:
        _check_shape(name + " (gate_proj)", parts[0], (F, H))
        _check_shape(name + " (up_proj)", parts[1], (F, H))
        return _cat(parts, 0)
    q, k, v = parts
    _check_shape(name + " (q_proj)", q, (NH * D, H))
    _check_shape(name + " (k_proj)", k, (NKV * D, H))
    _check_shape(name + " (v_proj)", v, (NKV * D, H))
    grouped = _cat([q.reshape(NKV, G, D, H), k.reshape(NKV, 1, D, H), v.reshape(NKV, 1, D, H)], 1)
    return grouped.reshape((NH + 2 * NKV) * D, H)


def from_hf_state_dict(state: Tensors, model: Mapping[str, Any], strict: bool = True) -> Dict[str, Any]:
    """A Hugging Face Llama state dict (or named gradients) -> contract names and layouts."""
    return dict(iter_contract_tensors(state, model, strict))


def hf_grads(hf_model: Any) -> Iterator[Tuple[str, Any]]:
    """(HF name, gradient) of every parameter of `hf_model` (after backward)."""
    return named_gradients(hf_model, "hf_model")


def load_golden_into(hf_model: Any, golden: GoldenFile, step: int = 0) -> None:
    """Copies the golden parameters (step 0: /params/init; s: after update s) into a Hugging Face
    Llama model tensor by tensor, converting each to the model's dtype. Every parameter of the model
    must receive one (ValueError naming the first that does not)."""
    import torch

    check_module(hf_model, "hf_model")
    if not isinstance(golden, GoldenFile):
        raise ValueError(f"golden is of type {type(golden).__name__}, not GoldenFile")
    targets = dict(hf_model.named_parameters())
    filled = set()
    with torch.no_grad():
        for name, tensor in iter_hf_tensors(golden.params(step), golden.model):
            if name not in targets:
                raise ValueError(f"{name}: the Hugging Face model has no such parameter")
            _check_shape(name, targets[name], tuple(tensor.shape))
            targets[name].copy_(torch.from_numpy(np.ascontiguousarray(tensor)))
            filled.add(name)
    for name in targets:
        if name not in filled:
            raise ValueError(f"{name}: the golden file gives this Hugging Face parameter no value")


def exact_fp64(model: Any, **kwargs: Any) -> Any:
    """Removes transformers' float32 computations from a float64 Llama (touchstone/hf_fp64.py)."""
    from touchstone.hf_fp64 import exact_fp64 as patch

    return patch(model, **kwargs)


def hf_config_of(golden: GoldenFile) -> Dict[str, Any]:
    """hf_config_dict of a golden file; a ValueError names the file and the key."""
    try:
        return hf_config_dict(golden.config, golden.precision)
    except ValueError as e:
        raise ValueError(f"{golden.path}: {e}") from None


__all__ = ["hf_config_dict", "hf_config_of", "llama_config", "iter_hf_tensors", "to_hf_state_dict",
           "iter_contract_tensors", "from_hf_state_dict", "hf_grads", "load_golden_into", "exact_fp64"]
