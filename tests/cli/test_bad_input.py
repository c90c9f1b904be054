"""Command-line behaviour of `touchstone`: bad input is a one-line error with exit status 2, reported
before any compute, and never leaves an output file (or a temporary one) behind. Also checks the help
texts and that --init-from reproduces a run exactly.

Usage: test_bad_input.py PATH_TO_TOUCHSTONE   (standard library, and h5py for the --init-from check)
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

TOUCHSTONE = None
SMALL = ["--set", "model.hidden_size=16", "--set", "model.ffn_hidden_size=32", "--set", "model.seq_length=16"]


def run(*args, cwd=None, env=None):
    return subprocess.run([TOUCHSTONE, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


class BadInput(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.out = os.path.join(self.dir.name, "golden.h5")

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, text):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def assert_refused(self, args, message, env=None):
        """Exit 2, exactly one line on stderr containing `message`, and an empty output directory."""
        before = set(os.listdir(self.dir.name))
        result = run("golden", *args, "--out", self.out, env=env)
        self.assertEqual(result.returncode, 2, result.stderr + result.stdout)
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertIn(message, lines[0])
        self.assertEqual(set(os.listdir(self.dir.name)), before, "an output or temporary file was left behind")
        self.assertNotIn("step 1/", result.stdout, "compute started before the error")

    # ---- config ----
    def test_unknown_key_in_file(self):
        config = self.write("c.json", json.dumps({"model": {"hiden_size": 32}}))
        self.assert_refused(["--config", config], "unknown config key 'model.hiden_size'")

    def test_unknown_key_in_override(self):
        self.assert_refused(["--set", "optim.learning_rate=1"],
                            "--set optim.learning_rate=1: unknown config key 'optim.learning_rate'")
        self.assert_refused(["--set", "train=1"], "--set train=1: 'train' is a section, not a key")
        self.assert_refused(["--set", "train"], "--set train: expected section.key=value")

    def test_wrong_type(self):
        self.assert_refused(["--set", "train.steps=three"],
                            "--set train.steps=three: train.steps must be an integer")

    def test_bad_json(self):
        config = self.write("c.json", "{\"model\": ")
        self.assert_refused(["--config", config], "c.json: not valid JSON")

    def test_missing_config_file(self):
        self.assert_refused(["--config", os.path.join(self.dir.name, "none.json")], "cannot open config file")

    def test_heads_do_not_divide_hidden(self):
        self.assert_refused(["--set", "model.num_heads=3"], "model.hidden_size (64) must be divisible by model.num_heads (3)")

    def test_dropout_probability_out_of_range(self):
        self.assert_refused(["--set", "model.attention_dropout=1"], "model.attention_dropout must be in [0, 1) (got 1)")
        self.assert_refused(["--set", "model.hidden_dropout=-0.1"], "model.hidden_dropout must be in [0, 1) (got -0.1)")

    def test_batch_not_divisible_by_micro_batch(self):
        self.assert_refused(["--set", "train.micro_batch_size=3"], "train.global_batch_size (8) must be divisible")

    def test_unavailable_precision(self):
        self.assert_refused(["--set", "precision=fp16"], "precision must be")

    def test_layout_needs_more_processes(self):
        self.assert_refused(["--set", "parallel.tp=2"], "tp x cp x pp x dp = 2 but the run has 1 process")

    # ---- data ----
    def test_token_id_outside_vocab(self):
        data = self.write("d.jsonl", '{"tokens": [5, 6]}\n{"tokens": [7, 300]}\n')
        self.assert_refused(["--set", f"data.source={data}"], "d.jsonl:2: token id 300 is outside [0, 256)")

    def test_empty_document(self):
        data = self.write("d.jsonl", '{"tokens": [5, 6]}\n{"tokens": []}\n')
        self.assert_refused(["--set", f"data.source={data}"], "d.jsonl:2: empty document")

    def test_empty_file(self):
        data = self.write("d.jsonl", "")
        self.assert_refused(["--set", f"data.source={data}"], "d.jsonl: file is empty")

    def test_malformed_line(self):
        data = self.write("d.jsonl", '{"tokens": [5, 6]}\n{"tokens": [5,\n')
        self.assert_refused(["--set", f"data.source={data}"], "d.jsonl:2: malformed JSON")

    def test_missing_data_file(self):
        self.assert_refused(["--set", "data.source=/nonexistent/d.jsonl"], "/nonexistent/d.jsonl: cannot open file")

    def test_builtin_needs_long_windows(self):
        self.assert_refused(["--set", "model.seq_length=8"], "model.seq_length")

    # ---- files ----
    def test_missing_output_directory(self):
        result = run("golden", "--out", os.path.join(self.dir.name, "no", "g.h5"))
        self.assertEqual(result.returncode, 2)
        self.assertIn("does not exist", result.stderr)

    def test_init_from_missing_file(self):
        self.assert_refused(["--init-from", os.path.join(self.dir.name, "none.h5")], "cannot open as HDF5")

    def test_init_from_wrong_shapes(self):
        other = os.path.join(self.dir.name, "other.h5")
        produced = run("golden", *SMALL, "--set", "train.steps=1", "--out", other)
        self.assertEqual(produced.returncode, 0, produced.stderr)
        self.assert_refused(["--init-from", other],
                            "tensor /params/init/embedding.word_embeddings.weight has shape [256,16], the model expects [256,64]")

    def test_init_from_untied_into_tied(self):
        other = os.path.join(self.dir.name, "other.h5")
        self.assertEqual(run("golden", *SMALL, "--set", "train.steps=1", "--out", other).returncode, 0)
        self.assert_refused([*SMALL, "--set", "model.tie_embeddings=true", "--init-from", other],
                            "tensor /params/init/output_layer.weight is not a parameter of this model")

    # ---- backend ----
    def test_unknown_backend(self):
        for bad in ("tpu", "CPU", "cuda "):
            self.assert_refused(["--backend", bad], f'--backend: unknown value "{bad}" (cpu, cuda)')

    def test_cuda_backend_without_a_visible_gpu(self):
        # An empty CUDA_VISIBLE_DEVICES hides every GPU, so this holds on GPU machines too. A build with
        # the CUDA backend says no device is usable; a build without it says so instead.
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        self.assert_refused(["--backend", "cuda"], "--backend cuda: ", env=env)
        result = run("golden", "--backend", "cuda", "--out", self.out, env=env)
        self.assertRegex(result.stderr, "no CUDA device|this build has no CUDA backend")

    def test_envelope_needs_a_lower_precision(self):
        self.assert_refused(["--envelope"],
                            "--envelope measures a lower precision against FP64: set precision to bf16 or fp32")

    def test_missing_out_option(self):
        result = run("golden")
        self.assertEqual(result.returncode, 2)
        self.assertIn("--out", result.stderr)


class BadCheckpointInput(unittest.TestCase):
    """Checkpoint options and checkpoints that cannot be resumed: exit 2 with one line, before any step,
    and the checkpoint directory left as it was."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.ckpt = os.path.join(self.dir.name, "ckpt")

    def tearDown(self):
        self.dir.cleanup()

    def listing(self):
        return sorted(os.path.join(root, name) for root, dirs, files in os.walk(self.dir.name) for name in dirs + files)

    def assert_refused(self, args, message):
        before = self.listing()
        result = run("train", *SMALL, *args)
        self.assertEqual(result.returncode, 2, result.stderr + result.stdout)
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertIn(message, lines[0])
        self.assertNotIn("step ", result.stdout, "compute started before the error")
        self.assertEqual(self.listing(), before, "the checkpoint directory changed")

    def save_one_step(self):
        result = run("train", *SMALL, "--set", "train.steps=1", "--checkpoint-dir", self.ckpt)
        self.assertEqual(result.returncode, 0, result.stderr)
        return os.path.join(self.ckpt, "step_00000001", "state.h5")

    def test_options_need_a_checkpoint_directory(self):
        for args in (["--resume"], ["--fallback"], ["--save-every", "2"]):
            self.assert_refused(args, "--resume, --fallback and --save-every need --checkpoint-dir")

    def test_bad_fail_at(self):
        for spec in ["3", "x:0", "2:0:sideways", "0:0", "2:-1"]:
            self.assert_refused(["--fail-at", spec], f"--fail-at {spec}: expected step:rank[:phase]")
        self.assert_refused(["--fail-at", "2:4"], "--fail-at 2:4: rank is not below the world size 1")

    def test_bad_keep_and_directory(self):
        self.assert_refused(["--checkpoint-dir", self.ckpt, "--keep", "-1"], "--keep must be >= 0")
        self.assert_refused(["--checkpoint-dir", self.ckpt, "--save-every", "-1"], "--save-every must be >= 0")
        not_a_directory = os.path.join(self.dir.name, "file")
        open(not_a_directory, "w").close()
        self.assert_refused(["--checkpoint-dir", not_a_directory], f"--checkpoint-dir {not_a_directory}: is not a directory")

    def test_envelope_takes_no_checkpoint_directory(self):
        self.assert_refused(["--set", "precision=bf16", "--envelope", "--checkpoint-dir", self.ckpt],
                            "--envelope runs twice from the same weights: it takes no --checkpoint-dir")

    def test_golden_file_of_a_resumed_run(self):
        result = run("golden", *SMALL, "--checkpoint-dir", self.ckpt, "--resume", "--out",
                     os.path.join(self.dir.name, "g.h5"))
        self.assertEqual(result.returncode, 2)
        self.assertIn("--out records a whole run from its initial weights; it cannot be combined with --resume",
                      result.stderr)

    def test_truncated_checkpoint(self):
        state = self.save_one_step()
        os.truncate(state, os.path.getsize(state) // 3)
        self.assert_refused(["--checkpoint-dir", self.ckpt, "--resume", "--set", "train.steps=2"], "truncated")

    def test_checkpoint_of_another_model(self):
        self.save_one_step()
        self.assert_refused(["--checkpoint-dir", self.ckpt, "--resume", "--set", "train.steps=2", "--set",
                             "model.num_layers=3"], "model.num_layers is 2 in the checkpoint and 3 in this run")


class CommOption(unittest.TestCase):
    """--comm: an unknown backend, and NCCL where it cannot run, are one-line errors with exit status 2
    before any step."""

    def assert_refused(self, args, pattern, env=None):
        result = subprocess.run([TOUCHSTONE, "train", *SMALL, "--set", "train.steps=1", *args], capture_output=True,
                                text=True, timeout=120, env=env)
        self.assertEqual(result.returncode, 2, result.stderr + result.stdout)
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertRegex(lines[0], pattern)
        self.assertNotIn("step 1/", result.stdout, "compute started before the error")

    def test_unknown_backend(self):
        for bad in ("bogus", "", "NCCL", "gloo", "mpi "):
            self.assert_refused(["--comm", bad], rf'^touchstone: error: --comm: unknown value "{bad}" \(mpi, nccl\)$')

    def test_nccl_without_a_visible_gpu(self):
        # A build without CUDA says so; a CUDA build sees no device once none is visible. The reason is
        # worded for both flags that need CUDA, and names neither: only --comm nccl leads it.
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        self.assert_refused(["--comm", "nccl"],
                            r"^touchstone: error: --comm nccl: (this build has no CUDA backend|no CUDA device)(?!.*--)",
                            env=env)

    def test_mpi_is_the_default_and_runs(self):
        for args in ([], ["--comm", "mpi"]):
            result = run("train", *SMALL, "--set", "train.steps=1", *args)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertIn("step 1/1", result.stdout)


class ParserErrors(unittest.TestCase):
    def test_parser_errors_are_one_prefixed_line(self):
        # What the parser refuses (an unknown flag, a missing value, a value of the wrong type, an unknown
        # subcommand) reads like every other refusal: one line, the same prefix, exit 2, and a pointer to
        # the --help of the command the parser had reached.
        cases = [
            (["train", "--bogus"], ["--bogus", "touchstone train --help"]),
            (["golden", "--out"], ["--out", "touchstone golden --help"]),
            (["plan", "memory", "--tp", "two"], ["--tp", "two", "touchstone plan memory --help"]),
            (["export", "hf", "--golden", "g.h5"], ["--out", "touchstone export hf --help"]),
            (["frobnicate"], ["frobnicate", "touchstone --help"]),
            (["supervise", "--max-restarts", "-1", "--", "true"], ["--max-restarts", "-1", "not in range"]),
            # Integer flags take a decimal integer of their range: CLI11 alone read 99999999999999999999 as
            # 2^63 - 1 and 0x10 as 16.
            (["plan", "memory", "--params", "1e9", "--tp", "99999999999999999999"],
             ["--tp", "99999999999999999999", "out of range"]),
            (["plan", "memory", "--params", "1e9", "--dp", "1,99999999999999999999"],
             ["--dp", "99999999999999999999", "out of range"]),
            (["plan", "memory", "--params", "1e9", "--tp", "0x10"], ["--tp", "0x10", "not a decimal integer"]),
            (["export", "hf", "--golden", "g.h5", "--out", "o", "--step", "99999999999999999999"],
             ["--step", "out of range"]),
        ]
        for args, pieces in cases:
            with self.subTest(args=args), tempfile.TemporaryDirectory() as cwd:
                result = run(*args, cwd=cwd)
                self.assertEqual(result.returncode, 2, result.stderr + result.stdout)
                lines = result.stderr.strip().splitlines()
                self.assertEqual(len(lines), 1, result.stderr)
                self.assertTrue(lines[0].startswith("touchstone: error: "), lines[0])
                for piece in pieces:
                    self.assertIn(piece, lines[0])
                self.assertEqual(result.stdout, "")
        # Leading zeros are decimal (CLI11 alone reads 010 in base 8).
        result = run("plan", "memory", "--params", "1e9", "--tp", "010")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("TP 10 x PP 1", result.stdout)


class GoodInput(unittest.TestCase):
    def test_help_lists_every_option(self):
        top = run("--help")
        self.assertEqual(top.returncode, 0)
        for command in ("golden", "train", "config"):
            self.assertIn(command, top.stdout)
        for command in ("golden", "train"):
            text = run(command, "--help").stdout
            for option in ("--config", "--set", "--out", "--init-from", "--init-group", "--save-optimizer-state",
                           "--backend", "--comm"):
                self.assertIn(option, text, f"{command} --help lacks {option}")

    def test_init_from_reproduces_the_run_bitwise(self):
        with tempfile.TemporaryDirectory() as d:
            first, second = os.path.join(d, "a.h5"), os.path.join(d, "b.h5")
            self.assertEqual(run("golden", *SMALL, "--set", "train.seed=9", "--out", first).returncode, 0)
            # A different seed, but the initial weights come from the first file.
            result = run("golden", *SMALL, "--init-from", first, "--out", second)
            self.assertEqual(result.returncode, 0, result.stderr)
            for step in (1, 2, 3):
                self.assertIn(f"step {step}/3", result.stdout)
            a, b = datasets(first), datasets(second)
            self.assertEqual(sorted(a), sorted(b))
            for name in a:
                self.assertTrue((a[name] == b[name]).all(), name)

    def test_train_writes_nothing_unless_asked(self):
        with tempfile.TemporaryDirectory() as d:
            result = run("train", *SMALL, "--set", "train.steps=2", cwd=d)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertEqual(len([l for l in result.stdout.splitlines() if l.startswith("step ")]), 2)
            self.assertEqual(os.listdir(d), [])

    def test_config_prints_the_resolved_config(self):
        result = run("config", "--set", "model.hidden_size=32")
        self.assertEqual(result.returncode, 0, result.stderr)
        config = json.loads(result.stdout)
        self.assertEqual(config["model"]["hidden_size"], 32)
        self.assertEqual(config["data"]["source"], "builtin:acceptance")
        self.assertEqual(config["model"]["attention_dropout"], 0.0)  # dropout is off by default
        self.assertEqual(config["model"]["hidden_dropout"], 0.0)


def datasets(path):
    """Every dataset of an HDF5 file as {path: numpy array}."""
    import h5py  # Debian's python3-h5py; only this test needs it

    found = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: found.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return found


if __name__ == "__main__":
    TOUCHSTONE = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=1)
