"""Python package: reading, converting and loading a 1B-parameter golden file, time and peak memory.

The script writes a synthetic FP64 golden file of a Llama-style model of about a billion parameters
(V 32000, H 2048, 16 query and 8 key/value heads, F 5632, T 2048, untied embeddings, 20 layers by
default: 1.07 B parameters, 8.6 GB) with h5py, one dataset at a time: the root attributes, /params/init
with every contract parameter (a small seeded random block repeated; the norm weights ones) and one
step's scalars (/steps/1: loss, num_loss_tokens, grad_norm, lr), which `touchstone export hf` needs to
accept the file. Then it measures, each in a fresh child process, one after the other:

  (a) raw h5py: every /params/init dataset read into memory, one at a time (the HDF5 floor), and the
      same once more after dropping the file from the page cache (posix_fadvise DONTNEED: the disk);
  (b) GoldenFile.init_params(): the package's reader;
  (c) iter_hf_tensors over it: Hugging Face names and layouts, every tensor made contiguous
      (np.ascontiguousarray), the copy a consumer that needs contiguous memory makes;
  (d) load_golden_into a float64 LlamaForCausalLM (built as tools/examples/hf_candidate.py does, outside
      the timed part): torch.no_grad copy_ into the model's parameters;
  (e) `touchstone export hf` (config.json and model.safetensors next to the golden file, synced);
  (a) again at the end, to show how much the floor moved during the run.

Every operation but the cold read starts with the whole file in the page cache (it is read through
first, 16 MiB at a time); the table says how much of it was there (mincore). For each: wall and CPU
time, parameter bytes per second, the peak RSS of the operation (VmHWM, reset through
/proc/self/clear_refs when the operation starts; for (e), ru_maxrss of the process), the RSS when it
started (the interpreter and its imports; for (d) the model too), and peak - start - the largest tensor
(the embedding, V x H x 8 bytes): close to 0 when the operation holds about one tensor at a time.

The reference is one FP64 training step of the same model on one micro-batch of T = 2048 tokens,
estimated (far too slow to run here) as 6 x parameters x tokens FLOPs at the DGEMM rate measured in
the same run (numpy float64 4096 x 4096 matrix product, best of 3, before and after the reads; the
best of the two). Attention's T x T products would
add about 16%, so the estimate is a lower bound on the step and an upper bound on the fraction.

Usage (from the repository root, after a Release build):
  PYTHONPATH=python:build/python-deps /usr/bin/python3 bench/bench_python_package.py \\
      [--layers 20] [--dir /tmp] [--json out.json] [--markdown] [--keep]
"""
import argparse
import json
import os
import platform
import resource
import shutil
import struct
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for extra in (os.path.join(REPO, "build", "python-deps"), os.path.join(REPO, "python")):
    if os.path.isdir(extra) and extra not in sys.path:
        sys.path.insert(0, extra)

MODEL = {"vocab_size": 32000, "hidden_size": 2048, "num_heads": 16, "num_kv_heads": 8,
         "ffn_hidden_size": 5632, "seq_length": 2048, "tie_embeddings": False}
TOKENS = 2048  # one micro-batch of one window of seq_length tokens
GB = 1e9

# `touchstone config` of version 0.1.0, used only when the binary is not built.
DEFAULT_CONFIG = {
    "data": {"document_masking": True, "eos_loss": True, "eos_token": 1, "pad_token": 0,
             "source": "builtin:acceptance"},
    "envelope": {"floor": 1e-06, "k": 4.0},
    "model": {"attention_dropout": 0.0, "ffn_hidden_size": 176, "hidden_dropout": 0.0, "hidden_size": 64,
              "init_std": 0.02, "norm_eps": 1e-05, "num_heads": 4, "num_kv_heads": 2, "num_layers": 2,
              "rope_theta": 10000.0, "seq_length": 64, "tie_embeddings": False, "vocab_size": 256},
    "optim": {"beta1": 0.9, "beta2": 0.95, "clip_grad": 1.0, "decay_steps": 4, "eps": 1e-08, "lr": 0.001,
              "min_lr": 0.0001, "warmup_steps": 1, "weight_decay": 0.1},
    "parallel": {"distributed_optimizer": False, "dp": 1, "pp": 1, "schedule": "1f1b",
                 "sequence_parallel": False, "stage_layers": [], "tp": 1},
    "precision": "fp64",
    "train": {"global_batch_size": 8, "grad_accumulation_fusion": True, "loss_normalization": "global_token_mean",
              "micro_batch_size": 2, "seed": 1234, "steps": 3},
}

