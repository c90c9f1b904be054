"""A kill at any instant of a checkpoint save leaves a directory that resumes to the uninterrupted run's
exact state with a ledger that checks (docs/checkpoints.md, "The commit and the ledger"; coverage in
docs/testing.md).

One small run (3 steps, checkpoints after steps 2 and 3) is traced once with strace to list the file
system calls of its main thread. Then, for every call of the save of step 2 (from the call after the
ledger's line of step 2 to the fsync of the save's own ledger line), and for a sample of the calls before
and after, a fresh run is killed
with SIGKILL on entering exactly that call (`strace -e inject=NAME:signal=KILL:when=N`, counted per call
name in the main thread, which does every file operation of a save), and then `touchstone supervise`
restarts it with --resume. Each recovery must exit 0, `touchstone ledger check` must pass, and the final
checkpoint and every step of the ledger (samples, loss, grad norm, lr) must equal the uninterrupted
run's bit for bit. strace needs ptrace: where it is not permitted, the test fails, it does not skip.

Usage: test_kill_every_syscall.py PATH_TO_TOUCHSTONE   (/usr/bin/python3 with h5py and numpy)
"""
import collections
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

from checkpoint_files import checkpoint_tensors, ledger_steps

TOUCHSTONE = None
STEPS, SAVE_EVERY, KILLED_SAVE = 3, 2, 2
TINY = ["--set", "model.hidden_size=16", "--set", "model.ffn_hidden_size=32", "--set", "model.seq_length=16",
        "--set", "model.num_layers=1", "--set", f"train.steps={STEPS}"]
# Every call that changes a file or a directory, and the opens and closes around them. A kill on entry
# stops the call from running, so a kill at each of them reaches every state the disk can be left in.
SYSCALLS = ("openat,write,pwrite64,fsync,fdatasync,rename,renameat,renameat2,mkdir,mkdirat,unlink,unlinkat,"
            "rmdir,close,ftruncate")
SAMPLES_BEFORE, SAMPLES_AFTER = 12, 8  # kills outside the save, spread evenly
TRIES = 40  # runs to land a kill on one call of the save (the runtime's calls before it vary: kill_in_save)
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1")
CALL = re.compile(r"^([a-z0-9_]+)\(")


def train_command(directory):
    return [TOUCHSTONE, "train", *TINY, "--checkpoint-dir", directory, "--save-every", str(SAVE_EVERY), "--resume"]


def strace_command(log, *inject):
    return ["strace", "-o", log, "-s", "64", "-e", f"trace={SYSCALLS}", *inject]


def traced_calls(log):
    """The traced calls of a strace log, in order, as (name, line)."""
    calls = []
    with open(log) as f:
        for line in f:
            match = CALL.match(line)
            if match:
                calls.append((match.group(1), line.rstrip("\n")))
    return calls


def call_text(line, directory):
    """A traced call without its result, its run's directory and its numbers (process ids in temporary
    names, descriptors, times)."""
    return re.sub(r"[0-9]+", "#", line.rsplit(" = ", 1)[0].rstrip().replace(directory, "DIR"))


def save_start(calls):
    """The index of the first call of the killed save, or None when the calls stop before it: the save
    starts right after the fsync of the ledger's line of its step, which the run writes just before."""
    step_lines = [i for i, (name, line) in enumerate(calls) if name == "write" and '\\"event\\":\\"step\\"' in line]
    if len(step_lines) < KILLED_SAVE:
        return None
    synced = next((i for i in range(step_lines[KILLED_SAVE - 1] + 1, len(calls)) if calls[i][0] == "fsync"), None)
    return synced + 1 if synced is not None and synced + 1 < len(calls) else None


def save_window(calls):
    """The calls of the killed save, from its first one to the fsync of its ledger line."""
    first = save_start(calls)
    ledger_line = next(i for i, (name, line) in enumerate(calls)
                       if i > first and name == "write" and '\\"event\\":\\"checkpoint\\"' in line)
    last = next(i for i in range(ledger_line + 1, len(calls)) if calls[i][0] == "fsync")
    return first, calls[first:last + 1]


def spread(indices, count):
    if len(indices) <= count:
        return list(indices)
    return [indices[round(k * (len(indices) - 1) / (count - 1))] for k in range(count)]


def count_of(name, calls):
    return sum(1 for n, _ in calls if n == name)


