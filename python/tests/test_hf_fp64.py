"""touchstone.hf_fp64.exact_fp64 against an independent float64 Llama forward written here.

A tiny LlamaForCausalLM (GQA: 4 query heads on 2 KV heads) in float64 with random weights is run on
one batch, twice: as transformers computes it and through `reference_forward` below (HF's parameter
names, the math of docs/contract.md, nothing of transformers). The objective is the golden one (the
token-summed cross entropy of the logits over the loss tokens, as touchstone.loss computes it) plus
transformers' own `labels=` loss, so one backward exercises all four float32 sites.

Eager attention (both API generations have it); SDPA is in test_hf_transformers5.py. Run with the
transformers of tools/install-deps.sh (4.47.1, Debian's torch 1.13) on the path, or with transformers
5.x on torch 2:
    PYTHONPATH=python:build/python-deps /usr/bin/python3 -m pytest python/tests/test_hf_fp64.py
    PYTHONPATH=python /work/venv-probe/bin/python -m pytest python/tests/test_hf_fp64.py
"""

from __future__ import annotations

import io
import math
import sys
import warnings
from typing import Dict

import pytest

import torch
# transformers from build/python-deps (tools/install-deps.sh): its absence is a failure, never a skip.
from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel
from transformers.models.llama import modeling_llama

from touchstone import hf_fp64  # noqa: E402
from touchstone.hf_fp64 import SITES, exact_fp64  # noqa: E402

F = torch.nn.functional
CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, rms_norm_eps=1e-5,
              max_position_embeddings=256, initializer_range=0.1, attention_bias=False, mlp_bias=False)
BATCH, SEQ = 2, 48
# Float64 agreement bound: unit roundoff 1.1e-16 and reductions of at most a few hundred terms
# (hidden 64, intermediate 160, vocabulary 256, 48 keys, 96 tokens) give errors of order
# sqrt(n) * 1e-16 = 1e-15 per operation, a few hundred operations deep at most: 1e-12 is safe.
EXACT = 1e-12
# A float32 site rounds to 6e-8 relative; its effect on logits and gradients is 1e-8 or more.
ROUNDED = 1e-9


def build_model(seed: int = 0, cls=LlamaForCausalLM, attention: str = "eager"):
    """Eager attention by default: the only one of 4.47 on torch 1.13; transformers 5.x defaults to SDPA."""
    torch.manual_seed(seed)
    model = cls(LlamaConfig(**CONFIG, attn_implementation=attention)).to(torch.float64)
    with torch.no_grad():  # norm weights away from 1, so that they matter
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(1.0 + 0.2 * torch.randn_like(parameter))
    return model


def make_batch(documents: bool):
    """(input_ids, HF labels, golden targets, position_ids or None, HF attention_mask or None, allowed):
    `allowed[b, q, k]` says whether query q of row b attends to key k."""
    generator = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ), generator=generator)
    targets = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ), generator=generator)
    targets[0, 5] = targets[1, 17] = targets[1, 40] = -100
    labels = ids.clone()
    labels[0, 9] = labels[1, 30] = -100
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()
    if not documents:
        return ids, labels, targets, None, None, causal.expand(BATCH, SEQ, SEQ)
    # Packed documents: row 0 holds documents of 20, 12 and 16 tokens, row 1 of 48.
    document = torch.zeros(BATCH, SEQ, dtype=torch.long)
    document[0, 20:32], document[0, 32:] = 1, 2
    position_ids = torch.zeros(BATCH, SEQ, dtype=torch.long)
    for b in range(BATCH):
        for t in range(1, SEQ):
            position_ids[b, t] = position_ids[b, t - 1] + 1 if document[b, t] == document[b, t - 1] else 0
    allowed = causal & (document[:, :, None] == document[:, None, :])
    mask = torch.zeros(BATCH, 1, SEQ, SEQ, dtype=torch.float64)
    mask = mask.masked_fill(~allowed[:, None], torch.finfo(torch.float64).min)  # HF's additive 4-D mask
    return ids, labels, targets, position_ids, mask, allowed


