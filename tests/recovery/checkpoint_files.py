"""Reading what a run with --checkpoint-dir leaves behind, for the recovery tests: the tensors of a
checkpoint and the effective steps of the sample ledger."""
import json
import os

import h5py


def checkpoint_tensors(directory, step):
    """Every dataset of DIR/step_<step>/state.h5 by path (parameters, moments, progress scalars)."""
    tensors = {}
    with h5py.File(os.path.join(directory, f"step_{step:08d}", "state.h5"), "r") as f:
        f.visititems(lambda name, obj: tensors.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return tensors


def ledger_steps(directory):
    """step -> (samples per dp rank, loss, loss tokens, grad norm, lr) of the last attempt that recorded it."""
    steps = {}
    with open(os.path.join(directory, "ledger.jsonl")) as f:
        for line in f:
            e = json.loads(line)
            if e["event"] == "step":
                steps[e["step"]] = (e["samples"], e["loss"], e["num_loss_tokens"], e["grad_norm"], e["lr"])
    return steps
