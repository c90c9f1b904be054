"""Shared fixtures: the touchstone binary (environment variable TOUCHSTONE, set by CTest), golden files
written by it once per test session, and the check that the Python stack is the one CTest meant
(TOUCHSTONE_STACK: "debian" or "torch2", tests/frameworks/CMakeLists.txt)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Four configs that between them exercise every rule the package handles: GQA with document masking
# and micro-batch accumulation (the defaults), tied embeddings with per_microbatch_mean and micro-batch 1,
# 8 heads on 2 KV heads, attention without document masking, and both of the last two at once.
CONFIGS = {
    "default": [],
    "tied_pmm": ["model.tie_embeddings=true", "train.loss_normalization=per_microbatch_mean",
                 "train.micro_batch_size=1"],
    "gqa8": ["model.num_heads=8", "model.num_kv_heads=2"],
    "nomask": ["data.document_masking=false"],
    "gqa8_nomask": ["model.num_heads=8", "model.num_kv_heads=2", "data.document_masking=false"],
}


@pytest.fixture(scope="session", autouse=True)
def python_stack():
    """Fails every test when the interpreter is not the stack TOUCHSTONE_STACK names, so that a test of
    today's stack never passes on Debian's by a wrong path (and the reverse). Unset: run by hand, any stack."""
    import numpy

    stack = os.environ.get("TOUCHSTONE_STACK")
    in_venv = sys.prefix != sys.base_prefix
    debian_numpy = numpy.__file__.startswith("/usr/lib/python3/dist-packages/")
    if stack == "debian" and (in_venv or not debian_numpy):
        pytest.fail(f"TOUCHSTONE_STACK=debian, but {sys.executable} runs numpy from {numpy.__file__}")
    if stack == "torch2" and (not in_venv or debian_numpy):
        pytest.fail(f"TOUCHSTONE_STACK=torch2, but {sys.executable} is not today's venv (numpy from {numpy.__file__})")
    if stack not in (None, "debian", "torch2"):
        pytest.fail(f"TOUCHSTONE_STACK={stack!r}: expected debian or torch2")
    return stack


def touchstone_binary() -> str:
    binary = os.environ.get("TOUCHSTONE")
    if not binary or not os.access(binary, os.X_OK):
        pytest.fail("set TOUCHSTONE to the built touchstone binary (CTest does: ctest -R python_package)")
    return binary


def make_golden(directory: Path, name: str, settings, extra=()) -> Path:
    out = directory / f"{name}.h5"
    if not out.exists():
        command = [touchstone_binary(), "golden", "--out", str(out)]
        for setting in settings:
            command += ["--set", setting]
        subprocess.run(command + list(extra), check=True, capture_output=True, text=True)
    return out


@pytest.fixture(scope="session")
def golden_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("golden")


@pytest.fixture(scope="session")
def golden_files(golden_dir):
    """name -> path of a FP64 golden file for each of CONFIGS."""
    return {name: make_golden(golden_dir, name, settings) for name, settings in CONFIGS.items()}


@pytest.fixture(scope="session")
def bf16_envelope_golden(golden_dir):
    """A BF16 golden file with its tolerance envelope (docs/precision.md), default config."""
    return make_golden(golden_dir, "bf16_envelope", ["precision=bf16"], ["--envelope"])


@pytest.fixture(scope="session")
def touchstone():
    return touchstone_binary()
