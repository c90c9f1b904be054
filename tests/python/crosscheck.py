#!/usr/bin/python3
"""Cross-checks `touchstone golden` against an independent float64 PyTorch reference.

For each config of a small matrix this script
  1. runs `touchstone golden --set ... --out WORKDIR/NAME.h5`;
  2. checks the golden file's structure against docs/golden-format.md (root attributes, dataset
     names, dtypes and shapes, the exact set of parameter names of section 2), that the stored
     config is the one asked for, and the data rules of section 3 that can be read off one window;
  3. replays every recorded step with torch_reference.py, starting from /params/init and carrying
     its own parameters from step to step, and compares loss, num_loss_tokens (exactly),
     token_losses, every gradient, grad_norm, lr and every updated parameter;
  4. shows that the comparison can fail: the reference with the other loss normalization, with
     document masking flipped, or (with dropout on) without dropout or with masks of another seed,
     must disagree with the golden file by a large margin.

Usage (with Debian's /usr/bin/python3, which has python3-torch and h5py):
    crosscheck.py --touchstone build/tools/touchstone --workdir /tmp/crosscheck [--only NAME]
Prints one line per config with its worst tensor and exits non-zero on any failure.
"""

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
import traceback

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import torch_reference as ref  # noqa: E402

torch.set_num_threads(1)

# Agreement bound: relative L2 error ||golden - reference|| / ||reference|| <= 1e-10.
# Both sides compute in FP64 (unit roundoff u = 1.1e-16) but sum in different orders. A reduction
# of n terms has a relative error of at most about n*u in the worst case (sqrt(n)*u typically);
# the longest reductions here (the vocabulary in the softmax, B*T positions in a weight gradient)
# have at most a few thousand terms, so ~1e-13. A few layers and the backward pass amplify that by
# a modest factor and three AdamW steps (whose update divides by sqrt(v)) add a little more: ~1e-12
# at worst. 1e-10 leaves a 100x margin and is still about 1e6 times smaller than the effect of any
# real bug (a wrong mask, normalization, layout or schedule changes results at the 1e-4 level or
# more; the deliberately wrong references below differ by 1e-2 to 1).
RELATIVE_TOLERANCE = 1e-10
# A deliberately wrong reference must differ by more than this (far above roundoff).
SENSITIVITY_THRESHOLD = 1e-6

# A small model so the matrix runs in seconds; the data are the built-in acceptance documents.
SMALL_MODEL = {"model.hidden_size": 32, "model.num_layers": 2, "model.ffn_hidden_size": 64,
               "model.num_heads": 4, "model.num_kv_heads": 2,
               "train.global_batch_size": 8, "train.micro_batch_size": 2, "train.steps": 3}

# Each config: name, overrides on top of SMALL_MODEL, and the deliberately wrong references that
# must FAIL against it ("other_normalization", "flip_masking").
CONFIGS = [
    ("untied_gqa_masked_global",
     {"model.tie_embeddings": False, "data.document_masking": True,
      "train.loss_normalization": "global_token_mean",
      "optim.lr": 0.01, "optim.min_lr": 0.001, "optim.warmup_steps": 1, "optim.decay_steps": 3},
     ["other_normalization", "flip_masking"]),
    # Megatron-LM's scheduler convention, warm-up from a non-zero rate (megatron_scheduler.py).
    ("tied_mha",
     {"model.tie_embeddings": True, "model.num_kv_heads": 4,
      "optim.lr": 0.01, "optim.warmup_steps": 2, "optim.decay_steps": 10, "optim.clip_grad": 0.0,
      "optim.schedule_convention": "megatron", "optim.warmup_init": 0.002},
     ["flip_masking"]),
    ("per_microbatch_mean",
     {"train.loss_normalization": "per_microbatch_mean",
      "optim.lr": 0.005, "optim.warmup_steps": 0, "optim.decay_steps": 2, "optim.clip_grad": 0.05},
     ["other_normalization"]),
    ("no_document_masking",
     {"data.document_masking": False, "optim.lr": 0.01, "optim.weight_decay": 0.0},
     ["flip_masking"]),
    ("no_eos_loss",
     {"data.eos_loss": False, "optim.lr": 0.01, "optim.beta2": 0.999},
     []),
    ("tied_gqa_pmm_nomask",
     {"model.tie_embeddings": True, "train.loss_normalization": "per_microbatch_mean",
      "data.document_masking": False, "optim.lr": 0.02, "optim.clip_grad": 0.1},
     ["other_normalization"]),
    # Attention and hidden dropout: the reference draws the masks from the documented mapping
    # (dropout_masks.py), keyed by the global sample index, so steps 2 and 3 use other masks.
    ("dropout",
     {"model.attention_dropout": 0.1, "model.hidden_dropout": 0.1, "optim.lr": 0.01},
     ["no_dropout", "other_dropout_seed", "flip_masking"]),
]

