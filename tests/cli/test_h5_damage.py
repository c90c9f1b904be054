"""Damaged HDF5 files and outputs that cannot be written never crash `touchstone`.

- A checkpoint whose HDF5 metadata is damaged (one flipped byte in its global heap, where HDF5 1.10
  itself crashes) is refused by the whole-file checksum before HDF5 parses it: one line naming the file
  and exit status 2, or with --fallback the run continues from the previous checkpoint.
- A write the file system refuses (golden --out, a checkpoint save) ends with one line naming the file
  and exit status 2, no crash at exit, and no output, temporary file or partial directory left.

A full file system is simulated without privileges by RLIMIT_FSIZE, the per-process limit on the size
of a file: with SIGXFSZ ignored, a write() past it fails with EFBIG exactly as one on a full disk fails
with ENOSPC, through the same error paths. The limit caps every file the process writes, PMIx's
shared-memory store included, so that store is switched to its in-memory form (PMIX_MCA_gds=hash).

Usage: test_h5_damage.py PATH_TO_TOUCHSTONE   (standard library only)
"""
import os
import resource
import signal
import subprocess
import sys
import tempfile
import unittest

TOUCHSTONE = None
SMALL = ["--set", "model.hidden_size=16", "--set", "model.ffn_hidden_size=32", "--set", "model.seq_length=16"]
FILE_SIZE_LIMIT = 1 << 20  # bytes: the default model's golden file (7 MB) and checkpoint (3 MB) exceed it


def run(*args, env=None, preexec_fn=None):
    return subprocess.run([TOUCHSTONE, *args], capture_output=True, text=True, timeout=120, env=env,
                          preexec_fn=preexec_fn)


def flip_heap_byte(path):
    """Flips the byte 25 bytes after the first global heap collection's signature: the size of its first
    object (a root attribute's string), which HDF5 1.10 reads out of bounds when it is wrong."""
    with open(path, "r+b") as f:
        data = f.read()
        at = data.find(b"GCOL")
        assert at >= 0, f"{path} has no global heap collection"
        f.seek(at + 25)
        f.write(bytes([data[at + 25] ^ 0xFF]))


def limited_file_size():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # inherited across exec: write() returns EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))


class DamagedCheckpointMetadata(unittest.TestCase):
    """Checkpoints of steps 2 and 4; the metadata of step 4's file is damaged."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.ckpt = os.path.join(self.dir.name, "ckpt")
        saved = run("train", *SMALL, "--set", "train.steps=4", "--checkpoint-dir", self.ckpt, "--save-every", "2")
        self.assertEqual(saved.returncode, 0, saved.stderr)
        self.damaged = os.path.join(self.ckpt, "step_00000004", "state.h5")
        flip_heap_byte(self.damaged)

    def tearDown(self):
        self.dir.cleanup()

    def resume(self, *args):
        return run("train", *SMALL, "--set", "train.steps=4", "--checkpoint-dir", self.ckpt, "--resume", *args)

    def test_refused_with_one_line_naming_the_file(self):
        result = self.resume()
        self.assertEqual(result.returncode, 2, result.stderr + result.stdout)
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertIn(self.damaged + ": corrupted (file checksum", lines[0])
        self.assertNotIn("step ", result.stdout, "compute started before the error")

    def test_fallback_continues_from_the_previous_checkpoint(self):
        result = self.resume("--fallback")
        self.assertEqual(result.returncode, 0, result.stderr + result.stdout)
        self.assertIn(f"skipped checkpoint: {self.damaged}: corrupted (file checksum", result.stdout)
        self.assertIn(f"resumed from {os.path.join(self.ckpt, 'step_00000002')} ", result.stdout)
        self.assertIn("step 3/4", result.stdout)
        self.assertIn("step 4/4", result.stdout)


class OutputThatCannotBeWritten(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.env = dict(os.environ, PMIX_MCA_gds="hash")

    def tearDown(self):
        self.dir.cleanup()

    def assert_refused(self, result, path):
        self.assertEqual(result.returncode, 2, f"status {result.returncode}\n{result.stderr}{result.stdout}")
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertRegex(lines[0], r"^touchstone: error: ")
        self.assertIn(path + ": ", lines[0])
        self.assertIn("File too large", lines[0])

    def listing(self):
        return sorted(os.path.relpath(os.path.join(root, name), self.dir.name)
                      for root, dirs, files in os.walk(self.dir.name) for name in dirs + files)

    def test_golden_file(self):
        out = os.path.join(self.dir.name, "golden.h5")
        result = run("golden", "--out", out, env=self.env, preexec_fn=limited_file_size)
        self.assert_refused(result, out)
        self.assertEqual(self.listing(), [], "an output or temporary file was left behind")

    def test_checkpoint_save(self):
        ckpt = os.path.join(self.dir.name, "ckpt")
        result = run("train", "--set", "train.steps=2", "--checkpoint-dir", ckpt, env=self.env,
                     preexec_fn=limited_file_size)
        self.assert_refused(result, os.path.join(ckpt, ".partial-step_00000002", "state.h5"))
        # The ledger the run appended to stays; nothing of the failed save does.
        self.assertEqual(self.listing(), ["ckpt", os.path.join("ckpt", "ledger.jsonl")])


if __name__ == "__main__":
    TOUCHSTONE = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=1)
