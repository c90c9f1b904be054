#!/usr/bin/python3
"""Fuzzes tools/import_megatron_dump.py, the one reader of Megatron-LM dumps (Python: torch.load of
mp_rank_TT[_PPP].pth files; the shard directory it writes is read by touchstone's C++ shards reader).

libFuzzer does not reach Python code and atheris is not used, so this is a deterministic mutation loop:
from seed dumps written here with torch.save (one rank, and tp 2 x pp 2 with tied embeddings), each
iteration mutates either the saved object (wrong types, names, layer numbers, extra chunks, empty or
odd tensors) or the bytes of one rank file (flips, overwrites, insertions, deletions, truncation), and
runs the importer's main() in this process on the result.

A finding is any outcome but exit status 0 or 2 with an `import_megatron_dump.py: error:` line (the
script's documented DumpError): an uncaught exception, a crash of the process, or a hang (each
iteration runs under an alarm). The input of the first finding is kept in --findings.

Usage: fuzz_import_megatron_dump.py [--iterations N | --seconds S] [--seed S] [--findings DIR]
Exit status: 0 when no iteration found anything, 1 otherwise.
"""

import argparse
import contextlib
import copy
import importlib.util
import io
import os
import random
import shutil
import signal
import sys
import tempfile
import time

import torch

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECONDS_PER_ITERATION = 20


