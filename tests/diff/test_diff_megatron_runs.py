"""Megatron-LM runs as its source has them (docs/frameworks/megatron.md): the learning rates of
optim.schedule_convention = megatron against a transcription of Megatron-LM's scheduler
(tests/python/megatron_scheduler.py) over warm-up, decay and the constant tail, the flags that
reproduce the default convention, the first update that does not move, and the default
normalisation under context parallelism, which no Touchstone normalisation matches.

Usage: test_diff_megatron_runs.py PATH_TO_TOUCHSTONE PATH_TO_SOURCE_TREE
"""

import json
import os
import sys
import unittest

import diff_common as common  # first: it keeps bytecode out of the source tree

import h5py  # noqa: E402
import numpy as np  # noqa: E402

U = 2.0 ** -53
# A model small enough that 20 steps take a second; 6 windows per step in micro-batches of 2.
TINY = {"model.hidden_size": 16, "model.num_layers": 1, "model.num_heads": 2, "model.num_kv_heads": 1,
        "model.ffn_hidden_size": 32, "model.seq_length": 16, "train.global_batch_size": 6,
        "train.micro_batch_size": 2}


def golden(path, **settings):
    command = [common.TOUCHSTONE, "golden", "--out", path]
    for key, value in {**TINY, **settings}.items():
        command += ["--set", f"{key}={value}"]
    result = common.run(command)
    assert result.returncode == 0, result.stderr + result.stdout
    return path


def recorded_rates(path):
    with h5py.File(path, "r") as f:
        return [float(f[f"steps/{s}/lr"][()]) for s in range(1, len(f["steps"]) + 1)]


