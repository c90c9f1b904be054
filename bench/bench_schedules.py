"""Pipeline schedules on this machine: the idle share of each stage measured from the trace
(`touchstone train --trace` prints "pipeline idle: ..." after each step, parallel/pipeline/timeline.h
measure_idle) next to the schedule's bubble formula, for AFAB, 1F1B, ZB-H1 and interleaved 1F1B with 2
virtual stages (a layer per chunk at pp 2) at the given pipeline sizes and micro-batch counts, all in
one run.

The model: 4 layers, H 256, FFN 704, 8 heads (4 KV), T 256, vocabulary 256, one window per
micro-batch, FP64; m micro-batches per step; 3 steps, the last one reported (the activation arena is
laid out after the first). Each pipeline size runs only when the machine has a core per rank: a rank
that waits in a blocking receive keeps its core busy, so oversubscribed ranks would count each
other's time slices as work.

Formulas (equal stages, backward = 2 forwards, ZB-H1 with F = I = W): AFAB and 1F1B
(p - 1) / (m + p - 1), ZB-H1 (p - 1) / (3m + p - 1) for m >= p, interleaved 1F1B (p - 1) / (v m + p - 1)
(its bubble is (p - 1) / (v m) of the ideal time, Megatron-LM's figure; as a share of the step it is
this). The stages are not equal here: the
first holds the embedding and the last the output layer and the loss, so measured shares differ by
stage.

Usage: /usr/bin/python3 bench/bench_schedules.py [--touchstone build/tools/touchstone] [--pp 2,4]
       [--micro-batches 4,8,16] [--markdown]
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATRIX_CONFIG = os.path.join(ROOT, "tests", "parallel", "layout_matrix.json")
MODEL = ["model.hidden_size=256", "model.ffn_hidden_size=704", "model.seq_length=256", "model.num_layers=4",
         "train.micro_batch_size=1", "train.steps=3"]
# name: the config's settings; "interleaved_v2" is 1F1B over 2 model chunks per stage.
SCHEDULES = {
    "afab": ["parallel.schedule=afab"],
    "1f1b": ["parallel.schedule=1f1b"],
    "zb_h1": ["parallel.schedule=zb_h1"],
    "interleaved_v2": ["parallel.schedule=1f1b", "parallel.virtual_stages=2"],
}
IDLE = re.compile(r"^pipeline idle: (.*) of ([0-9.]+) s$")


def launcher():
    return ["mpirun", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])


def formula(schedule, p, m):
    if schedule == "zb_h1":
        return (p - 1) / (3 * m + p - 1) if m >= p else None
    if schedule == "interleaved_v2":
        return (p - 1) / (2 * m + p - 1)
    return (p - 1) / (m + p - 1)


def measured_idle(touchstone, schedule, p, m):
    """The last step's (span in s, [idle share per stage]) from rank 0's trace."""
    args = [*launcher(), "-np", str(p), touchstone, "train", "--config", MATRIX_CONFIG, "--trace",
            "--set", f"parallel.pp={p}", "--set", f"train.global_batch_size={m}"]
    for s in MODEL + SCHEDULES[schedule]:
        args += ["--set", s]
    run = subprocess.run(args, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"bench_schedules.py: {' '.join(args)} failed:\n{run.stderr[-2000:]}")
    found = [IDLE.match(line) for line in run.stdout.splitlines()]
    last = [f for f in found if f][-1]
    shares = [float(part.split()[-1].rstrip("%")) / 100 for part in last.group(1).split(", ")]
    return float(last.group(2)), shares


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--touchstone", default=os.path.join(ROOT, "build", "tools", "touchstone"))
    parser.add_argument("--pp", default="2,4", help="pipeline sizes, comma-separated (default 2,4)")
    parser.add_argument("--micro-batches", default="4,8,16", help="micro-batches per step (default 4,8,16)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    sizes = [int(p) for p in args.pp.split(",")]
    counts = [int(m) for m in args.micro_batches.split(",")]
    rows = []
    for p in sizes:
        if p > cores:
            print(f"pp {p}: skipped, {p} ranks need {p} cores and this machine has {cores}", file=sys.stderr)
            continue
        for m in counts:
            for schedule in SCHEDULES:
                print(f"pp {p}, m {m}, {schedule} ...", file=sys.stderr, flush=True)
                span, shares = measured_idle(args.touchstone, schedule, p, m)
                rows.append((p, m, schedule, formula(schedule, p, m), shares, span))
    if args.markdown:
        print("| pp | m | schedule | formula | measured idle per stage | mean | step's pipeline span |")
        print("|---:|---:|---|---:|---|---:|---:|")
    for p, m, schedule, expected, shares, span in rows:
        per_stage = " / ".join(f"{100 * s:.1f}%" for s in shares)
        mean = sum(shares) / len(shares)
        expected_text = f"{100 * expected:.1f}%" if expected is not None else "-"
        if args.markdown:
            print(f"| {p} | {m} | {schedule} | {expected_text} | {per_stage} | {100 * mean:.1f}% | {span:.3f} s |")
        else:
            print(f"pp {p} m {m:3d} {schedule:14s} formula {expected_text:>6s} measured {per_stage} "
                  f"(mean {100 * mean:.1f}%) of {span:.3f} s")


if __name__ == "__main__":
    main()
