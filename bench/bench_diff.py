"""`touchstone diff` with re-anchoring on the bench model (bench/step_config.json, 3 steps): its wall
time and peak memory next to the golden run's own step time, measured in one run.

The golden file is the BF16 envelope of the bench config (FP64 values, per-tensor BF16 tolerances);
the candidate is Touchstone's own BF16 run of the same config, which records its parameters after
every step, so diff re-anchors steps 2 and 3 (one FP64 and one BF16 step each at the candidate's
parameters) and checks every update with the optimizer check. `--no-recompute` (the golden trajectory
alone) is timed beside it.

Usage: /usr/bin/python3 bench/bench_diff.py [--touchstone build/tools/touchstone] [--dir DIR]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 3


def run(command):
    """Runs a child; returns (stdout, wall seconds, peak RSS of that child in MB, exit status)."""
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if child.returncode not in (0, 1):
        sys.exit(f"{' '.join(command)} failed ({child.returncode}):\n{stderr}")
    return stdout, seconds, usage.ru_maxrss / 1024.0, child.returncode


def step_seconds(output):
    return [float(s) for s in re.findall(r"\| ([0-9.]+) s \|", output)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--touchstone", default=os.path.join(HERE, "..", "build", "tools", "touchstone"))
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    work = args.dir or tempfile.mkdtemp(prefix="bench_diff_")
    os.makedirs(work, exist_ok=True)
    config = os.path.join(HERE, "step_config.json")
    base = [args.touchstone, "golden", "--config", config, "--set", f"train.steps={STEPS}"]
    golden, candidate = os.path.join(work, "golden.h5"), os.path.join(work, "candidate.h5")
    print(f"bench model, {STEPS} steps; writing the BF16 candidate ...", flush=True)
    out, candidate_seconds, _, _ = run(base + ["--set", "precision=bf16", "--out", candidate])
    bf16_steps = step_seconds(out)
    print("writing the envelope golden file (BF16 then FP64) ...", flush=True)
    out, golden_seconds, golden_peak, _ = run(base + ["--set", "precision=bf16", "--envelope", "--out", golden])
    steps = step_seconds(out)  # BF16 steps, then FP64 steps
    fp64_steps = steps[STEPS:]
    print("touchstone diff --no-recompute ...", flush=True)
    _, plain_seconds, _, plain_status = run([args.touchstone, "diff", golden, candidate, "--no-recompute"])
    print("touchstone diff (re-anchored) ...", flush=True)
    report = os.path.join(work, "diff.json")
    _, diff_seconds, diff_peak, status = run([args.touchstone, "diff", golden, candidate, "--json", report])
    with open(report) as f:
        result = json.load(f)
    mean = lambda xs: sum(xs) / len(xs)
    summary = {
        "golden_fp64_step_s": mean(fp64_steps), "golden_bf16_step_s": mean(bf16_steps),
        "golden_envelope_run_s": golden_seconds, "golden_envelope_peak_mb": golden_peak,
        "diff_no_recompute_s": plain_seconds, "diff_no_recompute_exit": plain_status,
        "diff_reanchored_s": diff_seconds, "diff_reanchored_exit": status,
        "diff_recompute_s": result["recompute_seconds"], "diff_peak_mb": diff_peak,
        "judgment": result["judgment"],
    }
    print(json.dumps(summary, indent=1))
    print(f"\n| | wall time | ratio to one FP64 golden step ({summary['golden_fp64_step_s']:.2f} s) | peak RSS |")
    print("|---|---:|---:|---:|")
    print(f"| golden --envelope ({STEPS} BF16 + {STEPS} FP64 steps) | {golden_seconds:.1f} s | "
          f"{golden_seconds / summary['golden_fp64_step_s']:.1f} | {golden_peak:.0f} MB |")
    print(f"| diff --no-recompute | {plain_seconds:.1f} s | {plain_seconds / summary['golden_fp64_step_s']:.1f} | - |")
    print(f"| diff, re-anchored (of which re-evaluating steps: {result['recompute_seconds']:.1f} s) | "
          f"{diff_seconds:.1f} s | {diff_seconds / summary['golden_fp64_step_s']:.1f} | {diff_peak:.0f} MB |")


if __name__ == "__main__":
    main()
