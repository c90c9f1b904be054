#!/usr/bin/python3
"""Times one FP64 training step of Touchstone against the same step in PyTorch float64, on the CPU.

Both sides run in one invocation of this script, back to back on the same machine, and the ratio
of their step times is reported. Measuring side by side matters because the machine is noisy:
absolute step times drift from one run to the next, so only ratios measured in one run are
compared. --rounds R repeats the pair R times, alternating which side goes first, and pools the
step times.

What is timed, on both sides, is one optimizer update of the config in bench/step_config.json:
forward and backward of the objective over every micro-batch of the global batch, the global
gradient norm, clipping and the AdamW update, all in float64.

  Touchstone: `touchstone train --set train.steps=N+1` prints each step's wall time; step 1 is the
              warm-up and is dropped.
  PyTorch:    tests/python/torch_reference.py (model, cross entropy, AdamW) with gradient
              accumulation over the same micro-batches, timed with time.perf_counter around the
              whole update. Step 1 is the warm-up; steps 2 .. N+1 are timed.

Both sides do literally the same computation: PyTorch starts from the initial parameters of a
golden file that Touchstone writes for the bench config (train.steps=1), and trains on the global
batches Touchstone uses at steps 1 .. N+1 (taken from a second golden file of a tiny model with
the same data settings, so the batches are identical but the file stays small). The script checks
that the step-1 loss and gradient norm of PyTorch agree with the golden file to 1e-10 relative,
and that the loss of every later step agrees with the one Touchstone prints (6 decimals); it
exits with status 1 if any check fails.

PyTorch runs with its default intra-op thread count (--torch-threads changes it) and both sides
use OpenBLAS with its default thread count; the report lists them with the CPU model and core count.

Usage (Debian's /usr/bin/python3, which has torch, numpy and h5py), from the repository root:
    /usr/bin/python3 bench/bench_step.py [--touchstone build/tools/touchstone] [--steps N]
                                         [--micro-batch-size M] [--rounds R] [--markdown]
                                         [--torch-threads N] [--config FILE] [--workdir DIR]
--markdown prints a section to paste into docs/BENCHMARKS.md instead of the plain report.
Exit status: 0 measured, 1 the two sides disagree, 2 touchstone failed.
"""

import argparse
import ctypes
import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile
import importlib.util
import time

import h5py
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # keep the source tree free of __pycache__


