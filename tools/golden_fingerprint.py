#!/usr/bin/python3
"""Prints one SHA-256 per golden (or any HDF5) file over its content: every group, dataset and
attribute by path, with dtype, shape and raw bytes. The `generator` attribute (version and git
commit) and HDF5's object timestamps are left out, so two files written by the same computation
at different commits fingerprint the same. Used to prove a restructuring left the numbers alone:

  /usr/bin/python3 tools/golden_fingerprint.py golden_a.h5 golden_b.h5
"""
import hashlib
import sys

import h5py
import numpy as np

IGNORED_ATTRIBUTES = {"generator"}


def attribute_bytes(value):
    if isinstance(value, (bytes, str)):
        return value.encode() if isinstance(value, str) else value
    array = np.asarray(value)
    if array.dtype.kind == "O":
        return repr(array.tolist()).encode()
    return array.dtype.str.encode() + repr(array.shape).encode() + array.tobytes()


def fingerprint(path):
    digest = hashlib.sha256()

    def add_attributes(name, obj):
        for key in sorted(obj.attrs.keys()):
            if key in IGNORED_ATTRIBUTES:
                continue
            digest.update(f"@{name}:{key}=".encode())
            digest.update(attribute_bytes(obj.attrs[key]))

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            data = obj[()]
            array = np.asarray(data)
            digest.update(f"D {name} {array.dtype.str} {array.shape}\n".encode())
            digest.update(array.tobytes() if array.dtype.kind != "O" else repr(array.tolist()).encode())
        else:
            digest.update(f"G {name}\n".encode())
        add_attributes(name, obj)

    with h5py.File(path, "r") as f:
        add_attributes("/", f)
        f.visititems(visit)
    return digest.hexdigest()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: golden_fingerprint.py FILE.h5 [FILE.h5 ...]")
    for file_path in sys.argv[1:]:
        print(f"{fingerprint(file_path)}  {file_path}")
