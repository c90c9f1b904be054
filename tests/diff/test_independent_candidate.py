"""`touchstone diff` judging an independent candidate trainer (tests/python/independent_candidate.py):
a correct FP64 run and a correct, differently rounded BF16 mixed-precision run must pass, with their
parameters compared; each planted bug must fail at the first step it changes anything, with a verdict
that names it.

Usage: test_independent_candidate.py PATH_TO_TOUCHSTONE PATH_TO_SOURCE_TREE [unittest options]

Golden files: five configs of the default model (H 64, 2 layers, T 64, 8 windows per step in
micro-batches of 2, 3 steps), each written twice with --save-optimizer-state: FP64 (tolerance 1e-10)
and `--set precision=bf16 --envelope` (FP64 values, per-tensor BF16 tolerances).

  default       the default config: GQA 4 query / 2 KV heads, global_token_mean, untied;
                its gradient norms (0.56 to 0.68) stay below optim.clip_grad = 1, so clipping
                never acts
  default_clip  the same with optim.clip_grad = 0.5: clipping acts in every step
  tied_pmm      tied embeddings and per_microbatch_mean
  gqa8x2        8 query heads, 2 KV heads (head size 8)
  megatron      optim.schedule_convention = megatron: update s at the rate after s-1 scheduler
                steps (so update 1 at 0: the step-1 parameters are the initial ones)

Every case is one row of ROWS below and one test method, test_<row name>. A row with no expected
signature is a correct candidate: exit status 0, and every step's gradients and updated parameters
compared and passing. A row with a bug expects exit status 1, the first failure at the first step
>= --inject-from-step where the bug changes anything (read off the golden batch: padding only in the
steps whose windows hold it, a normalisation only where micro-batches hold different token counts,
clip_after_moments only where clipping acts), and the expected verdict signature among the verdicts.

The table of results (first failure, verdicts, the largest ratio of relative L2 error to relative-L2
tolerance over the failing tensors of the first failing step, optimizer moments left out, and for
correct candidates the worst ratio per step and group) is printed at the end, and written as JSON to the path in the environment
variable TOUCHSTONE_CANDIDATE_TABLE when it is set.
"""

import dataclasses
import json
import math
import os
import sys
import tempfile
import unittest

import diff_common as common  # first: it keeps bytecode out of the source tree

import h5py  # noqa: E402
import numpy as np  # noqa: E402

CONFIGS = {
    "default": {},
    "default_clip": {"optim.clip_grad": 0.5},
    "tied_pmm": {"model.tie_embeddings": True, "train.loss_normalization": "per_microbatch_mean"},
    "gqa8x2": {"model.num_heads": 8, "model.num_kv_heads": 2},
    "megatron": {"optim.schedule_convention": "megatron"},
}

# The verdict signature that names each bug.
SIGNATURE = {
    "per_microbatch_mean": "loss_normalization",
    "global_token_mean": "loss_normalization",
    "grad_half": "gradient_scale",
    "qkv_wrong_grouping": "qkv_grouping",
    "qkv_split_in_conversion": "qkv_conversion",
    "no_document_mask": "document_mask_missing",
    "padding_in_loss": "token_count",
    "padding_in_loss_strict": "token_count",
    "fp32_sites": "fp32_in_fp64",
    "no_bias_correction": "optimizer_bias_correction",
    "wd_on_norms": "optimizer_weight_decay",
    "clip_after_moments": "optimizer_clipping",
    "schedule_megatron": "learning_rate_behind",
    "schedule_touchstone": "learning_rate_ahead",
    "step_before_last_w": "weight_gradients_before_last_w",
    "zero3_not_regathered": "parameters_not_regathered_for_backward",
    "tied_embedding_reduced_twice": "tied_embedding_reduced_twice",
    "cp2_token_count_not_reduced": "token_count",
    "cp2_merge_without_lse": "cp_attention_merge_without_lse",
    "cp2_chunks_not_load_balanced": "cp_chunks_not_load_balanced",
}

# Text the verdict's message must hold, where the signature alone does not say it.
MESSAGE = {"padding_in_loss": "padding", "padding_in_loss_strict": "padding",
           "cp2_token_count_not_reduced": "the loss tokens of cp rank 0 of cp = 2 alone",
           "cp2_merge_without_lse": "cp = 2 ranks", "cp2_chunks_not_load_balanced": "cp = 2 ranks"}


