"""Megatron-LM's tensor- and pipeline-parallel layouts, written independently of Touchstone's C++
(parallel/tensor/sharding.h) so that the tests can produce per-rank shards the way Megatron-LM holds
them and check that `touchstone diff` puts them back together.

  vocab-parallel embedding and output layer   rows in tp contiguous blocks
  linear_qkv (grouped per KV group)           rows in tp contiguous blocks = whole KV groups
  linear_fc1 ([gate; up])                     rank r holds [gate rows of r; up rows of r]
  linear_proj, linear_fc2 (row-parallel)      columns in tp contiguous blocks
  norm weights                                whole on every rank
Layer numbers are local to the pipeline stage; with tied embeddings and pp > 1 the last stage holds a
copy of the embedding named output_layer.weight.
"""

import re

import numpy as np

LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


def shard(name, tensor, tp, rank):
    """Rank `rank`'s shard of a full tensor, in Megatron-LM's layout."""
    if name.endswith("linear_fc1.weight"):
        ffn = tensor.shape[0] // 2
        local = ffn // tp
        gate = tensor[rank * local:(rank + 1) * local]
        up = tensor[ffn + rank * local:ffn + (rank + 1) * local]
        return np.concatenate([gate, up])
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        cols = tensor.shape[1] // tp
        return tensor[:, rank * cols:(rank + 1) * cols]
    if name.endswith(("linear_qkv.weight", "word_embeddings.weight")) or name == "output_layer.weight":
        rows = tensor.shape[0] // tp
        return tensor[rank * rows:(rank + 1) * rows]
    return tensor  # norm weights are replicated


def placements(name, stage_layers, tied):
    """[(stage, stage-local name)] for a contract parameter name."""
    pp = len(stage_layers)
    match = LAYER.match(name)
    if match:
        layer, suffix = int(match.group(1)), match.group(2)
        first = 0
        for stage, count in enumerate(stage_layers):
            if layer < first + count:
                return [(stage, f"decoder.layers.{layer - first}.{suffix}")]
            first += count
        raise ValueError(f"layer {layer} beyond the stages {stage_layers}")
    if name == "embedding.word_embeddings.weight":
        return [(0, name)] + ([(pp - 1, "output_layer.weight")] if tied and pp > 1 else [])
    return [(pp - 1, name)]  # final norm and output layer live on the last stage
