"""A resume checks the data's content, not only its path (docs/checkpoints.md, "The data fingerprint"): other
tokens under the same data.source are refused with one line naming both fingerprints and the source
(status 2); the same tokens resume; a checkpoint written before the fingerprint existed resumes with a
note; and a ledger whose attempts read different data fails `ledger check`.

Usage: test_resume_data.py PATH_TO_TOUCHSTONE   (/usr/bin/python3 with h5py)
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

import h5py

TOUCHSTONE = None
TINY = ["--set", "model.hidden_size=16", "--set", "model.ffn_hidden_size=32", "--set", "model.seq_length=16",
        "--set", "model.num_layers=1"]
FINGERPRINT = re.compile(r"fnv1a64:[0-9a-f]{16}")


def write_documents(path, first_token):
    """Twelve documents of 20 tokens; `first_token` changes the content, not the shape."""
    with open(path, "w") as f:
        for d in range(12):
            f.write(json.dumps({"tokens": [(first_token + d * 7 + i) % 90 + 5 for i in range(20)]}) + "\n")


def fnv1a64(path):
    value = 0xcbf29ce484222325
    with open(path, "rb") as f:
        for byte in f.read():
            value = ((value ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{value:016x}"


class ResumeData(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.data = os.path.join(self.tmp.name, "docs.jsonl")
        self.ckpt = os.path.join(self.tmp.name, "ckpt")
        write_documents(self.data, 0)

    def tearDown(self):
        self.tmp.cleanup()

    def train(self, steps, *args):
        return subprocess.run([TOUCHSTONE, "train", *TINY, "--set", f"data.source={self.data}", "--set",
                               f"train.steps={steps}", "--checkpoint-dir", self.ckpt, "--save-every", "1", "--resume",
                               *args], capture_output=True, text=True, timeout=120)

    def ledger_check(self):
        return subprocess.run([TOUCHSTONE, "ledger", "check", self.ckpt], capture_output=True, text=True, timeout=60)

    def start_fingerprints(self):
        with open(os.path.join(self.ckpt, "ledger.jsonl")) as f:
            return [e.get("data_fingerprint") for e in map(json.loads, f) if e["event"] == "start"]

    def test_other_tokens_under_the_same_source_are_refused(self):
        first = self.train(1)
        self.assertEqual(first.returncode, 0, first.stderr)
        with h5py.File(os.path.join(self.ckpt, "step_00000001", "state.h5"), "r") as f:
            saved = f.attrs["data_fingerprint"]
            saved = saved.decode() if isinstance(saved, bytes) else saved
        self.assertRegex(saved, FINGERPRINT)
        self.assertEqual(self.start_fingerprints(), [saved])

        write_documents(self.data, 1)  # same shape and path, other tokens
        refused = self.train(2)
        self.assertEqual(refused.returncode, 2, refused.stdout + refused.stderr)
        lines = refused.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, refused.stderr)
        self.assertIn(f"data.source {self.data} has content fingerprint", lines[0])
        self.assertIn(saved, lines[0])
        self.assertEqual(len(set(FINGERPRINT.findall(lines[0]))), 2, lines[0])
        self.assertNotIn("step 2/2", refused.stdout)

        write_documents(self.data, 0)  # the run's own data again
        resumed = self.train(2)
        self.assertEqual(resumed.returncode, 0, resumed.stderr)
        self.assertIn("resumed from", resumed.stdout)
        self.assertEqual(self.start_fingerprints(), [saved, saved])
        self.assertEqual(self.ledger_check().returncode, 0)

    def test_checkpoint_without_a_fingerprint_resumes_with_a_note(self):
        self.assertEqual(self.train(1).returncode, 0)
        directory = os.path.join(self.ckpt, "step_00000001")
        state = os.path.join(directory, "state.h5")
        with h5py.File(state, "r+") as f:  # as written before the attribute existed
            del f.attrs["data_fingerprint"]
        manifest_path = os.path.join(directory, "manifest.json")
        with open(manifest_path) as f:
            manifest = json.load(f)
        manifest["files"]["state.h5"] = {"bytes": os.path.getsize(state), "fnv1a64": fnv1a64(state)}
        with open(manifest_path, "w") as f:
            json.dump(manifest, f)
        resumed = self.train(2)
        self.assertEqual(resumed.returncode, 0, resumed.stderr)
        self.assertIn("records no data fingerprint (written before it was recorded): the data is not verified",
                      resumed.stdout)

    def test_attempts_that_read_different_data_fail_the_ledger_check(self):
        # Attempt 1 dies before its first checkpoint, so attempt 2 starts fresh on other data: no checkpoint
        # to refuse it, but the ledger shows that the run's attempts read different data.
        killed = self.train(2, "--fail-at", "1:0:forward")
        self.assertNotEqual(killed.returncode, 0)
        write_documents(self.data, 1)
        second = self.train(2)
        self.assertEqual(second.returncode, 0, second.stderr)
        check = self.ledger_check()
        self.assertEqual(check.returncode, 1, check.stdout + check.stderr)
        self.assertIn("attempt 2 read data with content fingerprint", check.stderr)
        self.assertIn("(the data set changed between attempts)", check.stderr)


if __name__ == "__main__":
    TOUCHSTONE = os.path.abspath(sys.argv.pop(1))
    unittest.main()
