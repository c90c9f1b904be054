"""The attention masks each framework wants, built from a batch's document ids.

The rule (docs/contract.md): query i may attend key j iff j <= i and, with data.document_masking,
both positions belong to the same document. Padding (document id -1) is a document of its own, so a
padding position attends to the padding before it and every row has at least itself: no row is empty.

Three forms, one rule:
- `attention_allowed`: numpy bool [B, T, T], True where attending is allowed (the rule itself).
- `hf_attention_mask`: torch [B, 1, T, T] *additive* mask for Hugging Face transformers: 0 where
  allowed, the dtype's minimum elsewhere. Transformers 4.47 uses a 4-D attention_mask exactly as
  given and adds it to the scores: a boolean or 0/1 mask passed there masks nothing, not even
  causally, and no error is raised.
- `sdpa_attention_mask`: torch bool [B, 1, T, T], True where allowed
  (torch.nn.functional.scaled_dot_product_attention's convention for a boolean attn_mask).
- `cu_seqlens`: cumulative sequence lengths over the flattened B*T tokens, for packed (THD) kernels
  (flash-attention varlen, Transformer Engine, Megatron-LM's packed sequences): each run of one document
  id inside a window is one sequence.
"""

from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from touchstone.candidate import numeric_array


def _document_ids(document_ids: Any) -> np.ndarray:
    ids = numeric_array(document_ids, "document_ids")
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"document_ids must be an integer array [B, T], not {ids.dtype} {list(ids.shape)}")
    return ids.astype(np.int64, copy=False)


def _masking(document_masking: Any) -> bool:
    # A string ("false") or an array would be read as true, or be ambiguous: only a bool is accepted.
    if not isinstance(document_masking, (bool, np.bool_)):
        raise ValueError(f"document_masking must be True or False, not {document_masking!r}")
    return bool(document_masking)


def attention_allowed(document_ids: Any, document_masking: bool = True) -> np.ndarray:
    """bool [B, T, T]: element [b, i, j] is True iff query i of window b may attend key j."""
    ids = _document_ids(document_ids)
    document_masking = _masking(document_masking)
    T = ids.shape[1]
    allowed = np.broadcast_to(np.tril(np.ones((T, T), dtype=bool)), (ids.shape[0], T, T))
    if document_masking:
        allowed = allowed & (ids[:, :, None] == ids[:, None, :])
    return np.ascontiguousarray(allowed)


def hf_attention_mask(document_ids: Any, document_masking: bool = True, dtype: Any = None) -> Any:
    """torch [B, 1, T, T] additive mask (0 allowed, torch.finfo(dtype).min elsewhere) for transformers.

    `dtype` is the model's compute dtype (default torch.float64). Pass it as `attention_mask=`; HF adds
    it to the attention scores as it is.
    """
    import torch

    dtype = torch.float64 if dtype is None else dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a torch floating-point dtype (the model's), not {dtype!r}")
    allowed = torch.from_numpy(attention_allowed(document_ids, document_masking))[:, None]
    mask = torch.zeros(allowed.shape, dtype=dtype)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)


def sdpa_attention_mask(document_ids: Any, document_masking: bool = True) -> Any:
    """torch bool [B, 1, T, T], True where attending is allowed (scaled_dot_product_attention's attn_mask)."""
    import torch

    return torch.from_numpy(attention_allowed(document_ids, document_masking))[:, None]


def cu_seqlens(document_ids: Any, document_masking: bool = True) -> Tuple[np.ndarray, int]:
    """(cu_seqlens int32 [n + 1], max_seqlen) over the B*T tokens flattened window by window.

    Sequence k covers flattened tokens cu_seqlens[k] .. cu_seqlens[k+1] - 1. With document masking each
    run of one document id (padding included) inside a window is a sequence; without, each window is
    one. A document id that appears in two separate runs of one window cannot be expressed this way
    (its runs would attend to each other under the mask) and is a ValueError.
    """
    ids = _document_ids(document_ids)
    document_masking = _masking(document_masking)
    B, T = ids.shape
    starts = [0]
    for b in range(B):
        row = ids[b]
        if document_masking:
            boundaries = np.flatnonzero(row[1:] != row[:-1]) + 1
            runs = np.split(row, boundaries)
            seen = [int(run[0]) for run in runs]
            if len(set(seen)) != len(seen):
                raise ValueError(f"document_ids: window {b} holds a document in two separate runs; "
                                 "cu_seqlens cannot express its mask")
            starts += [b * T + int(x) for x in boundaries]
        starts.append((b + 1) * T)
    out = np.asarray(starts, dtype=np.int32)
    return out, int(np.diff(out).max()) if len(out) > 1 else 0