OPERATIONS = {
    "raw": "(a) raw h5py read of /params/init",
    "cold": "(a) the same, file dropped from the page cache first",
    "golden": "(b) GoldenFile.init_params()",
    "hf": "(c) iter_hf_tensors + np.ascontiguousarray",
    "load": "(d) load_golden_into(LlamaForCausalLM float64)",
    "export": "(e) touchstone export hf",
    "raw_again": "(a) raw h5py read, again at the end",
    "dgemm": "DGEMM rate (numpy float64 4096 x 4096)",
}


def progress(text):
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# -- the child: one operation, its time and its peak memory -------------------------------------------

def status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak():
    """Sets VmHWM to the current RSS (Linux 4.0+); False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def page_cache_fraction(path):
    """The fraction of the file's pages in the page cache (mincore), or None where it cannot be asked."""
    import ctypes
    import mmap

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        size, page = os.path.getsize(path), mmap.PAGESIZE
        pages = (size + page - 1) // page
        with open(path, "rb") as f:
            address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
        if address in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            vector = (ctypes.c_ubyte * pages)()
            if libc.mincore(address, size, vector) != 0:
                return None
            return sum(1 for v in bytes(vector) if v & 1) / pages
        finally:
            libc.munmap(address, size)
    except (OSError, AttributeError):
        return None


def set_page_cache(path, cached):
    """Reads the file through (16 MiB at a time, so RSS does not grow) to bring it into the page cache,
    or drops its pages from the cache (posix_fadvise DONTNEED; the file was synced after writing)."""
    with open(path, "rb", buffering=0) as f:
        if cached:
            buffer = bytearray(16 << 20)
            while f.readinto(buffer):
                pass
        else:
            os.fsync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


class Meter:
    """Counts the tensors and bytes an operation produces and prints progress every 2 GB."""

    def __init__(self, total_bytes):
        self.total, self.bytes, self.count, self.next_report = total_bytes, 0, 0, 2 * GB

    def add(self, array):
        self.bytes += array.nbytes
        self.count += 1
        if self.bytes >= self.next_report:
            progress(f"  {self.bytes / GB:.1f} of {self.total / GB:.1f} GB")
            self.next_report += 2 * GB


