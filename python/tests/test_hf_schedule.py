"""transformers' cosine scheduler, stepped after optimizer.step() as its Trainer steps it, runs update
k at the schedule of step k-1: the golden file's optim.schedule_convention = megatron, not the
default (docs/frameworks/huggingface.md). Checked against transformers itself."""

import h5py
import pytest
import torch

from conftest import make_golden

transformers_optimization = pytest.importorskip("transformers.optimization")

LR, MIN_LR, WARMUP, DECAY = 1e-3, 1e-4, 2, 6


def transformers_rates(updates):
    """The rate each optimizer.step() of a transformers run uses, the scheduler stepped after it."""
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    scheduler = transformers_optimization.get_cosine_with_min_lr_schedule_with_warmup(
        optimizer, num_warmup_steps=WARMUP, num_training_steps=DECAY, min_lr_rate=MIN_LR / LR)
    rates = []
    for _ in range(updates):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def golden_rates(golden_dir, convention, steps):
    path = make_golden(golden_dir, f"schedule_{convention}", [
        f"optim.schedule_convention={convention}", f"optim.lr={LR}", f"optim.min_lr={MIN_LR}",
        f"optim.warmup_steps={WARMUP}", f"optim.decay_steps={DECAY}", f"train.steps={steps}",
        "model.num_layers=1", "train.global_batch_size=2", "train.micro_batch_size=1"])
    with h5py.File(path, "r") as f:
        return [float(f[f"steps/{s}/lr"][()]) for s in range(1, steps + 1)]


def test_transformers_cosine_with_min_lr_is_the_megatron_convention(golden_dir):
    # Up to update D + 1: past D transformers' cosine rises again where both conventions hold min_lr.
    # The same numbers by other operations (a factor of lr against lr - min_lr): 1e-15 relative.
    steps = DECAY + 1
    ours, theirs = golden_rates(golden_dir, "megatron", steps), transformers_rates(steps)
    assert ours == pytest.approx(theirs, rel=1e-15, abs=1e-18)
    assert theirs[0] == 0.0  # update 1 does not move the parameters
    default = golden_rates(golden_dir, "touchstone", steps)
    assert default[:-1] == pytest.approx(theirs[1:], rel=1e-15)  # the default is one step ahead
    assert default[0] != pytest.approx(theirs[0])
