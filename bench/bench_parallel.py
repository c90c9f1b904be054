"""Parallel benchmarks on this machine: the wall time of the whole layout matrix
(`touchstone check parallel`), and the bytes every parallelism communicates per step, measured from
the trace's per-rank counters, next to the analytic count. The measured bytes must equal the formula
exactly; the script exits non-zero if one does not.

Usage: /usr/bin/python3 bench/bench_parallel.py [--touchstone build/tools/touchstone] [--markdown]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATRIX_CONFIG = os.path.join(ROOT, "tests", "parallel", "layout_matrix.json")


def launcher():
    return ["mpirun", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])


def rank0_counters(touchstone, ranks, sets):
    """Runs one step with --trace; returns {(group, op): bytes} of world rank 0 (its own output file)."""
    with tempfile.TemporaryDirectory() as d:
        args = [*launcher(), "--output-filename", d, "-np", str(ranks), touchstone, "train", "--config",
                MATRIX_CONFIG, "--set", "train.steps=1", "--trace"]
        for s in sets:
            args += ["--set", s]
        subprocess.run(args, capture_output=True, text=True, check=True)
        with open(os.path.join(d, "1", "rank.0", "stdout")) as f:
            lines = f.read().splitlines()
    start = next(i for i, l in enumerate(lines) if re.match(r"^\[rank 0\] transfers by group and op", l))
    counters = {}
    for line in lines[start + 2:]:
        if line.startswith("total"):
            break
        group, op, _calls, nbytes = line.split()
        counters[(group, op)] = int(nbytes)
    return counters


def config():
    cfg = json.loads(subprocess.run([TOUCHSTONE, "config", "--config", MATRIX_CONFIG], capture_output=True,
                                    text=True, check=True).stdout)
    return cfg


def params_per_rank(m, tp, stage_layers, first, last):
    """Elements of the tensors one rank holds (tp shards), as the parameter table defines them."""
    H, V, F, NH, NKV = m["hidden_size"], m["vocab_size"], m["ffn_hidden_size"], m["num_heads"], m["num_kv_heads"]
    D = H // NH
    layer = 2 * H + ((NH + 2 * NKV) * D * H + H * NH * D + 2 * F * H + H * F) // tp
    n = stage_layers * layer
    if first:
        n += V * H // tp
    if last:
        n += H + (0 if m["tie_embeddings"] and first else V * H // tp)
    return n


def padded(n, dp):
    return (n + dp - 1) // dp * dp


def tensors_per_rank(m, tp):
    """(dim 0, elements) of each tensor of a one-stage rank, in table order (model/param_table.cpp)."""
    H, V, F, NH, NKV = m["hidden_size"], m["vocab_size"], m["ffn_hidden_size"], m["num_heads"], m["num_kv_heads"]
    D = H // NH
    layer = [(H, H), ((NH + 2 * NKV) * D // tp, (NH + 2 * NKV) * D * H // tp), (H, H * NH * D // tp), (H, H),
             (2 * F // tp, 2 * F * H // tp), (H, H * F // tp)]
    out = [(V // tp, V * H // tp)] + layer * m["num_layers"] + [(H, H)]
    return out + ([] if m["tie_embeddings"] else [(V // tp, V * H // tp)])


def dim0_padded(rows, numel, dp):
    """A tensor's dp dim-0 shards, each ceil(rows / dp) rows (parallel/data/dim0_shard.h)."""
    return (rows + dp - 1) // dp * (numel // rows) * dp


