"""`touchstone supervise` with small shell-script children (no trainer): restart after a crash, giving
up, stall detection, no process left behind (grandchildren included), --restart-command, forwarding of
SIGTERM, and the recovery report built from faults.jsonl and the sample ledger; a job that exits 0 with a
ledger that does not check is a failure (status 1); every duration flag must be finite and in range.

The tests look only at processes they started: every child of a test's supervisor inherits a marker
variable unique to that test, and a process counts as left behind when it still runs (not a zombie)
and carries the marker. An unrelated `sleep 300` elsewhere on the machine does not matter.

Usage: test_supervise.py PATH_TO_TOUCHSTONE   (standard library only)
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import uuid
import xml.dom.minidom

TOUCHSTONE = None

# A job that writes the sample ledger like the trainer (B=4, M=1, dp=2, 8 windows, 5 steps, a checkpoint
# every 2 steps). The first attempt records steps 1..3, then an injected failure at step 4 kills it;
# the second resumes from the checkpoint of step 2 and finishes.
LEDGER_JOB = r"""#!/bin/sh
dir=$1
now() { date +%s.%N; }
if [ -e "$dir/ledger.jsonl" ]; then attempt=2; from=2; else attempt=1; from=0; fi
printf '{"event":"start","attempt":%d,"time":%s,"resumed_from_step":%d,"world_size":2,"tp":1,"pp":1,"dp":2,"global_batch_size":4,"micro_batch_size":1,"num_windows":8,"steps":5}\n' \
  $attempt $(now) $from >> "$dir/ledger.jsonl"
s=$((from + 1))
while [ $s -le 5 ]; do
  if [ $attempt -eq 1 ] && [ $s -eq 4 ]; then
    printf '{"event":"injected_failure","step":4,"rank":1,"phase":"backward","time":%s}\n' $(now) >> "$dir/faults.jsonl"
    kill -9 $$
  fi
  b=$(( (s - 1) * 4 ))
  printf '{"event":"step","attempt":%d,"step":%d,"time":%s,"samples":[[%d,%d],[%d,%d]]}\n' \
    $attempt $s $(now) $b $((b + 2)) $((b + 1)) $((b + 3)) >> "$dir/ledger.jsonl"
  echo "step $s"
  if [ $((s % 2)) -eq 0 ]; then
    printf '{"event":"checkpoint","attempt":%d,"step":%d,"time":%s,"path":"step_%08d"}\n' $attempt $s $(now) $s >> "$dir/ledger.jsonl"
  fi
  s=$((s + 1))
done
printf '{"event":"end","attempt":%d,"time":%s,"steps":5}\n' $attempt $(now) >> "$dir/ledger.jsonl"
"""


MARK_VARIABLE = "TOUCHSTONE_SUPERVISE_TEST_MARK"


def marked_and_running(pid, mark):
    """True while process `pid` runs (exists and is not a zombie) and carries `mark` in its environment,
    i.e. is one the test started: a recycled pid belongs to another program and has no marker."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/environ", "rb") as f:
            environment = f.read().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return state not in ("Z", "X") and f"{MARK_VARIABLE}={mark}".encode() in environment