@dataclasses.dataclass
class Row:
    name: str
    config: str
    precision: str            # "fp64": the FP64 golden file; "bf16": the BF16 envelope golden file
    bug: str = None           # None: a correct candidate
    from_step: int = 1
    cli: bool = False         # run the script as a command instead of in this process
    initial_params: bool = True  # the candidate writes params/init (the step-1 anchor)
    params_only: bool = False    # the candidate keeps only its parameters (no loss, counts, gradients)
    expected_signature: str = None  # where it differs from SIGNATURE[bug]

    @property
    def signature(self):
        return self.expected_signature or (SIGNATURE[self.bug] if self.bug else None)


def _rows():
    rows = [Row("correct_fp64_default", "default", "fp64", cli=True),
            Row("correct_bf16_default", "default", "bf16", cli=True)]
    for config in ("default_clip", "tied_pmm", "gqa8x2", "megatron"):
        rows += [Row(f"correct_fp64_{config}", config, "fp64"), Row(f"correct_bf16_{config}", config, "bf16")]
    # Every bug from step 1 on the default config, FP64 and BF16 (clip_after_moments where clipping acts).
    for bug in SIGNATURE:
        if bug in ("global_token_mean", "qkv_split_in_conversion", "schedule_touchstone",
                   "tied_embedding_reduced_twice"):
            continue  # the default config uses it or is untied: see tied_pmm and megatron; the conversion: below
        config = "default_clip" if bug == "clip_after_moments" else "default"
        for precision in ("fp64", "bf16"):
            if bug == "fp32_sites" and precision == "bf16":
                continue  # an FP64-mode bug
            rows.append(Row(f"{bug}_{precision}_{config}", config, precision, bug))
    # Bugs switched on in a later step: the first failure must be at that step.
    for bug, step in (("per_microbatch_mean", 2), ("grad_half", 2), ("qkv_wrong_grouping", 2),
                      ("no_document_mask", 3), ("padding_in_loss_strict", 2), ("fp32_sites", 2),
                      ("no_bias_correction", 2), ("wd_on_norms", 3), ("schedule_megatron", 2)):
        rows.append(Row(f"{bug}_from_step{step}_fp64_default", "default", "fp64", bug, step))
    rows.append(Row("clip_after_moments_from_step2_fp64_default_clip", "default_clip", "fp64",
                    "clip_after_moments", 2))
    # Without clipping the bug changes nothing and the run is right to pass.
    rows.append(Row("clip_after_moments_unclipped_fp64_default", "default", "fp64", "clip_after_moments"))
    # The qkv split wrong only in the conversion to separate q/k/v: with the candidate's own initial
    # parameters recorded, they are the first failure (a layout, not a computation; every step re-anchored
    # at them passes); without them, step 1 re-anchored at the golden parameters fails.
    rows += [Row("qkv_split_in_conversion_fp64_default", "default", "fp64", "qkv_split_in_conversion",
                 expected_signature="qkv_layout"),
             Row("qkv_split_in_conversion_no_init_fp64_default", "default", "fp64", "qkv_split_in_conversion",
                 initial_params=False),
             Row("qkv_split_in_conversion_no_init_bf16_default", "default", "bf16", "qkv_split_in_conversion",
                 initial_params=False)]
    # Parameters only (a safetensors params file per step): the verdict comes through the update,
    # each step re-anchored at the candidate's parameters after the one before.
    rows += [Row("per_microbatch_mean_params_only_fp64_default", "default", "fp64", "per_microbatch_mean",
                 params_only=True),
             Row("no_document_mask_from_step2_params_only_fp64_default", "default", "fp64", "no_document_mask", 2,
                 params_only=True),
             Row("correct_params_only_fp64_default", "default", "fp64", params_only=True)]
    # The other configs.
    rows += [Row("global_token_mean_fp64_tied_pmm", "tied_pmm", "fp64", "global_token_mean"),
             Row("global_token_mean_bf16_tied_pmm", "tied_pmm", "bf16", "global_token_mean"),
             Row("grad_half_fp64_tied_pmm", "tied_pmm", "fp64", "grad_half"),
             Row("tied_embedding_reduced_twice_fp64_tied_pmm", "tied_pmm", "fp64", "tied_embedding_reduced_twice"),
             Row("tied_embedding_reduced_twice_bf16_tied_pmm", "tied_pmm", "bf16", "tied_embedding_reduced_twice"),
             Row("wd_on_norms_fp64_tied_pmm", "tied_pmm", "fp64", "wd_on_norms"),
             Row("qkv_wrong_grouping_from_step2_fp64_tied_pmm", "tied_pmm", "fp64", "qkv_wrong_grouping", 2),
             Row("qkv_wrong_grouping_fp64_gqa8x2", "gqa8x2", "fp64", "qkv_wrong_grouping"),
             Row("qkv_wrong_grouping_bf16_gqa8x2", "gqa8x2", "bf16", "qkv_wrong_grouping"),
             Row("no_document_mask_fp64_tied_pmm", "tied_pmm", "fp64", "no_document_mask"),
             Row("no_document_mask_bf16_tied_pmm", "tied_pmm", "bf16", "no_document_mask"),
             Row("no_document_mask_fp64_gqa8x2", "gqa8x2", "fp64", "no_document_mask"),
             Row("no_bias_correction_bf16_gqa8x2", "gqa8x2", "bf16", "no_bias_correction"),
             # Touchstone's own convention against a golden file of Megatron-LM's.
             Row("schedule_touchstone_fp64_megatron", "megatron", "fp64", "schedule_touchstone"),
             Row("schedule_touchstone_bf16_megatron", "megatron", "bf16", "schedule_touchstone")]
    return rows