def expected(cfg, layout):
    """Analytic bytes per step on world rank 0, by (group, op). 8 bytes per element (FP64, int64)."""
    m, t = cfg["model"], cfg["train"]
    tp, pp, dp = layout.get("tp", 1), layout.get("pp", 1), layout.get("dp", 1)
    sp, zero = layout.get("sp", False), layout.get("zero", False)
    L, H, T = m["num_layers"], m["hidden_size"], m["seq_length"]
    mbs, B = t["micro_batch_size"], t["global_batch_size"]
    micro = B // (mbs * dp)  # micro-batches per dp rank
    N = mbs * T  # rows of a micro-batch
    Ls = L // pp  # layers on rank 0's stage (even split)
    first, last = True, pp == 1
    e = {("dp", "all_reduce"): 8, ("world", "all_reduce"): 16}  # loss tokens; loss and grad norm
    if True:  # groups of one rank record their (local) calls too, so the formula counts them
        regions = 2 * Ls + (1 if first else 0)  # region exits in the forward (embedding, proj, fc2)
        entries = 2 * Ls + (1 if last else 0)   # region entries in the forward (qkv, fc1, output layer)
        if sp:
            e[("tp", "reduce_scatter")] = micro * (regions + entries) * N * H * 8
            e[("tp", "all_gather")] = micro * (entries + regions) * N * H * 8
            norms = (2 * Ls + (1 if last else 0)) * H * 8
            e[("tp", "all_reduce")] = micro * (2 * N * 8 if last else 0) + norms
        else:
            e[("tp", "all_reduce")] = micro * ((regions + entries) * N * H * 8 + (2 * N * 8 if last else 0))
        if last:
            e[("tp", "all_reduce_max")] = micro * N * 8
    if pp > 1:
        Nl = N // tp if sp else N
        e[("pp", "send")] = micro * Nl * H * 8
        e[("pp", "recv")] = micro * Nl * H * 8
        # --trace gathers each stage's timeline to rank 0: a length, then 6 doubles per recorded action
        # (parallel/pipeline/timeline.h; the last stage records F, B, the activation receive and the
        # gradient send of every micro-batch).
        e[("world", "recv")] = 8 + micro * 4 * 6 * 8
    flat = padded(params_per_rank(m, tp, Ls, first, last), dp)
    stage = layout.get("zero_stage", 1 if zero else 0)
    # ZeRO-2 and ZeRO-3 move each tensor's dp dim-0 shards (one-stage layouts only here).
    shards = sum(dim0_padded(rows, n, dp) for rows, n in tensors_per_rank(m, tp)) if stage >= 2 else 0
    if stage == 1:
        e[("dp", "reduce_scatter")] = flat * 8
        e[("dp", "all_gather")] = flat * 8
    elif stage == 2:  # each gradient reduce-scattered, each parameter gathered, once per step
        e[("dp", "reduce_scatter")] = shards * 8
        e[("dp", "all_gather")] = shards * 8
    elif stage == 3:  # per micro-batch: gathered before the forward and the backward, gradients scattered after
        e[("dp", "reduce_scatter")] = micro * shards * 8
        e[("dp", "all_gather")] = 2 * micro * shards * 8
    else:
        e[("dp", "all_reduce")] += flat * 8
    return {k: v for k, v in e.items() if v}


LAYOUTS = [
    ("dp2", 2, {"dp": 2}, ["parallel.dp=2"]),
    ("dp2 distributed optimizer", 2, {"dp": 2, "zero": True}, ["parallel.dp=2", "parallel.distributed_optimizer=true"]),
    ("dp4 zero stage 1", 4, {"dp": 4, "zero_stage": 1}, ["parallel.dp=4", "parallel.zero_stage=1"]),
    ("dp4 zero stage 2", 4, {"dp": 4, "zero_stage": 2}, ["parallel.dp=4", "parallel.zero_stage=2"]),
    ("dp4 zero stage 3", 4, {"dp": 4, "zero_stage": 3}, ["parallel.dp=4", "parallel.zero_stage=3"]),
    ("tp2", 2, {"tp": 2}, ["parallel.tp=2"]),
    ("tp2 sequence parallel", 2, {"tp": 2, "sp": True}, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
    ("pp2", 2, {"pp": 2}, ["parallel.pp=2"]),
]


def main():
    global TOUCHSTONE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--touchstone", default=os.path.join(ROOT, "build", "tools", "touchstone"))
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    TOUCHSTONE = os.path.abspath(args.touchstone)
    cfg = config()

    rows, ok = [], True
    for name, ranks, layout, sets in LAYOUTS:
        measured = rank0_counters(TOUCHSTONE, ranks, sets)
        formula = expected(cfg, layout)
        # The tp and dp groups exist (with one rank) in every layout; compare only what the formula covers
        # and every group this layout parallelises.
        keys = sorted(set(formula) | {k for k in measured if measured[k]})
        for key in keys:
            a, b = measured.get(key, 0), formula.get(key, 0)
            ok &= a == b
            rows.append((name, key[0], key[1], a, b, "equal" if a == b else "DIFFERENT"))

    with tempfile.TemporaryDirectory() as d:
        start = time.monotonic()
        check = subprocess.run([TOUCHSTONE, "check", "parallel", "--config", MATRIX_CONFIG, "--workdir", d],
                               capture_output=True, text=True)
        matrix_seconds = time.monotonic() - start
    ok &= check.returncode == 0

    m, t = cfg["model"], cfg["train"]
    header = (f"Config: tests/parallel/layout_matrix.json (V={m['vocab_size']}, H={m['hidden_size']}, "
              f"L={m['num_layers']}, NH={m['num_heads']}, NKV={m['num_kv_heads']}, F={m['ffn_hidden_size']}, "
              f"T={m['seq_length']}, B={t['global_batch_size']}, mbs={t['micro_batch_size']}), one step, world rank 0.")
    if args.markdown:
        print(header + "\n")
        print("| layout | group | op | measured bytes | formula bytes | |")
        print("|---|---|---|---:|---:|---|")
        for r in rows:
            print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} |")
        print(f"\nLayout matrix (11 layouts, up to 8 ranks, 3 steps each, plus references): {matrix_seconds:.1f} s "
              f"wall on {os.cpu_count()} cores, exit status {check.returncode}.")
    else:
        print(header)
        for r in rows:
            print(f"{r[0]:28s} {r[1]:6s} {r[2]:15s} {r[3]:>12d} {r[4]:>12d}  {r[5]}")
        print(check.stdout)
        print(f"layout matrix: {matrix_seconds:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