def marked_processes(mark):
    """'pid: command line' of every running process that carries `mark`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and marked_and_running(int(entry), mark):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    found.append(f"{entry}: " + f.read().replace(b"\0", b" ").decode(errors="replace").strip())
            except (FileNotFoundError, ProcessLookupError):
                pass
    return found


class Supervise(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.report = os.path.join(self.dir.name, "recovery.json")
        self.mark = f"{os.getpid()}-{uuid.uuid4().hex}"  # inherited by everything this test starts
        self.env = dict(os.environ, **{MARK_VARIABLE: self.mark})

    def tearDown(self):
        self.dir.cleanup()

    def assertNothingLeft(self):
        self.assertEqual(marked_processes(self.mark), [], "processes this test started outlived the supervisor")

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def script(self, name, text):
        path = self.path(name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)
        return path

    def supervise(self, *args, timeout=30):
        return subprocess.run([TOUCHSTONE, "supervise", "--report", self.report, *args], capture_output=True,
                              text=True, timeout=timeout, cwd=self.dir.name, env=self.env)

    def load_report(self):
        with open(self.report) as f:
            report = json.load(f)
        xml.dom.minidom.parse(self.report[:-len(".json")] + ".svg")  # the timeline is well-formed SVG
        return report

    def test_crash_then_success_with_ledger_and_injected_failure(self):
        job = self.script("job.sh", LEDGER_JOB)
        result = self.supervise("--checkpoint-dir", self.dir.name, "--", job, self.dir.name)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("step 3", result.stdout)  # the job's output is passed through
        report = self.load_report()
        self.assertEqual(report["outcome"], "succeeded")
        self.assertEqual(report["restarts"], 1)
        self.assertEqual(len(report["failures"]), 1)
        failure = report["failures"][0]
        self.assertEqual(failure["signal"], 9)
        self.assertEqual(failure["exit_status"], 137)
        self.assertEqual(failure["failure_time_source"], "faults.jsonl")
        self.assertEqual(failure["injected_failure"], {"step": 4, "rank": 1, "phase": "backward"})
        self.assertLessEqual(failure["failure_time"], failure["detection_time"])
        self.assertLessEqual(failure["detection_time"], failure["restart_time"])
        self.assertLessEqual(failure["restart_time"], failure["first_step_after_restart_time"])
        self.assertEqual(failure["resumed_from_step"], 2)
        self.assertEqual(failure["steps_recomputed"], [3])
        self.assertEqual(failure["samples_reread"], 4)
        self.assertTrue(report["ledger"]["passed"], report["ledger"]["problems"])
        self.assertTrue(report["ledger"]["finished"])
        self.assertIn("outcome: succeeded after 1 restart(s)", result.stderr)
        check = subprocess.run([TOUCHSTONE, "ledger", "check", self.dir.name], capture_output=True, text=True,
                               timeout=30)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        self.assertIn("recomputed: 1 step(s), 4 sample(s) re-read", check.stdout)

    def test_gives_up_after_max_restarts(self):
        job = self.script("fail.sh", "#!/bin/sh\necho attempt >> attempts.txt\nexit 5\n")
        result = self.supervise("--max-restarts", "2", "--", job)
        self.assertEqual(result.returncode, 5, result.stderr)
        with open(self.path("attempts.txt")) as f:
            self.assertEqual(len(f.readlines()), 3)
        report = self.load_report()
        self.assertEqual(report["outcome"], "gave up")
        self.assertEqual(len(report["failures"]), 3)
        self.assertIsNone(report["failures"][-1]["restart_time"])
        errors = [line for line in result.stderr.splitlines() if "error" in line]
        self.assertEqual(len(errors), 1, result.stderr)
        self.assertIn("gave up after 2 restart(s)", errors[0])

    def test_stall_is_killed_and_restarted(self):
        job = self.script("stall.sh", "#!/bin/sh\necho started\n[ -e ran ] && exit 0\ntouch ran\nsleep 60\n")
        begin = time.time()
        result = self.supervise("--stall-timeout", "2", "--kill-grace", "1", "--", job)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertLess(time.time() - begin, 20)
        report = self.load_report()
        self.assertTrue(report["failures"][0]["stalled"])
        self.assertGreaterEqual(report["failures"][0]["detection_time"] - report["attempts"][0]["launch_time"], 2)
        self.assertIn("stalled", result.stderr)
        self.assertNothingLeft()  # the stalled attempt's `sleep 60`

    def test_no_process_left_behind(self):
        # A background grandchild in the job's group, and one that left it with setsid.
        job = self.script("spawn.sh", "#!/bin/sh\nsleep 300 &\necho $! >> pids\n"
                                      "setsid sh -c 'echo $$ >> pids; exec sleep 301' &\nsleep 0.3\n"
                                      "[ -e ran ] && exit 0\ntouch ran\nkill -9 $$\n")
        result = self.supervise("--kill-grace", "1", "--", job)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(self.path("pids")) as f:
            pids = [int(line) for line in f]
        self.assertEqual(len(pids), 4)
        for pid in pids:
            self.assertFalse(marked_and_running(pid, self.mark), f"process {pid} outlived the supervisor")
        self.assertNothingLeft()  # nor any process whose pid the job did not record

    def test_restart_command_is_used_for_restarts(self):
        result = self.supervise("--restart-command", "echo restarted with dp=$((2 * 2)); exit 0", "--", "sh", "-c",
                                "echo first; exit 1")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("first", result.stdout)
        self.assertIn("restarted with dp=4", result.stdout)
        report = self.load_report()
        self.assertEqual([a["command"] for a in report["attempts"]],
                         ["sh -c echo first; exit 1", "echo restarted with dp=$((2 * 2)); exit 0"])

    def test_sigterm_is_forwarded_and_nothing_is_left(self):
        job = self.script("long.sh", "#!/bin/sh\nsleep 300 &\necho $! > pid\necho ready\nwait\n")
        process = subprocess.Popen([TOUCHSTONE, "supervise", "--kill-grace", "1", "--report", self.report, "--",
                                    job], cwd=self.dir.name, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=self.env)
        self.assertEqual(process.stdout.readline().strip(), "ready")
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)
        self.assertEqual(process.returncode, 128 + signal.SIGTERM, err)
        with open(self.path("pid")) as f:
            self.assertFalse(marked_and_running(int(f.read()), self.mark))
        self.assertNothingLeft()
        report = self.load_report()
        self.assertEqual(report["outcome"], "interrupted")
        self.assertEqual(len(report["attempts"]), 1)

    def test_bad_report_path_is_refused_before_running(self):
        result = subprocess.run([TOUCHSTONE, "supervise", "--report", self.path("no/such/dir/r.json"), "--",
                                 "touch", self.path("ran")], capture_output=True, text=True, timeout=30)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
        self.assertFalse(os.path.exists(self.path("ran")))

    def test_success_with_a_failing_ledger_is_a_failure(self):
        for name, ledger in [("empty", ""), ("malformed", "{oops\n")]:
            with self.subTest(ledger=name):
                job = self.script("job.sh", f"#!/bin/sh\nprintf '{ledger}' > ledger.jsonl\necho done\n")
                result = self.supervise("--checkpoint-dir", self.dir.name, "--", job)
                self.assertEqual(result.returncode, 1, result.stderr)
                errors = [line for line in result.stderr.splitlines() if "error" in line]
                self.assertEqual(len(errors), 1, result.stderr)
                self.assertIn("the job succeeded but its ledger", errors[0])
                report = self.load_report()
                self.assertEqual(report["outcome"], "ledger check failed")
                self.assertEqual(report["exit_status"], 1)
                self.assertEqual(report["restarts"], 0)

    def test_duration_flags_must_be_finite_and_in_range(self):
        bad = {"--stall-timeout": ["nan", "inf", "-inf", "-1", "0", "1e308", "1e6x", ""],
               "--kill-grace": ["nan", "NaN", "inf", "-1", "-0.5", "1e308", "1000001"]}
        for flag, values in bad.items():
            for value in values:
                with self.subTest(flag=flag, value=value):
                    result = subprocess.run([TOUCHSTONE, "supervise", flag, value, "--", "touch", self.path("ran")],
                                            capture_output=True, text=True, timeout=30)
                    self.assertEqual(result.returncode, 2, result.stderr)
                    self.assertIn(flag, result.stderr.splitlines()[0])
                    self.assertFalse(os.path.exists(self.path("ran")))

    def test_zero_kill_grace_kills_a_job_that_ignores_sigterm_at_once(self):
        job = self.script("stubborn.sh", "#!/bin/sh\ntrap '' TERM\necho started\nsleep 60\n")
        begin = time.time()
        result = self.supervise("--stall-timeout", "1", "--kill-grace", "0", "--max-restarts", "0", "--", job)
        self.assertLess(time.time() - begin, 20, result.stderr)
        self.assertNotEqual(result.returncode, 0, result.stderr)
        self.assertEqual(self.load_report()["kill_grace_s"], 0)
        self.assertNothingLeft()


if __name__ == "__main__":
    TOUCHSTONE = os.path.abspath(sys.argv.pop(1))
    unittest.main()
