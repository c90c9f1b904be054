"""Checkpoint and resume seen from the command line (docs/checkpoints.md): a run saved at step k and
resumed continues bitwise as if it had not stopped at the same layout, and within the FP64 layout
tolerance at other layouts, with dropout off and on; a fresh --resume starts from the initial weights.

Usage: test_resume.py PATH_TO_TOUCHSTONE   (/usr/bin/python3 with h5py and numpy)
"""
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from checkpoint_files import checkpoint_tensors, ledger_steps

TOUCHSTONE = None
STEPS = 6
# The FP64 layout tolerance of `touchstone check parallel` (derivation in tools/check/check_parallel.cpp):
# other layouts reassociate sums of a few hundred terms per step; measured ~4e-16 relative L2 here.
LAYOUT_TOLERANCE = 1e-12
LAYOUTS = {  # name: (ranks, overrides)
    "tp2_pp2_dp2": (8, ["parallel.tp=2", "parallel.pp=2", "parallel.dp=2"]),
    "dp4_zero": (4, ["parallel.dp=4", "parallel.distributed_optimizer=true"]),
    "dp4_zero3": (4, ["parallel.dp=4", "parallel.zero_stage=3"]),
    "tp1_pp4_dp2": (8, ["parallel.pp=4", "parallel.dp=2", "model.num_layers=4"]),
    "pp2_v2": (2, ["parallel.pp=2", "parallel.virtual_stages=2"]),  # interleaved 1F1B, a layer per chunk
    "cp2_dp2": (4, ["parallel.cp=2", "parallel.dp=2"]),  # context parallel: each window over 2 ranks
    "cp1_dp4": (4, ["parallel.dp=4"]),
    "single": (1, []),
}
MODEL = ["model.num_layers=4"]  # so that pp=4 has a layer per stage


