"""Sizes and non-finite values at the command line: a size the machine cannot hold is refused before
anything is allocated (each run here is limited to 2 GB of address space and must end with exit 2
within seconds), every integer key is held to its range with a one-line message, a diverging run stops
with exit 2 and writes no golden file, and `touchstone diff` checks a candidate's declared shapes
against the golden file before reading them.

Usage: test_sizes.py PATH_TO_TOUCHSTONE   (standard library, and h5py for the diff cases)
"""
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

TOUCHSTONE = None
ADDRESS_SPACE = 2 << 30  # bytes: a run that allocated what these configs ask for would fail on this
ENV = dict(os.environ, PMIX_MCA_gds="hash", OPENBLAS_NUM_THREADS="1")
ASAN = False


def sanitized(binary):
    """Whether the binary is built with AddressSanitizer, which reserves terabytes of address space for
    its shadow memory and so cannot start under an address-space limit."""
    return "libasan" in subprocess.run(["ldd", binary], capture_output=True, text=True).stdout


def limited_memory():
    if ASAN:
        return  # ASan's own cap (ENV below) refuses any single allocation above ADDRESS_SPACE instead
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run(*args):
    start = time.monotonic()
    result = subprocess.run([TOUCHSTONE, *args], capture_output=True, text=True, env=ENV, timeout=120,
                            preexec_fn=limited_memory)
    result.seconds = time.monotonic() - start
    return result