class MegatronRuns(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = common.tempfile.TemporaryDirectory()
        sys.path.insert(0, os.path.join(common.SOURCE, "tests", "python"))
        import megatron_scheduler
        cls.megatron = megatron_scheduler

    @classmethod
    def tearDownClass(cls):
        cls.scratch.cleanup()

    def path(self, name):
        return os.path.join(self.scratch.name, name)

    def test_megatron_convention_is_megatrons_scheduler(self):
        # Megatron-LM counts samples ((k-1) g against W g and D g): the decay's quotient is the same
        # correctly rounded number, so decay and tail are bitwise equal; the warm-up's product and
        # quotient round twice on each side, plus the sum with warmup_init: within 6 u lr.
        for warmup, decay, init, lr in ((1, 4, 0.0, 1e-3), (0, 5, 0.0, 1e-3), (3, 9, 2e-5, 6e-4), (5, 6, 0.0, 1e-2)):
            with self.subTest(W=warmup, D=decay, init=init):
                steps = decay + 3
                path = golden(self.path(f"megatron_{warmup}_{decay}.h5"), **{
                    "optim.schedule_convention": "megatron", "optim.warmup_steps": warmup,
                    "optim.decay_steps": decay, "optim.warmup_init": init, "optim.lr": lr,
                    "optim.min_lr": lr / 10, "train.steps": steps})
                expected = self.megatron.rates(steps, lr, lr / 10, warmup, decay, init, global_batch=6)
                for k, (got, want) in enumerate(zip(recorded_rates(path), expected), start=1):
                    if warmup > 0 and k - 1 <= warmup:
                        self.assertLessEqual(abs(got - want), 6 * U * lr, f"update {k}")
                    else:
                        self.assertEqual(got, want, f"update {k}")
                self.assertEqual(recorded_rates(path)[0], init if warmup > 0 else lr)
                self.assertEqual(recorded_rates(path)[-1], lr / 10)  # the constant tail

    def test_flags_that_reproduce_the_default_convention(self):
        # --lr-warmup-init lr/W --lr-warmup-iters W-1 --lr-decay-iters D-1: the same curve one step
        # earlier; a few roundings of the same real numbers on each side (8 u lr).
        for warmup, decay in ((1, 3), (2, 6), (4, 7)):
            with self.subTest(W=warmup, D=decay):
                steps, lr = decay + 3, 1e-3
                path = golden(self.path(f"touchstone_{warmup}_{decay}.h5"), **{
                    "optim.warmup_steps": warmup, "optim.decay_steps": decay, "optim.lr": lr,
                    "optim.min_lr": lr / 10, "train.steps": steps})
                expected = self.megatron.rates(steps, lr, lr / 10, warmup - 1, decay - 1, lr / warmup, global_batch=6)
                for k, (got, want) in enumerate(zip(recorded_rates(path), expected), start=1):
                    self.assertLessEqual(abs(got - want), 8 * U * lr, f"update {k}")

    def test_update_one_does_not_move_under_megatrons_warmup(self):
        path = golden(self.path("still.h5"), **{"optim.schedule_convention": "megatron", "train.steps": 2})
        with h5py.File(path, "r") as f:
            self.assertEqual(float(f["steps/1/lr"][()]), 0.0)
            for name, init in f["params/init"].items():
                np.testing.assert_array_equal(f[f"steps/1/params/{name}"][()], init[()], err_msg=name)
                self.assertFalse(np.array_equal(f[f"steps/2/params/{name}"][()], init[()]), name)
        moving = golden(self.path("moving.h5"), **{"optim.schedule_convention": "megatron",
                                                   "optim.warmup_init": 1e-4, "train.steps": 1})
        with h5py.File(moving, "r") as f:
            self.assertEqual(float(f["steps/1/lr"][()]), 1e-4)
            name = "decoder.layers.0.mlp.linear_fc1.weight"
            self.assertFalse(np.array_equal(f[f"steps/1/params/{name}"][()], f[f"params/init/{name}"][()]))

    def test_megatron_refuses_what_megatron_refuses(self):
        for settings, expected in (
                ({"optim.schedule_convention": "megatron", "optim.warmup_steps": 4, "optim.decay_steps": 4},
                 "config: optim.decay_steps must be > optim.warmup_steps under optim.schedule_convention"),
                ({"optim.warmup_init": 0.5}, "config: optim.warmup_init must be in [0, optim.lr] (got 0.5)"),
                ({"optim.schedule_convention": "cosine"}, 'optim.schedule_convention must be "touchstone" or "megatron"')):
            with self.subTest(**settings):
                command = [common.TOUCHSTONE, "golden", "--out", self.path("refused.h5")]
                for key, value in settings.items():
                    command += ["--set", f"{key}={value}"]
                result = common.run(command)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn(expected, result.stderr)
                self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
                self.assertFalse(os.path.exists(self.path("refused.h5")))

    def test_context_parallel_default_normalization_is_neither(self):
        # Megatron-LM without --calculate-per-token-loss under cp = 2: the mean of the CP ranks'
        # means. Against either normalisation it fails at the loss of the first step whose ranks hold
        # different loss-token counts, far outside the FP64 tolerance, and no verdict claims it is
        # the other normalisation.
        import importlib
        candidate_module = importlib.import_module("independent_candidate")
        for normalization in ("global_token_mean", "per_microbatch_mean"):
            with self.subTest(normalization=normalization):
                path = common.make_golden(self.path(f"cp_{normalization}.h5"), train__loss_normalization=normalization,
                                          train__steps=1)
                out = self.path(f"cp_{normalization}_candidate.h5")
                candidate_module.run(path, out, "fp64", ["cp2_default_normalization"])
                status, output, report = common.diff(path, out)
                self.assertEqual(status, 1, output)
                first = next(t for t in report["tensors"] if t["status"] == "fail")
                self.assertEqual((first["step"], first["group"]), (1, "loss"), output)
                self.assertGreater(first["metrics"]["relative_l2"], 1e4 * first["tolerance"]["relative_l2"], output)
                self.assertNotIn("loss_normalization", common.signatures(report), output)


if __name__ == "__main__":
    common.setup_from_argv()
    unittest.main()
