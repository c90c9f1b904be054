"""`touchstone ledger check`: exit 0 with the per-epoch report on a good history with a restart, 1 with
the step or sample named when a check fails, 2 on bad input; the torn last line of a killed writer is
tolerated with a note; --json writes the same report. A checkpoint line recorded from the disk by the
resuming attempt (its committer was killed before writing it) is accepted only in its place; an empty
ledger fails; attempts that read different data (content fingerprints) fail, and an older ledger without
fingerprints passes with a note.

Usage: test_ledger_cli.py PATH_TO_TOUCHSTONE   (standard library only)
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

TOUCHSTONE = None


def planned(step, batch=8, micro=2, dp=2):
    """Megatron-LM's order: micro-batch j of dp rank r holds (s-1)*B + j*M*dp + r*M ... + M-1."""
    return [[(step - 1) * batch + j * micro * dp + r * micro + i
             for j in range(batch // (micro * dp)) for i in range(micro)] for r in range(dp)]


def start(attempt, resumed_from, dp=2):
    return {"event": "start", "attempt": attempt, "time": 100.0 * attempt, "resumed_from_step": resumed_from,
            "world_size": dp, "tp": 1, "pp": 1, "dp": dp, "global_batch_size": 8, "micro_batch_size": 2,
            "num_windows": 16, "steps": 6}


def step(attempt, s, samples=None, dp=2):
    return {"event": "step", "attempt": attempt, "step": s, "time": 100.0 * attempt + s,
            "samples": samples if samples is not None else planned(s, dp=dp)}


def with_fingerprints(events, fingerprints):
    """The events with data_fingerprint on each start line, in order."""
    starts = iter(fingerprints)
    return [dict(e, data_fingerprint=next(starts)) if e["event"] == "start" else e for e in events]


def recovered_history():
    """good_history, but attempt 1 was killed between committing step 3 and writing its checkpoint line
    (so it recorded no step 4), and attempt 2 recorded that line from the checkpoint before its start."""
    events = [e for e in good_history() if not (e["attempt"] == 1 and e["event"] in ("checkpoint", "step")
                                                 and e["step"] >= 3)]
    events.insert(3, step(1, 3))
    events.insert(4, {"event": "checkpoint", "attempt": 1, "step": 3, "time": 199.0, "path": "step_00000003",
                      "recovered_by": 2})
    return events


def good_history():
    """Attempt 1 (dp 2) records steps 1..4 and dies after the checkpoint of step 3; attempt 2 (dp 4)
    resumes from it and finishes: 6 steps x 8 samples = 3 epochs of 16 windows."""
    return ([start(1, 0)] + [step(1, s) for s in range(1, 4)] +
            [{"event": "checkpoint", "attempt": 1, "step": 3, "time": 104.0, "path": "step_00000003"}, step(1, 4),
             start(2, 3, dp=4)] + [step(2, s, dp=4) for s in range(4, 7)] +
            [{"event": "end", "attempt": 2, "time": 300.0, "steps": 6}])


class LedgerCli(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.ledger = os.path.join(self.dir.name, "ledger.jsonl")

    def tearDown(self):
        self.dir.cleanup()

    def write(self, events, tail=""):
        with open(self.ledger, "w") as f:
            f.write("".join(json.dumps(e) + "\n" for e in events) + tail)

    def check(self, *args):
        return subprocess.run([TOUCHSTONE, "ledger", "check", *args], capture_output=True, text=True, timeout=60)

    def test_good_history_with_restart_and_layout_change(self):
        self.write(good_history())
        out_json = os.path.join(self.dir.name, "check.json")
        result = self.check(self.dir.name, "--json", out_json)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        for epoch in range(3):
            self.assertIn(f"epoch {epoch}: windows 0..15 each read once", result.stdout)
        self.assertIn("recomputed: 1 step(s), 8 sample(s) re-read", result.stdout)
        self.assertIn("restarts: 1: attempt 2 from step 3 (world_size 2 -> 4, dp 2 -> 4)", result.stdout)
        self.assertIn("check passed", result.stdout)
        with open(out_json) as f:
            report = json.load(f)
        self.assertTrue(report["passed"])
        self.assertEqual(report["attempts"][1]["recomputed_steps"], [4])
        self.assertEqual([e["complete"] for e in report["epochs"]], [True, True, True])

    def test_torn_last_line_is_noted(self):
        self.write(good_history(), tail='{"event":"step","attempt":2,"st')
        result = self.check(self.ledger)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("ledger.jsonl:12: unterminated last line", result.stdout)

    def test_duplicated_sample_fails_naming_it(self):
        events = good_history()
        events[7]["samples"][3][1] = 0  # attempt 2's step 4: dp rank 3 reads sample 0 again instead of 31
        self.write(events)
        result = self.check(self.ledger)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("check FAILED", result.stdout)
        self.assertIn("sample 0 (window 0 of epoch 0) read 2 times", result.stdout)
        self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
        self.assertIn("ledger check failed", result.stderr)

    def test_bad_input_exits_2(self):
        result = self.check(os.path.join(self.dir.name, "missing"))
        self.assertEqual(result.returncode, 2)
        self.assertIn("no such ledger file", result.stderr)
        self.write(good_history()[:2], tail="{oops\n")
        result = self.check(self.ledger)
        self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
        self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
        self.assertIn("ledger.jsonl:3: not valid JSON", result.stderr)

    def test_empty_ledger_fails(self):
        for content in ["", '{"event":"start","att']:  # nothing, or only a torn line
            self.write([], tail=content)
            result = self.check(self.ledger)
            self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
            self.assertIn("the ledger records nothing", result.stderr)

    def test_checkpoint_recorded_by_the_resuming_attempt_passes(self):
        self.write(recovered_history())
        out_json = os.path.join(self.dir.name, "check.json")
        result = self.check(self.ledger, "--json", out_json)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("checkpoints at 3 (3 killed before its ledger line, recorded by the next attempt from the "
                      "disk)", result.stdout)
        with open(out_json) as f:
            self.assertEqual(json.load(f)["attempts"][0]["recovered_checkpoints"], [3])

    def test_resume_from_a_step_never_committed_still_fails(self):
        events = [e for e in recovered_history() if "recovered_by" not in e]
        self.write(events)
        result = self.check(self.ledger)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("attempt 2 resumed from step 3, but no earlier attempt committed a checkpoint of that step",
                      result.stdout)

    def test_recovered_checkpoint_out_of_place_fails(self):
        events = recovered_history()
        events[4]["recovered_by"] = 3  # names an attempt that is not the next start
        self.write(events)
        result = self.check(self.ledger)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("expected the start of attempt 3", result.stdout)
        events = recovered_history()
        events[4]["step"] = 2  # a step the killed attempt was not at
        self.write(events)
        result = self.check(self.ledger)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("checkpoint of step 2, but attempt 1 is at step 3", result.stdout)

    def test_attempts_that_read_different_data_fail(self):
        a, b = "fnv1a64:00000000000000aa", "fnv1a64:00000000000000bb"
        self.write(with_fingerprints(good_history(), [a, a]))
        result = self.check(self.ledger)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertNotIn("no data fingerprint", result.stdout)
        self.write(with_fingerprints(good_history(), [a, b]))
        result = self.check(self.ledger)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn(f"attempt 2 read data with content fingerprint {b}, attempt 1 {a}", result.stderr)

    def test_ledger_without_fingerprints_passes_with_a_note(self):
        self.write(good_history())
        result = self.check(self.ledger)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("note: attempt(s) 1, 2 recorded no data fingerprint (an older ledger)", result.stdout)


if __name__ == "__main__":
    TOUCHSTONE = os.path.abspath(sys.argv.pop(1))
    unittest.main()
