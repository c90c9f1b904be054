"""One flipped byte anywhere in the metadata of an HDF5 file never crashes `touchstone`: for every flip
of a sweep, the exit status is 0, 1 or 2 (never a signal, never a hang), and a status 2 comes with one
line on stderr.

- A small golden file, read by `touchstone diff`: every 7th byte of its first 4 KiB (superblock, root
  group, B-trees, local heaps) as the golden file; as the golden file and as the candidate, every byte
  of the headers of its global heap collection and of each object in it (the strings of its
  attributes), and of the heap ID by which the first attribute points into it. HDF5 1.10 reads a
  damaged heap or heap ID out of bounds or loops forever, so Touchstone checks them before HDF5 does
  (common/h5_vlen_check.h).
- A checkpoint, resumed: every 56th byte of its first 4 KiB and every byte of the first 32 of its
  global heap. The whole-file checksum refuses them all before HDF5 opens the file.

Usage: test_h5_flips.py PATH_TO_TOUCHSTONE   (standard library only)
"""
import concurrent.futures
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

TOUCHSTONE = None
SMALL = ["--set", "model.hidden_size=16", "--set", "model.ffn_hidden_size=32", "--set", "model.seq_length=16"]
WORKERS = 2


def run(*args):
    try:
        return subprocess.run([TOUCHSTONE, *args], capture_output=True, text=True, errors="replace", timeout=30)
    except subprocess.TimeoutExpired:
        return None


def heap_headers(data, heap):
    """The offsets of the bytes of the global heap collection at `heap` that HDF5 parses: its header
    (signature, version, size) and each object's header (index, references, size), up to the free
    space (addresses and lengths of 8 bytes, as Touchstone writes)."""
    size = struct.unpack_from("<Q", data, heap + 8)[0]
    offsets = list(range(heap, heap + 16))
    position = 16
    while position + 16 <= size:
        index, _, _, object_size = struct.unpack_from("<HHIQ", data, heap + position)
        offsets += range(heap + position, heap + position + 16)
        if index == 0:
            break
        position += 16 + (object_size + 7) // 8 * 8
    return offsets


def flipped_copy(source, offset, target):
    with open(source, "rb") as f:
        data = bytearray(f.read())
    data[offset] ^= 0xFF
    with open(target, "wb") as f:
        f.write(data)


class FlipSweep(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def check_sweep(self, offsets, attempt):
        """attempt(offset) runs touchstone on a copy with that byte flipped and returns its results; each
        must be an exit status of 0, 1 or 2 (with one line on stderr for 2)."""
        with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
            outcomes = list(pool.map(attempt, sorted(set(offsets))))
        failures = []
        for offset, result in ((offset, result) for offset, results in outcomes for result in results):
            if result is None:
                failures.append(f"byte {offset}: no exit within 30 s")
            elif result.returncode not in (0, 1, 2):
                failures.append(f"byte {offset}: status {result.returncode}")
            elif result.returncode == 2 and len(result.stderr.strip().splitlines()) != 1:
                failures.append(f"byte {offset}: status 2 without one line: {result.stderr.strip()[-300:]}")
        if failures:
            self.fail(f"{len(failures)} failures over {len(outcomes)} flips:\n" + "\n".join(failures[:20]))

    def test_golden_file_read_by_diff(self):
        golden = os.path.join(self.dir.name, "golden.h5")
        made = run("golden", *SMALL, "--set", "train.steps=1", "--out", golden)
        self.assertEqual(made.returncode, 0, made.stderr)
        with open(golden, "rb") as f:
            data = f.read()
        heap = data.find(b"GCOL")
        self.assertGreater(heap, 0)
        reference = data.find(struct.pack("<Q", heap))  # a heap ID: length (4 bytes), address, index (4)
        self.assertGreater(reference, 0)
        in_both_roles = {*heap_headers(data, heap), *range(reference - 4, reference + 12)}

        def attempt(offset):
            damaged = os.path.join(self.dir.name, f"flip_{offset}.h5")
            flipped_copy(golden, offset, damaged)
            results = [run("diff", damaged, golden)]
            if offset in in_both_roles:
                results.append(run("diff", golden, damaged))
            os.remove(damaged)
            return offset, results

        self.check_sweep([*range(0, 4096, 7), *in_both_roles], attempt)

    def test_checkpoint_resumed(self):
        saved = os.path.join(self.dir.name, "saved")
        made = run("train", *SMALL, "--set", "train.steps=1", "--checkpoint-dir", saved)
        self.assertEqual(made.returncode, 0, made.stderr)
        state = os.path.join("step_00000001", "state.h5")
        with open(os.path.join(saved, state), "rb") as f:
            heap = f.read().find(b"GCOL")
        self.assertGreater(heap, 0)
        offsets = [*range(0, 4096, 56), *range(heap, heap + 32)]

        def attempt(offset):
            copy = os.path.join(self.dir.name, f"flip_{offset}")
            shutil.copytree(saved, copy)
            flipped_copy(os.path.join(saved, state), offset, os.path.join(copy, state))
            result = run("train", *SMALL, "--set", "train.steps=1", "--checkpoint-dir", copy, "--resume")
            shutil.rmtree(copy)
            return offset, [result]

        self.check_sweep(offsets, attempt)


if __name__ == "__main__":
    TOUCHSTONE = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=1)
