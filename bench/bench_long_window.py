#!/usr/bin/env python3
"""Long windows: step time and peak memory of the FP64 trainer at T = 512 ... 32,768, and the step's
FLOP rate against OpenBLAS DGEMM on the step's own GEMM shapes, measured side by side in one run.

Every case trains the bench model (bench/step_config.json) on the built-in data with `touchstone
train`: step 1 is the warm-up (it also records the activation arena's layout), the later steps' printed
times are the measurement, and the peak resident memory of the whole process comes from the kernel
(wait4's ru_maxrss). The built-in data lays its documents out relative to the window (24 windows:
runs of 2- and 3-token documents, windows filled by one document, short and medium ones; see
data/builtin_acceptance.cpp), so a case with one window per step sees a different kind of window at
every step: the 8192 x 1 case times windows 1 to 8, the FLOPs are counted per step from that step's
skipped tile share, and the rate is the timed steps' FLOPs over their time. The DGEMM rate is measured
in a child process on the same OpenBLAS library the binary links, on the forward and backward GEMMs of
the 512 x 8 case's linear layers and logits (their shapes, transposes and beta as the trainer calls
them), right before and right after every case: a shared machine's speed drifts within minutes, so each
case is compared with the mean of the two around it. --rounds N repeats the chosen cases N times, one
report per round; --markdown prints each as a table for docs/BENCHMARKS.md instead of a line per case.
Each step is also split into its linear layers' and logits' GEMMs and the rest (attention, the
elementwise loops, the optimizer): bench/dgemm_timer.c, compiled here with `cc` and preloaded into the
trainer, times every DGEMM larger than an attention tile product.

    OPENBLAS_CORETYPE=SkylakeX /usr/bin/python3 bench/bench_long_window.py [--markdown] [--cases "512 x 8; 8192 x 1"] [--rounds N]
"""

import argparse
import ctypes
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "bench", "step_config.json")
TILE = 64  # kAttentionTile (kernels/attention_tiles.h)
STEP_LINE = re.compile(r"^step (\d+)/\d+ \|.*\| ([0-9.]+) s \|.*attention tiles ([0-9.]+)% skipped")

# (name, window T, windows per step, document masking, timed steps after the warm-up, what they see):
# 512 x 16 and 8192 x 1 hold the same tokens per step.
CASES = [
    ("512 x 8", 512, 8, True, 3, "built-in windows 8-31"),
    ("512 x 16", 512, 16, True, 3, "built-in windows 16-63"),
    ("8192 x 1", 8192, 1, True, 8, "built-in windows 1-8"),
    ("8192 x 1, one document", 8192, 1, False, 2, "document masking off: plain causal"),
    ("32768 x 1", 32768, 1, True, 1, "built-in window 1: documents of 2 and 3 tokens"),
]


def run_command(args, env=None):
    """Runs args, echoing its output to stderr as progress; returns (its output lines, the peak resident
    memory of the process in bytes, wait4's ru_maxrss). Raises with the output if it fails."""
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    for line in process.stdout:
        lines.append(line)
        print("  " + line.rstrip(), file=sys.stderr, flush=True)
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{''.join(lines)}")
    return lines, usage.ru_maxrss * 1024


def build_dgemm_timer(directory):
    """Compiles bench/dgemm_timer.c into directory; returns the shared library's path."""
    library = os.path.join(directory, "dgemm_timer.so")
    subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", os.path.join(ROOT, "bench", "dgemm_timer.c"),
                    "-o", library, "-ldl"], check=True)
    return library


def gemm_seconds_per_step(log_path, shapes, steps):
    """The seconds of the linear layers' and logits' GEMMs in each of `steps` steps, from dgemm_timer's
    log: consecutive groups of len(shapes) calls, each checked to be exactly one step's shapes."""
    with open(log_path) as f:
        calls = [line.split() for line in f]
    expected = sorted(shape[:3] for shape in shapes)
    if len(calls) != steps * len(shapes):
        raise RuntimeError(f"{log_path}: {len(calls)} GEMMs timed, expected {steps} steps x {len(shapes)}")
    seconds = []
    for s in range(steps):
        group = calls[s * len(shapes):(s + 1) * len(shapes)]
        if sorted(tuple(int(v) for v in call[:3]) for call in group) != expected:
            raise RuntimeError(f"{log_path}: the GEMMs of step {s + 1} are not the step's linear layers and logits")
        seconds.append(sum(float(call[3]) for call in group))
    return seconds


