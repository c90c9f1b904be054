"""Megatron-LM runs as its source has them (docs/frameworks/megatron.md): the learning rates of
optim.schedule_convention = megatron against a transcription of Megatron-LM's scheduler
(tests/python/megatron_scheduler.py) over warm-up, decay and the constant tail, the flags that
reproduce the default convention, the first update that does not move, and the default
normalisation under context parallelism, which no Touchstone normalisation matches; and Megatron-LM
dumps (wgrads and params of each iteration, laid out as save_grads writes them) of the independent
candidate's runs: a correct one, one with Megatron-LM's scheduler against a default-convention golden
file, one with a loss scale of 2^16, each imported and diffed.

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

    def candidate(self, golden, name, bugs=(), precision="fp64"):
        import importlib
        out = self.path(f"{name}.h5")
        importlib.import_module("independent_candidate").run(golden, out, precision, list(bugs))
        return out

    def import_run(self, candidate, name, steps, scale=1.0, loss_scale=None, params_dtype=None):
        """Megatron-LM's wgrads/ and params/ dumps of `steps` iterations of `candidate` (tp 2, stages
        [1, 2]), imported into one shard directory; returns it."""
        import test_diff_importers as importers
        import torch
        shards = self.path(f"{name}_shards")
        script = os.path.join(common.SOURCE, "tools", "import_megatron_dump.py")
        for step in range(1, steps + 1):
            for kind, group in (("wgrads", "grads"), ("params", "params")):
                dump = importers.write_megatron_dump(
                    candidate, self.path(f"{name}/{kind}/iter_{step:07d}"), 2, [1, 2], group=f"steps/{step}/{group}",
                    scale=scale if group == "grads" else 1.0,
                    dtype=params_dtype if group == "params" and params_dtype else torch.float64)
                extra = ["--loss-scale", str(loss_scale)] if loss_scale and group == "grads" else []
                result = common.run([common.PYTHON, script, dump, "--out", shards, *extra])
                self.assertEqual(result.returncode, 0, result.stderr + result.stdout)
        return shards

    def test_megatron_dumps_of_independent_runs(self):
        golden = common.make_golden(self.path("dumps_golden.h5"), **{**common.SHARDABLE, "train__steps": 2})
        correct = self.candidate(golden, "dumps_correct")
        behind = self.candidate(golden, "dumps_behind", ["schedule_megatron"])
        import torch
        # A BF16 params dump of an FP64 run is judged at one step only: from step 2 on Touchstone
        # re-anchors at the BF16 copies, where this candidate did not compute its gradients.
        bf16 = dict(params_dtype=torch.bfloat16, steps=1)
        cases = (  # name, candidate, options, expected exit status, expected verdict
            ("correct", correct, {}, 0, None),
            ("behind", behind, {}, 1, "learning_rate_behind"),
            ("scaled_and_unscaled", correct, dict(scale=2.0 ** 16, loss_scale=65536), 0, None),
            ("scaled", correct, dict(scale=2.0 ** 16), 1, "gradient_scale"),
            ("correct_bf16_params", correct, bf16, 0, None),
            ("behind_bf16_params", behind, bf16, 1, "learning_rate_behind"))
        for name, candidate, options, status_expected, verdict in cases:
            with self.subTest(name):
                options = dict(options)
                steps = options.pop("steps", 2)
                shards = self.import_run(candidate, name, steps, **options)
                status, output, report = common.diff(golden, shards)
                self.assertEqual(status, status_expected, output)
                checked = ", ".join(str(s) for s in range(1, steps + 1))
                self.assertIn(f"by the optimizer check: steps {checked}", report["judgment"], output)
                if verdict:
                    self.assertIn(verdict, common.signatures(report), output)
                    first = next(t for t in report["tensors"] if t["status"] == "fail")
                    self.assertEqual(first["step"], 1, output)
                else:
                    self.assertEqual({t["group"] for t in common.compared(report)}, {"grads", "params"}, output)
        # The run one step behind did not move in iteration 1: its params dump is the initial weights.
        with h5py.File(behind, "r") as f, h5py.File(golden, "r") as g:
            for name in g["params/init"]:
                np.testing.assert_array_equal(f[f"steps/1/params/{name}"][()], g[f"params/init/{name}"][()])

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
