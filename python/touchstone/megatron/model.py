"""Megatron-Core's GPTModel of a golden config, holding the golden /params/init cut for this rank.

`transformer_config` maps the golden `model` section onto a `TransformerConfig` (RMSNorm, SwiGLU as
`gated_linear_unit` with SiLU, no biases, RoPE, dropout 0, no fusion, `use_cpu_initialization`,
`perform_initialization=False`: the weights are loaded, never drawn). `build_model` builds
`GPTModel` with Megatron-Core's local spec (`get_gpt_layer_local_spec(normalization="RMSNorm")`) for
this rank's pipeline stage, and `load_golden_params` copies the golden initial weights into it, each
cut as Megatron-Core's tensor-parallel layers hold it:

- `embedding.word_embeddings.weight`, `output_layer.weight` (VocabParallelEmbedding,
  ColumnParallelLinear): vocabulary rows, tp rank t holding rows t V/tp ... (t+1) V/tp - 1;
- `linear_qkv` (ColumnParallelLinear): rows, whole KV groups per rank (the golden rows are already
  grouped per KV group, [q_g; k_g; v_g], as Megatron-Core's);
- `linear_fc1` (ColumnParallelLinear, gated): [gate_t; up_t], rank t's rows of each half;
- `linear_proj`, `linear_fc2` (RowParallelLinear): columns;
- norm weights whole on every rank.

The decoder layers are numbered from 0 on every stage (Megatron-Core's module names); stage p of pp
holds golden layers p L/pp ... (p+1) L/pp - 1. With tied embeddings and pp > 1 the last stage's
`output_layer.weight` is Megatron-Core's copy of the word embedding and is loaded with it.

Megatron-Core 0.16.1 sets no tensor-parallel attributes (`tensor_model_parallel`, `partition_dim`)
when `use_cpu_initialization=True` and `perform_initialization=False`, so its gradient norm counts
every sharded tensor of tp rank 0 only; `set_tensor_parallel_attributes` sets them, as 0.19.2's layers
do, and says so (docs/frameworks/megatron.md, "Megatron-Core 0.16.1 at TP > 1").
"""

from __future__ import annotations

from typing import Any, Iterator, Tuple

import numpy as np
import torch

from touchstone.golden import GoldenFile


def check_layout(golden: GoldenFile, tp: int, pp: int) -> None:
    """ValueError (one line, naming the key) for a golden model that cannot be cut into tp x pp."""
    m = golden.model
    L, NKV, V, F = int(m["num_layers"]), int(m["num_kv_heads"]), int(m["vocab_size"]), int(m["ffn_hidden_size"])
    for what, size, name, by in ((NKV, tp, "model.num_kv_heads", "tp"), (V, tp, "model.vocab_size", "tp"),
                                 (F, tp, "model.ffn_hidden_size", "tp"), (L, pp, "model.num_layers", "pp")):
        if what % size:
            raise ValueError(f"{golden.path}: {name} {what} is not a multiple of {by} {size}")
    if float(m["attention_dropout"]) != 0.0 or float(m["hidden_dropout"]) != 0.0:
        raise ValueError(f"{golden.path}: model.attention_dropout and model.hidden_dropout must be 0")