def run(layout, *args, steps=STEPS, extra=()):
    ranks, overrides = LAYOUTS[layout]
    launcher = ["mpirun", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    sets = []
    for item in MODEL + overrides + [f"train.steps={steps}", *extra]:
        sets += ["--set", item]
    result = subprocess.run([*launcher, "-np", str(ranks), TOUCHSTONE, "train", *sets, *args], capture_output=True,
                            text=True, timeout=300)
    if result.returncode != 0:
        raise AssertionError(f"{layout} {args} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


class Resume(unittest.TestCase):
    extra = ()  # config overrides of every run of the class
    saved_at = "tp2_pp2_dp2"  # the layout of the uninterrupted run and of the stopped one

    @classmethod
    def run_layout(cls, layout, *args, steps=STEPS):
        return run(layout, *args, steps=steps, extra=cls.extra)

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.continuous = os.path.join(cls.tmp.name, "continuous")
        cls.run_layout(cls.saved_at, "--checkpoint-dir", cls.continuous)
        cls.reference = checkpoint_tensors(cls.continuous, STEPS)
        # The same run stopped after update 3 (its checkpoint is the starting point of every resume).
        cls.stopped = os.path.join(cls.tmp.name, "stopped")
        cls.run_layout(cls.saved_at, "--checkpoint-dir", cls.stopped, steps=3)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def resume_copy(self, name):
        target = os.path.join(self.tmp.name, name)
        subprocess.run(["cp", "-r", self.stopped, target], check=True)
        return target

    def test_same_layout_continues_bitwise(self):
        directory = self.resume_copy("same")
        out = self.run_layout(self.saved_at, "--checkpoint-dir", directory, "--resume")
        self.assertIn("resumed from", out)
        self.assertIn("next sample index 24", out)  # 3 updates x B = 8
        self.assertNotIn("step 3/6", out)
        resumed = checkpoint_tensors(directory, STEPS)
        self.assertEqual(sorted(resumed), sorted(self.reference))
        for name, value in self.reference.items():
            self.assertTrue(np.array_equal(resumed[name], value), name)
        # The ledger: the same samples and the same losses, bit for bit, step by step.
        self.assertEqual(ledger_steps(directory), ledger_steps(self.continuous))

    def check_other_layout(self, layout):
        directory = self.resume_copy(layout)
        self.run_layout(layout, "--checkpoint-dir", directory, "--resume")
        resumed = checkpoint_tensors(directory, STEPS)
        for name, value in self.reference.items():
            if name.startswith("state/") or name.startswith("rng/"):
                self.assertEqual(resumed[name], value, name)
                continue
            error = np.linalg.norm(resumed[name] - value) / max(np.linalg.norm(value), 1e-300)
            self.assertLessEqual(error, LAYOUT_TOLERANCE, f"{layout}: {name}")
        # The ledger: every step read the same global samples (split over this layout's dp ranks), and
        # computed the same loss within the layout tolerance.
        reference, steps = ledger_steps(self.continuous), ledger_steps(directory)
        self.assertEqual(sorted(steps), sorted(reference))
        for step, (samples, loss, tokens, *_) in reference.items():
            self.assertEqual(sorted(sum(steps[step][0], [])), sorted(sum(samples, [])), step)
            self.assertEqual(steps[step][2], tokens)
            self.assertLessEqual(abs(steps[step][1] - loss), LAYOUT_TOLERANCE * abs(loss), step)

    def test_resume_at_dp4_with_distributed_optimizer(self):
        self.check_other_layout("dp4_zero")

    def test_resume_at_dp4_zero_stage_3(self):
        self.check_other_layout("dp4_zero3")

    def test_resume_at_tp2_pp2_dp2(self):
        self.check_other_layout("tp2_pp2_dp2")

    def test_resume_at_tp1_pp4_dp2(self):
        self.check_other_layout("tp1_pp4_dp2")

    def test_resume_on_one_process(self):
        self.check_other_layout("single")

    def test_resume_at_pp2_virtual_stages_2(self):
        self.check_other_layout("pp2_v2")

    def test_resume_at_cp2_dp2(self):
        self.check_other_layout("cp2_dp2")

    def test_resume_without_a_checkpoint_starts_fresh(self):
        directory = os.path.join(self.tmp.name, "fresh")
        out = self.run_layout(self.saved_at, "--checkpoint-dir", directory, "--resume")
        self.assertNotIn("resumed from", out)
        fresh = checkpoint_tensors(directory, STEPS)
        for name, value in self.reference.items():
            self.assertTrue(np.array_equal(fresh[name], value), name)


class ResumeFromZeroStage3(Resume):
    """A ZeRO-3 run keeps each tensor as dim-0 shards over dp; its checkpoint holds full tensors (gathered
    at save), so it resumes at the same layout bitwise and at any other within tolerance."""
    saved_at = "dp4_zero3"


class ResumeFromInterleaved(Resume):
    """A stage of an interleaved pipeline holds non-adjacent layers (virtual stages s and s + pp); its
    checkpoint names every tensor by its global layer, so it resumes anywhere."""
    saved_at = "pp2_v2"


class ResumeFromContextParallel(Resume):
    """A context-parallel run's replicas over cp hold the same tensors (their gradients summed over dp x
    cp); its checkpoint is written from cp rank 0 and resumes at a layout without context parallelism."""
    saved_at = "cp2_dp2"

    def test_resume_at_cp1_dp4(self):
        self.check_other_layout("cp1_dp4")


class ResumeWithDropout(Resume):
    """Masks are keyed by (seed, site, layer, global sample index, global element), so a resumed run draws
    the masks the uninterrupted run drew: bitwise at the same layout, within tolerance at others."""
    extra = ("model.attention_dropout=0.1", "model.hidden_dropout=0.1")

    def test_dropout_is_on(self):
        plain = os.path.join(self.tmp.name, "no_dropout")
        run("tp2_pp2_dp2", "--checkpoint-dir", plain, steps=1)
        self.assertNotEqual(ledger_steps(plain)[1][1], ledger_steps(self.continuous)[1][1])


if __name__ == "__main__":
    TOUCHSTONE = sys.argv.pop(1)
    unittest.main()
