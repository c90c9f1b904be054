"""Megatron-Core itself against golden files: touchstone.megatron's candidates must pass
`touchstone diff --tolerance 1e-12` (parameters included) at every layout, and fail when one float32
site is left unfixed.

Needs TOUCHSTONE (the binary) and TOUCHSTONE_MEGATRON_DIR, a directory holding Megatron-Core 0.19.2
and 0.16.1 as `<dir>/0.19.2/megatron/core` and `<dir>/0.16.1/megatron/core` (pip --target or an
unpacked wheel). Each candidate runs in processes of its own with PYTHONPATH=<dir>/<version>:python,
so both versions are tested from one pytest process. Missing either is a failure, never a skip.
Those processes run under TOUCHSTONE_MEGATRON_PYTHON when it is set (an interpreter with torch >= 2.4,
numpy and h5py: Megatron-Core needs a newer torch than Debian's 1.13), else under pytest's own.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_golden, touchstone_binary

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "tools" / "examples" / "megatron_candidate.py"
SITE_CHECK = Path(__file__).resolve().parent / "megatron_site_check.py"
SITES = ("norm", "rope", "cross_entropy", "loss_func", "num_tokens", "grad_norm")

# Two steps of Megatron-LM's stepping (docs/frameworks/megatron.md "The learning-rate schedule").
# "default": GQA 4 heads on 2, untied, global_token_mean (--calculate-per-token-loss), micro-batch 2.
# "tied_gqa": tied embeddings, 8 heads on 2 KV heads, per_microbatch_mean (Megatron-LM's default loss).
GOLDEN = {
    "default": ["optim.schedule_convention=megatron", "train.steps=2"],
    "tied_gqa": ["optim.schedule_convention=megatron", "train.steps=2", "model.tie_embeddings=true",
                 "model.num_heads=8", "model.num_kv_heads=2", "train.loss_normalization=per_microbatch_mean"],
    # The default config's FP64 values with the BF16 tolerance envelope (docs/precision.md), 3 steps.
    "bf16": ["optim.schedule_convention=megatron", "train.steps=3", "precision=bf16"],
}
# Four layers for PP2 with 2 virtual stages (one layer per virtual stage), untied and tied.
GOLDEN["vpp"] = GOLDEN["default"] + ["model.num_layers=4"]
GOLDEN["vpp_tied"] = GOLDEN["tied_gqa"] + ["model.num_layers=4"]
VIRTUAL_STAGES = {"vpp": 2, "vpp_tied": 2}
EXTRA = {"bf16": ["--envelope"]}
# The largest `x tol` a BF16 tensor may reach: Megatron's BF16 run reaches 0.45 (TP1) and 0.36
# (TP2 x DP2); with BF16 main gradients (no --accumulate-allreduce-grads-in-fp32) it reaches 0.51.
BF16_WORST = 0.5
BF16_LAYOUTS = [(1, 1, 1), (2, 1, 2)]


def megatron_dir(version: str) -> Path:
    root = os.environ.get("TOUCHSTONE_MEGATRON_DIR")
    if not root:
        pytest.fail("set TOUCHSTONE_MEGATRON_DIR to the directory holding Megatron-Core 0.19.2/ and 0.16.1/")
    path = Path(root) / version
    if not (path / "megatron" / "core" / "__init__.py").is_file():
        pytest.fail(f"TOUCHSTONE_MEGATRON_DIR={root}: no Megatron-Core {version} at {path}/megatron/core")
    return path


def python() -> str:
    """The interpreter of the Megatron-Core processes (pytest's own needs no torch)."""
    return os.environ.get("TOUCHSTONE_MEGATRON_PYTHON") or sys.executable


def environment(version: str) -> dict:
    env = dict(os.environ)
    # Megatron-Core first, then this package, then what the caller had (CTest's TOUCHSTONE_PYTHON_DEPS),
    # unless the processes run under an interpreter of their own, which brings its own packages.
    inherited = os.environ.get("PYTHONPATH") if not os.environ.get("TOUCHSTONE_MEGATRON_PYTHON") else None
    env["PYTHONPATH"] = os.pathsep.join([str(megatron_dir(version)), str(ROOT / "python")] +
                                        ([inherited] if inherited else []))
    env["PYTHONWARNINGS"] = "ignore"
    return env


@pytest.fixture(scope="module")
def goldens(golden_dir):
    return {name: make_golden(golden_dir, f"megatron_{name}", settings, EXTRA.get(name, ()))
            for name, settings in GOLDEN.items()}


LAYOUTS = [(config, tp, pp, dp) for config in ("default", "tied_gqa")
           for tp, pp, dp in ((1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1))]

# Every candidate the tests diff: (version, config, tp, pp, dp, float32 site left unfixed or "").
# "no_tp_attributes": 0.16.1 as it is, the tensor-parallel attributes of the loaded weights left unset.
CANDIDATES = ([("0.19.2", c, t, p, d, "") for c, t, p, d in LAYOUTS] + [("0.16.1", "default", 1, 1, 1, "")] +
              [("0.16.1", "default", 2, 1, 1, ""), ("0.16.1", "default", 2, 1, 1, "no_tp_attributes")] +
              [("0.19.2", "default", 1, 1, 1, site) for site in SITES] +
              [("0.19.2", "bf16", t, p, d, "") for t, p, d in BF16_LAYOUTS] +
              [("0.19.2", config, 1, 2, 1, "") for config in VIRTUAL_STAGES])

LAUNCH = """
import json, sys
from touchstone.megatron.run import launch_jobs
launch_jobs(json.loads(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def candidates(goldens, tmp_path_factory):
    """key of CANDIDATES -> its candidate directory. The candidates of one Megatron-Core version and
    world size run in one launch (launch_jobs), made when the first of them is asked for: Megatron-Core
    takes longer to import than these runs take to train."""
    made, stderr = {}, {}
    root = tmp_path_factory.mktemp("megatron")

    def out(key):
        version, config, tp, pp, dp, keep = key
        return root / f"{config}_{version}_tp{tp}_pp{pp}_dp{dp}_{keep or 'fixed'}"

    def make(key):
        if key not in made:
            version, world = key[0], key[2] * key[3] * key[4]
            group = [k for k in CANDIDATES if k[0] == version and k[2] * k[3] * k[4] == world and k not in made]
            jobs = [{"golden": str(goldens[k[1]]), "out": str(out(k)), "tp": k[2], "pp": k[3], "dp": k[4],
                     "vp": VIRTUAL_STAGES.get(k[1], 1),
                     "sites": [s for s in SITES if s != k[5]], "set_tp_attributes": k[5] != "no_tp_attributes"}
                    for k in group]
            done = subprocess.run([python(), "-c", LAUNCH, json.dumps(jobs)], env=environment(version),
                                  capture_output=True, text=True, timeout=800)
            assert done.returncode == 0, done.stderr[-3000:]
            made.update({k: out(k) for k in group})
            stderr[(version, world)] = done.stderr
        return made[key]

    make.stderr = stderr
    return make


def diff(golden: Path, candidate: Path, tolerance=("--tolerance", "1e-12")):
    report = candidate.parent / f"{candidate.name}.json"
    done = subprocess.run([touchstone_binary(), "diff", str(golden), str(candidate), *tolerance,
                           "--json", str(report)], capture_output=True, text=True, timeout=300)
    return done, json.loads(report.read_text()) if report.exists() else None


@pytest.mark.parametrize("config,tp,pp,dp", LAYOUTS, ids=[f"{c}-tp{t}pp{p}dp{d}" for c, t, p, d in LAYOUTS])
def test_fp64_layouts_pass(goldens, candidates, config, tp, pp, dp):
    out = candidates(("0.19.2", config, tp, pp, dp, ""))
    layout = json.loads((out / "shards.json").read_text())
    assert (layout["tp"], layout["pp"]) == (tp, pp)
    assert sorted(p.name for p in out.glob("rank_*.h5")) == sorted(
        f"rank_tp{t}_pp{p}.h5" for t in range(tp) for p in range(pp))
    done, _ = diff(goldens[config], out)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    assert " 0 fail; 0 not compared" in summary, summary
    for step in (0, 1, 2):  # init, both steps' gradients and updated parameters, every scalar
        assert f"\n     {step}  " in done.stdout
    assert "params/decoder.layers.1.mlp.linear_fc1.weight" in done.stdout
    assert "\n     2  loss " in done.stdout and "\n     2  grad_norm " in done.stdout
    schedule = "forward_backward_pipelining_without_interleaving" if pp > 1 else "forward_backward_no_pipelining"
    assert f"touchstone.megatron (megatron.core 0.19.2, {schedule})" in done.stdout


def test_megatron_core_0_16_1_tp1(goldens, candidates):
    out = candidates(("0.16.1", "default", 1, 1, 1, ""))
    done, _ = diff(goldens["default"], out)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr
    assert "(megatron.core 0.16.1, forward_backward_no_pipelining)" in done.stdout


def test_megatron_core_0_16_1_tp2_needs_the_tensor_parallel_attributes(goldens, candidates):
    # 0.16.1 marks no loaded weight tensor-parallel, so its gradient norm counts tp rank 0's shards
    # only (0.5409 for 0.7080 here); with the attributes set as 0.19.2 sets them, the run passes.
    out = candidates(("0.16.1", "default", 2, 1, 1, ""))
    done, _ = diff(goldens["default"], out)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr
    assert "megatron.core 0.16.1: set the tensor-parallel attributes of 10 parameters itself" in \
        candidates.stderr[("0.16.1", 2)]
    done, report = diff(goldens["default"], candidates(("0.16.1", "default", 2, 1, 1, "no_tp_attributes")))
    assert done.returncode == 1
    assert report["first_failure"] == "steps/1/grad_norm", report["first_failure"]
    norms = {t["path"]: t["metrics"] for t in report["tensors"] if t["path"].endswith("grad_norm")}
    assert 0.2 < norms["steps/1/grad_norm"]["relative_l2"] < 0.3, norms
    assert all(t["status"] == "pass" for t in report["tensors"] if not t["path"].endswith("grad_norm"))


@pytest.mark.parametrize("site", SITES)
def test_each_float32_site_fails_the_diff_unfixed(goldens, candidates, site):
    out = candidates(("0.19.2", "default", 1, 1, 1, site))
    done, _ = diff(goldens["default"], out)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr
    assert " fail; 0 not compared" in done.stdout and " 0 fail;" not in done.stdout


def test_float32_site_fixes_checked_numerically(goldens):
    done = subprocess.run([python(), str(SITE_CHECK), str(goldens["default"])], env=environment("0.19.2"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["version"] == "0.19.2"
    # The CPU shims place and name tensors as Megatron-Core expects, and are gone after the block.
    assert result["shims"] == {"cuda_device": "cpu", "index_device": "cpu", "type": "torch.cuda.DoubleTensor",
                               "undone": True}
    fixed, unfixed = result["fixed"], result["unfixed"]
    assert set(fixed) == set(SITES) == set(unfixed)
    for site in ("norm", "cross_entropy"):
        assert fixed[site] <= 1e-15, (site, fixed[site])
    for site in ("rope", "num_tokens", "grad_norm"):
        assert fixed[site] == 0.0, (site, fixed[site])
    assert fixed["loss_func"] == {"dtype": "torch.float64", "error": 0.0, "count": 10}
    assert "RMSNorm weight (0) is torch.float32" in unfixed["norm"]
    assert "computes in torch.float32" in unfixed["rope"] and "computes in torch.float32" in unfixed["cross_entropy"]
    for site in ("num_tokens", "grad_norm"):
        assert "differs from the float64 formula" in unfixed[site], unfixed[site]
    assert unfixed["loss_func"]["dtype"] == "torch.float32" and unfixed["loss_func"]["error"] > 1e-12
    # Without Transformer Engine and Apex, get_megatron_optimizer's Adam is torch's AdamW, and two of
    # its steps are the contract's AdamW (bias correction, decoupled decay on the 2-D tensors only).
    optimizer = result["optimizer"]
    assert optimizer["using_pytorch_optimizer"] is True
    assert optimizer["megatron"][0] in ("ChainedOptimizer", "FP32Optimizer")
    assert set(optimizer["megatron"][1:]) <= {"FP32Optimizer"}
    assert optimizer["torch"] == ["torch.optim.adamw.AdamW"]
    assert optimizer["max_relative_error"] <= 1e-15, optimizer


def test_unread_version_refused(tmp_path, goldens):
    # A copy of 0.19.2 whose package_info says 0.17.0: a version whose float32 sites were not read.
    fake = tmp_path / "megatron_fake"
    core = megatron_dir("0.19.2") / "megatron"
    (fake / "megatron").mkdir(parents=True)
    for entry in core.iterdir():
        if entry.name != "core":
            (fake / "megatron" / entry.name).symlink_to(entry)
    (fake / "megatron" / "core").mkdir()
    for entry in (core / "core").iterdir():
        if entry.name != "package_info.py":
            (fake / "megatron" / "core" / entry.name).symlink_to(entry)
    info = (core / "core" / "package_info.py").read_text()
    (fake / "megatron" / "core" / "package_info.py").write_text(info + "\nVERSION = (0, 17, 0, '')\n")
    env = environment("0.19.2")
    env["PYTHONPATH"] = os.pathsep.join([str(fake), str(ROOT / "python")])
    done = subprocess.run([python(), str(RECIPE), str(goldens["default"]), "--out", str(tmp_path / "c")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "megatron_candidate.py: error: megatron.core 0.17.0: its float32 sites have not been read (read: 0.16.1, "
        "0.19.2); see docs/frameworks/megatron-float32-sites.md"]
    assert not (tmp_path / "c").exists()


def test_golden_of_the_default_schedule_convention_refused(golden_dir, tmp_path):
    golden = make_golden(golden_dir, "megatron_touchstone_convention", ["train.steps=1"])
    done = subprocess.run([python(), str(RECIPE), str(golden), "--out", str(tmp_path / "c")],
                          env=environment("0.19.2"), capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"megatron_candidate.py: error: {golden}: optim.schedule_convention is touchstone; make the golden "
        "file with --set optim.schedule_convention=megatron"]


def test_layout_the_golden_batch_cannot_take_refused(goldens, tmp_path):
    done = subprocess.run([python(), str(RECIPE), str(goldens["default"]), "--out", str(tmp_path / "c"), "--dp",
                           "3"], env=environment("0.19.2"), capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"megatron_candidate.py: error: {goldens['default']}: train.global_batch_size 8 is not a multiple of "
        "train.micro_batch_size 2 x dp 3"]


@pytest.mark.parametrize("tp,pp,dp", BF16_LAYOUTS, ids=[f"tp{t}pp{p}dp{d}" for t, p, d in BF16_LAYOUTS])
def test_bf16_passes_the_envelope(goldens, candidates, tp, pp, dp, capsys):
    # Megatron's own BF16 (Float16Module, FP32 main gradients and parameters) judged by the envelope.
    out = candidates(("0.19.2", "bf16", tp, pp, dp, ""))
    done, report = diff(goldens["bf16"], out, tolerance=())
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr
    assert "tolerance  envelope" in done.stdout
    compared = [t for t in report["tensors"] if t["status"] != "not_compared"]
    assert {t["step"] for t in compared} == {1, 2, 3}
    assert all(t["status"] == "pass" for t in compared)
    assert sum(t["path"].startswith("steps/3/params/") for t in compared) == 15
    worst = max(compared, key=lambda t: t["metrics"]["tolerance_ratio"])
    with capsys.disabled():
        print(f"\nBF16 tp{tp} pp{pp} dp{dp}: worst {worst['metrics']['tolerance_ratio']:.3f} x tol ({worst['path']})")
    assert worst["metrics"]["tolerance_ratio"] <= BF16_WORST, (worst["path"], worst["metrics"])


@pytest.mark.parametrize("config", sorted(VIRTUAL_STAGES))
def test_fp64_virtual_pipeline_stages_pass(goldens, candidates, config):
    # PP2 with 2 model chunks per rank (interleaved 1F1B): chunk c of stage s is virtual stage 2c + s,
    # written as shard file rank_tp0_pp{2c + s}.h5 of a 4-stage layout, one layer each.
    out = candidates(("0.19.2", config, 1, 2, 1, ""))
    layout = json.loads((out / "shards.json").read_text())
    assert (layout["tp"], layout["pp"], layout["stage_layers"]) == (1, 4, [1, 1, 1, 1])
    done, _ = diff(goldens[config], out)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    assert " 0 fail; 0 not compared" in summary, summary
    assert "params/decoder.layers.3.mlp.linear_fc1.weight" in done.stdout and "\n     2  grad_norm " in done.stdout
    assert "(megatron.core 0.19.2, forward_backward_pipelining_with_interleaving)" in done.stdout