def transformer_config(golden: GoldenFile, tp: int, pp: int, dtype: torch.dtype, vp: int = 1) -> Any:
    """The TransformerConfig of the golden model for tp x pp (ValueError for what cannot be cut so);
    `dtype` torch.bfloat16 is Megatron-LM's --bf16 (`bf16=True`, BF16 parameters and pipeline)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    check_layout(golden, tp, pp * vp)
    m = golden.model
    L, H, NH, NKV = int(m["num_layers"]), int(m["hidden_size"]), int(m["num_heads"]), int(m["num_kv_heads"])
    V, F = int(m["vocab_size"]), int(m["ffn_hidden_size"])
    return TransformerConfig(
        num_layers=L, hidden_size=H, num_attention_heads=NH, num_query_groups=NKV, kv_channels=H // NH,
        ffn_hidden_size=F, normalization="RMSNorm", layernorm_epsilon=float(m["norm_eps"]),
        gated_linear_unit=True, activation_func=torch.nn.functional.silu, add_bias_linear=False,
        hidden_dropout=0.0, attention_dropout=0.0, bias_activation_fusion=False,
        bias_dropout_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False,
        persist_layer_norm=False, gradient_accumulation_fusion=False,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, sequence_parallel=False,
        virtual_pipeline_model_parallel_size=vp if vp > 1 else None,
        # Interleaved 1F1B over gloo at pp = 2 with batched p2p (batch_isend_irecv) gives stage 1's
        # first chunk wrong gradients (cosine ~0 against the golden file, measured on 0.19.2): there the
        # next and previous rank are one peer, sent to twice in one batch. Unbatched sends pass.
        batch_p2p_comm=vp == 1,
        params_dtype=dtype, pipeline_dtype=dtype, bf16=dtype == torch.bfloat16, use_cpu_initialization=True,
        perform_initialization=False,
        calculate_per_token_loss=golden.loss_normalization == "global_token_mean")


def build_model(golden: GoldenFile, config: Any, vp_stage: Any = None) -> Any:
    """GPTModel (local spec) of this rank's pipeline stage; with virtual stages, its model chunk
    `vp_stage` (virtual stage vp_stage x pp + stage, Megatron-Core's interleaving)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    m = golden.model
    return GPTModel(
        config=config, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=int(m["vocab_size"]), max_sequence_length=int(m["seq_length"]),
        pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
        post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
        vp_stage=vp_stage,
        share_embeddings_and_output_weights=bool(m["tie_embeddings"]),
        position_embedding_type="rope", rotary_percent=1.0, rotary_base=float(m["rope_theta"]))


def golden_name(local: str, golden: GoldenFile, pp: int, stage: int) -> str:
    """The golden name of this stage's parameter `local` (layer numbers made global). With virtual
    stages, pp is the number of virtual stages (pp x vp) and stage the virtual stage."""
    if local.startswith("decoder.layers."):
        layer, rest = local[len("decoder.layers."):].split(".", 1)
        per_stage = int(golden.model["num_layers"]) // pp
        return f"decoder.layers.{int(layer) + stage * per_stage}.{rest}"
    if local == "output_layer.weight" and golden.model["tie_embeddings"]:
        return "embedding.word_embeddings.weight"  # the last stage's copy of the tied embedding
    return local


def tp_shard(name: str, full: np.ndarray, tp: int, rank: int) -> np.ndarray:
    """Tensor-parallel rank `rank`'s part of the golden tensor `name`, as Megatron-Core holds it."""
    if tp == 1 or full.ndim == 1:
        return full
    if name.endswith("mlp.linear_fc1.weight"):  # [gate; up]: rank t holds [gate_t; up_t]
        gate, up = np.split(full, 2, axis=0)
        return np.concatenate([np.split(gate, tp, axis=0)[rank], np.split(up, tp, axis=0)[rank]])
    if name.endswith(("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")):
        return np.split(full, tp, axis=1)[rank]  # RowParallelLinear: input columns
    # word embeddings, output layer, linear_qkv (whole KV groups): output rows
    return np.split(full, tp, axis=0)[rank]


def load_golden_params(model: Any, golden: GoldenFile, tp: int, tp_rank: int, pp: int, stage: int,
                       attr: str = "") -> None:
    """Copies /params/init into `model`, cut for (tp_rank, stage); every parameter must be loaded.

    With `attr` "main_param" it goes into each parameter's FP32 main copy of Megatron-Core's mixed
    precision optimizer instead, as loading a checkpoint's optimizer state does (the optimizer makes
    the copies from the BF16 parameters, which would start the master weights at the BF16 rounding
    of /params/init instead of /params/init itself)."""
    with torch.no_grad():
        for local, model_param in model.named_parameters():
            param = getattr(model_param, attr) if attr else model_param
            name = golden_name(local, golden, pp, stage)
            shard = tp_shard(name, golden.init_param(name), tp, tp_rank)
            if tuple(shard.shape) != tuple(param.shape):
                raise ValueError(f"{golden.path}: /params/init/{name} cut for tp rank {tp_rank} has shape "
                                 f"{list(shard.shape)}, Megatron-Core's {local} has {list(param.shape)}")
            param.copy_(torch.from_numpy(np.ascontiguousarray(shard)).to(param.dtype))


def set_tensor_parallel_attributes(model: Any) -> int:
    """Marks the sharded weights as 0.19.2's layers do (0.16.1 skips it without initialisation).

    Returns how many parameters were marked. Partition dims: 0 for the column-parallel and embedding
    weights, 1 for the row-parallel ones.
    """
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    marked = 0
    for local, param in model.named_parameters():
        if param.dim() < 2:
            continue
        dim = 1 if local.endswith(("linear_proj.weight", "linear_fc2.weight")) else 0
        if not getattr(param, "tensor_model_parallel", False):
            set_tensor_model_parallel_attributes(param, is_parallel=True, dim=dim, stride=1)
            marked += 1
    return marked


def stage_params(model: Any, attr: str = "data") -> Iterator[Tuple[str, torch.Tensor]]:
    """(shard name, tensor) of this rank: Megatron-Core's own names, layer numbers local to the stage
    (docs/diffing.md "per-rank shards"); `attr` "data" gives the parameters, "main_grad" the
    gradients in the DDP buffer, "main_param" the FP32 main parameters of the BF16 optimizer."""
    for local, param in model.named_parameters():
        yield local, getattr(param, attr)
