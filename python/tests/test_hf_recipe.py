"""The Hugging Face recipe (tools/examples/hf_candidate.py) with the real transformers (4.47.1 on torch
1.13, or 5.x on torch 2; eager attention, as the recipe builds it; SDPA is in test_hf_transformers5.py):
correct runs pass `touchstone diff` at 1e-12 in FP64 and against a BF16 envelope; each trap the recipe
avoids, planted in it, fails the diff and is named by its verdict.

The traps are planted by replacing one function of the recipe (load_model, attention_mask, micro_loss)
with the mistaken version a user would write, so everything else is the recipe as documented.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from touchstone import GoldenFile, attention_allowed
from touchstone.hf import llama_config, load_golden_into

RECIPE = Path(os.environ.get("TOUCHSTONE_SOURCE_DIR", Path(__file__).parents[2])) / "tools/examples/hf_candidate.py"


def load_recipe():
    """A fresh copy of the recipe module (so a planted mistake never leaks into another test)."""
    spec = importlib.util.spec_from_file_location("hf_candidate", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_recipe(golden_path, out, steps=2, bf16=False, recipe=None):
    torch.use_deterministic_algorithms(True)
    recipe = recipe or load_recipe()
    with GoldenFile(golden_path) as golden:
        recipe.run(golden, str(out), steps, bf16)
    return out


def diff(touchstone, golden, candidate, tmp_path, *extra):
    report = tmp_path / "diff.json"
    result = subprocess.run([touchstone, "diff", str(golden), str(candidate), "--json", str(report), *extra],
                            capture_output=True, text=True)
    return result, json.loads(report.read_text()) if report.exists() else None


# -- correct runs ----------------------------------------------------------------------------------

@pytest.mark.parametrize("config", ["default", "tied_pmm", "gqa8_nomask"])
def test_fp64_recipe_passes_at_1e_12(touchstone, golden_files, tmp_path, config):
    """FP64 everywhere once exact_fp64 has removed HF's float32 sites: every tensor of 2 steps agrees to
    1e-12 (FP64 rounding through a step is ~1e-15 relative; 1e-12 leaves 1000x for summation order)."""
    candidate = run_recipe(golden_files[config], tmp_path / "candidate.h5")
    result, report = diff(touchstone, golden_files[config], candidate, tmp_path, "--tolerance", "1e-12")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert report["summary"]["failed"] == 0 and report["summary"]["not_compared"] == 0
    worst = max(t["metrics"]["relative_l2"] for t in report["tensors"])
    print(f"{config}: worst relative L2 {worst:.2e} over {len(report['tensors'])} tensors")


def test_bf16_recipe_passes_the_envelope(touchstone, bf16_envelope_golden, tmp_path):
    """HF in mixed precision (FP32 master weights, BF16 autocast, HF's own float32 sites kept as
    production runs them) is a correct BF16 run: it passes the envelope, step by step (re-anchored)."""
    candidate = run_recipe(bf16_envelope_golden, tmp_path / "candidate.h5", steps=3, bf16=True)
    result, report = diff(touchstone, bf16_envelope_golden, candidate, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    worst = max((t for t in report["tensors"] if t.get("metrics")), key=lambda t: t["metrics"]["tolerance_ratio"])
    print(f"bf16: worst {worst['path']} at {worst['metrics']['tolerance_ratio']:.2f} of its tolerance "
          f"(basis {worst['basis']})")


@pytest.mark.parametrize("bf16", [False, True], ids=["fp64", "bf16"])
def test_recipe_runs_free_of_warnings(golden_files, bf16_envelope_golden, tmp_path, bf16):
    """The script as a user runs it, under `python -W error`: no warning of Python, torch or
    transformers (torch 2.x warns at float() of a tensor that requires grad; the recipe detaches)."""
    golden = bf16_envelope_golden if bf16 else golden_files["default"]
    package = str(Path(__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([package] + [p for p in os.environ.get("PYTHONPATH", "")
                                                                     .split(os.pathsep) if p])}
    command = [sys.executable, "-W", "error", str(RECIPE), str(golden), "--out", str(tmp_path / "candidate.h5"),
               "--steps", "1"] + (["--bf16"] if bf16 else [])
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Warning" not in result.stderr, result.stderr[-3000:]


# -- the traps ---------------------------------------------------------------------------------------

def boolean_mask(micro, golden, dtype):
    """The mask as booleans, True where allowed: HF adds it to the scores (+1), masking nothing."""
    return torch.from_numpy(attention_allowed(micro.document_ids, golden.document_masking))[:, None]


def labels_shifted_twice(model, inputs, micro):
    """HF's own loss from labels=: it shifts the (already shifted) golden targets once more. The
    objective's scale is kept right (num_items_in_batch is the golden count)."""
    count = round(1 / micro.loss_weight)  # global_token_mean: the global batch's loss tokens
    return model(**inputs, labels=torch.from_numpy(micro.targets), num_items_in_batch=count).loss