def load_reference_module(name):
    """A module of the PyTorch reference the cross-check tests use (tests/python/), loaded from its
    file, so that the benchmark times exactly the reference that is tested."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO_ROOT, "tests", "python", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


load_reference_module("dropout_masks")  # imported by torch_reference
load_reference_module("megatron_scheduler")  # imported by torch_reference
ref = load_reference_module("torch_reference")

# The step-1 loss and gradient norm of both sides must agree to this relative error (both are
# FP64 and differ only in summation order; see tests/python/crosscheck.py for the reasoning).
RELATIVE_TOLERANCE = 1e-10
# Touchstone prints the loss of later steps with 6 decimals.
PRINTED_LOSS_TOLERANCE = 1e-6

# A tiny model with the bench config's data settings: its golden file records the same batches as
# the bench model would, at a few MiB instead of hundreds per step.
TINY_MODEL = ["model.hidden_size=8", "model.num_layers=1", "model.num_heads=2",
              "model.num_kv_heads=1", "model.ffn_hidden_size=8"]

# A progress line: "step 2/4 | ... | loss 5.556075 | ... | 0.017 s | 27168 tok/s | ETA 00:00:00".
# The fields are found by name, so columns may be added to the line.
STEP_LINE = re.compile(r"^step (\d+)/\d+ \|")
LOSS_FIELD = re.compile(r"\| loss (\S+) \|")
SECONDS_FIELD = re.compile(r"\| (\d+(?:\.\d*)?) s \|")


class CheckFailed(Exception):
    """The two sides did not compute the same thing."""


# ----------------------------------------------------------------------------------------------
# Touchstone
# ----------------------------------------------------------------------------------------------

def run_touchstone(binary, args):
    """Runs the binary with `args` and returns its stdout; raises RuntimeError if it fails."""
    result = subprocess.run([binary] + args, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{binary} {' '.join(args)} failed with status {result.returncode}:\n"
                           f"{result.stdout}{result.stderr}")
    return result.stdout


def config_args(config_path, micro_batch_size, steps, extra=()):
    args = ["--config", config_path, "--set", f"train.micro_batch_size={micro_batch_size}",
            "--set", f"train.steps={steps}"]
    for override in extra:
        args += ["--set", override]
    return args


def time_touchstone(binary, config_path, micro_batch_size, steps):
    """Trains 1 + steps steps; returns (step times of steps 2.., printed losses of all steps)."""
    args = ["train"] + config_args(config_path, micro_batch_size, steps + 1)
    output = run_touchstone(binary, args)
    times, losses = {}, {}
    for line in output.splitlines():
        step, loss, seconds = (STEP_LINE.match(line), LOSS_FIELD.search(line),
                               SECONDS_FIELD.search(line))
        if step and loss and seconds:
            losses[int(step.group(1))] = float(loss.group(1))
            times[int(step.group(1))] = float(seconds.group(1))
    if sorted(times) != list(range(1, steps + 2)):
        raise RuntimeError(f"could not read the step lines of touchstone train:\n{output}")
    return [times[s] for s in range(2, steps + 2)], [losses[s] for s in range(1, steps + 2)]


# ----------------------------------------------------------------------------------------------
# PyTorch
# ----------------------------------------------------------------------------------------------

def torch_step(params, state, batch, step, settings):
    """One update as Touchstone runs it: forward and backward of every micro-batch, accumulating
    the gradients, then global norm, clipping and AdamW. Returns (loss, grad norm, new params).

    With a single micro-batch this is torch_reference.train_step; with several it splits the
    objective the way Touchstone does (each micro-batch's share of it is differentiated
    separately and the gradients are summed), so both sides hold the same activations in memory.
    """
    shape, mbs = settings.shape, settings.micro_batch_size
    leaves = {name: p.detach().requires_grad_(True) for name, p in params.items()}
    targets = batch["targets"]
    windows = targets.shape[0]
    num_micro_batches = windows // mbs
    num_loss_tokens = max(int((targets != ref.IGNORE_INDEX).sum()), 1)
    loss = 0.0
    for j in range(num_micro_batches):
        rows = slice(j * mbs, (j + 1) * mbs)
        logits = ref.forward(leaves, batch["tokens"][rows], batch["position_ids"][rows],
                             batch["document_ids"][rows], shape, settings.document_masking)
        token_losses = ref.token_cross_entropy(logits, targets[rows])            # [mbs, T]
        if settings.loss_normalization == "global_token_mean":
            share = token_losses.sum() / num_loss_tokens
        else:  # per_microbatch_mean: this micro-batch's own mean, one of num_micro_batches
            share = ref.objective(token_losses, targets[rows], "per_microbatch_mean",
                                  mbs) / num_micro_batches
        share.backward()
        loss += float(share)
    grads = {name: leaf.grad for name, leaf in leaves.items()}

    norm = ref.global_grad_norm(grads)
    clip = float(settings.optim["clip_grad"])
    scale = min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0
    lr = ref.learning_rate(step, settings.optim)
    with torch.no_grad():
        clipped = {name: g * scale for name, g in grads.items()}
        new_params = ref.adamw_update(params, clipped, state, step, lr, settings.optim)
    return loss, norm, new_params


def relative_difference(a, b):
    return abs(a - b) / max(abs(b), 1e-300)


class TorchRun:
    """PyTorch's replay of Touchstone's run: parameters and AdamW state carried step to step."""

    def __init__(self, init_golden, batches_golden, steps):
        with h5py.File(init_golden, "r") as golden:
            self.settings = ref.Settings.from_config(ref.read_config(golden))
            self.init_params = ref.read_init_params(golden)
            self.golden_loss = float(golden["steps/1/loss"][()])
            self.golden_grad_norm = float(golden["steps/1/grad_norm"][()])
            first_batch = ref.read_batch(golden, 1)
        with h5py.File(batches_golden, "r") as golden:
            self.batches = [ref.read_batch(golden, s) for s in range(1, steps + 2)]
        for key, value in first_batch.items():
            if not torch.equal(value, self.batches[0][key]):
                raise CheckFailed(f"batch/{key} of step 1 differs between the two golden files")
        self.restart()

    def restart(self):
        """Back to the initial parameters and an empty optimizer state, before step 1."""
        self.params = self.init_params
        self.state = {}
        self.step = 0
        self.losses = []

    def run_step(self):
        """Runs the next update; returns (seconds, loss, grad norm)."""
        self.step += 1
        start = time.perf_counter()
        loss, norm, self.params = torch_step(self.params, self.state, self.batches[self.step - 1],
                                             self.step, self.settings)
        seconds = time.perf_counter() - start
        self.losses.append(loss)
        return seconds, loss, norm

    def warm_up(self):
        """Restarts and runs step 1, checking its loss and grad norm against the golden file.
        Returns (seconds, loss, relative loss difference, relative grad norm difference)."""
        self.restart()
        seconds, loss, norm = self.run_step()
        loss_difference = relative_difference(loss, self.golden_loss)
        norm_difference = relative_difference(norm, self.golden_grad_norm)
        if loss_difference > RELATIVE_TOLERANCE or norm_difference > RELATIVE_TOLERANCE:
            raise CheckFailed(f"step-1 loss {loss!r} or grad norm {norm!r} differs from the golden "
                              f"file ({self.golden_loss!r}, {self.golden_grad_norm!r}): relative "
                              f"differences {loss_difference:.2e} and {norm_difference:.2e} > "
                              f"{RELATIVE_TOLERANCE:.0e}")
        return seconds, loss, loss_difference, norm_difference


# ----------------------------------------------------------------------------------------------
# Machine facts
# ----------------------------------------------------------------------------------------------

def cpu_model():
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def openblas_facts(library_path):
    """(thread count, config string) of the OpenBLAS at `library_path`, in this environment."""
    try:
        library = ctypes.CDLL(library_path)
        library.openblas_get_config.restype = ctypes.c_char_p
        return int(library.openblas_get_num_threads()), library.openblas_get_config().decode()
    except (OSError, AttributeError):
        return None, "not OpenBLAS"


def torch_blas_library():
    """The BLAS shared library loaded into this process (by torch)."""
    torch.zeros(2, 2, dtype=torch.float64) @ torch.zeros(2, 2, dtype=torch.float64)
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "blas" in line.rsplit("/", 1)[-1]}
    return min(paths, key=len) if paths else None


def touchstone_blas_library(binary):
    """The BLAS library the dynamic linker resolves for the binary (via ldd)."""
    output = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    for line in output.splitlines():
        if "blas" in line and "=>" in line:
            return os.path.realpath(line.split("=>")[1].split()[0])
    return None


def machine_facts(binary, torch_threads_set):
    torch_blas = torch_blas_library()
    torch_blas_threads, torch_blas_config = openblas_facts(torch_blas) if torch_blas else (None, "")
    ts_blas = touchstone_blas_library(binary)
    ts_blas_threads, ts_blas_config = openblas_facts(ts_blas) if ts_blas else (None, "")
    version = run_touchstone(binary, ["--version"]).strip()
    return {
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)),
        "touchstone": version,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_threads_source": ("set by --torch-threads" if torch_threads_set
                                 else "its default here"),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "torch_blas": f"{os.path.realpath(torch_blas) if torch_blas else 'unknown'}",
        "torch_blas_threads": torch_blas_threads,
        "torch_blas_config": torch_blas_config,
        "touchstone_blas": ts_blas or "unknown",
        "touchstone_blas_threads": ts_blas_threads,
        "touchstone_blas_config": ts_blas_config,
        "thread_env": ", ".join(f"{k}={os.environ[k]}" for k in
                                ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
                                if k in os.environ) or "none set",
    }


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------

def summarize(times, tokens_per_step):
    median = statistics.median(times)
    return {"median": median, "min": min(times), "tokens_per_s": tokens_per_step / median,
            "all": times}


def timing_description(r):
    rounds = r["rounds"]
    each = f"1 warm-up + {r['steps']} timed steps per side"
    if rounds == 1:
        return each
    return (f"{rounds} rounds of {each}, alternating which side goes first "
            f"({rounds * r['steps']} timed steps per side in all)")


def plain_report(r):
    s, f = r["settings"], r["facts"]
    lines = [
        f"CPU training step, FP64: {r['config']} with micro_batch_size {s.micro_batch_size} "
        f"({r['micro_batches']} micro-batch(es) of B={r['windows']} windows x T={r['seq']})",
        f"{timing_description(r)}; tokens/s = B*T / median step time",
        "",
        f"{'implementation':<28}{'median s/step':>15}{'min s/step':>12}{'tokens/s':>11}",
    ]
    for name, t in (("Touchstone (FP64, OpenBLAS)", r["touchstone"]),
                    ("PyTorch float64", r["torch"])):
        lines.append(f"{name:<28}{t['median']:>15.3f}{t['min']:>12.3f}{t['tokens_per_s']:>11.0f}")
    lines += [
        "",
        f"ratio Touchstone/PyTorch: {r['ratio_median']:.2f} (median), {r['ratio_min']:.2f} (min)"
        f"  -> target 'no slower than PyTorch' {'MET' if r['ratio_median'] <= 1.0 else 'NOT met'}",
        f"ratio of the medians in each round: {', '.join(f'{x:.2f}' for x in r['round_ratios'])}",
        f"Touchstone step times: {', '.join(f'{t:.3f}' for t in r['touchstone']['all'])} s",
        f"PyTorch step times:    {', '.join(f'{t:.3f}' for t in r['torch']['all'])} s",
        "",
        f"step-1 loss: golden {r['golden_loss']:.15e}, PyTorch {r['torch_loss']:.15e} "
        f"(relative difference {r['loss_difference']:.1e}, tolerance {RELATIVE_TOLERANCE:.0e})",
        f"step-1 grad norm relative difference {r['norm_difference']:.1e}; "
        f"later steps' losses agree with Touchstone's printed ones to "
        f"{r['printed_difference']:.1e}",
        "",
        f"CPU: {f['cpu']}, {f['cores']} cores",
        f"{f['touchstone']}; BLAS {f['touchstone_blas']} "
        f"({f['touchstone_blas_threads']} threads; {f['touchstone_blas_config']})",
        f"PyTorch {f['torch']}: {f['torch_threads']} intra-op ({f['torch_threads_source']}) / "
        f"{f['torch_interop_threads']} inter-op threads; BLAS {f['torch_blas']} "
        f"({f['torch_blas_threads']} threads; "
        f"{f['torch_blas_config']})",
        f"thread environment variables: {f['thread_env']}",
    ]
    return "\n".join(lines)


def markdown_report(r):
    s, f = r["settings"], r["facts"]
    met = r["ratio_median"] <= 1.0
    lines = [
        f"### micro_batch_size {s.micro_batch_size} ({r['micro_batches']} micro-batch"
        f"{'es' if r['micro_batches'] > 1 else ''} per step)",
        "",
        f"Measured {datetime.date.today().isoformat()} with `{f['touchstone']}` and PyTorch "
        f"{f['torch']}; {timing_description(r)}. "
        f"Tokens/s is B x T = {r['windows'] * r['seq']} positions per step over the median "
        f"step time.",
        "",
        "| Implementation | Median s/step | Min s/step | Tokens/s |",
        "|---|---:|---:|---:|",
    ]
    for name, t in (("Touchstone (FP64, OpenBLAS)", r["touchstone"]),
                    ("PyTorch float64", r["torch"])):
        lines.append(f"| {name} | {t['median']:.3f} | {t['min']:.3f} | {t['tokens_per_s']:.0f} |")
    lines += [
        "",
        f"**Ratio Touchstone / PyTorch: {r['ratio_median']:.2f}** (median; {r['ratio_min']:.2f} "
        f"on the minimum). Target: Touchstone's step no slower than PyTorch's (ratio <= 1.00): "
        f"**{'met' if met else 'not met'}**.",
        "",
        *([f"Ratio of the medians in each round: "
           f"{', '.join(f'{x:.2f}' for x in r['round_ratios'])}.", ""]
          if r["rounds"] > 1 else []),
        f"Every timed step, in order (s): Touchstone "
        f"{', '.join(f'{t:.2f}' for t in r['touchstone']['all'])}; PyTorch "
        f"{', '.join(f'{t:.2f}' for t in r['torch']['all'])}.",
        "",
        f"Same computation: step-1 loss {r['torch_loss']:.12f} on both sides, relative difference "
        f"{r['loss_difference']:.1e} (grad norm {r['norm_difference']:.1e}); the losses of the "
        f"timed steps agree with Touchstone's printed ones to {r['printed_difference']:.1e}.",
        "",
        f"Machine: {f['cpu']}, {f['cores']} cores. Touchstone: OpenBLAS "
        f"{f['touchstone_blas_threads']} threads (`{f['touchstone_blas_config']}`). PyTorch: "
        f"{f['torch_threads']} intra-op thread(s) ({f['torch_threads_source']}), OpenBLAS "
        f"{f['torch_blas_threads']} threads (`{f['torch_blas_config']}`). Thread environment "
        f"variables: {f['thread_env']}.",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------

def display_path(path):
    """`path` relative to the repository root when it lies inside it."""
    relative = os.path.relpath(path, REPO_ROOT)
    return path if relative.startswith("..") else relative


def benchmark(args, workdir):
    binary = os.path.abspath(args.touchstone)
    config = os.path.abspath(args.config)
    mbs, steps = args.micro_batch_size, args.steps
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731

    log(f"writing golden files (initial parameters, batches) to {workdir}")
    init_golden = os.path.join(workdir, "bench_init.h5")
    batches_golden = os.path.join(workdir, "bench_batches.h5")
    run_touchstone(binary, ["golden"] + config_args(config, mbs, 1) + ["--out", init_golden])
    run_touchstone(binary, ["golden"] + config_args(config, mbs, steps + 1, TINY_MODEL)
                   + ["--out", batches_golden])
    run = TorchRun(init_golden, batches_golden, steps)
    settings = run.settings
    windows, seq = run.batches[0]["tokens"].shape
    if windows % settings.micro_batch_size != 0:
        raise CheckFailed("the global batch does not split into whole micro-batches")

    ts_times, torch_times, round_ratios, printed_difference = [], [], [], 0.0
    for round_index in range(args.rounds):
        log(f"round {round_index + 1}/{args.rounds}: PyTorch warm-up (step 1), checked against "
            f"the golden file")
        seconds, torch_loss, loss_difference, norm_difference = run.warm_up()
        log(f"  {seconds:.3f} s, loss {torch_loss:.15e} (golden {run.golden_loss:.15e}), "
            f"relative differences: loss {loss_difference:.1e}, grad norm {norm_difference:.1e}")

        # Odd rounds time PyTorch first, so that a slow drift of the machine favours neither side.
        torch_first = round_index % 2 == 1
        for side in (("torch", "touchstone") if torch_first else ("touchstone", "torch")):
            if side == "touchstone":
                log(f"  Touchstone: 1 warm-up + {steps} timed steps")
                ts_round, ts_losses = time_touchstone(binary, config, mbs, steps)
                times = ts_round
            else:
                log(f"  PyTorch: {steps} timed steps")
                torch_round = [run.run_step()[0] for _ in range(steps)]
                times = torch_round
            log(f"    {', '.join(f'{t:.3f}' for t in times)} s")
        ts_times += ts_round
        torch_times += torch_round
        round_ratios.append(statistics.median(ts_round) / statistics.median(torch_round))

        difference = max(abs(a - b) for a, b in zip(ts_losses, run.losses))
        if difference > PRINTED_LOSS_TOLERANCE:
            raise CheckFailed(f"losses differ between the sides: Touchstone printed {ts_losses}, "
                              f"PyTorch computed {run.losses}")
        printed_difference = max(printed_difference, difference)

    touchstone = summarize(ts_times, windows * seq)
    pytorch = summarize(torch_times, windows * seq)
    return {
        "config": display_path(config), "settings": settings, "steps": steps,
        "rounds": args.rounds, "round_ratios": round_ratios,
        "windows": windows, "seq": seq, "micro_batches": windows // settings.micro_batch_size,
        "touchstone": touchstone, "torch": pytorch,
        "ratio_median": touchstone["median"] / pytorch["median"],
        "ratio_min": touchstone["min"] / pytorch["min"],
        "golden_loss": run.golden_loss, "torch_loss": torch_loss,
        "loss_difference": loss_difference, "norm_difference": norm_difference,
        "printed_difference": printed_difference,
        "facts": machine_facts(binary, args.torch_threads is not None),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--touchstone", default=os.path.join(REPO_ROOT, "build/tools/touchstone"),
                        help="the touchstone binary (default: build/tools/touchstone)")
    parser.add_argument("--config", default=os.path.join(REPO_ROOT, "bench/step_config.json"),
                        help="the bench config (default: bench/step_config.json)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per side (default 3)")
    parser.add_argument("--micro-batch-size", type=int, default=8,
                        help="train.micro_batch_size (default 8: the whole global batch at once)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat the pair of measurements this many times, alternating which "
                        "side goes first; times are pooled (default 1)")
    parser.add_argument("--torch-threads", type=int,
                        help="torch.set_num_threads for the PyTorch side "
                        "(default: torch's default)")
    parser.add_argument("--markdown", action="store_true",
                        help="print a section for docs/BENCHMARKS.md")
    parser.add_argument("--workdir", help="keep the golden files here (default: a temporary "
                        "directory, removed afterwards)")
    args = parser.parse_args()
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds must be at least 1")
    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)

    try:
        if args.workdir:
            os.makedirs(args.workdir, exist_ok=True)
            result = benchmark(args, args.workdir)
        else:
            with tempfile.TemporaryDirectory(prefix="bench_step_") as workdir:
                result = benchmark(args, workdir)
    except CheckFailed as failure:
        print(f"bench_step: CHECK FAILED: {failure}", file=sys.stderr)
        return 1
    except RuntimeError as error:
        print(f"bench_step: {error}", file=sys.stderr)
        return 2
    print(markdown_report(result) if args.markdown else plain_report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
