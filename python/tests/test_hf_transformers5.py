"""transformers 5.x (on torch 2.x): SDPA attention, `shift_labels=` and the recipe under both attentions.

What only the 5.x API has, so this file runs on today's stack only (CTest runs it there alone,
tests/frameworks/CMakeLists.txt) and fails, never skips, under an older transformers (Debian's
4.47.1 on torch 1.13 has no SDPA path to test and no `shift_labels=`). The tests that both
generations run (eager FP64 on three configs, BF16, the traps, the version policy) are in
test_hf_fp64.py and test_hf_recipe.py.

    PYTHONPATH=python build/venv/bin/python -m pytest python/tests/test_hf_transformers5.py
"""

from __future__ import annotations

import sys

import pytest
import torch
import transformers
from transformers import LlamaForCausalLM

from test_hf_fp64 import (EXACT, ROUNDED, build_model, cross_entropy_sum, errors_against_reference, make_batch,
                          summary)
from test_hf_recipe import diff, load_recipe, run_recipe
from touchstone import attention_allowed
from touchstone.hf import exact_fp64, llama_config, load_golden_into
from touchstone.hf_fp64 import SITES, UnlistedVersionWarning

MAJOR = int(transformers.__version__.split(".")[0])


@pytest.fixture(autouse=True)
def transformers_5():
    if MAJOR < 5:
        pytest.fail(f"needs transformers >= 5 (SDPA on torch 2, shift_labels=), this is {transformers.__version__}: "
                    "run it with today's stack (build/venv/bin/python)")


# -- SDPA: exact_fp64 patches RoPE and RMSNorm, and leaves the attention to SDPA ----------------------

@pytest.mark.parametrize("documents", [False, True], ids=["causal", "documents"])
def test_sdpa_exact_fp64_matches_float64_reference(documents):
    """Causal: no mask, SDPA's is_causal path. Documents: the additive 4-D mask, restarting positions."""
    model = build_model(attention="sdpa")
    assert model.config._attn_implementation == "sdpa"
    exact_fp64(model)
    assert "forward" not in model.model.layers[0].self_attn.__dict__  # SDPA's own attention, unpatched
    errors = errors_against_reference(model, documents)
    print(f"\nexact_fp64, SDPA ({'documents' if documents else 'causal'}): {summary(errors)}")
    bad = {name: error for name, error in errors.items() if not error <= EXACT}
    assert not bad, bad


@pytest.mark.parametrize("left", [None, "rope", "rmsnorm"], ids=["all", "rope", "rmsnorm"])
def test_sdpa_model_still_rounds_rope_and_rmsnorm_to_float32(left):
    """SDPA computes in float64, but HF's RoPE and RMSNorm around it do not: unpatched (all), or with
    either left in, the logits and gradients are float32-rounded."""
    model = build_model(attention="sdpa")
    if left is not None:
        exact_fp64(model, sites=tuple(site for site in SITES if site != left))
    errors = errors_against_reference(model, documents=True)
    print(f"\nSDPA, {left or 'all four'} left in: {summary(errors)}")
    assert errors["logits"] > ROUNDED, errors
    assert max(e for n, e in errors.items() if n.endswith("weight")) > ROUNDED, errors


def test_sdpa_boolean_mask_means_may_attend():
    """Under SDPA a boolean 4-D mask is True where a query may attend (eager adds it to the scores:
    test_hf_fp64.test_a_4d_attention_mask_is_added_as_given); with no mask at all and no cache,
    transformers 5.x reads packed documents from position ids that restart, so all three agree. With
    a cache (use_cache=True, this config's default; llama_config sets False) it does not: causal only."""
    model = exact_fp64(build_model(attention="sdpa"))
    ids, _, _, position_ids, additive, allowed = make_batch(documents=True)
    with torch.no_grad():
        with_additive = model(input_ids=ids, attention_mask=additive, position_ids=position_ids).logits
        with_boolean = model(input_ids=ids, attention_mask=allowed[:, None], position_ids=position_ids).logits
        without = model(input_ids=ids, position_ids=position_ids, use_cache=False).logits
        with_cache = model(input_ids=ids, position_ids=position_ids, use_cache=True).logits
    assert float((with_boolean - with_additive).norm() / with_additive.norm()) <= EXACT
    assert float((without - with_additive).norm() / with_additive.norm()) <= EXACT
    assert not torch.allclose(with_cache, with_additive)  # the documents are not seen through a cache


# -- the loss with shift_labels= -------------------------------------------------------------------

def shift_labels_errors(model):
    """Relative errors of HF's loss with shift_labels= (the golden targets, not shifted again) and of its
    gradients, against the token-mean cross entropy of the same logits written in the test."""
    ids, labels, targets, position_ids, mask, _ = make_batch(documents=True)
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, labels=labels, shift_labels=targets)
    out.loss.backward()
    hf_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
    total, count = cross_entropy_sum(logits, targets)
    want = total / count
    want.backward()
    errors = {"loss": float((out.loss - want).abs().detach() / want.abs().detach())}
    for name, parameter in model.named_parameters():
        errors[name] = float((hf_grads[name] - parameter.grad).norm() / parameter.grad.norm())
    return errors


def test_shift_labels_loss_is_float64_and_not_shifted_again():
    errors = shift_labels_errors(exact_fp64(build_model()))
    print(f"\nshift_labels=, exact_fp64: loss {errors['loss']:.2e}, gradients max {max(errors.values()):.2e}")
    bad = {name: error for name, error in errors.items() if not error <= EXACT}
    assert not bad, bad


