"""Checkpoint save and load throughput (MB/s) for a larger model at 1 and 8 ranks, next to a plain
sequential write (dd, fsync'ed) and read of a file of the same size on the same disk, in one run.

A save is: gather every shard to world rank 0, write the HDF5 file with a checksum per tensor, sync,
write the manifest (a second pass over the file for its checksum), rename, update latest.json. A load
is: verify the manifest and file size, read every tensor and verify its checksum, verify the whole-file
checksum; every rank reads the full tensors and keeps its shards. The throughputs are the ones the
trainer prints ("saved ...", "resumed from ..."), timed inside the run.

Usage: /usr/bin/python3 bench/bench_checkpoint.py [--touchstone build/tools/touchstone] [--dir DIR]
"""
import argparse
import os
import re
import subprocess
import tempfile
import time

MODEL = ["model.vocab_size=16384", "model.hidden_size=768", "model.num_layers=4", "model.num_heads=12",
         "model.num_kv_heads=4", "model.ffn_hidden_size=2048", "model.seq_length=16",
         "train.global_batch_size=8", "train.micro_batch_size=1"]
LAYOUTS = {1: [], 8: ["parallel.tp=2", "parallel.pp=2", "parallel.dp=2"]}


def launcher(ranks):
    return ["mpirun", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else []) + ["-np", str(ranks)]


def train(touchstone, ranks, directory, steps, *extra):
    sets = []
    for item in MODEL + LAYOUTS[ranks] + [f"train.steps={steps}"]:
        sets += ["--set", item]
    out = subprocess.run([*launcher(ranks), touchstone, "train", *sets, "--checkpoint-dir", directory, *extra],
                         capture_output=True, text=True, check=True).stdout
    return out


def dd_write_read(directory, megabytes):
    path = os.path.join(directory, "sequential.bin")
    start = time.monotonic()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={megabytes}", "conv=fsync"],
                   capture_output=True, check=True)
    write = megabytes * 1.048576 / (time.monotonic() - start)
    start = time.monotonic()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], capture_output=True, check=True)
    read = megabytes * 1.048576 / (time.monotonic() - start)
    os.remove(path)
    return write, read


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--touchstone", default="build/tools/touchstone")
    parser.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temporary one)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        size_mb = None
        for ranks in LAYOUTS:
            directory = os.path.join(tmp, f"ranks{ranks}")
            saved = re.search(r"saved \S+ \(([\d.]+) MB in ([\d.]+) s, (\d+) MB/s\)",
                              train(args.touchstone, ranks, directory, 1))
            loaded = re.search(r"loaded and verified ([\d.]+) MB in ([\d.]+) s, (\d+) MB/s",
                               train(args.touchstone, ranks, directory, 2, "--resume"))
            size_mb = float(saved.group(1))
            rows.append((ranks, size_mb, float(saved.group(2)), float(saved.group(1)) / float(saved.group(2)),
                         float(loaded.group(2)), float(loaded.group(1)) / float(loaded.group(2))))
        write, read = dd_write_read(tmp, int(size_mb))
    print("| ranks | checkpoint MB | save s | save MB/s | load s | load MB/s | save / dd write | load / dd read |")
    print("|---|---|---|---|---|---|---|---|")
    for ranks, mb, save_s, save_rate, load_s, load_rate in rows:
        print(f"| {ranks} | {mb:.1f} | {save_s:.2f} | {save_rate:.0f} | {load_s:.2f} | {load_rate:.0f} | "
              f"{save_rate / write:.2f} | {load_rate / read:.2f} |")
    print(f"\nplain sequential file on the same disk: dd write (conv=fsync) {write:.0f} MB/s, dd read {read:.0f} MB/s "
          f"({int(size_mb)} MiB)")


if __name__ == "__main__":
    main()
