#!/usr/bin/python3
"""Fuzzes the Python package's golden-file reader (python/touchstone: GoldenFile and everything it
reads, with the Hugging Face config built from the file's config). The package has no candidate reader:
candidates are read by `touchstone diff` (fuzz/fuzz_golden_reader.cpp fuzzes that side).

libFuzzer does not reach Python code and atheris is not used, so this is a deterministic mutation loop:
from seed golden files written by `touchstone golden` (an untied model, and a tied one with
per_microbatch_mean), each iteration either changes the file's structure with h5py (a root attribute
or a config key replaced by an odd value or removed, a dataset replaced by one of another dtype or
shape, or removed) or its bytes (flips, overwrites, truncation, biased towards the metadata: the first
4 KiB and the global heap of the string attributes), and reads the result in a child process, asking
it for everything (config, steps, parameters, batches, micro-batches, expected values).

A finding is any outcome but a normal read or a ValueError with one line naming the file: another
exception, a crash of the child (the package's own child-process walk should turn a crash of the HDF5
library into a ValueError), or no answer within the time limit. The input of the first finding is kept
in --findings.

Usage: fuzz_golden_file.py [--touchstone PATH] [--iterations N | --seconds S] [--seed S] [--findings DIR]
Exit status: 0 when no iteration found anything, 1 otherwise.
"""

import argparse
import concurrent.futures
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The package's walk gives up on a stuck file after 10 s here (READER); a reader that takes far longer
# has hung itself.
SECONDS_PER_INPUT = 60
SMALL = ["model.hidden_size=16", "model.ffn_hidden_size=32", "model.seq_length=16", "model.vocab_size=64",
         "train.steps=2"]
SEEDS = {"untied": [], "tied_pmm": ["model.tie_embeddings=true", "train.loss_normalization=per_microbatch_mean",
                                    "train.micro_batch_size=1"]}

# The child: reads everything; exit 0 after a normal read, 3 after a ValueError (printed as one line).
READER = r"""
import sys
import touchstone.h5_walk
touchstone.h5_walk.MIN_SECONDS = 10  # a stuck walk is given up on sooner than in use (60 s)
from touchstone import GoldenFile
from touchstone.hf import hf_config_dict
path = sys.argv[1]
try:
    with GoldenFile(path) as golden:
        golden.precision, golden.param_dtype, golden.tolerance_model, golden.document_masking
        hf_config_dict(golden.config)
        for _ in golden.init_params():
            pass
        for step in golden.steps:
            for dp in (1, 2):
                golden.micro_batches(step, dp=dp)
            expected = golden.expected(step)
            expected.loss, expected.num_loss_tokens, expected.grad_norm, expected.lr
            expected.token_losses()
            for _ in expected.grads():
                pass
            for _ in golden.params(step):
                pass
except ValueError as error:
    print(error)
    sys.exit(3)
"""

ODD_VALUES = [1.7, "one", np.array([1, 2]), np.int64(-1), np.int64(2**62), "", "{", "[]", "null", "{}",
              np.array([b"a", b"b"]), np.float64("nan"), np.uint8(1), np.array([1])]
ODD_CONFIG_VALUES = [None, 0, -1, 2**40, 1.5, "x", True, [], {}, [1, 2], float("inf")]


def mutate_structure(path, rng):
    """One to three h5py edits of the golden file at `path`."""
    with h5py.File(path, "r+") as f:
        for _ in range(rng.randint(1, 3)):
            choice = rng.randrange(5)
            if choice == 0:  # a root attribute replaced or removed
                key = rng.choice(["format", "format_version", "config", "precision", "tolerance_model"])
                if key in f.attrs and rng.random() < 0.2:
                    del f.attrs[key]
                else:
                    f.attrs[key] = rng.choice(ODD_VALUES)
            elif choice in (1, 2):  # a config key replaced or removed
                try:
                    config = json.loads(f.attrs["config"])
                    section = config[rng.choice(sorted(k for k in config if isinstance(config[k], dict)))]
                    key = rng.choice(sorted(section))
                except (KeyError, TypeError, ValueError, IndexError):
                    continue
                if rng.random() < 0.2:
                    del section[key]
                else:
                    section[key] = rng.choice(ODD_CONFIG_VALUES)
                f.attrs["config"] = json.dumps(config)
            else:  # a dataset replaced or removed
                datasets = []
                f.visititems(lambda name, item: datasets.append(name) if isinstance(item, h5py.Dataset) else None)
                if not datasets:
                    continue
                name = rng.choice(sorted(datasets))
                shape = f[name].shape
                del f[name]
                if rng.random() < 0.2:
                    continue
                f[name] = rng.choice([np.zeros(shape, dtype=np.int32), np.zeros((2,) + shape), np.array(b"x"),
                                      np.full(shape, 10**6, dtype=np.int64), np.zeros(()), np.zeros(shape[:-1]),
                                      np.full(shape, np.nan)])