ROWS = _rows()
# The targets of docs/testing.md "Detection power": a bug at least this many times its tolerance on the
# default config, a correct candidate at most CORRECT_AT_MOST of any tolerance.
DETECTED_AT_LEAST = {"fp64": 10.0, "bf16": 3.0}
CORRECT_AT_MOST = 0.5
RESULTS = {}  # row name -> what was observed


# ----------------------------------------------------------------------------------------------------
# Where a bug first changes anything, read off the golden file
# ----------------------------------------------------------------------------------------------------

def first_affected_step(golden_path, bug, from_step, initial_params=True):
    """The first step >= from_step in which `bug` changes the candidate's numbers; None if none does.
    0 for a conversion mistake that shows in the initial parameters the candidate records."""
    if bug == "qkv_split_in_conversion" and initial_params and from_step == 1:
        return 0
    with h5py.File(golden_path, "r") as f:
        config = json.loads(f.attrs["config"])
        targets, docs = f["batch/targets"][()], f["batch/document_ids"][()]
        steps = len(f["steps"])
        grad_norms = [float(f[f"steps/{s}/grad_norm"][()]) for s in range(1, steps + 1)]
    mbs, clip = config["train"]["micro_batch_size"], float(config["optim"]["clip_grad"])

    def changes(s):
        t, d = targets[s - 1], docs[s - 1]                      # [B, T]
        if bug in ("per_microbatch_mean", "global_token_mean"):
            counts = (t != -100).reshape(-1, mbs * t.shape[1]).sum(axis=1)
            return len(set(counts.tolist())) > 1               # equal counts: both means coincide
        if bug == "no_document_mask":
            if not config["data"]["document_masking"]:
                return False
            # a loss position with an earlier key of another document
            for w in range(t.shape[0]):
                for i in range(t.shape[1]):
                    if t[w, i] != -100 and np.any(d[w, :i] != d[w, i]):
                        return True
            return False
        if bug in ("padding_in_loss", "padding_in_loss_strict"):
            return bool(np.any(d == -1))
        if bug == "clip_after_moments":
            return clip > 0 and grad_norms[s - 1] + 1e-6 > clip
        return True

    for s in range(from_step, steps + 1):
        if changes(s):
            return s
    return None


# ----------------------------------------------------------------------------------------------------
# Reading the JSON report
# ----------------------------------------------------------------------------------------------------

def step_of(path):
    if path is None:
        return None
    if path.startswith("params/init/"):
        return 0
    return int(path.split("/")[1])


def ratio(tensor):
    """How far the tensor is from its tolerance (the diff's tolerance_ratio: the largest of relative L2
    / its tolerance, max-abs / its tolerance and, for elements with bounds of their own such as the
    optimizer check's, error / bound); None where it is no measure (integers, not compared)."""
    metrics = tensor.get("metrics")
    if tensor["status"] == "not_compared" or not metrics or tensor["group"] == "num_loss_tokens":
        return None
    value = metrics.get("tolerance_ratio")
    return math.inf if value is None else value


def worst(tensors):
    ratios = [(ratio(t), t["path"]) for t in tensors if ratio(t) is not None]
    return max(ratios) if ratios else (None, None)


# The optimizer moments are compared in FP64 but have no BF16 envelope tolerance; the ratios below
# leave them out so that FP64 and BF16 rows measure the same datasets (the core golden schema).
MOMENTS = ("exp_avg", "exp_avg_sq")


