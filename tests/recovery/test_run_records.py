"""What a run records about itself must let every later run start: the layout in the ledger and the
checkpoint names every dimension, context parallelism included (docs/recovery.md, docs/checkpoints.md),
and a fault record torn by a kill (faults.jsonl) never blocks a restart: the next record is written on a
line of its own, so the reader that ignores a torn last line still reads every record.

Usage: test_run_records.py PATH_TO_TOUCHSTONE   (/usr/bin/python3 with h5py; mpirun for the cp run)
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import h5py

TOUCHSTONE = None
SMALL = ["--set", "model.seq_length=16", "--set", "train.steps=3"]


def launcher(ranks):
    return ["mpirun", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else []) + ["-np", str(ranks)]


def run(command, timeout=300):
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def start_lines(directory):
    with open(os.path.join(directory, "ledger.jsonl")) as f:
        return [e for e in map(json.loads, f) if e["event"] == "start"]


class RunRecords(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = os.path.join(self.tmp.name, "ck")

    def tearDown(self):
        self.tmp.cleanup()

    def test_a_context_parallel_layout_is_recorded_whole(self):
        # tp 1 x cp 2 x pp 1 x dp 1 runs on 2 processes; a record of tp x pp x dp alone says 1.
        result = run([*launcher(2), TOUCHSTONE, "train", *SMALL, "--set", "train.steps=1", "--set", "parallel.cp=2",
                      "--checkpoint-dir", self.dir, "--save-every", "1"])
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        (start,) = start_lines(self.dir)
        self.assertEqual((start["world_size"], start["tp"], start["cp"], start["pp"], start["dp"]), (2, 1, 2, 1, 1))
        with h5py.File(os.path.join(self.dir, "step_00000001", "state.h5"), "r") as f:
            layout = json.loads(f.attrs["layout"])
        self.assertEqual((layout["world_size"], layout["cp"]), (2, 2), layout)
        check = run([TOUCHSTONE, "ledger", "check", self.dir])
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        self.assertIn("cp 2", check.stdout)

    def test_a_torn_fault_record_does_not_block_the_restart(self):
        # A record cut short by a kill, then a run killed by its injected fault at step 2: the new record
        # must not be glued onto the torn one, or every restart refuses faults.jsonl as not JSON.
        os.mkdir(self.dir)
        faults = os.path.join(self.dir, "faults.jsonl")
        with open(faults, "w") as f:
            f.write('{"event":"inj')
        command = [TOUCHSTONE, "train", *SMALL, "--checkpoint-dir", self.dir, "--save-every", "1", "--resume",
                   "--fail-at", "2:0"]
        killed = run(command)
        self.assertEqual(killed.returncode, -9, killed.stderr[-3000:])  # the injected SIGKILL
        self.assertIn("injected failure: rank 0 dies in forward of step 2", killed.stderr)
        with open(faults) as f:
            lines = f.read().splitlines()
        self.assertEqual(len(lines), 1, lines)
        self.assertEqual(json.loads(lines[0])["step"], 2)
        # The restart reads the record, knows the fault fired, and finishes the run from step 1's checkpoint.
        restarted = run(command)
        self.assertEqual(restarted.returncode, 0, restarted.stderr[-3000:])
        check = run([TOUCHSTONE, "ledger", "check", self.dir])
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        self.assertIn("every sample read exactly once", check.stdout)


if __name__ == "__main__":
    TOUCHSTONE = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
