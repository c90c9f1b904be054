"""Shared fixtures: the touchstone binary (environment variable TOUCHSTONE, set by CTest) and golden
files written by it once per test session."""

import os
import subprocess
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
