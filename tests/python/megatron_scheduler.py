"""Megatron-LM's learning-rate scheduler, transcribed: the reference the `megatron` schedule
convention (docs/contract.md "Update") is tested against.

Transcribed from megatron/core/optimizer_param_scheduler.py (OptimizerParamScheduler: __init__'s
step(0), step(increment), get_lr with decay style "cosine", main of 2026-08, commit d98e8a64ddf3) and
megatron/training/training.py (get_optimizer_param_scheduler: iteration-based lengths are
--lr-warmup-iters and --lr-decay-iters times the global batch; train_step: optimizer.step(), then
opt_param_scheduler.step(increment = micro-batches x micro-batch size x data-parallel size)).
Only what a dense cosine schedule uses is kept: no WSD, no inverse-square-root, no weight-decay ramp.
"""

import math


class OptimizerParamScheduler:
    """The scheduler's state as Megatron-LM keeps it: num_steps counts samples."""

    def __init__(self, init_lr, max_lr, min_lr, lr_warmup_steps, lr_decay_steps):
        assert min_lr >= 0.0 and max_lr >= min_lr and init_lr <= max_lr
        assert lr_decay_steps > 0 and lr_warmup_steps < lr_decay_steps
        self.init_lr, self.max_lr, self.min_lr = init_lr, float(max_lr), min_lr
        self.lr_warmup_steps, self.lr_decay_steps = lr_warmup_steps, lr_decay_steps
        self.num_steps = 0
        self.lr = None
        self.step(0)

    def get_lr(self):
        max_lr, min_lr = self.max_lr, self.min_lr
        if self.lr_warmup_steps > 0 and self.num_steps <= self.lr_warmup_steps:
            return self.init_lr + ((max_lr - self.init_lr) * float(self.num_steps) / float(self.lr_warmup_steps))
        if self.num_steps > self.lr_decay_steps:
            return min_lr
        num_steps_ = self.num_steps - self.lr_warmup_steps
        decay_steps_ = self.lr_decay_steps - self.lr_warmup_steps
        decay_ratio = float(num_steps_) / float(decay_steps_)
        assert 0.0 <= decay_ratio <= 1.0
        delta_lr = max_lr - min_lr
        coeff = 0.5 * (math.cos(math.pi * decay_ratio) + 1.0)
        return min_lr + coeff * delta_lr

    def step(self, increment):
        self.num_steps += increment
        self.lr = self.get_lr()


def rates(updates, lr, min_lr, warmup_iters, decay_iters, warmup_init=0.0, global_batch=1):
    """The rates of updates 1..updates of an iteration-based run with --lr lr --min-lr min_lr
    --lr-warmup-iters warmup_iters --lr-decay-iters decay_iters --lr-warmup-init warmup_init
    --lr-decay-style cosine: each optimizer.step() at the scheduler's rate, then step(global batch)."""
    scheduler = OptimizerParamScheduler(warmup_init, lr, min_lr, warmup_iters * global_batch,
                                        decay_iters * global_batch)
    out = []
    for _ in range(updates):
        out.append(scheduler.lr)
        scheduler.step(global_batch)
    return out


def rate(update, optim, global_batch=1):
    """The rate of update `update` (1-based) of a Megatron-LM run with the golden config's optim
    values as its flags (optim.warmup_steps -> --lr-warmup-iters, optim.decay_steps ->
    --lr-decay-iters, optim.warmup_init -> --lr-warmup-init)."""
    return rates(update, float(optim["lr"]), float(optim["min_lr"]), int(optim["warmup_steps"]),
                 int(optim["decay_steps"]), float(optim.get("warmup_init", 0.0)), global_batch)[-1]