def mutate_bytes(data, rng):
    """One to four byte edits, most of them in the metadata (the first 4 KiB, the string heap)."""
    data = bytearray(data)
    heap = data.find(b"GCOL")
    for _ in range(rng.randint(1, 4)):
        if not data:
            break
        region = rng.random()
        if region < 0.4 and 0 < heap < len(data):
            at = heap + rng.randrange(min(4096, len(data) - heap))
        elif region < 0.8:
            at = rng.randrange(min(4096, len(data)))
        else:
            at = rng.randrange(len(data))
        choice = rng.randrange(5)
        if choice == 0:
            data[at] ^= 1 << rng.randrange(8)
        elif choice == 1:
            data[at] = rng.choice([0, 1, 0x7F, 0x80, 0xFF])
        elif choice == 2:
            data[at:at + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x7f\xff\xff\xff"])
        elif choice == 3:
            data[at] ^= 0xFF
        else:
            del data[at:]
    return bytes(data)


def read_in_child(path):
    """("read", None) for a normal read, ("refused", None) for a one-line ValueError naming `path`, or
    ("finding", what happened)."""
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (os.path.join(SOURCE, "python"), os.environ.get("PYTHONPATH")) if p))
    try:
        result = subprocess.run([sys.executable, "-c", READER, path], env=environment, capture_output=True,
                                text=True, errors="replace", timeout=SECONDS_PER_INPUT)
    except subprocess.TimeoutExpired:
        return "finding", f"no answer within {SECONDS_PER_INPUT} s"
    if result.returncode == 0:
        return "read", None
    lines = result.stdout.strip().splitlines()
    if result.returncode == 3 and len(lines) == 1 and lines[0].startswith(f"{path}"):
        return "refused", None
    if result.returncode < 0:
        return "finding", f"the reader died by signal {-result.returncode}"
    return "finding", f"exit status {result.returncode}: {(result.stdout + result.stderr).strip()[-600:]}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--touchstone", default=os.environ.get("TOUCHSTONE", os.path.join(SOURCE, "build", "tools",
                                                                                      "touchstone")),
                        help="the touchstone binary, which writes the seed golden files (default: $TOUCHSTONE, "
                             "else build/tools/touchstone)")
    parser.add_argument("--iterations", type=int, default=80)
    parser.add_argument("--seconds", type=float, help="run for this long instead of a number of iterations")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--findings", default="fuzz-findings/golden_file")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    deadline = time.monotonic() + args.seconds if args.seconds else None
    with tempfile.TemporaryDirectory() as scratch:
        seeds = {}
        for name, settings in SEEDS.items():
            seeds[name] = os.path.join(scratch, f"seed_{name}.h5")
            command = [args.touchstone, "golden", "--out", seeds[name]]
            for setting in SMALL + settings:
                command += ["--set", setting]
            subprocess.run(command, check=True, capture_output=True)
        # The inputs are made here, in order, from one random stream: the run is the same on any machine
        # and with any number of workers.
        iteration = 0
        outcomes = {"read": 0, "refused": 0}
        with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
            while (time.monotonic() < deadline) if deadline else (iteration < args.iterations):
                batch = []
                for _ in range(args.workers * 4):
                    if not ((time.monotonic() < deadline) if deadline else (iteration < args.iterations)):
                        break
                    path = os.path.join(scratch, f"case{iteration}.h5")
                    shutil.copy(seeds[rng.choice(sorted(seeds))], path)
                    if rng.random() < 0.5:
                        mutate_structure(path, rng)
                    else:
                        with open(path, "rb") as f:
                            data = mutate_bytes(f.read(), rng)
                        with open(path, "wb") as f:
                            f.write(data)
                    batch.append((iteration, path))
                    iteration += 1
                for (number, path), (outcome, finding) in zip(batch, pool.map(read_in_child, [p for _, p in batch])):
                    if finding:
                        os.makedirs(args.findings, exist_ok=True)
                        kept = os.path.join(args.findings, f"case{number}.h5")
                        shutil.copy(path, kept)
                        print(f"finding at iteration {number} (--seed {args.seed}): {finding}\n"
                              f"the file is kept as {kept}", file=sys.stderr)
                        return 1
                    outcomes[outcome] += 1
                for _, path in batch:
                    os.remove(path)
    print(f"GoldenFile: {iteration} mutated golden files, {outcomes['read']} read, {outcomes['refused']} refused "
          "with a one-line ValueError, no finding")
    return 0


if __name__ == "__main__":
    sys.exit(main())
