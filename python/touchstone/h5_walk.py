"""Reads an HDF5 file once in a child process before the package's readers touch it, so that a file the
HDF5 library cannot read safely is a ValueError naming it instead of a dead Python process.

HDF5 1.10 (the library h5py uses on Debian) trusts the structure of the files it reads: one flipped byte
in the global heap that holds string attributes makes it read out of bounds (SIGSEGV, SIGABRT) or loop
forever, and damaged attribute or datatype messages overflow its own buffers. No checksum covers that
metadata. The C++ reader guards against the same thing the same way (common/h5_walk.h): a child process
opens the file and reads everything in it — every group, every attribute (strings included), every
dataset's values — and if the child dies by a signal, fails or does not finish in time (60 s plus 1 s
per 10 MB), the file is refused. A clean walk means the reader's own calls, a subset of the walk's on
the same bytes, cannot crash either.

The child is a fresh interpreter (`python -c ... walk_file(PATH)`), not a fork: forking a process
that holds torch's threads, a CUDA context or HDF5's own state is unsafe, and fork does not exist on
every platform. A file that walked cleanly is remembered for the life of the process by its identity
(device, inode, size, modification and change times), so opening it again costs nothing.
python/README.md "Damaged files" says why this, and not a port of the C++ heap check, guards the package.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from typing import Any, Set, Tuple

# The child's exit status when HDF5 failed to list an object's attributes or a group's links: what it did
# not list the walk did not read, yet a reader can still open it by name (common/h5_walk.cpp).
LISTING_FAILED = 4
MAX_DEPTH = 64               # a group linked into itself must not make the walk endless
MAX_OBJECTS = 4_000_000
SLICE_BYTES = 64 << 20       # a dataset's values are read this much at a time, not held whole
# A walk slower than this floor plus 1 s per 10 MB is stuck in a damaged structure (reading proceeds at
# far more than 10 MB/s); the floor leaves room for starting the interpreter on a loaded machine.
MIN_SECONDS = 60

_walked: Set[Tuple[int, ...]] = set()
# No exit handlers in the child (os._exit): a damaged file can leave h5py in any state.
_CHILD = "import os, sys\nfrom touchstone.h5_walk import walk_file\nos._exit(walk_file(sys.argv[1]))\n"


def _identity(status: os.stat_result) -> Tuple[int, ...]:
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)


def check_in_child_process(path: str) -> None:
    """Raises ValueError naming `path` when reading the whole file crashes, fails or hangs the HDF5
    library in a child process. A missing, non-regular or non-HDF5 file passes: the reader says what is
    wrong with it, with h5py's reason."""
    try:
        status = os.stat(path)
    except (OSError, ValueError):
        return
    if not stat.S_ISREG(status.st_mode) or _identity(status) in _walked:
        return
    limit = MIN_SECONDS + status.st_size // 10_000_000
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, environment.get("PYTHONPATH")) if p)
    try:
        result = subprocess.run([sys.executable, "-c", _CHILD, path], env=environment,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, timeout=limit)
    except subprocess.TimeoutExpired:
        raise ValueError(f"{path}: damaged HDF5 file (reading it did not finish within {limit} s)") from None
    except (OSError, ValueError, TypeError) as e:  # TypeError: no sys.executable (an embedded interpreter)
        raise ValueError(f"{path}: cannot start the process that checks the file "
                         f"({getattr(e, 'strerror', None) or e})") from None
    if result.returncode < 0:
        raise ValueError(f"{path}: damaged HDF5 file (the HDF5 library crashed reading it: signal "
                         f"{-result.returncode})")
    if result.returncode == LISTING_FAILED:
        raise ValueError(f"{path}: damaged HDF5 file (the HDF5 library cannot list the attributes or links "
                         "of an object, which it could still open by name)")
    if result.returncode != 0:
        raise ValueError(f"{path}: damaged HDF5 file (the HDF5 library failed reading it: status "
                         f"{result.returncode})")
    _walked.add(_identity(status))


# -- the child ----------------------------------------------------------------------------------------

class _ListingFailed(Exception):
    pass


# What h5py raises for a file it reads but refuses (the reader reports those itself).
_REFUSALS = (OSError, KeyError, ValueError, TypeError, RuntimeError, NotImplementedError, IndexError)


def _walk(h5py: Any, item: Any, depth: int, budget: dict) -> None:
    budget["objects"] -= 1
    if depth > MAX_DEPTH or budget["objects"] < 0:
        return
    try:
        address = h5py.h5o.get_info(item.id).addr
    except _REFUSALS:
        address = None
    if address is not None:
        if address in budget["visited"]:
            return  # a hard link to an object already walked
        budget["visited"].add(address)
    try:
        names = list(item.attrs.keys())
    except _REFUSALS:
        raise _ListingFailed() from None
    for name in names:
        for read in (lambda: item.attrs[name], lambda: item.attrs.get_id(name).dtype, lambda: name in item.attrs):
            try:
                read()
            except _REFUSALS:
                pass
    try:
        _ = "touchstone walk: no such attribute" in item.attrs  # walks every attribute message
    except _REFUSALS:
        pass
    if isinstance(item, h5py.Group):
        try:
            children = list(item.keys())
        except _REFUSALS:
            raise _ListingFailed() from None
        for name in children:
            try:
                child = item.get(name)
            except _REFUSALS:
                continue
            if child is not None:
                _walk(h5py, child, depth + 1, budget)
        return
    if isinstance(item, h5py.Dataset):
        try:
            _read_values(item, budget)
        except _REFUSALS:
            pass


def _read_values(dataset: Any, budget: dict) -> None:
    shape = dataset.shape
    if shape is None:  # a null dataspace holds nothing
        return
    item_bytes = max(int(dataset.dtype.itemsize), 1)
    count = 1
    for dim in shape:
        count *= int(dim)
    if count * item_bytes > budget["dataset_bytes"]:
        return  # the reader refuses a dataset larger than the file can hold
    if not shape:
        dataset[()]
        return
    row_bytes = max(count // max(int(shape[0]), 1), 1) * item_bytes
    step = max(SLICE_BYTES // row_bytes, 1)
    for start in range(0, int(shape[0]), step):
        dataset[start:start + step]


def walk_file(path: str) -> int:
    """The child: 0 when the walk finished, whatever h5py refused along the way."""
    import h5py

    try:
        file = h5py.File(path, "r")
    except _REFUSALS:
        return 0
    # Uncompressed values take at least their size in the file; allow compression up to 8x.
    budget = {"objects": MAX_OBJECTS, "visited": set(), "dataset_bytes": 8 * os.path.getsize(path) + (64 << 20)}
    try:
        _walk(h5py, file, 0, budget)
    except _ListingFailed:
        return LISTING_FAILED
    finally:
        try:
            file.close()
        except _REFUSALS:
            pass
    return 0

