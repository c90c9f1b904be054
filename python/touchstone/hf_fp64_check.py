"""The self-check of `exact_fp64` (touchstone/hf_fp64.py): each patched module of a model run on small
deterministic float64 inputs and compared with an independent float64 computation written out here
(RoPE's cos and sin element by element from the contract's formula, RMSNorm, one attention layer with
its projections, rotate-half RoPE, GQA and a masked softmax, and HF's `labels=` loss, with 5.x's
`shift_labels=` too), within `TOLERANCE`. A site that still rounds to float32 shows 2e-9 to 7e-6
relative and is reported with its site name; so is a site whose module no longer takes the call
(an unlisted transformers version whose API moved). An SDPA attention, which exact_fp64 leaves as it
is, is checked the same way, with an additive mask and with none (SDPA's causal path)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterable, List, Set, Tuple

from touchstone.hf_fp64 import TOLERANCE, _loss_takes_shift_labels, contract_inv_freq, rope_theta_and_dim

if TYPE_CHECKING:  # pragma: no cover
    import torch


def _relative_error(got: Any, want: Any) -> float:
    import torch

    got = got.detach().to(torch.float64)
    want = want.detach().to(torch.float64)
    scale = float(torch.linalg.vector_norm(want))
    return float(torch.linalg.vector_norm(got - want)) / (scale if scale > 0 else 1.0)


def _check(what: str, got: Any, want: Any, errors: List[str]) -> None:
    error = _relative_error(got, want)
    if not error <= TOLERANCE:
        errors.append(f"{what}: relative error {error:.3g} > {TOLERANCE:g}")


def _inputs(shape: Tuple[int, ...], salt: int, device: Any) -> "torch.Tensor":
    """Deterministic float64 values in about [-1.7, 1.7] without touching the global RNG."""
    import torch

    n = 1
    for d in shape:
        n *= d
    i = torch.arange(n, dtype=torch.float64)
    values = torch.sin(i * 0.7548776662466927 + salt * 1.61803398875) * 1.7
    return values.reshape(shape).to(device)


def _reference_cos_sin(theta: float, dim: int, positions: Iterable[int]) -> Tuple[Any, Any]:
    """[len(positions), D] cos and sin by the contract, element by element in Python floats."""
    import torch

    inv_freq = contract_inv_freq(theta, dim)
    cos = [[math.cos(p * f) for f in inv_freq] * 2 for p in positions]
    sin = [[math.sin(p * f) for f in inv_freq] * 2 for p in positions]
    return torch.tensor(cos, dtype=torch.float64), torch.tensor(sin, dtype=torch.float64)


def _reference_attention(module: Any, h: Any, cos: Any, sin: Any, allowed: Any) -> Any:
    """One attention layer written out: projections, rotate-half RoPE, GQA scores / sqrt(D) over the
    allowed keys, a softmax by exp(s - max) / sum, the weighted values and the output projection."""
    import torch

    def linear(layer: Any, x: Any) -> Any:
        y = x @ layer.weight.t()
        return y + layer.bias if layer.bias is not None else y

    T = h.shape[0]
    D = module.head_dim
    q = linear(module.q_proj, h).reshape(T, -1, D)          # [T, NH, D]
    k = linear(module.k_proj, h).reshape(T, -1, D)          # [T, NKV, D]
    v = linear(module.v_proj, h).reshape(T, -1, D)
    half = D // 2

    def rope(x: Any) -> Any:
        c, s = cos[:, None, :half], sin[:, None, :half]
        first, second = x[..., :half], x[..., half:]
        return torch.cat((first * c - second * s, second * c + first * s), dim=-1)

    q, k = rope(q), rope(k)
    group = q.shape[1] // k.shape[1]
    heads = []
    for head in range(q.shape[1]):
        kv = head // group
        scores = (q[:, head, :] @ k[:, kv, :].t()) / math.sqrt(D)          # [T, T]
        scores = scores.masked_fill(~allowed, -math.inf)
        weights = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        heads.append(weights @ v[:, kv, :])
    return linear(module.o_proj, torch.cat(heads, dim=-1))


def verify(model: Any, chosen: Set[str], rotaries: List[Any], norms: List[Any], attentions: List[Any]) -> None:
    """Runs each patched module of `model` on small float64 inputs and compares it with the
    independent computations above; RuntimeError listing every disagreement, by site."""
    import torch
    from transformers.models.llama import modeling_llama as ml

    errors: List[str] = []
    config = model.config
    device = next(model.parameters()).device
    hidden = config.hidden_size
    # Positions up to 4000: a float32 inv_freq or angle is off there by ~1e-4 absolute.
    positions = [0, 1, 2, 5, 17, 100, 1023, 4000]
    T = len(positions)

    def site(name: str, check: Any) -> None:
        site_errors: List[str] = []
        try:
            check(site_errors)
        except Exception as error:  # an unlisted version whose modules take other arguments
            site_errors.append(f"{type(error).__name__}: {error}")
        errors.extend(f'site "{name}", {message}' for message in site_errors)

    with torch.no_grad():
        x = _inputs((1, T, hidden), 1, device)
        position_ids = torch.tensor([positions], dtype=torch.long, device=device)

        def check_rope(out: List[str]) -> None:
            for index, module in enumerate(rotaries):
                theta, dim = rope_theta_and_dim(module)
                want_cos, want_sin = _reference_cos_sin(theta, dim, positions)
                cos, sin = module(x, position_ids)
                _check(f"rotary embedding {index} cos", cos[0], want_cos.to(device), out)
                _check(f"rotary embedding {index} sin", sin[0], want_sin.to(device), out)

        def check_rmsnorm(out: List[str]) -> None:
            for index, module in enumerate(norms):
                want = x * (1.0 / torch.sqrt((x * x).sum(-1, keepdim=True) / hidden + module.variance_epsilon))
                _check(f"RMSNorm {index}", module(x), want * module.weight, out)

        def check_attention(out: List[str]) -> None:
            theta, dim = rope_theta_and_dim(rotaries[0])
            cos, sin = _reference_cos_sin(theta, dim, positions)
            cos, sin = cos.to(device), sin.to(device)
            causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
            # causal over the first 5 positions, then a new document (as packed data) from the 6th
            allowed = causal.clone()
            allowed[5:, :5] = False
            additive = torch.zeros(T, T, dtype=torch.float64, device=device)
            additive = additive.masked_fill(~allowed, torch.finfo(torch.float64).min)[None, None]
            masks = [("additive mask", additive, allowed)]
            if config._attn_implementation == "sdpa":  # no mask: SDPA's is_causal path, as HF calls it
                masks.append(("no mask", None, causal))
            for index, module in enumerate(attentions):
                was_training = module.training
                module.eval()
                try:
                    for what, mask, pattern in masks:
                        got = module(hidden_states=x, attention_mask=mask, position_ids=position_ids,
                                     position_embeddings=(cos[None], sin[None]))[0]
                        _check(f"attention layer {index} ({config._attn_implementation}, {what})", got[0],
                               _reference_attention(module, x[0], cos, sin, pattern), out)
                finally:
                    module.train(was_training)

        def check_loss(out: List[str]) -> None:
            vocab = config.vocab_size
            logits = _inputs((1, T, vocab), 2, device) * 4.0
            labels = torch.tensor([[(7 * i + 3) % vocab for i in range(T)]], device=device)
            labels[0, 3] = -100

            def reference(rows: Any, targets: Any) -> Any:
                keep = targets != -100
                top = rows.max(dim=-1, keepdim=True).values
                logsumexp = torch.log(torch.exp(rows - top).sum(dim=-1)) + top[:, 0]
                picked = rows[torch.arange(rows.shape[0], device=device), targets.clamp(min=0)]
                return ((logsumexp - picked) * keep).sum() / keep.sum()

            got = model.loss_function(logits=logits, labels=labels, vocab_size=vocab)
            _check("loss (labels=)", got, reference(logits[0, :-1], labels[0, 1:]), out)
            if _loss_takes_shift_labels():  # 5.x: shift_labels= are the targets of every position
                got = model.loss_function(logits=logits, labels=labels, vocab_size=vocab, shift_labels=labels)
                _check("loss (shift_labels=)", got, reference(logits[0], labels[0]), out)

        if "rope" in chosen:
            site("rope", check_rope)
        if "rmsnorm" in chosen:
            site("rmsnorm", check_rmsnorm)
        if "softmax" in chosen or config._attn_implementation == "sdpa":
            site("softmax", check_attention)
        if "loss" in chosen and isinstance(model, ml.LlamaForCausalLM):
            site("loss", check_loss)
    if errors:
        raise RuntimeError("touchstone.hf.exact_fp64: after patching, the model still disagrees with float64 "
                           "(a float32 site is left?): " + "; ".join(errors))