def without_exact_fp64(original_load_model):
    def load_model(golden, dtype):
        model = LlamaForCausalLM(llama_config(golden.config)).to(dtype)
        load_golden_into(model, golden)
        return model  # HF's float32 RoPE, RMSNorm and softmax left in
    return load_model


def qkv_split_q_k_v(original_load_model):
    """linear_qkv cut as [all q; all k; all v] rows when loading. The candidate's /params/init, converted
    back per KV group by the package, then differs from the golden weights in the rows of linear_qkv
    alone: the diff names that layout at step 0 (and judges the steps from the weights the candidate
    really started from)."""
    def load_model(golden, dtype):
        model = original_load_model(golden, dtype)
        m = golden.model
        D = m["hidden_size"] // m["num_heads"]
        with torch.no_grad():
            for layer in range(m["num_layers"]):
                qkv = torch.from_numpy(golden.init_param(f"decoder.layers.{layer}.self_attention.linear_qkv.weight"))
                q, k, v = qkv.split([m["num_heads"] * D, m["num_kv_heads"] * D, m["num_kv_heads"] * D])
                attention = model.model.layers[layer].self_attn
                attention.q_proj.weight.copy_(q), attention.k_proj.weight.copy_(k), attention.v_proj.weight.copy_(v)
        return model
    return load_model


MISTAKES = {  # name -> (recipe function replaced, original -> mistaken version, the verdict's signature)
    "boolean_mask": ("attention_mask", lambda original: boolean_mask, "attention_mask_added"),
    "labels_shifted_twice": ("micro_loss", lambda original: labels_shifted_twice, "targets_shifted_twice"),
    "float32_sites": ("load_model", without_exact_fp64, "fp32_in_fp64"),
    "qkv_split": ("load_model", qkv_split_q_k_v, "qkv_layout"),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_each_trap_fails_and_is_named(touchstone, golden_files, tmp_path, mistake):
    recipe = load_recipe()
    function, mistaken, signature = MISTAKES[mistake]
    setattr(recipe, function, mistaken(getattr(recipe, function)))
    candidate = run_recipe(golden_files["default"], tmp_path / "candidate.h5", recipe=recipe)
    result, report = diff(touchstone, golden_files["default"], candidate, tmp_path, "--tolerance", "1e-12")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr
    signatures = [v["signature"] for v in report["verdicts"]]
    assert signature in signatures, (signatures, result.stdout[-2000:])
    # The margin: the trap's largest error, at least 1000 x the 1e-12 pass line (a correct run's worst
    # is ~1e-14, test_fp64_recipe_passes_at_1e_12).
    worst = max(report["tensors"], key=lambda t: t["metrics"]["relative_l2"])
    assert worst["metrics"]["relative_l2"] > 1e-9, worst
    print(f"{mistake}: first failure {report['first_failure']}; worst {worst['path']}, relative L2 "
          f"{worst['metrics']['relative_l2']:.2e}; verdicts {signatures}")


def test_recipe_in_the_docs_is_the_script():
    """docs/frameworks/huggingface.md shows the recipe whole; it must be the file the tests run."""
    page = (RECIPE.parents[2] / "docs/frameworks/huggingface.md").read_text()
    block = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert block == RECIPE.read_text()
