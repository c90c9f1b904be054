"""The output-path policy and the signal policy of every command (docs/config.md#outputs).

Every flag that names an output file or directory refuses, before any work, with exit status 2 and one
line naming the flag and the path: an empty path, a missing or read-only directory, a directory, a FIFO,
a device (a socket when not root: mknod needs root), a symbolic link. What was at the path is still
there afterwards, and no temporary file is left. A FIFO made at the path while the command runs is not
replaced either, a write failure is one line with status 2, SIGTERM and SIGINT during `golden` leave
no temporary file and exit 143 and 130, and the README's `supervise` example runs as written from a
fresh directory.

Usage: test_outputs.py PATH_TO_TOUCHSTONE   (standard library only)
"""
import contextlib
import os
import re
import resource
import shlex
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import unittest

TOUCHSTONE = None
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCALING_CSV = os.path.join(REPO, "docs", "examples", "scaling_acceptance.csv")
SMALL = ["--set", "model.hidden_size=16", "--set", "model.ffn_hidden_size=32", "--set", "model.seq_length=16"]
ONE_STEP = [*SMALL, "--set", "train.steps=1"]
IS_ROOT = os.geteuid() == 0


def run(args, cwd=None, env=None, preexec_fn=None):
    return subprocess.run([TOUCHSTONE, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          preexec_fn=preexec_fn, timeout=300)


def temporaries(directory):
    return [os.path.join(d, f) for d, _, files in os.walk(directory) for f in files if ".tmp." in f]


def kind(path):
    """What is at `path`, without following a link: 'file', 'dir', 'fifo', 'char', 'socket', 'link', None."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    for test, name in [(stat.S_ISLNK, "link"), (stat.S_ISREG, "file"), (stat.S_ISDIR, "dir"),
                       (stat.S_ISFIFO, "fifo"), (stat.S_ISCHR, "char"), (stat.S_ISSOCK, "socket")]:
        if test(mode):
            return name
    return "other"


class Shared:
    """Inputs the output flags need: a golden file (diff) and a checkpoint directory with a ledger."""
    dir = None
    golden = None
    ledger_dir = None

    @classmethod
    def make(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.golden = os.path.join(cls.dir.name, "g.h5")
        cls.ledger_dir = os.path.join(cls.dir.name, "ckpt")
        for args in (["golden", *ONE_STEP, "--out", cls.golden],
                     ["train", *ONE_STEP, "--checkpoint-dir", cls.ledger_dir]):
            result = run(args)
            assert result.returncode == 0, result.stderr


# Every flag that names an output file: (command, flag, the arguments with the path PATH).
FILE_FLAGS = [
    ("golden", "--out", lambda p: ["golden", *ONE_STEP, "--out", p]),
    ("golden", "--timeline", lambda p: ["golden", *ONE_STEP, "--out", os.path.join(Shared.dir.name, "x.h5"),
                                        "--timeline", p]),
    ("train", "--out", lambda p: ["train", *ONE_STEP, "--out", p]),
    ("train", "--timeline", lambda p: ["train", *ONE_STEP, "--timeline", p]),
    ("diff", "--json", lambda p: ["diff", Shared.golden, Shared.golden, "--json", p]),
    ("diff", "--report", lambda p: ["diff", Shared.golden, Shared.golden, "--report", p]),
    ("plan scaling", "--svg", lambda p: ["plan", "scaling", "--csv", SCALING_CSV, "--svg", p]),
    ("ledger check", "--json", lambda p: ["ledger", "check", Shared.ledger_dir, "--json", p]),
    ("supervise", "--report", lambda p: ["supervise", "--report", p, "--", "true"]),
    ("commbench", "--json", lambda p: ["commbench", "-b", "8", "-e", "8", "--json", p]),
]
# Every flag that names an output directory.
DIRECTORY_FLAGS = [
    ("train", "--checkpoint-dir", lambda p: ["train", *ONE_STEP, "--checkpoint-dir", p]),
    ("check parallel", "--workdir", lambda p: ["check", "parallel", *SMALL, "--workdir", p]),
    ("supervise", "--checkpoint-dir", lambda p: ["supervise", "--checkpoint-dir", p, "--", "true"]),
    ("export hf", "--out", lambda p: ["export", "hf", "--golden", Shared.golden, "--out", p]),
]


@contextlib.contextmanager
def read_only_directory(parent):
    """A directory nothing can be created in: a read-only tmpfs as root (chmod does not stop root), a
    directory without write permission otherwise."""
    path = os.path.join(parent, "read_only")
    os.mkdir(path)
    if IS_ROOT:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", path], check=True)
    else:
        os.chmod(path, 0o555)
    try:
        yield path
    finally:
        if IS_ROOT:
            subprocess.run(["umount", path], check=True)
        else:
            os.chmod(path, 0o755)
        os.rmdir(path)


class OutputPaths(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.root = self.dir.name

    def tearDown(self):
        self.dir.cleanup()

    def assert_refused(self, args, flag, path, what_is_there, message=None):
        result = run(args)
        label = " ".join(shlex.quote(a) for a in args)
        self.assertEqual(result.returncode, 2, label + "\n" + result.stderr + result.stdout)
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, label + "\n" + result.stderr)
        self.assertIn(flag, lines[0])
        self.assertIn(path if path else "''", lines[0])
        if message:
            self.assertIn(message, lines[0])
        self.assertEqual(kind(path), what_is_there, label + ": what was at the path changed")
        self.assertEqual(temporaries(self.root), [], label)

    def special_file(self, name):
        """A character device when root (a node of its own: the real /dev/null is never an output in
        a test), else a socket: either is not a regular file."""
        path = os.path.join(self.root, name)
        if IS_ROOT:
            os.mknod(path, 0o644 | stat.S_IFCHR, os.makedev(1, 3))
            return path, "char", "character device"
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(path)
        sock.close()
        return path, "socket", "socket"

    def test_every_output_file_flag_refuses_what_is_not_a_regular_file(self):
        for command, flag, make_args in FILE_FLAGS:
            with self.subTest(command=command, flag=flag):
                fifo = os.path.join(self.root, "fifo")
                os.mkfifo(fifo)
                self.assert_refused(make_args(fifo), flag, fifo, "fifo", "is a FIFO")
                os.unlink(fifo)

                special, special_kind, name = self.special_file("special")
                self.assert_refused(make_args(special), flag, special, special_kind, "is a " + name)
                os.unlink(special)

                target = os.path.join(self.root, "target")
                with open(target, "w") as f:
                    f.write("kept")
                link = os.path.join(self.root, "link")
                os.symlink(target, link)
                self.assert_refused(make_args(link), flag, link, "link", "is a symbolic link")
                with open(target) as f:
                    self.assertEqual(f.read(), "kept")
                os.unlink(link)
                os.unlink(target)

                directory = os.path.join(self.root, "a_directory")
                os.mkdir(directory)
                self.assert_refused(make_args(directory), flag, directory, "dir", "is a directory")
                os.rmdir(directory)

    def test_every_output_file_flag_refuses_a_path_it_cannot_create(self):
        for command, flag, make_args in FILE_FLAGS:
            with self.subTest(command=command, flag=flag):
                self.assert_refused(make_args(""), flag, "", None, "empty path")
                missing = os.path.join(self.root, "no_such_directory", "out")
                self.assert_refused(make_args(missing), flag, missing, None, "does not exist")
                with read_only_directory(self.root) as read_only:
                    inside = os.path.join(read_only, "out")
                    self.assert_refused(make_args(inside), flag, inside, None, "cannot write in directory")

    def test_every_output_directory_flag_refuses_what_is_not_a_directory(self):
        for command, flag, make_args in DIRECTORY_FLAGS:
            with self.subTest(command=command, flag=flag):
                self.assert_refused(make_args(""), flag, "", None, "empty path")
                regular = os.path.join(self.root, "regular")
                open(regular, "w").close()
                self.assert_refused(make_args(regular), flag, regular, "file", "is not a directory")
                # A path whose parent is a regular file cannot be created either (ENOTDIR).
                under_file = os.path.join(regular, "ckpt")
                self.assert_refused(make_args(under_file), flag, under_file, None, "is not a directory")
                os.unlink(regular)
                fifo = os.path.join(self.root, "fifo")
                os.mkfifo(fifo)
                self.assert_refused(make_args(fifo), flag, fifo, "fifo", "is not a directory")
                os.unlink(fifo)
                with read_only_directory(self.root) as read_only:
                    inside = os.path.join(read_only, "ckpt")
                    self.assert_refused(make_args(inside), flag, inside, None, "cannot write in directory")

    def test_config_naming_a_directory_is_bad_input(self):
        result = run(["golden", "--config", self.root, "--out", os.path.join(self.root, "g.h5")])
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(result.stderr.strip().splitlines(),
                         [f"touchstone: error: --config {self.root}: is a directory, not a config file"])

    def test_a_write_failure_is_one_line_with_status_2(self):
        # A file size limit makes the write fail (EFBIG) for root and others alike, like a full disk.
        def limit_file_size():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

        out = os.path.join(self.root, "diff.json")
        result = run(["diff", Shared.golden, Shared.golden, "--json", out], preexec_fn=limit_file_size)
        self.assertEqual(result.returncode, 2, result.stderr)
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertIn(out + ": cannot write", lines[0])
        self.assertEqual(os.listdir(self.root), [])


def start_long_golden(directory, out):
    """`golden` with more --trace output than a pipe holds: after its first step line it cannot finish
    until its output is read, so it is surely in the middle of writing `out` when it is signalled."""
    process = subprocess.Popen([TOUCHSTONE, "golden", *SMALL, "--set", "train.steps=300", "--trace",
                                "--out", out], cwd=directory, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    for line in process.stdout:
        if line.startswith("step 1/"):
            return process
    raise AssertionError("no step line: " + process.stderr.read())


def finish(process):
    """Reads what is left of the output (so that the process can go on) and waits for it."""
    stdout, stderr = process.communicate(timeout=300)
    return process.returncode, stderr


class InFlight(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.out = os.path.join(self.dir.name, "golden.h5")

    def tearDown(self):
        self.dir.cleanup()

    def test_a_signal_during_golden_removes_the_temporary_file(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            with self.subTest(signal=sig.name):
                process = start_long_golden(self.dir.name, self.out)
                self.assertEqual(temporaries(self.dir.name), [f"{self.out}.tmp.{process.pid}"])
                process.send_signal(sig)
                status, stderr = finish(process)
                self.assertEqual(status, 128 + sig, stderr)
                self.assertEqual(os.listdir(self.dir.name), [])

    def test_a_fifo_made_while_golden_runs_is_not_replaced(self):
        process = start_long_golden(self.dir.name, self.out)
        os.mkfifo(self.out)
        status, stderr = finish(process)
        self.assertEqual(status, 2, stderr)
        self.assertEqual(stderr.strip().splitlines(),
                         [f"touchstone: error: {self.out}: is a FIFO; only a regular file is replaced"])
        self.assertEqual(kind(self.out), "fifo")
        self.assertEqual(temporaries(self.dir.name), [])


class ReadmeExample(unittest.TestCase):
    def test_supervise_example_runs_as_written_in_a_fresh_directory(self):
        with open(os.path.join(REPO, "README.md")) as f:
            readme = f.read()
        block = re.search(r"^build/tools/touchstone supervise .*?# kill, recover$", readme, re.M | re.S)
        self.assertIsNotNone(block, "the README's supervise example is gone")
        command = block.group(0).split("#")[0].replace("\\\n", " ")
        ledger = re.search(r"^build/tools/touchstone ledger check ckpt", readme, re.M)
        self.assertIsNotNone(ledger, "the README's ledger example is gone")
        with tempfile.TemporaryDirectory() as fresh:
            os.makedirs(os.path.join(fresh, "build", "tools"))
            os.symlink(os.path.abspath(TOUCHSTONE), os.path.join(fresh, "build", "tools", "touchstone"))
            env = dict(os.environ, OMPI_MCA_rmaps_base_oversubscribe="1")
            if IS_ROOT:
                env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
            for text in (command, ledger.group(0)):
                result = subprocess.run(shlex.split(text), cwd=fresh, env=env, capture_output=True, text=True,
                                        timeout=600)
                self.assertEqual(result.returncode, 0, text + "\n" + result.stderr[-3000:])
            self.assertTrue(os.path.isfile(os.path.join(fresh, "ckpt", "report.json")))
            self.assertTrue(os.path.isfile(os.path.join(fresh, "ckpt", "report.svg")))


if __name__ == "__main__":
    TOUCHSTONE = os.path.abspath(sys.argv.pop(1))
    Shared.make()
    try:
        unittest.main(verbosity=2)
    finally:
        Shared.dir.cleanup()