class Case(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.out = os.path.join(self.dir.name, "golden.h5")

    def tearDown(self):
        self.dir.cleanup()

    def assert_one_line_error(self, result, message):
        self.assertEqual(result.returncode, 2, result.stderr + result.stdout)
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertIn(message, lines[0])
        self.assertLess(len(lines[0]), 260, lines[0])
        return lines[0]

    def assert_refused(self, settings, message, *flags, computed_steps=False):
        """Exit 2 within seconds under the address-space limit, one line, no output file."""
        args = ["golden", "--out", self.out, *flags]
        for setting in settings:
            args += ["--set", setting]
        result = run(*args)
        line = self.assert_one_line_error(result, message)
        self.assertLess(result.seconds, 30, "the refusal came after allocating or computing")
        if not computed_steps:
            self.assertNotIn("step 1/", result.stdout)
        self.assertEqual(os.listdir(self.dir.name), [], "an output or temporary file was left behind")
        return line


class RefusedBeforeAllocating(Case):
    """Each of these used to end in std::bad_alloc (exit 1) after minutes of growing memory."""

    def test_a_billion_layers(self):
        self.assert_refused(["model.num_layers=1000000000"], "config: the run needs at least")

    def test_a_window_of_1e8_tokens(self):
        self.assert_refused(["model.seq_length=100000000"], "config: the run needs at least")

    def test_a_trillion_parameters(self):
        line = self.assert_refused(["model.hidden_size=1000000", "model.ffn_hidden_size=1000000",
                                    "model.num_heads=1000", "model.num_kv_heads=1000"],
                                   "config: the run needs at least")
        self.assertIn("GB is available (physical memory", line)
        self.assertIn("give a memory limit", line)

    def test_two_billion_steps(self):
        self.assert_refused(["train.steps=2147483647"], "config: the run needs at least")

    def test_steps_beyond_int32(self):
        self.assert_refused(["train.steps=4294967297"],
                            "config: train.steps must be in [1, 2147483647] (got 4294967297)")

    def test_the_memory_limit_flag_lowers_the_budget(self):
        line = self.assert_refused([], "config: the run needs", "--memory-limit-gb", "0.001")
        self.assertIn("(the memory limit given)", line)
        self.assert_refused([], "--memory-limit-gb: a memory limit must be a finite number", "--memory-limit-gb",
                            "-1")

    def test_a_run_that_fits_is_not_refused(self):
        result = run("golden", "--out", self.out)
        self.assertEqual(result.returncode, 0, result.stderr)


class OneLineRanges(Case):
    def test_vocabulary_of_int64_max_is_named_as_written(self):
        self.assert_refused(["model.vocab_size=9223372036854775807"],
                            "config: model.vocab_size must be in [3, 2147483647] (got 9223372036854775807)")

    def test_2_to_the_63_is_not_wrapped_to_a_negative_number(self):
        self.assert_refused(["train.seed=9223372036854775808"],
                            "train.seed must be in [0, 9223372036854775807] (got 9223372036854775808)")

    def test_negative_dp_is_a_range_not_a_divisibility_problem(self):
        self.assert_refused(["parallel.dp=-1"], "config: parallel.dp must be in [1, 1048576] (got -1)")

    def test_zero_and_negative_counts(self):
        for key, low in [("model.num_kv_heads", 1), ("model.hidden_size", 2), ("parallel.tp", 1),
                         ("train.micro_batch_size", 1), ("optim.warmup_steps", 0)]:
            with self.subTest(key=key):
                self.assert_refused([f"{key}=-5"], f"config: {key} must be in [{low}, ")

    def test_stage_layers_entries(self):
        self.assert_refused(["parallel.pp=1", "parallel.stage_layers=[0]"],
                            "config: parallel.stage_layers must be in [1, 2147483647] (got 0)")

    def test_nan_and_non_integers(self):
        self.assert_refused(["optim.lr=NaN"], "optim.lr must be a number")
        self.assert_refused(["model.num_layers=2.5"], "model.num_layers must be an integer, got 2.5")
        self.assert_refused(["model.num_layers=1e9"], "model.num_layers must be an integer")

    def test_a_long_value_is_quoted_short(self):
        self.assert_refused(["precision=" + "x" * 300], "precision must be")

    def test_nul_in_a_path(self):
        self.assert_refused(['data.source="docs.jsonl\\u0000.txt"'], "data.source must not contain a NUL")


class NonFinite(Case):
    def test_a_diverging_run_stops_and_writes_no_golden_file(self):
        line = self.assert_refused(["optim.lr=1e308"], "(fp64): the gradient norm is NaN", computed_steps=True)
        self.assertRegex(line, r"step \d+ \(fp64\)")
        self.assertIn("no golden file is written", line)

    def test_train_stops_too(self):
        result = run("train", "--set", "model.init_std=1e200")
        self.assert_one_line_error(result, "step 1 (fp64): ")


class DiffShapes(Case):
    def setUp(self):
        super().setUp()
        import h5py  # noqa: F401 (only these cases need it)
        self.golden = os.path.join(self.dir.name, "g.h5")
        result = subprocess.run([TOUCHSTONE, "golden", "--out", self.golden], capture_output=True, text=True,
                                env=ENV, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)

    def candidate(self, edit):
        import h5py
        path = os.path.join(self.dir.name, "c.h5")
        shutil.copy(self.golden, path)
        with h5py.File(path, "a") as f:
            edit(f)
        return path

    def test_a_declared_shape_is_checked_before_reading(self):
        name = "steps/1/grads/embedding.word_embeddings.weight"

        def declare(f):
            del f[name]
            f.create_dataset(name, shape=(1024000, 64), dtype="f8", chunks=(1024, 64), compression="gzip")
            f[name][:1024] = 1.0

        result = run("diff", self.golden, self.candidate(declare))
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("FAIL: shape [1024000, 64], the golden tensor is [256, 64]", result.stdout)
        self.assertLess(result.seconds, 30)

    def test_a_steps_group_that_is_not_a_step_is_noted(self):
        candidate = self.candidate(lambda f: f.create_dataset("steps/abc/loss", data=1.0))
        result = run("diff", self.golden, candidate)
        self.assertEqual(result.returncode, 0, result.stderr + result.stdout)
        self.assertIn("note: ignored candidate dataset /steps/abc/loss (not part of the compared schema)",
                      result.stdout)
        result = run("diff", candidate, self.golden)  # the same file as the golden side
        self.assertEqual(result.returncode, 0, result.stderr + result.stdout)
        self.assertIn("note: ignored golden group /steps/abc (not a step number)", result.stdout)

    def test_a_golden_dataset_larger_than_its_file_is_refused(self):
        def declare(f):
            del f["steps/1/token_losses"]
            f.create_dataset("steps/1/token_losses", shape=(256000000, 64), dtype="f8")

        result = run("diff", self.candidate(declare), self.golden)
        self.assert_one_line_error(result, "steps/1/token_losses")

    def test_a_count_that_is_not_a_whole_number(self):
        def fractional(f):
            count = int(f["steps/1/num_loss_tokens"][()])
            del f["steps/1/num_loss_tokens"]
            f["steps/1/num_loss_tokens"] = count + 0.4

        result = run("diff", self.golden, self.candidate(fractional))
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("verdict: token count is not a whole number: the candidate has", result.stdout)


if __name__ == "__main__":
    TOUCHSTONE = sys.argv.pop(1)
    ASAN = sanitized(TOUCHSTONE)
    if ASAN:
        ENV["ASAN_OPTIONS"] = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS", ""),
                                                      f"max_allocation_size_mb={ADDRESS_SPACE >> 20}",
                                                      "allocator_may_return_null=0"]))
    unittest.main()
