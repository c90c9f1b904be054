"""`touchstone diff` on golden-schema candidates edited here: partial candidates, NaN values, wrong
shapes, truncated and foreign files (exit 2 or a named failure, never a crash), per-tensor tolerances
from the golden file, step selection, ULP distances, signatures that need no recomputation, and the
three reports (terminal colour only on a terminal, JSON, self-contained HTML).

Usage: test_diff_inputs.py PATH_TO_TOUCHSTONE PATH_TO_SOURCE_TREE
"""

import json
import os
import pty
import shutil
import subprocess
import tempfile
import unittest

import h5py
import numpy as np

import diff_common as common


class Inputs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = tempfile.TemporaryDirectory()
        cls.golden = common.make_golden(os.path.join(cls.scratch.name, "golden.h5"))
        with h5py.File(cls.golden, "r") as g:
            cls.config = json.loads(g.attrs["config"])

    @classmethod
    def tearDownClass(cls):
        cls.scratch.cleanup()

    def copy(self, name, edit=None, source=None):
        """A copy of the golden file (or `source`), changed in place by edit(h5py.File)."""
        path = os.path.join(self.scratch.name, name)
        shutil.copy(source or self.golden, path)
        if edit is not None:
            with h5py.File(path, "r+") as f:
                edit(f)
        return path

    def test_partial_candidate_reports_the_rest_as_not_compared(self):
        def keep_some(f):
            for group in ("params/init", "steps/1/params", "steps/2"):
                del f[group]
            del f["steps/1/grads/output_layer.weight"]
        # A group held only in part (steps/1/grads without output_layer.weight) is refused: what it
        # left out was never checked. --allow-partial accepts it.
        status, output, report = common.diff(self.golden, self.copy("partial.h5", keep_some))
        self.assertEqual(status, 1, output)
        self.assertIn("partial candidate: steps/1/grads: 1 of 21 tensors missing (output_layer.weight)", output)
        self.assertIn("exit status 1 (partial candidates not accepted)", output)
        self.assertEqual(report["partial"], ["steps/1/grads: 1 of 21 tensors missing (output_layer.weight)"])
        status, output, report = common.diff(self.golden, self.copy("partial.h5", keep_some), "--allow-partial")
        self.assertEqual(status, 0, output)
        statuses = {t["path"]: t["status"] for t in report["tensors"]}
        self.assertEqual(statuses["steps/1/grads/output_layer.weight"], "not_compared")
        self.assertEqual(statuses["steps/1/loss"], "pass")
        self.assertEqual(report["summary"]["not_compared"], 1 + 21)
        self.assertIn("params/* (21 tensors)", output)
        self.assertIn("not compared: missing in the candidate", output)

    def test_the_report_says_when_recomputation_is_off(self):
        status, output, _ = common.diff(self.golden, self.golden, "--no-recompute")
        self.assertEqual(status, 0, output)
        self.assertIn(" (recomputation off)", output)
        self.assertNotIn("--no-recompute", output)

    def test_nan_and_wrong_shape_are_named_failures(self):
        def nan(f):
            f["steps/1/grads/decoder.layers.1.mlp.linear_fc2.weight"][3, 4] = np.nan
        status, output, report = common.diff(self.golden, self.copy("nan.h5", nan))
        self.assertEqual(status, 1, output)
        self.assertEqual(report["first_failure"], "steps/1/grads/decoder.layers.1.mlp.linear_fc2.weight")
        failed = next(t for t in report["tensors"] if t["path"] == report["first_failure"])
        self.assertIn("1 non-finite candidate value(s), the first at [3, 4]", failed["reason"])
        self.assertEqual(failed["metrics"]["non_finite"], 1)

        def reshape(f):
            data = f["steps/1/grads/decoder.final_layernorm.weight"][()]
            del f["steps/1/grads/decoder.final_layernorm.weight"]
            f["steps/1/grads/decoder.final_layernorm.weight"] = data[:-1]
        status, output, report = common.diff(self.golden, self.copy("shape.h5", reshape))
        self.assertEqual(status, 1, output)
        failed = next(t for t in report["tensors"] if t["path"] == report["first_failure"])
        self.assertEqual(failed["reason"], "shape [31], the golden tensor is [32]")

    def test_bad_inputs_exit_2_with_one_line(self):
        truncated = self.copy("truncated.h5")
        with open(truncated, "r+b") as f:
            f.truncate(os.path.getsize(truncated) // 2)
        only_batch = self.copy("only_batch.h5", lambda f: [f.__delitem__(g) for g in ("params", "steps")])
        nan_golden = self.copy("nan_golden.h5",
                               lambda f: f["steps/1/grads/output_layer.weight"].__setitem__((0, 0), np.nan))
        candidate = common.example(self.golden, os.path.join(self.scratch.name, "clean.h5"), "--steps", "1")
        bad_model = self.copy("bad_model.h5", lambda f: f.attrs.__setitem__("tolerance_model", "{\"kind\": 3,"))
        cases = [
            (self.golden, truncated, []), (self.golden, only_batch, []), (candidate, self.golden, []),
            (nan_golden, self.golden, []), (self.golden, os.path.join(self.scratch.name, "absent.h5"), []),
            (self.golden, candidate, ["--json", "/nonexistent/dir/out.json"]), (bad_model, candidate, []),
            (self.golden, candidate, ["--step", "5"]), (self.golden, candidate, ["--candidate-kind", "grads"]),
            (self.golden, candidate, ["--tolerance", "-1"]),
        ]
        # The errors about an option name the flag the user typed.
        messages = {("--candidate-kind", "grads"): "--candidate-kind applies to safetensors candidates only "
                                                   "(this one is read as golden)",
                    ("--tolerance", "-1"): "--tolerance must be a finite number >= 0"}
        for golden, cand, args in cases:
            with self.subTest(golden=os.path.basename(golden), candidate=os.path.basename(cand), args=args):
                result = common.run([common.TOUCHSTONE, "diff", golden, cand, *args])
                self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
                self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
                self.assertEqual(result.stdout, "")
                if tuple(args) in messages:
                    self.assertIn(messages[tuple(args)], result.stderr)
        unknown = os.path.join(self.scratch.name, "unknown.bin")
        with open(unknown, "wb") as f:
            f.write(b"not a tensor file")
        result = common.run([common.TOUCHSTONE, "diff", self.golden, unknown])
        self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
        self.assertIn("unknown.bin: neither HDF5 nor a .safetensors file; name the format with --format",
                      result.stderr)

    def test_tolerances_from_the_golden_file(self):
        def tolerances(f):
            f.attrs["tolerance_model"] = json.dumps({"kind": "test", "relative_l2": 1e-3})
            f["envelope/tolerance/steps/1/grads/output_layer.weight"] = np.array([0.0, 0.0])
        golden = self.copy("toleranced.h5", tolerances)

        def perturb(f):
            for name, dataset in f["steps/1/grads"].items():
                dataset[...] = dataset[()] * (1 + 1e-6)
            # Parameters that no longer follow from these gradients would fail the optimizer check.
            del f["steps/1/params"]
        status, output, report = common.diff(golden, self.copy("perturbed.h5", perturb), "--step", "1")
        self.assertEqual(status, 1, output)
        self.assertEqual([t["path"] for t in report["tensors"] if t["status"] == "fail"],
                         ["steps/1/grads/output_layer.weight"])
        self.assertEqual(report["tolerance"]["kind"], "test")

        envelope = lambda f: f.attrs.__setitem__("tolerance_model", json.dumps({"kind": "envelope"}))
        envelope_only = self.copy("envelope.h5", envelope, source=golden)
        status, output, report = common.diff(envelope_only, self.golden, "--step", "0")
        self.assertEqual(status, 2, output)
        self.assertIn("no tolerance", output)
        self.assertIn("give one with --tolerance", output)
        status, output, report = common.diff(envelope_only, self.golden, "--step", "1")
        self.assertEqual(status, 0, output)
        # The loss-token count is an integer and always compared exactly; the updated parameters are
        # judged by the optimizer check, whose bounds come from the master precision, not the file.
        compared = common.compared(report)
        self.assertEqual([t["path"] for t in compared if t["basis"] != "optimizer"],
                         ["steps/1/num_loss_tokens", "steps/1/grads/output_layer.weight"])
        self.assertTrue(all(t["path"].startswith("steps/1/params/") for t in compared if t["basis"] == "optimizer"))

    def test_step_selection_and_ulps(self):
        def nudge(f):
            dataset = f["steps/2/grads/decoder.layers.0.mlp.linear_fc1.weight"]
            value = dataset[5, 6]
            for _ in range(3):
                value = np.nextafter(value, np.inf)
            dataset[5, 6] = value
        candidate = self.copy("nudged.h5", nudge)
        status, output, report = common.diff(self.golden, candidate, "--step", "2")
        self.assertEqual(status, 0, output)
        self.assertEqual({t["step"] for t in report["tensors"]}, {2})
        path = "steps/2/grads/decoder.layers.0.mlp.linear_fc1.weight"
        nudged = next(t for t in report["tensors"] if t["path"] == path)
        self.assertEqual(nudged["metrics"]["max_ulp"], 3)
        self.assertEqual(nudged["metrics"]["worst_index"], [5, 6])
        status, output, report = common.diff(self.golden, candidate, "--step", "0")
        self.assertEqual({t["group"] for t in report["tensors"]}, {"init"})

    def test_signatures_on_stored_tensors(self):
        m = self.config["model"]
        NH, NKV, H = m["num_heads"], m["num_kv_heads"], m["hidden_size"]
        D, G = H // NH, NH // NKV

        def separate_qkv(f):  # the rows of every linear_qkv gradient in [q; k; v] order
            for layer in range(m["num_layers"]):
                dataset = f[f"steps/1/grads/decoder.layers.{layer}.self_attention.linear_qkv.weight"]
                blocks = dataset[()].reshape(NKV, G + 2, D, H)
                dataset[...] = np.concatenate([blocks[:, :G].reshape(-1, H), blocks[:, G].reshape(-1, H),
                                               blocks[:, G + 1].reshape(-1, H)])
        status, output, report = common.diff(self.golden, self.copy("qkv_layout.h5", separate_qkv), "--step", "1")
        self.assertEqual(status, 1, output)
        self.assertEqual(common.signatures(report).count("qkv_layout"), m["num_layers"], output)

        rng = np.random.default_rng(3)

        def noisy_layer(f):
            for name, dataset in f["steps/1/grads"].items():
                if name.startswith("decoder.layers.1."):
                    dataset[...] = dataset[()] * (1 + 1e-3 * rng.standard_normal(dataset.shape))
        status, output, report = common.diff(self.golden, self.copy("layer.h5", noisy_layer), "--step", "1")
        self.assertEqual(status, 1, output)
        self.assertEqual(common.signatures(report), ["one_layer"], output)

    def test_reports(self):
        candidate = common.example(self.golden, os.path.join(self.scratch.name, "bug.h5"), "--inject", "drop_tp_shard")
        html = os.path.join(self.scratch.name, "report.html")
        status, output, report = common.diff(self.golden, candidate, "--report", html, "--tolerance", "1e-9")
        self.assertEqual(status, 1, output)
        self.assertIn("OVERRIDDEN on the command line", output)
        with open(html) as f:
            page = f.read()
        self.assertIn("<svg", page)
        self.assertIn("overridden on the command line", page)
        self.assertIn(report["first_failure"], page)
        for outside in ("<script", "<link", "src=", "url(", "@import"):
            self.assertNotIn(outside, page, "the page must be self-contained")
        self.assertNotIn("\x1b[", output, "no colour when the output is not a terminal")
        for t in common.compared(report):
            self.assertTrue({"relative_l2", "max_abs_error", "max_abs_normalized", "cosine", "over_tolerance",
                             "worst_index", "worst_golden", "worst_candidate", "max_ulp"} <= set(t["metrics"]))

        primary, secondary = pty.openpty()
        process = subprocess.Popen([common.TOUCHSTONE, "diff", self.golden, candidate], stdout=secondary,
                                   stderr=subprocess.DEVNULL)
        os.close(secondary)
        text = b""
        while True:  # read while it writes: a full terminal buffer would block it
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the terminal closes when the process ends
                break
            if not chunk:
                break
            text += chunk
        os.close(primary)
        self.assertEqual(process.wait(timeout=120), 1)
        self.assertIn(b"\x1b[31m", text, "colour on a terminal")


if __name__ == "__main__":
    common.setup_from_argv()
    unittest.main()