def run_case(binary, timer, seq, windows, masking, steps, shapes):
    """Trains the case with dgemm_timer preloaded; returns ([(seconds, skipped tile %, GEMM seconds) of
    each timed step], peak RSS bytes). shapes: gemm_shapes of the case's rows."""
    args = [binary, "train", "--config", CONFIG, "--set", f"model.seq_length={seq}",
            "--set", f"train.global_batch_size={windows}", "--set", f"train.micro_batch_size={windows}",
            "--set", f"train.steps={1 + steps}", "--set", f"data.document_masking={str(masking).lower()}"]
    log_path = os.path.join(os.path.dirname(timer), "dgemm_timer.log")
    env = dict(os.environ, LD_PRELOAD=timer, DGEMM_TIMER_LOG=log_path)
    lines, peak_rss = run_command(args, env)
    times, skipped = {}, {}
    for line in lines:
        m = STEP_LINE.match(line)
        if m:
            times[int(m.group(1))] = float(m.group(2))
            skipped[int(m.group(1))] = float(m.group(3))
    if sorted(times) != list(range(1, steps + 2)):
        raise RuntimeError("could not read the step lines:\n" + "".join(lines))
    gemm = gemm_seconds_per_step(log_path, shapes, 1 + steps)
    return [(times[s], skipped[s], gemm[s - 1]) for s in range(2, steps + 2)], peak_rss


def model_shape():
    with open(CONFIG) as f:
        m = json.load(f)["model"]
    return m


def gemm_shapes(m, rows):
    """(M, N, K, transpose A, transpose B, beta) of every GEMM of one step's linear layers and logits,
    row-major as kernels/cpu/linear.cpp calls them: forward y = x W^T (W stored [out, in]), backward
    dx = dy W and dW += dy^T x (into the main gradient), per layer and for the output layer."""
    h, heads, kv, f, v = m["hidden_size"], m["num_heads"], m["num_kv_heads"], m["ffn_hidden_size"], m["vocab_size"]
    d = h // heads
    layer = [(h, (heads + 2 * kv) * d), (heads * d, h), (h, 2 * f), (f, h)]  # (in, out)
    shapes = []
    for fan_in, fan_out in layer * m["num_layers"] + [(h, v)]:
        shapes += [(rows, fan_out, fan_in, False, True, 0.0), (rows, fan_in, fan_out, False, False, 0.0),
                   (fan_out, fan_in, rows, True, False, 1.0)]
    return shapes


def gemm_flops(shapes):
    """2MNK summed over gemm_shapes."""
    return sum(2 * m * n * k for m, n, k, *_ in shapes)