def dgemm(repeats=3):
    import numpy as np

    n = 4096
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    np.dot(a, b)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.dot(a, b)
        times.append(time.perf_counter() - start)
    flops = 2.0 * n ** 3
    return {"n": n, "seconds": times, "gflops_best": flops / min(times) / 1e9,
            "gflops_median": flops / sorted(times)[len(times) // 2] / 1e9}


def child(mode, path):
    if mode == "dgemm":
        return dgemm()
    import h5py
    import numpy as np
    from touchstone.golden import GoldenFile

    extra = {}
    model = None
    if mode == "load":
        import torch
        from transformers import LlamaForCausalLM
        from touchstone.hf import llama_config, load_golden_into

        start = time.perf_counter()
        with GoldenFile(path) as golden:  # as tools/examples/hf_candidate.py builds it
            model = LlamaForCausalLM(llama_config(golden.config)).to(torch.float64)
        extra["model_build_s"] = time.perf_counter() - start
        extra["model_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
        progress(f"  model built in {extra['model_build_s']:.1f} s ({extra['model_bytes'] / GB:.2f} GB)")
    elif mode == "hf":
        from touchstone.hf import iter_hf_tensors

    with h5py.File(path, "r") as f:
        meter = Meter(sum(d.size * d.dtype.itemsize for d in f["params/init"].values()))
    set_page_cache(path, cached=mode != "cold")
    cached = page_cache_fraction(path)
    start_rss = status_kb("VmRSS") * 1024
    reset = reset_peak()
    cpu = cpu_seconds()
    start = time.perf_counter()
    if mode in ("raw", "cold"):
        with h5py.File(path, "r") as f:
            group = f["params/init"]
            for name in group:
                tensor = group[name][()]
                meter.add(tensor)
                del tensor
    elif mode == "golden":
        with GoldenFile(path) as golden:
            for name, tensor in golden.init_params():
                meter.add(tensor)
                del tensor
    elif mode == "hf":
        with GoldenFile(path) as golden:
            for name, tensor in iter_hf_tensors(golden.init_params(), golden.model):
                contiguous = np.ascontiguousarray(tensor)
                meter.add(contiguous)
                del tensor, contiguous
    elif mode == "load":
        with GoldenFile(path) as golden:
            read = golden.params

            def counted(step):  # counts what load_golden_into reads, holding nothing itself
                for name, tensor in read(step):
                    meter.add(tensor)
                    yield name, tensor
                    del tensor

            golden.params = counted
            load_golden_into(model, golden)
        # The values arrived: the file's embedding is a seeded random block, the fresh model's is not.
        extra["embedding_abs_sum"] = float(model.model.embed_tokens.weight.abs().sum())
    else:
        raise SystemExit(f"unknown mode {mode}")
    seconds = time.perf_counter() - start
    cpu = cpu_seconds() - cpu
    peak = status_kb("VmHWM") * 1024 if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"seconds": seconds, "cpu_seconds": cpu, "bytes": meter.bytes, "tensors": meter.count,
            "page_cache": cached, "start_rss": start_rss, "peak_rss": peak, "peak_reset": reset, **extra}


# -- the parent -----------------------------------------------------------------------------------------

def contract(model):
    from touchstone.golden import parameter_names, parameter_shape

    return [(name, parameter_shape(model, name)) for name in parameter_names(model)]


def full_config(touchstone, layers):
    try:
        config = json.loads(subprocess.run([touchstone, "config"], capture_output=True, text=True,
                                           check=True).stdout)
        source = f"`{touchstone} config`"
    except (OSError, subprocess.CalledProcessError, ValueError):
        config, source = json.loads(json.dumps(DEFAULT_CONFIG)), "the script's copy of the defaults"
    config["model"].update(MODEL, num_layers=layers)
    config["train"]["steps"] = 1
    config["precision"] = "fp64"
    return config, source


def write_golden(path, config):
    """The synthetic golden file, one dataset in memory at a time."""
    import h5py
    import numpy as np

    params = contract(config["model"])
    rng = np.random.default_rng(1234)
    block = rng.standard_normal(1 << 17) * float(config["model"]["init_std"])  # 1 MiB of values
    start = time.perf_counter()
    written = 0
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "touchstone-golden"
        f.attrs["format_version"] = np.int64(1)
        f.attrs["precision"] = "fp64"
        f.attrs["config"] = json.dumps(config, sort_keys=True)
        init = f.create_group("params/init")
        for index, (name, shape) in enumerate(params):
            if name.endswith("layernorm.weight"):
                tensor = np.ones(shape)
            else:  # a different rotation of the block for every tensor, so no two tensors are equal
                tensor = np.resize(np.roll(block, index), shape)
            init.create_dataset(name, data=tensor)
            written += tensor.nbytes
            del tensor
            if name.endswith("linear_fc2.weight") or index == len(params) - 1:
                rate = written / GB / (time.perf_counter() - start)
                progress(f"  wrote {name}: {written / GB:.2f} GB, {rate:.2f} GB/s")
        step = f.create_group("steps/1")
        step["loss"] = np.float64(np.log(config["model"]["vocab_size"]))
        step["num_loss_tokens"] = np.int64(config["train"]["global_batch_size"] * config["model"]["seq_length"])
        step["grad_norm"] = np.float64(1.0)
        step["lr"] = np.float64(config["optim"]["lr"])
    os.sync()
    return time.perf_counter() - start


def run_child(mode, path):
    progress(f"{OPERATIONS[mode]} ...")
    argv = [sys.executable, os.path.abspath(__file__), "--child", "raw" if mode == "raw_again" else mode,
            "--golden", path]
    out = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    if mode == "dgemm":
        progress(f"  {result['gflops_best']:.1f} GFLOP/s best of {len(result['seconds'])}, "
                 f"{result['gflops_median']:.1f} median")
    else:
        progress(f"  {result['seconds']:.1f} s, peak RSS {result['peak_rss'] / GB:.2f} GB")
    return result


def safetensors_header(path):
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header


def run_export(touchstone, path, out_dir):
    """`touchstone export hf` from a warm page cache; its peak RSS is the process's ru_maxrss (wait4)."""
    progress(f"{OPERATIONS['export']} ...")
    set_page_cache(path, cached=True)
    cached = page_cache_fraction(path)
    start = time.perf_counter()
    process = subprocess.Popen([touchstone, "export", "hf", "--golden", path, "--out", out_dir],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"touchstone export hf failed ({process.returncode}):\n{output}")
    tensors = safetensors_header(os.path.join(out_dir, "model.safetensors"))
    nbytes = sum(end - begin for begin, end in (t["data_offsets"] for t in tensors.values()))
    progress(f"  {seconds:.1f} s, peak RSS {usage.ru_maxrss * 1024 / GB:.2f} GB")
    return {"seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime, "bytes": nbytes,
            "tensors": len(tensors), "page_cache": cached, "start_rss": None, "peak_rss": usage.ru_maxrss * 1024,
            "peak_reset": False, "output": output.strip()}


def export_available(touchstone):
    try:
        return subprocess.run([touchstone, "export", "hf", "--help"], capture_output=True).returncode == 0
    except OSError:
        return False


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


HEAD = ["operation", "wall s", "CPU s", "GB/s", "file in page cache", "peak RSS GB", "RSS at start GB",
        "peak - start - largest tensor GB", "of one step"]


def table(rows, markdown):
    body = []
    for row in rows:
        body.append([row["label"], f"{row['seconds']:.1f}", f"{row['cpu_seconds']:.1f}", f"{row['gb_per_s']:.2f}",
                     "-" if row["page_cache"] is None else f"{100 * row['page_cache']:.0f}%",
                     f"{row['peak_rss_gb']:.2f}", "-" if row["start_rss_gb"] is None else f"{row['start_rss_gb']:.2f}",
                     f"{round(row['peak_above_one_tensor_gb'], 2) + 0.0:+.2f}", f"{100 * row['fraction_of_step']:.1f}%"])
    if markdown:
        lines = ["| " + " | ".join(HEAD) + " |", "|---|" + "---:|" * (len(HEAD) - 1)]
        return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in body])
    widths = [max(len(r[i]) for r in [HEAD] + body) for i in range(len(HEAD))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in [HEAD] + body)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=20, help="decoder layers (default 20: 1.07 B parameters)")
    parser.add_argument("--touchstone", default=os.path.join(REPO, "build", "tools", "touchstone"))
    parser.add_argument("--dir", default="/tmp", help="where the golden file is written (default /tmp)")
    parser.add_argument("--json", help="write the results to this JSON file too")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--keep", action="store_true", help="keep the golden file (and the export) afterwards")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--golden", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.golden)))
        return

    import numpy as np

    config, config_source = full_config(args.touchstone, args.layers)
    params = contract(config["model"])
    count = sum(int(np.prod(shape)) for _, shape in params)
    nbytes = 8 * count
    largest_name, largest_shape = max(params, key=lambda p: int(np.prod(p[1])))
    largest = 8 * int(np.prod(largest_shape))
    m = config["model"]
    print(f"model: V {m['vocab_size']}, H {m['hidden_size']}, {m['num_layers']} layers, NH {m['num_heads']}, "
          f"NKV {m['num_kv_heads']}, F {m['ffn_hidden_size']}, T {m['seq_length']}, untied embeddings "
          f"(config from {config_source})")
    print(f"parameters: {count:,} ({count / 1e9:.3f} B), {len(params)} tensors, {nbytes / GB:.2f} GB in float64; "
          f"largest {largest_name} {list(largest_shape)}: {largest / 1e6:.0f} MB")
    sys.stdout.flush()

    has_export = export_available(args.touchstone)
    try:
        version = subprocess.run([args.touchstone, "--version"], capture_output=True, text=True).stdout.strip()
    except OSError:
        version = None
    need = nbytes * (2 if has_export else 1) + 2 * GB
    free = shutil.disk_usage(args.dir).free
    if free < need:
        raise SystemExit(f"{args.dir}: {free / GB:.1f} GB free, the run needs {need / GB:.1f} GB")
    path = os.path.join(args.dir, f"touchstone-bench-{m['num_layers']}l-{os.getpid()}.h5")
    out_dir = path[:-3] + "-hf"
    results, rates = {}, []
    try:
        progress(f"writing {path} ({nbytes / GB:.2f} GB of parameters)")
        write_s = write_golden(path, config)
        file_bytes = os.path.getsize(path)
        progress(f"  written and synced in {write_s:.1f} s ({file_bytes / GB:.2f} GB on disk)")
        rates.append(run_child("dgemm", path))
        for mode in ("raw", "cold", "golden", "hf", "load"):
            results[mode] = run_child(mode, path)
        if has_export:
            results["export"] = run_export(args.touchstone, path, out_dir)
            if not args.keep:
                shutil.rmtree(out_dir, ignore_errors=True)
        else:
            progress(f"{args.touchstone} has no `export hf`: (e) not measured")
        results["raw_again"] = run_child("raw_again", path)
        rates.append(run_child("dgemm", path))
    finally:
        if not args.keep:
            if os.path.exists(path):
                os.remove(path)
            shutil.rmtree(out_dir, ignore_errors=True)

    gflops = max(r["gflops_best"] for r in rates)
    step_flops = 6.0 * count * TOKENS
    step_s = step_flops / (gflops * 1e9)
    rows = []
    for mode, result in results.items():
        if result["bytes"] != nbytes:
            raise SystemExit(f"{mode}: produced {result['bytes']} parameter bytes, the model has {nbytes}")
        start_rss = result["start_rss"]
        rows.append({
            "operation": mode, "label": OPERATIONS[mode], "seconds": result["seconds"],
            "gb_per_s": nbytes / GB / result["seconds"], "peak_rss_gb": result["peak_rss"] / GB,
            "start_rss_gb": None if start_rss is None else start_rss / GB,
            "peak_above_one_tensor_gb": (result["peak_rss"] - (start_rss or 0) - largest) / GB,
            "fraction_of_step": result["seconds"] / step_s,
            **{k: v for k, v in result.items() if k not in ("seconds", "bytes", "peak_rss", "start_rss")},
        })
    print()
    print(table(rows, args.markdown))
    print()
    print(f"One FP64 training step (forward + backward) on {TOKENS} tokens, estimated: 6 x {count / 1e9:.3f} B x "
          f"{TOKENS} = {step_flops / 1e12:.1f} TFLOP at {gflops:.1f} GFLOP/s = {step_s:.0f} s. DGEMM (numpy "
          f"float64 4096 x 4096, best of 3, before and after the reads): "
          f"{', '.join(format(r['gflops_best'], '.1f') for r in rates)} "
          f"GFLOP/s (medians {', '.join(format(r['gflops_median'], '.1f') for r in rates)}).")
    print(f"Versions: {version or 'touchstone not built'}, numpy {np.__version__}, h5py "
          f"{__import__('h5py').__version__} (HDF5 {__import__('h5py').version.hdf5_version}).")
    print(f"Golden file: written and synced in {write_s:.1f} s ({nbytes / GB / write_s:.2f} GB/s); "
          f"{file_bytes / GB:.2f} GB on disk. Machine: {cpu_model()}, {os.cpu_count()} cores "
          f"(nproc {len(os.sched_getaffinity(0))}).")
    if "load" in results:
        print(f"(d) built its model in {results['load']['model_build_s']:.1f} s before the timed part "
              f"(LlamaForCausalLM float32 init, then .to(float64)).")
    if not has_export:
        print(f"(e) not measured: {args.touchstone} has no `export hf` subcommand.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": m, "parameters": count, "parameter_bytes": nbytes, "tensors": len(params),
                       "largest_tensor": {"name": largest_name, "shape": list(largest_shape), "bytes": largest},
                       "golden_file_bytes": file_bytes, "write_seconds": write_s, "dgemm": rates,
                       "step_estimate": {"tokens": TOKENS, "flops": step_flops, "gflops": gflops,
                                         "seconds": step_s},
                       "machine": {"cpu": cpu_model(), "cores": os.cpu_count(),
                                   "nproc": len(os.sched_getaffinity(0))},
                       "touchstone_version": version, "export_available": has_export, "results": rows}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
