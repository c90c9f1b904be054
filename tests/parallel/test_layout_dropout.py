#!/usr/bin/python3
"""layout_dropout: attention and hidden dropout in every kind of parallel layout.

1. `touchstone check parallel` with model.attention_dropout and model.hidden_dropout at 0.1 runs the
   single-rank reference and each layout below, FP64, and holds loss, token losses, every gradient
   and every updated parameter of 3 steps to the layout bound (1e-12 relative L2, derived in
   tools/check/check_parallel.cpp). It passes only if every layout draws the single-rank masks:
   heads sharded over tp, rows sharded over tp by sequence parallelism, layers over stages, windows
   over dp ranks and micro-batches.
2. Dropout was really on: the single-rank run with dropout differs from the same run without it
   in the loss and the gradients of every step (so the check cannot pass with dropout silently off
   everywhere).

Usage: test_layout_dropout.py TOUCHSTONE LAYOUT_CONFIG WORKDIR
"""

import os
import subprocess
import sys

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__

import h5py  # noqa: E402
import numpy as np  # noqa: E402

LAYOUTS = "dp2,dp4_zero3,tp2,tp4,tp2_sp,pp2_1f1b,pp4_uneven_1f1b,pp2_zb_h1,pp2_v2,tp2_pp2_dp2_sp_zero,cp2,cp4_allgather,tp2_cp2_pp2_sp"
DROPOUT = ["--set", "model.attention_dropout=0.1", "--set", "model.hidden_dropout=0.1"]
# With dropout silently off both single-rank runs compute the same thing and agree bitwise. With it
# on, the loss at initialisation changes little (measured 6e-6 to 3e-4 relative: the residual
# branches are small), the gradients a lot (measured 0.33 to 0.37 relative L2). The bounds are far
# above 0 (and above the FP64 layout bound, 1e-12) and far below the measured changes.
MIN_LOSS_CHANGE = 1e-9
MIN_GRADIENT_CHANGE = 1e-2


def run(command):
    print("$ " + " ".join(command), flush=True)
    completed = subprocess.run(command, capture_output=True, text=True, timeout=280)
    print(completed.stdout + completed.stderr, flush=True)
    return completed.returncode


def steps(path):
    """Per step: (loss, every gradient flattened into one vector)."""
    with h5py.File(path, "r") as golden:
        result = []
        for s in sorted(golden["steps"], key=int):
            grads = golden["steps"][s]["grads"]
            result.append((float(golden["steps"][s]["loss"][()]),
                           np.concatenate([grads[name][()].ravel() for name in sorted(grads)])))
        return result


def main():
    touchstone, config, workdir = sys.argv[1:4]
    os.makedirs(workdir, exist_ok=True)
    if run([touchstone, "check", "parallel", "--config", config] + DROPOUT +
           ["--layouts", LAYOUTS, "--workdir", workdir]) != 0:
        print("FAIL: a layout with dropout differs from the single-rank run")
        return 1

    on, off = os.path.join(workdir, "dropout_on.h5"), os.path.join(workdir, "dropout_off.h5")
    if run([touchstone, "golden", "--config", config] + DROPOUT + ["--out", on]) != 0 or \
            run([touchstone, "golden", "--config", config, "--out", off]) != 0:
        print("FAIL: a single-rank run failed")
        return 1
    failed = False
    for step, ((loss_on, grads_on), (loss_off, grads_off)) in enumerate(zip(steps(on), steps(off)),
                                                                         start=1):
        loss_change = abs(loss_on - loss_off) / abs(loss_off)
        grad_change = np.linalg.norm(grads_on - grads_off) / np.linalg.norm(grads_off)
        print(f"step {step}: loss {loss_on:.12f} with dropout, {loss_off:.12f} without, relative "
              f"change {loss_change:.2e}; gradients' relative L2 change {grad_change:.2e}")
        failed |= not (loss_change > MIN_LOSS_CHANGE and grad_change > MIN_GRADIENT_CHANGE)
    if failed:
        print(f"FAIL: dropout changed the loss by at most {MIN_LOSS_CHANGE:g} or the gradients by "
              f"at most {MIN_GRADIENT_CHANGE:g}: it is not on")
        return 1
    print("pass: every layout draws the single-rank masks, and dropout changes the loss")
    return 0


if __name__ == "__main__":
    sys.exit(main())