def test_shift_labels_loss_without_the_loss_site_is_float32():
    errors = shift_labels_errors(exact_fp64(build_model(), sites=("rope", "rmsnorm", "softmax")))
    print(f"\nshift_labels=, loss site left in: loss {errors['loss']:.2e}, gradients max {max(errors.values()):.2e}")
    assert errors["loss"] > ROUNDED / 10 and max(errors.values()) > ROUNDED, errors


# -- the recipe with SDPA and with shift_labels= ------------------------------------------------------

def sdpa_load_model(original_load_model):
    def load_model(golden, dtype):
        config = llama_config(golden.config)
        config._attn_implementation = "sdpa"  # a user's own model: transformers 5.x's default attention
        model = LlamaForCausalLM(config).to(dtype)
        assert model.config._attn_implementation == "sdpa"
        load_golden_into(model, golden)
        return exact_fp64(model) if dtype == torch.float64 else model
    return load_model


def boolean_mask(micro, golden, dtype):
    """True where allowed: what SDPA takes as "may attend" (eager would add it to the scores)."""
    return torch.from_numpy(attention_allowed(micro.document_ids, golden.document_masking))[:, None]


def shift_labels_loss(model, inputs, micro):
    """HF's own loss with shift_labels=: the golden targets as given, scaled by the golden count."""
    count = round(1 / micro.loss_weight)
    targets = torch.from_numpy(micro.targets)
    return model(**inputs, labels=targets, shift_labels=targets, num_items_in_batch=count).loss


@pytest.mark.parametrize("config", ["default", "tied_pmm", "gqa8_nomask"])
def test_fp64_recipe_with_sdpa_passes_at_1e_12(touchstone, golden_files, tmp_path, config):
    recipe = load_recipe()
    recipe.load_model = sdpa_load_model(recipe.load_model)
    candidate = run_recipe(golden_files[config], tmp_path / "candidate.h5", recipe=recipe)
    result, report = diff(touchstone, golden_files[config], candidate, tmp_path, "--tolerance", "1e-12")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert report["summary"]["failed"] == 0 and report["summary"]["not_compared"] == 0
    worst = max(t["metrics"]["relative_l2"] for t in report["tensors"])
    print(f"sdpa {config}: worst relative L2 {worst:.2e} over {len(report['tensors'])} tensors")


def no_mask(micro, golden, dtype):
    """No attention_mask: transformers 5.x reads the documents from the restarting position ids."""
    return None


@pytest.mark.parametrize("mask", ["boolean", "none"])
def test_fp64_recipe_with_sdpa_and_a_boolean_mask_or_none_passes(touchstone, golden_files, tmp_path, mask):
    recipe = load_recipe()
    recipe.load_model = sdpa_load_model(recipe.load_model)
    recipe.attention_mask = boolean_mask if mask == "boolean" else no_mask
    candidate = run_recipe(golden_files["default"], tmp_path / "candidate.h5", recipe=recipe)
    result, report = diff(touchstone, golden_files["default"], candidate, tmp_path, "--tolerance", "1e-12")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr


def test_bf16_recipe_with_sdpa_passes_the_envelope(touchstone, bf16_envelope_golden, tmp_path):
    recipe = load_recipe()
    recipe.load_model = sdpa_load_model(recipe.load_model)
    candidate = run_recipe(bf16_envelope_golden, tmp_path / "candidate.h5", steps=3, bf16=True, recipe=recipe)
    result, report = diff(touchstone, bf16_envelope_golden, candidate, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    worst = max((t for t in report["tensors"] if t.get("metrics")), key=lambda t: t["metrics"]["tolerance_ratio"])
    print(f"bf16 sdpa: worst {worst['path']} at {worst['metrics']['tolerance_ratio']:.2f} of its tolerance")


def test_fp64_recipe_with_shift_labels_passes_at_1e_12(touchstone, golden_files, tmp_path):
    """HF's labels= loss is right once shift_labels= carries the golden targets (and exact_fp64 has
    removed its logits.float())."""
    recipe = load_recipe()
    recipe.micro_loss = shift_labels_loss
    candidate = run_recipe(golden_files["default"], tmp_path / "candidate.h5", recipe=recipe)
    result, report = diff(touchstone, golden_files["default"], candidate, tmp_path, "--tolerance", "1e-12")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert report["summary"]["failed"] == 0 and report["summary"]["not_compared"] == 0


def test_shift_labels_with_the_loss_site_left_in_is_named(touchstone, golden_files, tmp_path):
    """The same run with HF's float32 loss (exact_fp64 without its "loss" site): fp32_in_fp64."""
    recipe = load_recipe()

    def load_model(golden, dtype):
        model = LlamaForCausalLM(llama_config(golden.config)).to(dtype)
        load_golden_into(model, golden)
        return exact_fp64(model, sites=("rope", "rmsnorm", "softmax"))

    recipe.load_model, recipe.micro_loss = load_model, shift_labels_loss
    candidate = run_recipe(golden_files["default"], tmp_path / "candidate.h5", recipe=recipe)
    result, report = diff(touchstone, golden_files["default"], candidate, tmp_path, "--tolerance", "1e-12")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr
    signatures = [v["signature"] for v in report["verdicts"]]
    assert "fp32_in_fp64" in signatures, (signatures, result.stdout[-2000:])



def test_unlisted_version_with_sdpa_is_accepted_when_the_self_check_passes(monkeypatch):
    """The version policy with SDPA: the unpatched SDPA attention is checked too, and named so."""
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "5.99.0")
    with pytest.warns(UnlistedVersionWarning) as caught:
        model = exact_fp64(build_model(attention="sdpa"))
    assert len(caught) == 1
    assert "every patched site (loss, rmsnorm, rope, softmax (SDPA)) passed" in str(caught[0].message)
    assert max(errors_against_reference(model, documents=True).values()) <= EXACT
