"""A golden file with one flipped byte in its string-attribute heap is a ValueError naming it, never a
dead Python process.

HDF5 1.10 follows the heap ID and length of a variable-length string attribute without checking them
(tests/cli/test_h5_flips.py sweeps the same bytes for the C++ reader): flips there crashed h5py with
SIGSEGV or made it loop forever. The flipped files are opened in a subprocess, so that a crash fails
this test instead of killing pytest.
"""

import json
import struct
import subprocess
import sys

# Opens every file named on the command line with GoldenFile, two at a time, and prints one JSON line
# per file: "ok", or the ValueError's message. Anything else is printed as it is and fails the test.
READER = r"""
import concurrent.futures, json, sys
import touchstone.h5_walk
touchstone.h5_walk.MIN_SECONDS = 10  # a stuck walk is given up on sooner than in use (60 s)
from touchstone import GoldenFile

def attempt(path):
    try:
        with GoldenFile(path) as golden:
            golden.expected(golden.steps[0]).loss
        return path, "ok"
    except ValueError as e:
        return path, "ValueError: " + str(e)
    except Exception as e:
        return path, f"{type(e).__name__}: {e}"

with concurrent.futures.ThreadPoolExecutor(2) as pool:
    for path, outcome in pool.map(attempt, sys.argv[1:]):
        print(json.dumps([path, outcome]), flush=True)
"""


def heap_offsets(data, objects):
    """The bytes HDF5 parses of the global heap collection (its header and the headers of its first
    `objects` objects) and the heap ID by which an attribute points into it (8-byte addresses)."""
    heap = data.find(b"GCOL")
    assert heap > 0
    size = struct.unpack_from("<Q", data, heap + 8)[0]
    offsets = list(range(heap, heap + 16))
    position = 16
    while position + 16 <= size and objects > 0:
        index, _, _, object_size = struct.unpack_from("<HHIQ", data, heap + position)
        offsets += range(heap + position, heap + position + 16)
        if index == 0:
            break
        position += 16 + (object_size + 7) // 8 * 8
        objects -= 1
    reference = data.find(struct.pack("<Q", heap))  # length (4 bytes), collection address, index (4)
    assert reference > 0
    return offsets + list(range(reference - 4, reference + 12))


def test_flipped_heap_bytes_are_value_errors(golden_files, tmp_path):
    data = golden_files["default"].read_bytes()
    paths = []
    for offset in sorted(set(heap_offsets(data, objects=2))):
        damaged = bytearray(data)
        damaged[offset] ^= 0xFF
        path = tmp_path / f"flip_{offset}.h5"
        path.write_bytes(damaged)
        paths.append(str(path))
    result = subprocess.run([sys.executable, "-c", READER, *paths], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"the reader died (status {result.returncode}): {result.stderr[-500:]}"
    outcomes = dict(json.loads(line) for line in result.stdout.splitlines())
    assert sorted(outcomes) == sorted(paths)
    wrong = {p: o for p, o in outcomes.items() if o != "ok" and not o.startswith(f"ValueError: {p}: ")}
    assert not wrong, wrong
    assert any(o.startswith("ValueError") for o in outcomes.values())  # the flips were seen