CONFIG_SECTIONS = {
    "model": ["vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
              "ffn_hidden_size", "seq_length", "norm_eps", "rope_theta", "tie_embeddings",
              "init_std", "attention_dropout", "hidden_dropout"],
    "data": ["source", "eos_token", "pad_token", "eos_loss", "document_masking"],
    "train": ["global_batch_size", "micro_batch_size", "steps", "seed", "loss_normalization"],
    "optim": ["lr", "min_lr", "warmup_steps", "decay_steps", "warmup_init", "schedule_convention",
              "beta1", "beta2", "eps", "weight_decay", "clip_grad"],
    "parallel": ["tp", "pp", "dp", "schedule"],
}
BATCH_KEYS = ["tokens", "targets", "position_ids", "document_ids"]


def set_value_text(value):
    """How a Python value is written after `--set key=` on the command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def run_touchstone(binary, overrides, out_path, log_path):
    """Runs `touchstone golden` with the overrides; returns an error message or None."""
    command = [binary, "golden"]
    for key, value in overrides.items():
        command += ["--set", f"{key}={set_value_text(value)}"]
    command += ["--out", out_path]
    if os.path.exists(out_path):
        os.remove(out_path)
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "touchstone golden timed out after 300 s"
    with open(log_path, "w") as log:
        log.write(" ".join(command) + "\n--- stdout\n" + completed.stdout
                  + "--- stderr\n" + completed.stderr)
    if completed.returncode != 0:
        tail = (completed.stderr or completed.stdout).strip().splitlines()[-3:]
        return f"touchstone golden exited with {completed.returncode}: {' | '.join(tail)}"
    if not os.path.exists(out_path):
        return f"touchstone golden wrote no {out_path}"
    return None


# ----------------------------------------------------------------------------------------------
# Structure of the golden file (docs/golden-format.md) and the data rules (docs/data.md)
# ----------------------------------------------------------------------------------------------

def check_structure(golden, overrides):
    """Returns (problems, notes): contract violations, and harmless additions worth knowing."""
    problems, notes = [], []
    attrs = golden.attrs
    for key in ("format", "format_version", "precision", "loss_normalization", "config",
                "generator"):
        if key not in attrs:
            problems.append(f"root attribute {key!r} missing")
    if problems:
        return problems, notes
    if ref.as_str(attrs["format"]) != "touchstone-golden":
        problems.append(f"format = {ref.as_str(attrs['format'])!r}, expected 'touchstone-golden'")
    version = attrs["format_version"]
    if not isinstance(version, (int, np.integer)) or int(version) != 1:
        problems.append(f"format_version = {version!r}, expected the integer 1")
    if not ref.as_str(attrs["generator"]).strip():
        problems.append("generator attribute is empty")
    try:
        config = json.loads(ref.as_str(attrs["config"]))
    except json.JSONDecodeError as error:
        return problems + [f"config attribute is not JSON: {error}"], notes

    # The config: every contract key present, and the overrides we asked for applied.
    for section, keys in CONFIG_SECTIONS.items():
        if not isinstance(config.get(section), dict):
            problems.append(f"config section {section!r} missing")
            continue
        missing = [k for k in keys if k not in config[section]]
        extra = [k for k in config[section] if k not in keys]
        if missing:
            problems.append(f"config.{section} lacks {missing}")
        if extra:
            notes.append(f"config.{section} has extra keys {extra}")
    if "precision" not in config:
        problems.append("config key 'precision' missing")
    if any(p.startswith("config") for p in problems):
        return problems, notes  # the tree cannot be checked without the config
    for key, value in overrides.items():
        section, name = key.split(".")
        if config[section][name] != value:
            problems.append(f"config {key} = {config[section][name]!r}, asked for {value!r}")
    if ref.as_str(attrs["precision"]) != config["precision"]:
        problems.append("precision attribute differs from config precision")
    if ref.as_str(attrs["loss_normalization"]) != config["train"]["loss_normalization"]:
        problems.append("loss_normalization attribute differs from config")
    if config["precision"] != "fp64":
        problems.append(f"precision {config['precision']!r}: this cross-check needs fp64")

    # The tree.
    shape = ref.ModelShape.from_config(config)
    B, T = int(config["train"]["global_batch_size"]), shape.seq_length
    expected_params = ref.parameter_shapes(shape)
    missing_groups = [f"group /{g} missing" for g in ("batch", "params", "steps")
                      if g not in golden]
    if missing_groups:
        return problems + missing_groups, notes
    extra_root = sorted(set(golden.keys()) - {"batch", "params", "steps"})
    if extra_root:
        notes.append(f"extra root items {extra_root}")

    step_names = sorted(golden["steps"].keys(), key=lambda s: int(s) if s.isdigit() else -1)
    num_steps = len(step_names)
    if step_names != [str(s) for s in range(1, num_steps + 1)]:
        problems.append(f"/steps holds {step_names}, expected 1..{num_steps}")
    if num_steps != int(config["train"]["steps"]):
        problems.append(f"{num_steps} steps recorded, "
                        f"config train.steps = {config['train']['steps']}")
    for key in BATCH_KEYS:
        path = f"batch/{key}"
        if path not in golden:
            problems.append(f"/{path} missing")
            continue
        ds = golden[path]
        if ds.dtype != np.int32 or len(ds.shape) != 3 or ds.shape[1:] != (B, T) \
                or ds.shape[0] < num_steps:
            problems.append(f"/{path} is {ds.dtype} {ds.shape}, "
                            f"expected int32 [S>={num_steps}, {B}, {T}]")

    def check_param_group(group_path, expected_dtype):
        if group_path not in golden:
            problems.append(f"/{group_path} missing")
            return
        names = set(golden[group_path].keys())
        if names != set(expected_params):
            problems.append(f"/{group_path}: missing {sorted(set(expected_params) - names)}, "
                            f"unexpected {sorted(names - set(expected_params))}")
        for name in sorted(names & set(expected_params)):
            ds = golden[group_path][name]
            if ds.shape != expected_params[name] or ds.dtype != expected_dtype:
                problems.append(f"/{group_path}/{name} is {ds.dtype} {ds.shape}, expected "
                                f"{np.dtype(expected_dtype)} {expected_params[name]}")

    check_param_group("params/init", np.float64)
    for s in step_names:
        step = golden["steps"][s]
        scalars = {"loss": np.float64, "num_loss_tokens": np.int64, "grad_norm": np.float64,
                   "lr": np.float64}
        for key, dtype in scalars.items():
            if key not in step:
                problems.append(f"/steps/{s}/{key} missing")
            elif step[key].shape != () or step[key].dtype != dtype:
                problems.append(f"/steps/{s}/{key} is {step[key].dtype} {step[key].shape}, "
                                f"expected scalar {np.dtype(dtype)}")
        if "token_losses" not in step:
            problems.append(f"/steps/{s}/token_losses missing")
        elif step["token_losses"].shape != (B, T) or step["token_losses"].dtype != np.float64:
            problems.append(f"/steps/{s}/token_losses is {step['token_losses'].dtype} "
                            f"{step['token_losses'].shape}, expected float64 [{B}, {T}]")
        check_param_group(f"steps/{s}/grads", np.float64)
        check_param_group(f"steps/{s}/params", np.float64)
        extra = sorted(set(step.keys()) - set(scalars) - {"token_losses", "grads", "params"})
        if extra and s == "1":
            notes.append(f"extra items in /steps/<s>: {extra}")
    return problems, notes


def check_data_rules(golden, config):
    """Checks the section 3 rules that one window shows, for every recorded window.

    Returns (problems, stats). For positions i < T-1 (whose next token is in the window):
      - targets[i] is -100 exactly where section 3 says: padding at i or at i+1, an EOS target
        with eos_loss false, and with document masking a next token of another document; it is
        the next token, tokens[i+1], everywhere else;
      - the EOS ends its document: a non-padding EOS is followed by another document or padding,
        and a document is followed by another only after its EOS.
    For all positions: tokens and targets lie in [0, vocab_size), padding holds data.pad_token,
    padding and (with masking) an input EOS have no loss, no EOS target when eos_loss is false;
    position ids are 0..T-1 without document masking, and with it restart at 0 at every document
    start (the window start included) and count up within the document.
    """
    problems = []
    masking = bool(config["data"]["document_masking"])
    eos_loss = bool(config["data"]["eos_loss"])
    eos, pad = int(config["data"]["eos_token"]), int(config["data"]["pad_token"])
    vocab = int(config["model"]["vocab_size"])
    num_steps = len(golden["steps"])
    batch = {k: np.asarray(golden["batch"][k][:num_steps], dtype=np.int64) for k in BATCH_KEYS}
    tokens, targets = batch["tokens"], batch["targets"]                       # [S, B, T]
    positions, documents = batch["position_ids"], batch["document_ids"]       # [S, B, T]
    T = tokens.shape[-1]
    trained = targets != ref.IGNORE_INDEX                                     # [S, B, T]
    padding = documents == -1                                                 # [S, B, T]

    def rule(violations, text):
        count = int(np.count_nonzero(violations))
        if count:
            problems.append(f"data rule broken at {count} positions: {text}")

    # Positions 0..T-2 against their next position ("here" and "next" are [S, B, T-1]).
    here, nxt = np.s_[..., :-1], np.s_[..., 1:]
    next_other_document = documents[here] != documents[nxt]
    expected_trained = ~padding[here] & ~padding[nxt]
    if not eos_loss:
        expected_trained &= tokens[nxt] != eos
    if masking:
        expected_trained &= ~next_other_document
    rule(trained[here] != expected_trained, "targets are -100 exactly where section 3 says")
    rule(trained[here] & (targets[here] != tokens[nxt]), "targets[i] == tokens[i+1]")
    both_real = ~padding[here] & ~padding[nxt]
    rule(both_real & (tokens[here] == eos) & ~next_other_document, "an EOS ends its document")
    rule(both_real & (tokens[here] != eos) & next_other_document, "a document ends with its EOS")

    # Every position.
    rule((tokens < 0) | (tokens >= vocab), "tokens within [0, vocab_size)")
    rule(trained & ((targets < 0) | (targets >= vocab)), "targets within [0, vocab_size)")
    rule(padding & (tokens != pad), "padding positions hold pad_token")
    rule(trained & padding, "no loss at padding")
    if not eos_loss:
        rule(trained & (targets == eos), "no EOS target with eos_loss false")
    if masking:
        rule(trained & (tokens == eos) & ~padding, "no loss at an input EOS")
        starts = np.ones_like(padding)
        starts[nxt] = next_other_document
        expected = np.zeros_like(positions)
        for i in range(1, T):  # restart at 0 at a document start, otherwise count up
            expected[..., i] = np.where(starts[..., i], 0, expected[..., i - 1] + 1)
        rule(~padding & (positions != expected), "position ids restart at 0 per document")
    else:
        rule(positions != np.arange(T), "position ids 0..T-1 without document masking")

    windows_with_two_documents = 0
    for window in documents.reshape(-1, T):
        if len(set(window[window >= 0].tolist())) >= 2:
            windows_with_two_documents += 1
    stats = (f"{int(trained.sum())} loss tokens, {int(padding.sum())} padding positions, "
             f"{windows_with_two_documents}/{documents.shape[0] * documents.shape[1]} "
             "windows with >= 2 documents")
    return problems, stats


# ----------------------------------------------------------------------------------------------
# Numerical comparison
# ----------------------------------------------------------------------------------------------

def relative_error(golden_value, reference_value):
    """||golden - reference|| / ||reference||, or the absolute norm when the reference is 0."""
    a = torch.as_tensor(np.asarray(golden_value, dtype=np.float64))
    b = torch.as_tensor(reference_value, dtype=torch.float64)
    difference = float(torch.linalg.vector_norm((a - b).flatten()))
    scale = float(torch.linalg.vector_norm(b.flatten()))
    if not math.isfinite(difference):
        return math.inf
    return difference / scale if scale > 0 else difference


def compare_steps(golden, results):
    """Errors of every compared quantity: list of (label, error). num_loss_tokens is exact."""
    errors = []
    for s, result in enumerate(results, start=1):
        step = golden["steps"][str(s)]
        count = int(step["num_loss_tokens"][()])
        errors.append((f"steps/{s}/num_loss_tokens ({count} vs {result.num_loss_tokens})",
                       0.0 if count == result.num_loss_tokens else math.inf))
        errors.append((f"steps/{s}/loss", relative_error(step["loss"][()], result.loss)))
        errors.append((f"steps/{s}/token_losses",
                       relative_error(step["token_losses"][()], result.token_losses)))
        errors.append((f"steps/{s}/grad_norm",
                       relative_error(step["grad_norm"][()], result.grad_norm)))
        errors.append((f"steps/{s}/lr", relative_error(step["lr"][()], result.lr)))
        for name, grad in result.grads.items():
            errors.append((f"steps/{s}/grads/{name}",
                           relative_error(step["grads"][name][()], grad)))
        for name, param in result.params.items():
            errors.append((f"steps/{s}/params/{name}",
                           relative_error(step["params"][name][()], param)))
    return errors


def worst(errors):
    """The (label, error) with the largest error; on a tie a floating-point quantity is shown."""
    return max(errors, key=lambda item: (item[1], "num_loss_tokens" not in item[0]))


OTHER_NORMALIZATION = {"global_token_mean": "per_microbatch_mean",
                       "per_microbatch_mean": "global_token_mean"}
SENSITIVITY_VARIANTS = {
    "other_normalization": lambda st: dataclasses.replace(
        st, loss_normalization=OTHER_NORMALIZATION[st.loss_normalization]),
    "flip_masking": lambda st: dataclasses.replace(st, document_masking=not st.document_masking),
    "no_dropout": lambda st: dataclasses.replace(st, attention_dropout=0.0, hidden_dropout=0.0),
    "other_dropout_seed": lambda st: dataclasses.replace(st, seed=st.seed + 1),
}


def check_config(name, overrides, sensitivity, args):
    """Runs one config; returns (passed, line, details): details are printed under the line."""
    out_path = os.path.join(args.workdir, f"{name}.h5")
    log_path = os.path.join(args.workdir, f"{name}.log")
    if not args.no_run:
        error = run_touchstone(args.touchstone, overrides, out_path, log_path)
        if error:
            return False, f"FAIL {name}: {error} (log: {log_path})", []
    with h5py.File(out_path, "r") as golden:
        problems, notes = check_structure(golden, overrides)
        if problems:
            return (False, f"FAIL {name}: golden file does not follow the contract "
                    f"({len(problems)} problems, first: {problems[0]})", problems + notes)
        config = ref.read_config(golden)
        data_problems, stats = check_data_rules(golden, config)
        problems += data_problems
        results = ref.recompute_golden(out_path)
        errors = compare_steps(golden, results)

        # The check must be able to fail: a deliberately wrong reference has to disagree.
        sensitivity_errors = []
        for variant in sensitivity:
            # All steps: a difference may show only in a later step (e.g. the normalizations
            # agree on a step whose micro-batches hold equal numbers of loss tokens).
            wrong = ref.recompute_golden(out_path, settings_override=SENSITIVITY_VARIANTS[variant])
            label, error = worst(compare_steps(golden, wrong))
            sensitivity_errors.append((variant, label, error))
            if not error > SENSITIVITY_THRESHOLD:
                problems.append(f"the wrong reference '{variant}' was not detected "
                                f"(worst error {error:.2e} <= {SENSITIVITY_THRESHOLD:g})")

    failures = [(label, e) for label, e in errors if not e <= RELATIVE_TOLERANCE]
    label, error = worst(errors)
    passed = not failures and not problems
    clip = float(config["optim"]["clip_grad"])
    clipped_steps = [s for s, r in enumerate(results, start=1) if 0 < clip < r.grad_norm + 1e-6]
    line = (f"{'PASS' if passed else 'FAIL'} {name}: worst {label} rel err {error:.2e} "
            f"over {len(errors)} quantities, {len(results)} steps; {stats}; "
            f"clipped at steps {clipped_steps}")
    if sensitivity_errors:
        line += "; wrong references differ by " + ", ".join(
            f"{variant} {error:.1e}" for variant, _, error in sensitivity_errors)

    details = problems + notes
    details += [f"wrong reference '{variant}': worst {label} {error:.2e}"
                for variant, label, error in sensitivity_errors]
    if failures:
        details.append(f"{len(failures)} quantities above {RELATIVE_TOLERANCE:g} (first 40):")
        details += [f"  {label}: {e:.3e}" for label, e in failures[:40]]
    if args.verbose:
        details += [f"  {label}: {e:.3e}" for label, e in errors]
    return passed, line, details


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--touchstone", required=True, help="path to the touchstone binary")
    parser.add_argument("--workdir", required=True, help="where golden files and logs are written")
    parser.add_argument("--only", help="run only the config with this name")
    parser.add_argument("--no-run", action="store_true",
                        help="reuse WORKDIR/NAME.h5 from an earlier run, do not run touchstone")
    parser.add_argument("--verbose", action="store_true", help="print every compared quantity")
    args = parser.parse_args()

    configs = [c for c in CONFIGS if args.only in (None, c[0])]
    if not configs:
        parser.error(f"--only {args.only!r}: known configs are {[c[0] for c in CONFIGS]}")
    if not args.no_run and not os.access(args.touchstone, os.X_OK):
        print(f"FAIL: {args.touchstone} is not an executable")
        return 1
    os.makedirs(args.workdir, exist_ok=True)

    print(f"touchstone: {args.touchstone}; tolerance: relative L2 error <= {RELATIVE_TOLERANCE:g}")
    failed = []
    for name, extra, sensitivity in configs:
        overrides = dict(SMALL_MODEL, **extra)
        start = time.time()
        try:
            passed, line, details = check_config(name, overrides, sensitivity, args)
        except Exception as error:  # a malformed file must fail the check, not crash it
            passed, line = False, f"FAIL {name}: {type(error).__name__}: {error}"
            details = traceback.format_exc().splitlines()
        print(f"{line} [{time.time() - start:.1f} s]", flush=True)
        for detail in details if (not passed or args.verbose) else []:
            print(f"    {detail}")
        if not passed:
            failed.append(name)
    if failed:
        print(f"FAILED: {len(failed)} of {len(configs)} configs: {', '.join(failed)}")
        return 1
    print(f"all {len(configs)} configs agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