def step_flops(m, seq, windows, skipped_percent):
    """FLOPs counted for one step: 2MNK per GEMM of gemm_shapes, and attention's computed tile pairs at
    12 D per (query, key) entry (forward S and PV, backward dP, dV, dQ, dK; the backward's recomputed S
    is work done but not counted)."""
    gemm = gemm_flops(gemm_shapes(m, seq * windows))
    tiles = -(-seq // TILE)
    pairs = tiles * tiles * (1 - skipped_percent / 100) * windows * m["num_heads"] * m["num_layers"]
    attention = pairs * TILE * TILE * 12 * (m["hidden_size"] // m["num_heads"])
    return gemm + attention


def openblas(binary):
    output = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    for line in output.splitlines():
        if "blas" in line and "=>" in line:
            return os.path.realpath(line.split("=>")[1].split()[0])
    raise RuntimeError(f"{binary} links no BLAS library that ldd shows")


def dgemm_rate(library_path, shapes, rounds=3):
    """FLOP/s of cblas_dgemm on `shapes` (gemm_shapes: row-major, with the trainer's transposes and
    beta): best of `rounds`."""
    blas = ctypes.CDLL(library_path)
    c_int, c_double, pointer = ctypes.c_int, ctypes.c_double, ctypes.c_void_p
    blas.cblas_dgemm.argtypes = [c_int, c_int, c_int, c_int, c_int, c_int, c_double, pointer, c_int,
                                 pointer, c_int, c_double, pointer, c_int]
    row_major, no_trans, trans = 101, 111, 112
    rng = numpy.random.default_rng(1)
    # op(A)[M,K] is stored [K,M] when transposed, op(B)[K,N] is stored [N,K] when transposed.
    operands = [(rng.standard_normal((k, m) if ta else (m, k)), rng.standard_normal((n, k) if tb else (k, n)),
                 numpy.zeros((m, n))) for m, n, k, ta, tb, _ in shapes]
    flops = gemm_flops(shapes)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for (m, n, k, ta, tb, beta), (a, b, c) in zip(shapes, operands):
            blas.cblas_dgemm(row_major, trans if ta else no_trans, trans if tb else no_trans, m, n, k, 1.0,
                             a.ctypes.data, a.shape[1], b.ctypes.data, b.shape[1], beta, c.ctypes.data, n)
        best = min(best, time.perf_counter() - start)
    blas.openblas_get_config.restype = ctypes.c_char_p
    return flops / best, blas.openblas_get_config().decode(), int(blas.openblas_get_num_threads())


def dgemm_rate_in_child(library_path, shapes):
    """dgemm_rate in a process of its own: its operands (about 1 GB) never enter this process, whose
    children (the cases) would otherwise count the pages they inherit in their peak resident memory."""
    output = subprocess.run([sys.executable, os.path.abspath(__file__), "--dgemm-only", library_path,
                             json.dumps(shapes)], capture_output=True, text=True, check=True).stdout
    measured = json.loads(output)
    return measured["rate"], measured["config"], measured["threads"]


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--dgemm-only":  # dgemm_rate_in_child's process
        rate, config, threads = dgemm_rate(sys.argv[2], [tuple(shape) for shape in json.loads(sys.argv[3])])
        print(json.dumps(dict(rate=rate, config=config, threads=threads)))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--touchstone", default=os.path.join(ROOT, "build", "tools", "touchstone"))
    parser.add_argument("--cases", default="all", help="case names separated by ';' (default: all)")
    parser.add_argument("--markdown", action="store_true", help="print a table for docs/BENCHMARKS.md")
    parser.add_argument("--rounds", type=int, default=1, help="repeat the chosen cases this many times")
    args = parser.parse_args()
    m = model_shape()
    wanted = [name.strip() for name in args.cases.split(";")]
    chosen = [c for c in CASES if args.cases == "all" or c[0] in wanted]
    if not chosen:
        parser.error(f"no case named {args.cases!r}; the cases: {'; '.join(c[0] for c in CASES)}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    library = openblas(args.touchstone)
    shapes = gemm_shapes(m, 512 * 8)
    version = subprocess.run([args.touchstone, "--version"], capture_output=True, text=True).stdout.strip()
    timer_directory = tempfile.TemporaryDirectory()
    timer = build_dgemm_timer(timer_directory.name)
    for round_index in range(args.rounds):
        results, config, threads = {}, "", 0
        for name, seq, windows, masking, steps, what in chosen:
            print(f"{name}:", file=sys.stderr, flush=True)
            before, config, threads = dgemm_rate_in_child(library, shapes)
            case_shapes = gemm_shapes(m, seq * windows)
            timed, rss = run_case(args.touchstone, timer, seq, windows, masking, steps, case_shapes)
            after, _, _ = dgemm_rate_in_child(library, shapes)
            seconds = sum(t for t, _, _ in timed)
            gemm_seconds = sum(g for _, _, g in timed)
            flops = sum(step_flops(m, seq, windows, skipped) for _, skipped, _ in timed)
            linear_flops = len(timed) * gemm_flops(case_shapes)
            results[name] = dict(seq=seq, windows=windows, what=what, steps=len(timed), seconds=seconds / len(timed),
                                 rate=flops / seconds, flops=flops / len(timed), rss=rss,
                                 gemm_seconds=gemm_seconds / len(timed), gemm_rate=linear_flops / gemm_seconds,
                                 skipped=", ".join(f"{skipped:.1f}%" for _, skipped, _ in timed),
                                 each=", ".join(f"{t:.1f}" for t, _, _ in timed), dgemm=(before + after) / 2,
                                 dgemm_each=f"{before / 1e9:.1f}, {after / 1e9:.1f}")
        if args.rounds > 1:
            print(f"Round {round_index + 1} of {args.rounds}.")
            print()
        report(results, version, config, threads, args.markdown)
        print()


def report(results, version, config, threads, markdown):
    print(f"Measured {datetime.date.today()} with `{version}`; {len(os.sched_getaffinity(0))} cores; "
          f"OpenBLAS {threads} threads (`{config}`); each case one warm-up step, then its timed steps; DGEMM "
          "on the 512 x 8 step's GEMMs (same library, a child process) right before and after each case.")
    print()
    if markdown:
        print("| window T x windows | timed steps: what they see | tokens per step | attention tile pairs skipped | "
              "step s (each) | mean step s | FLOPs counted per step | GFLOP/s | DGEMM before, after GFLOP/s | "
              "of DGEMM | linear GEMMs s (GFLOP/s, of DGEMM) | rest s | peak RSS GB |")
        print("|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        if markdown:
            print(f"| {name} | {r['steps']}: {r['what']} | {r['seq'] * r['windows']:,} | {r['skipped']} | {r['each']} | "
                  f"{r['seconds']:.2f} | {r['flops'] / 1e9:.1f} G | {r['rate'] / 1e9:.1f} | {r['dgemm_each']} | "
                  f"{r['rate'] / r['dgemm']:.0%} | {r['gemm_seconds']:.2f} ({r['gemm_rate'] / 1e9:.1f}, "
                  f"{r['gemm_rate'] / r['dgemm']:.0%}) | {r['seconds'] - r['gemm_seconds']:.2f} | {r['rss'] / 1e9:.2f} |")
        else:
            print(f"{name}: {r['steps']} steps ({r['what']}), mean {r['seconds']:.2f} s (each {r['each']}), "
                  f"skipped {r['skipped']}, {r['flops'] / 1e9:.1f} GFLOPs counted a step, {r['rate'] / 1e9:.1f} "
                  f"GFLOP/s = {r['rate'] / r['dgemm']:.0%} of DGEMM ({r['dgemm_each']} GFLOP/s before, after); "
                  f"its linear GEMMs {r['gemm_seconds']:.2f} s at {r['gemm_rate'] / 1e9:.1f} GFLOP/s "
                  f"({r['gemm_rate'] / r['dgemm']:.0%} of DGEMM), the rest {r['seconds'] - r['gemm_seconds']:.2f} s; "
                  f"peak RSS {r['rss'] / 1e9:.2f} GB")
    print()
    if "512 x 8" in results:
        r = results["512 x 8"]
        print(f"512 x 8: the step runs at {r['rate'] / r['dgemm']:.0%} of the DGEMM rate measured around it "
              f"({r['rate'] / 1e9:.1f} / {r['dgemm'] / 1e9:.1f} GFLOP/s).")
    if "512 x 16" in results and "8192 x 1" in results:
        print(f"8192 x 1 against 512 x 16 (same tokens): {results['8192 x 1']['seconds'] / results['512 x 16']['seconds']:.2f}x "
              "the mean step time.")
    if "8192 x 1, one document" in results and "8192 x 1" in results:
        one, docs = results["8192 x 1, one document"], results["8192 x 1"]
        print(f"One document filling the 8192 window: {one['seconds'] / docs['seconds']:.2f}x the mean step time of the "
              f"built-in windows for {one['flops'] / docs['flops']:.2f}x their mean FLOPs counted.")

if __name__ == "__main__":
    main()
