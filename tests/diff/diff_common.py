"""What the tests of `touchstone diff` share: running the binary and the tools, writing small
golden files, and reading the JSON report.

Each test script is run as  test_X.py PATH_TO_TOUCHSTONE PATH_TO_SOURCE_TREE  (Debian's /usr/bin/python3
with torch, numpy and h5py).
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__

TOUCHSTONE = None
SOURCE = None
PYTHON = sys.executable

# A small model whose step-1 batch (24 windows of the built-in data) holds every data feature:
# documents spanning windows, several documents per window, EOS on a window edge, and padding.
SMALL = {"model.hidden_size": 32, "model.num_layers": 3, "model.num_heads": 4, "model.num_kv_heads": 2,
         "model.ffn_hidden_size": 64, "model.seq_length": 16, "train.global_batch_size": 24,
         "train.micro_batch_size": 4, "train.steps": 2}


# GQA 2:1 with 4 KV groups, so that TP 4 holds one whole group per rank.
SHARDABLE = {"model__num_heads": 8, "model__num_kv_heads": 4, "train__global_batch_size": 8,
             "train__micro_batch_size": 2, "train__steps": 1}


def setup_from_argv():
    """Takes the binary and source paths off sys.argv so that unittest sees only its own options."""
    global TOUCHSTONE, SOURCE
    if len(sys.argv) < 3:
        sys.exit(f"usage: {sys.argv[0]} PATH_TO_TOUCHSTONE PATH_TO_SOURCE_TREE")
    TOUCHSTONE, SOURCE = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    del sys.argv[1:3]


def run(command, **kwargs):
    return subprocess.run(command, capture_output=True, text=True, timeout=300, **kwargs)


def make_golden(path, **overrides):
    """`touchstone golden` with SMALL plus `overrides` (dotted keys as keyword arguments: a__b for a.b)."""
    settings = dict(SMALL)
    settings.update({key.replace("__", "."): value for key, value in overrides.items()})
    command = [TOUCHSTONE, "golden", "--out", path]
    for key, value in settings.items():
        command += ["--set", f"{key}={json.dumps(value) if isinstance(value, bool) else value}"]
    result = run(command)
    assert result.returncode == 0, result.stderr + result.stdout
    return path


def diff(golden, candidate, *args):
    """Runs `touchstone diff`; returns (exit status, stdout + stderr, parsed JSON report or None)."""
    with tempfile.TemporaryDirectory() as scratch:
        report = os.path.join(scratch, "report.json")
        result = run([TOUCHSTONE, "diff", golden, candidate, "--json", report, *args])
        data = None
        if os.path.exists(report):
            with open(report) as f:
                data = json.load(f)
        return result.returncode, result.stdout + result.stderr, data


def example(golden, out, *args):
    """Runs tools/examples/pytorch_candidate.py."""
    script = os.path.join(SOURCE, "tools", "examples", "pytorch_candidate.py")
    result = run([PYTHON, script, golden, "--out", out, *args])
    assert result.returncode == 0, result.stderr + result.stdout
    return out


def signatures(report):
    return [v["signature"] for v in report["verdicts"]]


def compared(report):
    return [t for t in report["tensors"] if t["status"] != "not_compared"]


class ShardableGoldens(unittest.TestCase):
    """Fixture: an untied and a tied golden file of the SHARDABLE model in a scratch directory."""

    @classmethod
    def setUpClass(cls):
        cls.scratch = tempfile.TemporaryDirectory()
        cls.golden = make_golden(os.path.join(cls.scratch.name, "golden.h5"), **SHARDABLE)
        cls.tied = make_golden(os.path.join(cls.scratch.name, "tied.h5"), model__tie_embeddings=True, **SHARDABLE)

    @classmethod
    def tearDownClass(cls):
        cls.scratch.cleanup()
