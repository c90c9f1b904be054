"""`touchstone-attention-bench` (tools/attention_bench): it runs, its fingerprint is the same every
repetition and with 1 or 2 kernel threads (the attention's bits do not depend on the thread count),
its tile count is that of the mask (causal, and documents aligned to the 64-position tiles), and bad
input is refused with exit status 2 before anything is allocated.

Usage: test_attention_bench.py PATH_TO_TOUCHSTONE_ATTENTION_BENCH   (standard library only)
"""
import os
import re
import subprocess
import sys
import unittest

BENCH = None
REP = re.compile(r"^rep (\d+)/(\d+) \| forward [0-9.e-]+ s \| backward [0-9.e-]+ s \| total [0-9.e-]+ s \| "
                 r"fingerprint ([0-9a-f]{16})$")
TILES = re.compile(r"^tile pairs per forward: (\d+) computed, (\d+) skipped$")


def run(*args, threads=None):
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return subprocess.run([BENCH, *args], capture_output=True, text=True, timeout=120, env=env)


class AttentionBench(unittest.TestCase):
    def measure(self, *args, threads=None):
        """(fingerprints of the repetitions, (computed, skipped) tile pairs per forward)."""
        result = run(*args, threads=threads)
        self.assertEqual(result.returncode, 0, result.stderr + result.stdout)
        lines = result.stdout.strip().splitlines()
        reps = [REP.match(line) for line in lines[1:-1]]
        self.assertTrue(all(reps), lines)
        tiles = TILES.match(lines[-1])
        self.assertTrue(tiles, lines[-1])
        return [m.group(3) for m in reps], (int(tiles.group(1)), int(tiles.group(2)))

    def test_causal_window(self):
        # T = 130: 3 tiles (64, 64, 2) per side, 6 pairs on or below the diagonal and 3 above, per head.
        fingerprints, tiles = self.measure("--seq", "130", "--reps", "2")
        self.assertEqual(len(fingerprints), 2)
        self.assertEqual(fingerprints[0], fingerprints[1])
        self.assertEqual(tiles, (8 * 6, 8 * 3))

    def test_documents_on_tile_boundaries(self):
        # T = 256 in documents of 64: only the 4 diagonal pairs of each head's 16 hold a visible key.
        _, tiles = self.measure("--seq", "256", "--document", "64", "--reps", "1")
        self.assertEqual(tiles, (8 * 4, 8 * 12))

    def test_thread_count_changes_no_bit(self):
        args = ("--seq", "200", "--windows", "2", "--heads", "4", "--kv-heads", "2", "--reps", "1")
        one, _ = self.measure(*args, threads=1)
        two, _ = self.measure(*args, threads=2)
        self.assertEqual(one, two)

    def test_bad_input(self):
        for args, flag in [(("--kv-heads", "3"), "--kv-heads"), (("--seq", "0"), "--seq"),
                           (("--seq", "1048576", "--windows", "1024"), "--windows"),
                           (("--heads", "x"), "--heads")]:
            with self.subTest(args=args):
                result = run(*args)
                self.assertEqual(result.returncode, 2, result.stderr + result.stdout)
                self.assertEqual(result.stdout, "")
                self.assertIn(flag, result.stderr.strip().splitlines()[0])


if __name__ == "__main__":
    BENCH = sys.argv.pop(1)
    unittest.main()