def observe(row, status, report, expected_step):
    first = report["first_failure"] if report else None
    fail_step = step_of(first)
    tensors = report["tensors"] if report else []
    core = [t for t in tensors if t["group"] not in MOMENTS]
    failing = [t for t in core if t["status"] == "fail" and t["step"] == fail_step]
    at_expected = [t for t in core if expected_step is not None and t["step"] == expected_step]
    per_group = {}
    for t in tensors:
        r = ratio(t)
        if r is not None and t["step"] > 0:
            key = f"{t['step']}/{t['group']}"
            per_group[key] = max(per_group.get(key, 0.0), r)
    return {
        "config": row.config, "precision": row.precision, "bug": row.bug, "from_step": row.from_step,
        "expected_step": expected_step, "expected_signature": row.signature,
        "exit_status": status, "first_failure": first,
        "verdicts": [[v["signature"], v["message"]] for v in (report["verdicts"] if report else [])],
        "worst_failing_ratio": worst(failing)[0], "worst_failing_tensor": worst(failing)[1],
        "worst_ratio_at_expected_step": worst(at_expected)[0],
        "worst_ratio_per_step_group": per_group,
        "failed": sum(t["status"] == "fail" for t in tensors),
        "worst_relative_l2": max([t["metrics"]["relative_l2"] for t in tensors
                                  if t.get("metrics") and t["metrics"].get("relative_l2") is not None] or [None]),
    }


# ----------------------------------------------------------------------------------------------------
# The test
# ----------------------------------------------------------------------------------------------------

class IndependentCandidate(unittest.TestCase):
    maxDiff = None

    @classmethod
    def setUpClass(cls):
        cls.scratch = tempfile.TemporaryDirectory()
        cls.goldens = {}
        for name, settings in CONFIGS.items():
            for precision in ("fp64", "bf16"):
                path = os.path.join(cls.scratch.name, f"golden_{name}_{precision}.h5")
                command = [common.TOUCHSTONE, "golden", "--out", path, "--save-optimizer-state"]
                for key, value in settings.items():
                    command += ["--set", f"{key}={json.dumps(value)}"]
                if precision == "bf16":
                    command += ["--set", "precision=bf16", "--envelope"]
                result = common.run(command)
                assert result.returncode == 0, result.stderr + result.stdout
                cls.goldens[(name, precision)] = path

    @classmethod
    def tearDownClass(cls):
        cls.scratch.cleanup()
        print_table()
        table = os.environ.get("TOUCHSTONE_CANDIDATE_TABLE")
        if table:
            with open(table, "w") as f:
                json.dump(RESULTS, f, indent=1, sort_keys=True)

    def candidate(self, row, golden):
        out = os.path.join(self.scratch.name, row.name + ".h5")
        bugs = [row.bug] if row.bug else []
        if row.cli:
            command = [common.PYTHON, CANDIDATE_SCRIPT, golden, "--out", out, "--precision", row.precision,
                       "--save-optimizer-state", "--inject-from-step", str(row.from_step)]
            command += ["--inject", ",".join(bugs)] if bugs else []
            result = common.run(command)
            self.assertEqual(result.returncode, 0, result.stderr + result.stdout)
        else:
            candidate_module.run(golden, out, row.precision, bugs, row.from_step, save_optimizer_state=True,
                                 initial_params=row.initial_params)
        return out

    def check(self, row):
        golden = self.goldens[(row.config, row.precision)]
        expected_step = (first_affected_step(golden, row.bug, row.from_step, row.initial_params)
                         if row.bug else None)
        candidate = self.candidate(row, golden)
        if row.params_only:
            with h5py.File(candidate, "a") as f:
                for step in f["steps"].values():
                    for name in ("loss", "num_loss_tokens", "token_losses", "grads", "grad_norm", "optimizer"):
                        if name in step:
                            del step[name]
        status, output, report = common.diff(golden, candidate)
        self.assertIsNotNone(report, output)
        seen = RESULTS[row.name] = observe(row, status, report, expected_step)
        said = (f"exit {status}, first failure {seen['first_failure']}, verdicts "
                f"{[v[0] for v in seen['verdicts']]}, worst ratio {seen['worst_failing_ratio']}")
        if expected_step is None:
            self.assertEqual(status, 0, said)
            with h5py.File(golden, "r") as f:
                steps = len(f["steps"])
            for group in ("params",) if row.params_only else ("grads", "params"):
                for s in range(1, steps + 1):
                    entries = [t for t in report["tensors"] if t["step"] == s and t["group"] == group]
                    self.assertTrue(entries and all(t["status"] == "pass" for t in entries),
                                    f"step {s} {group}: every tensor compared and passing")
            if row.precision == "fp64":
                # Both sides in FP64, summing in other orders through 3 steps: ~1e-14 (measured 6e-15
                # to 4e-14); 1e-12 keeps a margin and is far below the file's 1e-10.
                self.assertLessEqual(seen["worst_relative_l2"], 1e-12, said)
            # No false alarm near the line: a correct run stays within half of every tolerance.
            worst_correct = max(seen["worst_ratio_per_step_group"].values())
            self.assertLessEqual(worst_correct, CORRECT_AT_MOST, f"{said}; {seen['worst_ratio_per_step_group']}")
            return
        self.assertEqual(status, 1, said)
        self.assertEqual(step_of(seen["first_failure"]), expected_step, said)
        messages = [message for signature, message in seen["verdicts"] if signature == row.signature]
        self.assertTrue(messages, f"no verdict {row.signature}: {said}")
        # Detection power (docs/testing.md): a bug lands far outside its tolerance, not near the line.
        if row.config == "default" and row.from_step == 1 and row.bug != "clip_after_moments" and not row.params_only:
            power = DETECTED_AT_LEAST[row.precision]
            self.assertGreaterEqual(seen["worst_failing_ratio"], power, f"{said}: below {power} x tolerance")
        if row.bug in MESSAGE:
            self.assertTrue(any(MESSAGE[row.bug] in m for m in messages),
                            f"verdict {row.signature} does not say '{MESSAGE[row.bug]}': {messages}")

    def test_adamw_is_torch_optim_adamw_bitwise(self):
        self.assertTrue(candidate_module.adamw_matches_torch())

    def test_cli_refuses_bad_bugs(self):
        golden = self.goldens[("default", "fp64")]
        out = os.path.join(self.scratch.name, "refused.h5")
        for args in (["--inject", "no_such_bug"], ["--precision", "bf16", "--inject", "fp32_sites"],
                     ["--inject", "global_token_mean"], ["--inject", "tied_embedding_reduced_twice"]):
            result = common.run([common.PYTHON, CANDIDATE_SCRIPT, golden, "--out", out, *args])
            self.assertNotEqual(result.returncode, 0, args)
            self.assertFalse(os.path.exists(out), args)


