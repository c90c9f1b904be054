"""Context parallelism on this machine: the bytes each way of passing keys and values (`parallel.cp_comm`)
moves per step, measured from every rank's trace counters, next to the analytic count; and the share of
attention tile pairs that causality and document masking leave empty, summed over the cp ranks, next to
the single-rank run's. The measured bytes must equal the formula exactly; the script exits non-zero if
one does not.

One step of the layout-matrix model (tests/parallel/layout_matrix.json: 6 layers, H 64, 8 heads, 4 KV
heads, D 8) at T = 512 on the built-in data (micro-batches of 2 windows, 4 per step).

Usage: /usr/bin/python3 bench/bench_context.py [--touchstone build/tools/touchstone] [--markdown]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATRIX_CONFIG = os.path.join(ROOT, "tests", "parallel", "layout_matrix.json")
T = 512


def launcher():
    return ["mpirun", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])


def run(touchstone, cp, comm):
    """One traced step; per rank: {(group, op): bytes} and (tile pairs computed, skipped)."""
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([*launcher(), "--output-filename", d, "-np", str(cp), touchstone, "train", "--config",
                        MATRIX_CONFIG, "--set", f"model.seq_length={T}", "--set", "train.steps=1", "--set",
                        f"parallel.cp={cp}", "--set", f"parallel.cp_comm={comm}", "--trace"],
                       capture_output=True, text=True, check=True)
        ranks = []
        for r in range(cp):
            with open(os.path.join(d, "1", f"rank.{r}", "stdout")) as f:
                lines = f.read().splitlines()
            counters = {}
            start = next(i for i, l in enumerate(lines) if re.match(rf"^\[rank {r}\] transfers by group", l))
            for line in lines[start + 2:]:
                if line.startswith("total"):
                    break
                group, op, _calls, nbytes = line.split()
                counters[(group, op)] = int(nbytes)
            tiles = next(re.search(r"computed (\d+), skipped (\d+)", l) for l in lines if "attention tile pairs" in l)
            ranks.append((counters, (int(tiles.group(1)), int(tiles.group(2)))))
        return ranks


def expected_bytes(cfg, cp, comm):
    """Rank 0's bytes on the cp group in one step (ContextParallelAttention, context_attention.h)."""
    m, t = cfg["model"], cfg["train"]
    head_dim = m["hidden_size"] // m["num_heads"]
    micro_batches = t["global_batch_size"] // t["micro_batch_size"]
    # K and V of one rank for one micro-batch: [2, b, NKV, T/cp, D] doubles.
    block = 2 * t["micro_batch_size"] * m["num_kv_heads"] * (T // cp) * head_dim * 8
    per_layer = micro_batches * m["num_layers"]
    if comm == "p2p":  # forward: cp - 1 blocks on; backward: cp - 1 blocks and cp accumulators
        sent = per_layer * (3 * (cp - 1) + 1) * block
        return {("cp", "send"): sent, ("cp", "recv"): sent}
    # two all-gathers (forward, backward) and one reduce-scatter, each of cp blocks (nccl-tests' size)
    return {("cp", "all_gather"): per_layer * 2 * cp * block, ("cp", "reduce_scatter"): per_layer * cp * block}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--touchstone", default=os.path.join(ROOT, "build", "tools", "touchstone"))
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    cfg = json.loads(subprocess.run([args.touchstone, "config", "--config", MATRIX_CONFIG], capture_output=True,
                                    text=True, check=True).stdout)
    bytes_rows, tile_rows, wrong = [], [], 0
    single = run(args.touchstone, 1, "p2p")[0][1]
    tile_rows.append(("1", "-", single[0], single[1], f"{single[0]}"))
    for cp in (2, 4):
        for comm in ("p2p", "allgather"):
            ranks = run(args.touchstone, cp, comm)
            for key, formula in expected_bytes(cfg, cp, comm).items():
                measured = ranks[0][0].get(key, 0)
                wrong += measured != formula
                bytes_rows.append((cp, comm, key[1], measured, formula, "equal" if measured == formula else "DIFFERENT"))
            computed = sum(r[1][0] for r in ranks)
            skipped = sum(r[1][1] for r in ranks)
            per_rank = [r[1][0] for r in ranks]  # the load balance of the split: computed pairs per rank
            tile_rows.append((str(cp), comm, computed, skipped, f"{min(per_rank)} / {max(per_rank)}"))
    if args.markdown:
        print("| cp | cp_comm | op (rank 0, group cp) | measured bytes | formula bytes | |")
        print("|---:|---|---|---:|---:|---|")
        for r in bytes_rows:
            print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} |")
        print()
        print("| cp | cp_comm | tile pairs computed (all ranks) | skipped | skipped share | computed per rank (min / max) |")
        print("|---:|---|---:|---:|---:|---:|")
        for r in tile_rows:
            print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {100.0 * r[3] / (r[2] + r[3]):.1f}% | {r[4]} |")
    else:
        for r in bytes_rows:
            print(f"cp {r[0]} {r[1]:9s} {r[2]:15s} {r[3]:>12d} {r[4]:>12d}  {r[5]}")
        for r in tile_rows:
            print(f"cp {r[0]} {r[1]:9s} tile pairs computed {r[2]}, skipped {r[3]} "
                  f"({100.0 * r[3] / (r[2] + r[3]):.1f}%), per rank {r[4]}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
