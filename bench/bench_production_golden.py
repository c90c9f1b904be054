#!/usr/bin/env python3
"""A golden file at production widths on one machine: hidden 4,096, 32 heads, 8 KV heads, ffn 14,336,
vocab 32,000, 2 layers, one window of T = 8,192 (bench/production_config.json, 6.98e8 parameters, one
FP64 update on built-in window 1).

Runs `touchstone golden` on that config and reports the wall time of the whole command (parameter
initialisation, the step, writing the file), the step's own time and FLOP rate (FLOPs counted as
bench_long_window.py counts them), the peak resident memory of the process (wait4's ru_maxrss) next
to the memory planner's prediction of the trainer's peak (`touchstone plan memory`), and the file's
size. The golden file (about 17 GB: initial weights, gradients, updated weights) is written under
--dir and removed afterwards unless --keep.

    OPENBLAS_CORETYPE=SkylakeX /usr/bin/python3 bench/bench_production_golden.py --markdown [--dir /tmp] [--keep]
"""

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_long_window import STEP_LINE, run_command, step_flops  # noqa: E402  (one FLOP count for both)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "bench", "production_config.json")
PLANNED = re.compile(r"^Peak: model state ([0-9,]+) \+ ([0-9,]+) at (.*) = ([0-9,]+) bytes$")
LOSS = re.compile(r"\| loss ([0-9.]+) \| loss tokens (\d+) \| grad norm ([0-9.e+-]+) \|")


def planned_peak(binary):
    """(bytes, where) of the planner's peak of the trainer's step for the config."""
    out = subprocess.run([binary, "plan", "memory", "--config", CONFIG, "--breakdown"], capture_output=True,
                         text=True, check=True).stdout
    for line in out.splitlines():
        m = PLANNED.match(line)
        if m:
            return int(m.group(4).replace(",", "")), m.group(3)
    raise RuntimeError("no Peak line in the plan:\n" + out)


def run_golden(binary, path):
    """Runs the golden command; returns (wall seconds, its output lines, peak RSS bytes)."""
    args = [binary, "golden", "--config", CONFIG, "--out", path]
    start = time.perf_counter()
    lines, peak_rss = run_command(args)
    return time.perf_counter() - start, lines, peak_rss


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", default=os.path.join(ROOT, "build", "tools", "touchstone"))
    parser.add_argument("--dir", default="/tmp", help="where the golden file is written")
    parser.add_argument("--keep", action="store_true", help="keep the golden file")
    parser.add_argument("--markdown", action="store_true")
    options = parser.parse_args()

    with open(CONFIG) as f:
        model = json.load(f)["model"]
    planned, planned_at = planned_peak(options.binary)
    path = os.path.join(options.dir, "production_golden.h5")
    try:
        wall, lines, rss = run_golden(options.binary, path)
        size = os.path.getsize(path)
    finally:
        if not options.keep and os.path.exists(path):
            os.remove(path)
    step = next(STEP_LINE.match(line) for line in lines if STEP_LINE.match(line))
    step_seconds, skipped = float(step.group(2)), float(step.group(3))
    loss = next(LOSS.search(line) for line in lines if LOSS.search(line))
    flops = step_flops(model, model["seq_length"], 1, skipped)
    version = subprocess.run([options.binary, "--version"], capture_output=True, text=True).stdout.strip()

    rows = [
        ("command wall time (init, step, write)", f"{wall:.1f} s"),
        ("step time", f"{step_seconds:.1f} s"),
        ("step FLOPs counted, rate", f"{flops / 1e12:.2f} TFLOP, {flops / step_seconds / 1e9:.1f} GFLOP/s"),
        ("attention tile pairs skipped", f"{skipped:.1f}%"),
        ("peak resident memory (whole process)", f"{rss / 1e9:.2f} GB ({rss / 2**30:.2f} GiB)"),
        ("planner: trainer step peak", f"{planned / 1e9:.2f} GB (at {planned_at})"),
        ("golden file", f"{size / 1e9:.2f} GB"),
        ("loss, loss tokens, grad norm", f"{loss.group(1)}, {loss.group(2)}, {loss.group(3)}"),
    ]
    print(f"{datetime.date.today()}, {version}, OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '')}")
    if options.markdown:
        print("| measured | value |\n|---|---|")
        for name, value in rows:
            print(f"| {name} | {value} |")
    else:
        for name, value in rows:
            print(f"{name:40s} {value}")


if __name__ == "__main__":
    main()