def _make_test(row):
    def test(self):
        self.check(row)
    test.__doc__ = f"{row.name}: {row.bug or 'correct'} ({row.precision}, {row.config}, from step {row.from_step})"
    return test


for _row in ROWS:
    setattr(IndependentCandidate, "test_" + _row.name, _make_test(_row))


def _fmt(x):
    return "-" if x is None else ("inf" if math.isinf(x) else f"{x:.3g}")


def print_table():
    lines = ["", "independent candidate against touchstone diff:",
             f"{'row':50s} {'exit':>4s} {'want':>9s} {'first failure':58s} {'ratio':>9s}  verdicts"]
    for row in ROWS:
        r = RESULTS.get(row.name)
        if r is None:
            continue
        want = "0" if r["expected_step"] is None else f"1@s{r['expected_step']}"
        lines.append(f"{row.name:50s} {r['exit_status']:>4d} {want:>9s} {str(r['first_failure']):58s} "
                     f"{_fmt(r['worst_failing_ratio']):>9s}  {','.join(v[0] for v in r['verdicts']) or '-'}")
    lines.append("worst relative L2 of the correct FP64 candidates: " + ", ".join(
        f"{row.config} {_fmt(RESULTS[row.name]['worst_relative_l2'])}" for row in ROWS
        if row.name in RESULTS and not row.bug and row.precision == "fp64"))
    lines.append("worst relative-L2 ratio per step and group of the correct BF16 candidates:")
    for row in ROWS:
        r = RESULTS.get(row.name)
        if r is None or row.bug or row.precision != "bf16":
            continue
        groups = r["worst_ratio_per_step_group"]
        lines.append(f"  {row.config:14s} " + "  ".join(
            f"{key}={_fmt(groups[key])}" for key in sorted(groups) if key.split('/')[1] in ("grads", "params")))
    print("\n".join(lines), file=sys.stderr)


if __name__ == "__main__":
    common.setup_from_argv()
    sys.path.insert(0, os.path.join(common.SOURCE, "tests", "python"))
    CANDIDATE_SCRIPT = os.path.join(common.SOURCE, "tests", "python", "independent_candidate.py")
    import independent_candidate as candidate_module  # noqa: E402
    unittest.main()
