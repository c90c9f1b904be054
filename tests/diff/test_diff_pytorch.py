"""The PyTorch example against golden files: it passes in FP64 at <= 1e-10, and every planted bug is
caught and named, by a verdict or by the first failing tensor.

Usage: PYTHONPATH=SOURCE_TREE/python test_diff_pytorch.py PATH_TO_TOUCHSTONE PATH_TO_SOURCE_TREE
(the example imports the touchstone package; the CTest sets PYTHONPATH). The mistakes and what the
diff says about each are tabulated in docs/frameworks/pytorch.md.

Position ids: with the document mask on, a query sees only keys of its own document, whose positions
are consecutive whether or not they restart at the document start, and RoPE depends only on the
distance between positions; so ignoring the recorded (reset) position ids changes nothing but
rounding, and the diff is right to pass it. The mistake becomes visible once attention crosses
documents, so it is tested together with a missing document mask, where the diff must tell "mask
missing, positions reset" from "mask missing, positions 0..T-1".
"""

import os
import tempfile
import unittest

import diff_common as common


class PytorchExample(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = tempfile.TemporaryDirectory()
        cls.golden = common.make_golden(os.path.join(cls.scratch.name, "golden.h5"))

    @classmethod
    def tearDownClass(cls):
        cls.scratch.cleanup()

    def candidate(self, *bugs, golden=None, extra=()):
        name = "_".join(bugs) or "clean"
        args = [arg for bug in bugs for arg in ("--inject", bug)] + list(extra)
        return common.example(golden or self.golden, os.path.join(self.scratch.name, name + ".h5"), *args)

    def assert_named(self, bugs, signature, first_failure=None, golden=None):
        status, output, report = common.diff(golden or self.golden, self.candidate(*bugs, golden=golden))
        self.assertEqual(status, 1, output)
        self.assertIn(signature, common.signatures(report), output)
        if first_failure is not None:
            self.assertEqual(report["first_failure"], first_failure, output)
        return report

    def test_fp64_passes_at_1e_10(self):
        status, output, report = common.diff(self.golden, self.candidate())
        self.assertEqual(status, 0, output)
        tensors = common.compared(report)
        self.assertEqual(len(tensors), len(report["tensors"]), "every golden dataset is compared")
        self.assertGreater(len(tensors), 100)
        worst = max(t["metrics"]["relative_l2"] for t in tensors)
        self.assertLessEqual(worst, 1e-10, output)
        self.assertEqual(report["tolerance"]["model"], {"kind": "fp64", "relative_l2": 1e-10})
        self.assertEqual(report["verdicts"], [])

    def test_per_microbatch_mean(self):
        report = self.assert_named(["per_microbatch_mean"], "loss_normalization", "steps/1/loss")
        self.assertEqual(common.signatures(report), ["loss_normalization"])

    def test_document_mask_missing(self):
        report = self.assert_named(["no_document_mask"], "document_mask_missing", "steps/1/loss")
        self.assertNotIn("document_mask_missing_positions_not_reset", common.signatures(report))

    def test_positions_not_reset_alone_is_invisible_with_the_document_mask(self):
        status, output, _ = common.diff(self.golden, self.candidate("positions_not_reset"))
        self.assertEqual(status, 0, output)

    def test_positions_not_reset_without_the_document_mask(self):
        report = self.assert_named(["no_document_mask", "positions_not_reset"],
                                   "document_mask_missing_positions_not_reset", "steps/1/loss")
        self.assertNotIn("document_mask_missing", common.signatures(report))

    def test_padding_in_loss(self):
        report = self.assert_named(["padding_in_loss"], "token_count", "steps/1/loss")
        self.assertIn("padding counted in the loss", report["verdicts"][0]["message"])

    def test_eos_rule_flipped(self):
        report = self.assert_named(["eos_rule_flipped"], "token_count")
        self.assertIn("target is EOS left untrained", report["verdicts"][0]["message"])

    def test_eos_rule_flipped_on_a_run_without_eos_loss(self):
        golden = common.make_golden(os.path.join(self.scratch.name, "no_eos_loss.h5"), data__eos_loss=False)
        report = self.assert_named(["eos_rule_flipped"], "token_count", golden=golden)
        self.assertIn("target is EOS trained", report["verdicts"][0]["message"])

    def test_qkv_wrong_grouping(self):
        self.assert_named(["qkv_wrong_grouping"], "qkv_grouping", "steps/1/loss")

    def test_drop_tp_shard(self):
        report = self.assert_named(["drop_tp_shard"], "tp_shard",
                                   "steps/1/grads/decoder.layers.2.mlp.linear_fc1.weight")
        message = next(v["message"] for v in report["verdicts"] if v["signature"] == "tp_shard")
        self.assertIn("tp rank 1 of 2 (gate rows [32, 64) and up rows [96, 128))", message)

    def test_dp_double_division(self):
        report = self.assert_named(["dp_double_division"], "gradient_scale", "steps/1/grads/output_layer.weight")
        self.assertIn("candidate = 0.5 x golden", report["verdicts"][0]["message"])

    def test_float32_run_needs_a_looser_tolerance_and_says_so(self):
        candidate = self.candidate(extra=("--dtype", "float32", "--steps", "1"))
        status, output, _ = common.diff(self.golden, candidate)
        self.assertEqual(status, 1, output)
        status, output, report = common.diff(self.golden, candidate, "--tolerance", "1e-4")
        self.assertEqual(status, 0, output)
        self.assertIn("OVERRIDDEN on the command line", output)
        self.assertEqual(report["tolerance"]["override"], 1e-4)


if __name__ == "__main__":
    common.setup_from_argv()
    unittest.main()