class KillEverySyscall(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.runs = 0
        cls.runs_lock = threading.Lock()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_ok(self, command, what):
        result = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=120)
        self.assertEqual(result.returncode, 0, f"{what}: {result.stdout[-2000:]}{result.stderr[-2000:]}")
        return result

    def killed_run(self, label, name, ordinal):
        """A fresh run killed on entering its `ordinal`-th call `name`: its directory and traced calls, or
        None when it was not killed."""
        directory = os.path.join(self.tmp.name, label)
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        log = directory + ".strace"
        killed = subprocess.run(strace_command(log, "-e", f"inject={name}:signal=KILL:when={ordinal}") +
                                train_command(directory), capture_output=True, text=True, env=ENV, timeout=120)
        with self.runs_lock:
            type(self).runs += 1
        calls = traced_calls(log)
        if killed.returncode != -9 or not calls or calls[-1][0] != name or not calls[-1][1].endswith("= ?"):
            return directory, None
        return directory, calls

    def recover(self, directory, where):
        """Restarts the killed run under supervise with --resume; returns the failures (none: it recovered
        exactly)."""
        supervised = subprocess.run([TOUCHSTONE, "supervise", "--max-restarts", "0", "--stall-timeout", "60",
                                     "--checkpoint-dir", directory, "--", *train_command(directory)],
                                    capture_output=True, text=True, env=ENV, timeout=120)
        if supervised.returncode != 0:
            return [f"{where}: supervised resume exited {supervised.returncode}: {supervised.stderr[-1500:]}"]
        failures = []
        checked = subprocess.run([TOUCHSTONE, "ledger", "check", directory], capture_output=True, text=True,
                                 timeout=60)
        if checked.returncode != 0:
            failures.append(f"{where}: ledger check failed: {checked.stdout[-1500:]}")
        tensors = checkpoint_tensors(directory, STEPS)
        for path, value in self.reference.items():
            if path not in tensors or not np.array_equal(tensors[path], value):
                failures.append(f"{where}: {path} differs from the uninterrupted run")
                break
        if ledger_steps(directory) != self.reference_steps:
            failures.append(f"{where}: the ledger's steps differ from the uninterrupted run's")
        shutil.rmtree(directory)
        return failures

    def commonest_count_before(self, name):
        """The count of calls `name` before the save that the test's runs have made most often so far."""
        with self.runs_lock:
            return self.counts_before[name].most_common(1)[0][0]

    def kill_in_save(self, j):
        """Kills a run on entering call j of the save, then recovers it. The MPI runtime's own calls before
        the save (MPI_Init's wake-ups of its progress thread through an eventfd, other jobs' shared-memory
        segments) vary from run to run, so a try can only aim: at the count before the save seen most often
        so far over every run of the test. A try killed inside or after the save adds its run's exact count
        to those seen; one killed before the save shows that its run made more calls, and the next try aims
        that much higher; until a kill lands exactly on call j. Each try hits with the probability of the
        commonest count (about 0.4 for write, whose count spreads over about three values; 1 for the other
        calls), so TRIES tries all miss with probability about 0.6^TRIES."""
        name, line = self.window[j]
        in_window = count_of(name, self.window[:j + 1])
        where = f"kill at save call {j} ({line[:100]})"
        before = self.commonest_count_before(name)
        for _ in range(TRIES):
            directory, calls = self.killed_run(f"save_{j:04d}", name, before + in_window)
            if calls is None:
                return [f"{where}: the run was not killed there"]
            start = save_start(calls)
            if start is None:  # killed before the save: this run made at least that many calls before it
                before += in_window
                continue
            with self.runs_lock:
                self.counts_before[name][count_of(name, calls[:start])] += 1
            before = self.commonest_count_before(name)
            if len(calls) - 1 == start + j and call_text(calls[-1][1], directory) == call_text(line, self.traced_dir):
                return self.recover(directory, where)
        with self.runs_lock:
            seen = dict(self.counts_before[name])
        return [f"{where}: none of {TRIES} tries was killed at that call ({name} calls before the save, "
                f"with the runs that made them: {seen})"]

    def kill_anywhere(self, index, name, ordinal):
        directory, calls = self.killed_run(f"sample_{index:05d}", name, ordinal)
        where = f"kill at traced call {index}"
        if calls is None:
            return [f"{where}: the run was not killed"]
        return self.recover(directory, f"{where} ({calls[-1][1][:100]})")

    def test_kill_at_every_call_of_a_save(self):
        if shutil.which("strace") is None:
            self.fail("strace is not installed (tools/install-deps.sh installs it)")
        probe = subprocess.run(["strace", "-o", os.devnull, "true"], capture_output=True, text=True)
        self.assertEqual(probe.returncode, 0, "strace cannot trace here (is ptrace permitted?): " + probe.stderr)
        started = time.monotonic()

        reference_dir = os.path.join(self.tmp.name, "uninterrupted")
        self.run_ok(train_command(reference_dir), "uninterrupted run")
        self.reference = checkpoint_tensors(reference_dir, STEPS)
        self.reference_steps = ledger_steps(reference_dir)

        self.traced_dir = os.path.join(self.tmp.name, "traced")
        log = self.traced_dir + ".strace"
        self.run_ok(strace_command(log) + train_command(self.traced_dir), "traced run")
        calls = traced_calls(log)
        first, self.window = save_window(calls)
        self.counts_before = {name: collections.Counter([count_of(name, calls[:first])]) for name, _ in self.window}
        last = first + len(self.window) - 1
        ordinals, seen = [], {}
        for name, _ in calls:
            seen[name] = seen.get(name, 0) + 1
            ordinals.append(seen[name])
        samples = spread(range(0, first), SAMPLES_BEFORE) + spread(range(last + 1, len(calls)), SAMPLES_AFTER)

        jobs = [(self.kill_in_save, (j,)) for j in range(len(self.window))]
        jobs += [(self.kill_anywhere, (i, calls[i][0], ordinals[i])) for i in samples]
        failures = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            for result in pool.map(lambda job: job[0](*job[1]), jobs):
                failures += result
        kinds = sorted({name for name, _ in self.window})
        varied = {name: dict(sorted(seen.items())) for name, seen in self.counts_before.items() if len(seen) > 1}
        print(f"{len(calls)} traced calls in the run; the save of step {KILLED_SAVE} to the fsync of its ledger line "
              f"is {len(self.window)} calls ({', '.join(kinds)}), each killed; {len(samples)} kills sampled "
              f"outside it; {len(jobs)} kills recovered ({type(self).runs} killed runs with the retries that aimed them) "
              f"in {time.monotonic() - started:.0f} s; calls before the save that varied, with the runs that made "
              f"them: {varied or 'none'}", file=sys.stderr)
        self.assertEqual(failures, [])


if __name__ == "__main__":
    TOUCHSTONE = os.path.abspath(sys.argv.pop(1))
    unittest.main()