def load_importer():
    spec = importlib.util.spec_from_file_location(
        "import_megatron_dump", os.path.join(SOURCE, "tools", "import_megatron_dump.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def layer_tensors(prefix, hidden=4, ffn=8, qkv=8):
    return {
        f"{prefix}.self_attention.linear_qkv.layer_norm_weight": torch.ones(hidden),
        f"{prefix}.self_attention.linear_qkv.weight": torch.randn(qkv, hidden),
        f"{prefix}.self_attention.linear_proj.weight": torch.randn(hidden, hidden),
        f"{prefix}.mlp.linear_fc1.layer_norm_weight": torch.ones(hidden, dtype=torch.bfloat16),
        f"{prefix}.mlp.linear_fc1.weight": torch.randn(ffn, hidden, dtype=torch.float16),
        f"{prefix}.mlp.linear_fc2.weight": torch.randn(hidden, ffn // 2, dtype=torch.float64),
    }


def seed_dumps():
    """{name: {file name: saved object}}: small dumps in Megatron-LM's layout."""
    torch.manual_seed(0)
    one_rank = {"embedding.word_embeddings.weight": torch.randn(16, 4), "decoder.final_layernorm.weight":
                torch.ones(4), "output_layer.weight": torch.randn(16, 4), "module.decoder.layers.0._extra_state":
                io.BytesIO(b"te")}
    one_rank.update(layer_tensors("module.decoder.layers.0"))
    dumps = {"one_rank": {"mp_rank_00.pth": {"model_chunk0": one_rank}}, "tp2_pp2": {}}
    for tp in range(2):
        for pp in range(2):
            tensors = layer_tensors("decoder.layers.0")
            tensors.update(layer_tensors("decoder.layers.1") if pp == 1 else {})
            tensors["embedding.word_embeddings.weight" if pp == 0 else "output_layer.weight"] = torch.randn(8, 4)
            dumps["tp2_pp2"][f"mp_rank_{tp:02d}_{pp:03d}.pth"] = {"model_chunk0": tensors}
    return dumps


ODD_VALUES = [None, 0, -1, 2**63, 1.5, "x", b"\x00", [], {}, [1, 2], {"a": 1}, torch.empty(0),
              torch.zeros(3, 0, 2), torch.tensor(7), torch.ones(2, dtype=torch.int64),
              torch.ones(2, dtype=torch.bool), torch.ones(2, dtype=torch.complex64),
              torch.ones(4)[::2], torch.ones(2, 2).t()]
ODD_NAMES = ["", "module.", "module.module.x", "decoder.layers..weight", "decoder.layers.-1.mlp.linear_fc1.weight",
             "decoder.layers.99999999999999999999.input_layernorm.weight", "decoder.layers.1.input_layernorm.weight",
             "decoder.layers.0.self_attention.linear_qkv.bias", "embedding.word_embeddings.weight", "\udcff",
             "x" * 300, "decoder.layers.0.input_layernorm.weight_extra_state", 3, None, ("t",)]


def mutate_object(state, rng):
    """The saved object with one to three structural changes."""
    state = copy.deepcopy(state)
    for _ in range(rng.randint(1, 3)):
        chunk = state.get("model_chunk0") if isinstance(state, dict) else None
        choice = rng.randrange(8)
        if choice == 0:
            state = rng.choice(ODD_VALUES + [[state], (state,)])
        elif choice == 1 and isinstance(state, dict):
            state[rng.choice(["model_chunk1", "optimizer", 0, None])] = rng.choice(ODD_VALUES)
        elif choice == 2 and isinstance(state, dict):
            state["model_chunk0"] = rng.choice(ODD_VALUES)
        elif isinstance(chunk, dict) and chunk:
            name = rng.choice(sorted(chunk, key=str))
            if choice == 3:
                chunk[name] = rng.choice(ODD_VALUES)
            elif choice == 4:
                chunk[rng.choice(ODD_NAMES)] = chunk.pop(name)
            elif choice == 5:
                del chunk[name]
            elif choice == 6:
                chunk[rng.choice(ODD_NAMES)] = rng.choice(ODD_VALUES)
            else:
                chunk[name.replace("layers.0", "layers.1") if "layers.0" in str(name) else name] = chunk[name]
    return state


def mutate_bytes(data, rng):
    """The file's bytes with one to eight byte-level changes."""
    data = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if not data:
            break
        at = rng.randrange(len(data))
        choice = rng.randrange(6)
        if choice == 0:
            data[at] ^= 1 << rng.randrange(8)
        elif choice == 1:
            data[at] = rng.choice([0, 1, 0x7F, 0x80, 0xFF])
        elif choice == 2:
            data[at:at + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x7f\xff\xff\xff"])
        elif choice == 3:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif choice == 4:
            del data[at:at + rng.randint(1, 64)]
        else:
            del data[at:]
    return bytes(data)


class Timeout(Exception):
    pass


def run_importer(importer, dump, out, extra=()):
    """(exit status, stderr) of the importer's main() on `dump`; raises whatever main() lets escape."""
    argv, stderr = sys.argv, io.StringIO()
    sys.argv = ["import_megatron_dump.py", dump, "--out", out, *extra]
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            status = importer.main()
    finally:
        sys.argv = argv
    return status, stderr.getvalue()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=600)
    parser.add_argument("--seconds", type=float, help="run for this long instead of a number of iterations")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--findings", default="fuzz-findings/import_megatron_dump")
    args = parser.parse_args()
    importer = load_importer()
    dumps = seed_dumps()
    rng = random.Random(args.seed)
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(Timeout()))
    counts = {0: 0, 2: 0}
    deadline = time.monotonic() + args.seconds if args.seconds else None
    iteration = 0
    with tempfile.TemporaryDirectory() as scratch:
        while (time.monotonic() < deadline) if deadline else (iteration < args.iterations):
            dump = os.path.join(scratch, f"case{iteration}", "wgrads", "iter_0000001")
            os.makedirs(dump)
            files = dumps[rng.choice(sorted(dumps))]
            target = rng.choice(sorted(files))
            for name, state in files.items():
                path = os.path.join(dump, name)
                if name == target and rng.random() < 0.5:
                    torch.save(mutate_object(state, rng), path)
                else:
                    torch.save(state, path)
                    if name == target:
                        with open(path, "rb") as f:
                            data = mutate_bytes(f.read(), rng)
                        with open(path, "wb") as f:
                            f.write(data)
            signal.alarm(SECONDS_PER_ITERATION)
            try:
                # Every other input with a loss scale: the seeds hold float16 gradients, which the importer
                # refuses without one, so half the inputs reach the unscaling and the writing.
                extra = ("--loss-scale", "1024") if iteration % 2 == 0 else ()
                # Half of them --trusted-dump (the pickles are this loop's own): torch.load(weights_only=True)
                # refuses the seeds' BytesIO and, on torch 1.13, every float, before the checks behind it.
                extra += ("--trusted-dump",) if iteration % 4 < 2 else ()
                status, stderr = run_importer(importer, dump, os.path.join(scratch, f"case{iteration}", "out"), extra)
                finding = None
                if status not in counts or (status == 2 and "import_megatron_dump.py: error: " not in stderr):
                    finding = f"exit status {status}: {stderr.strip()}"
            except Timeout:
                finding = f"no answer within {SECONDS_PER_ITERATION} s"
            except BaseException as error:  # noqa: B036 - SystemExit and the like are findings too
                finding = f"{type(error).__name__} escaped: {error}"
            finally:
                signal.alarm(0)
            if finding:
                shutil.rmtree(args.findings, ignore_errors=True)
                shutil.copytree(dump, args.findings)
                print(f"finding at iteration {iteration} (--seed {args.seed}): {finding}\n"
                      f"the dump is kept in {args.findings}", file=sys.stderr)
                return 1
            counts[status] += 1
            shutil.rmtree(os.path.join(scratch, f"case{iteration}"))
            iteration += 1
    print(f"import_megatron_dump.py: {iteration} mutated dumps, {counts[0]} imported, {counts[2]} refused "
          "with a DumpError, no finding")
    return 0


if __name__ == "__main__":
    sys.exit(main())