def reference_forward(p: Dict[str, torch.Tensor], ids, position_ids, allowed):
    """Logits [B, T, V] of the Llama of docs/contract.md in float64, from HF-named parameters."""
    B, T = ids.shape
    H, NH, NKV = CONFIG["hidden_size"], CONFIG["num_attention_heads"], CONFIG["num_key_value_heads"]
    D, eps = H // NH, CONFIG["rms_norm_eps"]
    if position_ids is None:
        position_ids = torch.arange(T).expand(B, T)
    inv_freq = torch.tensor([CONFIG["rope_theta"] ** (-2.0 * i / D) for i in range(D // 2)],
                            dtype=torch.float64)
    angles = position_ids.to(torch.float64)[..., None] * inv_freq            # [B, T, D/2]
    cos, sin = angles.cos()[:, :, None, :], angles.sin()[:, :, None, :]      # per head

    def rope(x):                                                             # [B, T, heads, D]
        first, second = x[..., : D // 2], x[..., D // 2:]
        return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)

    def rms_norm(x, weight):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight

    x = p["model.embed_tokens.weight"][ids]
    for layer in range(CONFIG["num_hidden_layers"]):
        w = {k[len(f"model.layers.{layer}."):]: v for k, v in p.items() if k.startswith(f"model.layers.{layer}.")}
        h = rms_norm(x, w["input_layernorm.weight"])
        q = rope((h @ w["self_attn.q_proj.weight"].t()).view(B, T, NH, D))
        k = rope((h @ w["self_attn.k_proj.weight"].t()).view(B, T, NKV, D))
        v = (h @ w["self_attn.v_proj.weight"].t()).view(B, T, NKV, D)
        k = k.repeat_interleave(NH // NKV, dim=2)                            # query head h reads kv h / 2
        v = v.repeat_interleave(NH // NKV, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D)
        scores = scores.masked_fill(~allowed[:, None], -math.inf)
        scores = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
        probabilities = scores / scores.sum(dim=-1, keepdim=True)
        attention = torch.einsum("bhqk,bkhd->bqhd", probabilities, v).reshape(B, T, NH * D)
        x = x + attention @ w["self_attn.o_proj.weight"].t()
        h = rms_norm(x, w["post_attention_layernorm.weight"])
        gate, up = h @ w["mlp.gate_proj.weight"].t(), h @ w["mlp.up_proj.weight"].t()
        x = x + (gate * torch.sigmoid(gate) * up) @ w["mlp.down_proj.weight"].t()
    x = rms_norm(x, p["model.norm.weight"])
    return x @ p["lm_head.weight"].t()


def cross_entropy_sum(logits, targets):
    """Sum over the positions whose target is not -100 of logsumexp(logits) - logits[target]."""
    keep = targets != -100
    top = logits.max(dim=-1, keepdim=True).values
    logsumexp = torch.log(torch.exp(logits - top).sum(-1)) + top[..., 0]
    picked = logits.gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    return ((logsumexp - picked) * keep).sum(), keep.sum()


def objective_reference(logits, targets, labels):
    golden, count = cross_entropy_sum(logits, targets)
    shifted, shifted_count = cross_entropy_sum(logits[:, :-1], labels[:, 1:])
    return golden / count + shifted / shifted_count


def errors_against_reference(model, documents: bool) -> Dict[str, float]:
    """Relative L2 errors of HF's logits, labels= loss and every gradient against reference_forward."""
    ids, labels, targets, position_ids, mask, allowed = make_batch(documents)
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, labels=labels)
    golden, count = cross_entropy_sum(out.logits, targets)
    (golden / count + out.loss).backward()

    reference = {n: t.detach().clone().requires_grad_(True) for n, t in model.named_parameters()}
    ref_logits = reference_forward(reference, ids, position_ids, allowed)
    ref_shifted, ref_count = cross_entropy_sum(ref_logits[:, :-1], labels[:, 1:])
    objective_reference(ref_logits, targets, labels).backward()

    def relative(got, want):
        return float((got.detach() - want.detach()).norm() / want.detach().norm())

    errors = {"logits": relative(out.logits, ref_logits), "labels= loss": relative(out.loss, ref_shifted / ref_count)}
    for name, parameter in model.named_parameters():
        errors[name] = relative(parameter.grad, reference[name].grad)
    return errors


def summary(errors: Dict[str, float]) -> str:
    gradients = [e for n, e in errors.items() if n.endswith("weight")]
    return (f"logits {errors['logits']:.2e}, labels= loss {errors['labels= loss']:.2e}, "
            f"gradients max {max(gradients):.2e}")


@pytest.mark.parametrize("documents", [False, True], ids=["causal", "documents"])
def test_unpatched_model_is_not_float64(documents):
    errors = errors_against_reference(build_model(), documents)
    print(f"\nunpatched ({'documents' if documents else 'causal'}): {summary(errors)}")
    assert errors["logits"] > ROUNDED, errors
    assert max(errors.values()) > ROUNDED, errors


@pytest.mark.parametrize("documents", [False, True], ids=["causal", "documents"])
def test_exact_fp64_matches_float64_reference(documents):
    model = build_model()
    assert exact_fp64(model) is model
    errors = errors_against_reference(model, documents)
    print(f"\nexact_fp64 ({'documents' if documents else 'causal'}): {summary(errors)}")
    bad = {name: error for name, error in errors.items() if not error <= EXACT}
    assert not bad, bad
    assert len(errors) == 2 + len(list(model.parameters()))


@pytest.mark.parametrize("left", SITES)
def test_each_site_left_unpatched_rounds_to_float32(left):
    model = exact_fp64(build_model(), sites=tuple(site for site in SITES if site != left))
    errors = errors_against_reference(model, documents=True)
    print(f"\n{left} left in: {summary(errors)}")
    # the loss site shows only in the labels= path; the others in the logits too
    assert (errors["labels= loss"] if left == "loss" else errors["logits"]) > ROUNDED, errors
    gradients = [e for n, e in errors.items() if n.endswith("weight")]
    assert max(gradients) > ROUNDED, errors


def test_patch_is_local_to_the_instance():
    hf_forwards = (modeling_llama.LlamaRMSNorm.forward, modeling_llama.LlamaAttention.forward,
                   modeling_llama.LlamaRotaryEmbedding.forward, modeling_llama.LlamaForCausalLM.loss_function)
    patched = exact_fp64(build_model())
    exact_fp64(patched)  # again: harmless
    assert (modeling_llama.LlamaRMSNorm.forward, modeling_llama.LlamaAttention.forward,
            modeling_llama.LlamaRotaryEmbedding.forward, modeling_llama.LlamaForCausalLM.loss_function) == hf_forwards
    assert isinstance(patched, LlamaForCausalLM) and type(patched).__name__ == "LlamaForCausalLM"
    assert set(patched.state_dict()) == set(build_model().state_dict())  # inv_freq stays non-persistent
    buffer = io.BytesIO()  # the patched model pickles (torch.save) and comes back patched
    torch.save(patched, buffer)
    buffer.seek(0)
    assert errors_against_reference(torch.load(buffer, weights_only=False), documents=True)["labels= loss"] <= EXACT
    other = build_model()  # a model built after the patch is untouched
    assert errors_against_reference(other, documents=False)["logits"] > ROUNDED
    assert errors_against_reference(patched, documents=False)["logits"] <= EXACT


def test_llama_model_without_head():
    model = exact_fp64(build_model(cls=LlamaModel))
    assert isinstance(model, LlamaModel)


def unlisted_version(monkeypatch, version: str = "5.99.0") -> str:
    # sys.modules' entry, not the module object imported at the top: importing LlamaForCausalLM makes
    # transformers put a new lazy module object there.
    monkeypatch.setattr(sys.modules["transformers"], "__version__", version)
    assert version not in hf_fp64.KNOWN_VERSIONS
    return version


def test_unlisted_version_is_accepted_when_the_self_check_passes(monkeypatch):
    """The version policy: a transformers version not in KNOWN_VERSIONS whose patched sites all pass
    the float64 self-check is taken, with one warning naming the version, and computes float64."""
    unlisted_version(monkeypatch)
    with pytest.warns(hf_fp64.UnlistedVersionWarning) as caught:
        model = exact_fp64(build_model())
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    assert str(caught[0].message) == ("touchstone.hf.exact_fp64: transformers 5.99.0 is not in KNOWN_VERSIONS; "
                                      "every patched site (loss, rmsnorm, rope, softmax) passed the float64 "
                                      "self-check, so it is accepted")
    assert max(errors_against_reference(model, documents=True).values()) <= EXACT


def test_unlisted_version_is_refused_naming_the_failing_site(monkeypatch):
    """An unlisted version whose RMSNorm replacement does not take (HF's float32 forward in its place)
    is refused with a ValueError naming the site, and no warning says it was accepted."""
    unlisted_version(monkeypatch)
    monkeypatch.setattr(hf_fp64, "_rmsnorm_forward_fp64", modeling_llama.LlamaRMSNorm.forward)
    with warnings.catch_warnings():
        warnings.simplefilter("error", hf_fp64.UnlistedVersionWarning)
        with pytest.raises(ValueError, match=r"touchstone\.hf\.exact_fp64: transformers 5\.99\.0 is not in "
                                             r"KNOWN_VERSIONS \(.*4\.47\.1.*\) and fails the self-check: .*"
                                             r'site "rmsnorm", RMSNorm 0: relative error [0-9.e-]+ > 1e-12') as info:
            exact_fp64(build_model())
    assert "\n" not in str(info.value) and 'site "rope"' not in str(info.value)


def test_unlisted_version_is_refused_when_a_module_no_longer_takes_the_call(monkeypatch):
    """An API that moved (the attention module's forward no longer takes the copy's arguments): the
    self-check's call fails, and the refusal names the site."""
    unlisted_version(monkeypatch)

    def moved(self, hidden_states, **kwargs):
        raise TypeError("forward() got an unexpected keyword argument 'position_embeddings'")

    for name in ("_attention_forward_fp64", "_attention_forward_fp64_4_47"):
        monkeypatch.setattr(hf_fp64, name, moved)
    with pytest.raises(ValueError, match=r'fails the self-check: .*site "softmax", TypeError: forward\(\) got an '
                                         r"unexpected keyword argument 'position_embeddings'"):
        exact_fp64(build_model())


def test_refuses_what_it_cannot_patch():
    with pytest.raises(ValueError, match=r"model\.embed_tokens\.weight is torch\.float32, not torch\.float64"):
        exact_fp64(LlamaForCausalLM(LlamaConfig(**CONFIG)))
    with pytest.raises(ValueError, match="expected a transformers LlamaForCausalLM or LlamaModel, got Linear"):
        exact_fp64(torch.nn.Linear(2, 2).to(torch.float64))
    with pytest.raises(ValueError, match="unknown site"):
        exact_fp64(build_model(), sites=("rope", "layernorm"))
    model = build_model()
    if hasattr(modeling_llama, "eager_attention_forward"):  # transformers >= 4.48: SDPA is taken, not flex
        model.config._attn_implementation = "flex_attention"
        refusal = 'attention implementation is "flex_attention", not "eager" or "sdpa"'
    else:  # 4.47: SDPA is another module class (and needs torch >= 2.1.1)
        model.config._attn_implementation = "sdpa"
        refusal = 'attention implementation is "sdpa", not "eager"'
    with pytest.raises(ValueError, match=refusal):
        exact_fp64(model)
    assert "forward" not in model.model.norm.__dict__  # a refused model is left as it was
    torch.manual_seed(0)
    scaled = LlamaForCausalLM(LlamaConfig(**CONFIG, rope_scaling={"rope_type": "linear", "factor": 2.0}))
    with pytest.raises(ValueError, match="not plain RoPE"):
        exact_fp64(scaled.to(torch.float64))


def test_self_check_catches_a_patch_that_did_not_take(monkeypatch):
    # As if the replacement RMSNorm were HF's own: the numerical check must refuse the model.
    monkeypatch.setattr(hf_fp64, "_rmsnorm_forward_fp64", modeling_llama.LlamaRMSNorm.forward)
    with pytest.raises(RuntimeError, match=r"RMSNorm 0: relative error [0-9.e-]+ > 1e-12"):
        exact_fp64(build_model())


def test_a_4d_attention_mask_is_added_as_given():
    """The trap: HF adds a 4-D attention_mask to the scores whatever its dtype, and builds no causal
    mask of its own then. A boolean mask is added as 0/1, so it masks nothing: an all-True one
    (meant as "attend everywhere allowed") lets every query see every key, future ones included."""
    model = exact_fp64(build_model())
    ids = make_batch(False)[0]
    with torch.no_grad():
        causal = model(input_ids=ids).logits
        all_true = model(input_ids=ids, attention_mask=torch.ones(BATCH, 1, SEQ, SEQ, dtype=torch.bool)).logits
        zeros = model(input_ids=ids, attention_mask=torch.zeros(BATCH, 1, SEQ, SEQ, dtype=torch.float64)).logits
        tril = torch.ones(SEQ, SEQ, dtype=torch.bool).tril().expand(BATCH, 1, SEQ, SEQ)
        boolean_causal = model(input_ids=ids, attention_mask=tril).logits
        plus_one = model(input_ids=ids, attention_mask=tril.to(torch.float64)).logits
    # +1 on every score leaves the softmax as it is (up to rounding): nothing is masked
    assert float((all_true - zeros).norm() / zeros.norm()) <= EXACT
    assert not torch.allclose(all_true, causal)         # so the future is visible
    assert torch.equal(boolean_causal, plus_one)        # a causal boolean mask adds 1 where allowed
    assert not torch.allclose(boolean_causal, causal)   # and is not causal
