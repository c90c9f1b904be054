"""The config a golden file stores (its root attribute `config`), parsed and checked.

`GoldenFile` and the Hugging Face helpers compute shapes, names and loss weights from the config's
keys, so a key that is missing, of the wrong JSON type or out of range must be refused when the file is
opened, as one line naming the file and the key, not later as a KeyError, TypeError or a division by
zero. The limits are the C++ config's (common/config.cpp: integer_limits, validate_config), in the
same words, so that a file the Python reader refuses is one `touchstone diff` refuses too. Keys the
package does not read are left to the C++ reader; keys unknown to both are ignored (docs/golden-format.md
"Reading it safely").
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, Mapping

MAX_COUNT = 2147483647  # common/config.h kMaxCount
LOSS_NORMALIZATIONS = ("global_token_mean", "per_microbatch_mean")

# section -> key -> (kind, minimum): the keys the package reads. Integers and their minima are those of
# common/config.cpp integer_limits; floats are checked against validate_config's rules below.
# The dropout keys came later than the format: a file without them was written with none.
_KEYS: Dict[str, Dict[str, Any]] = {
    "model": {"vocab_size": ("integer", 3), "hidden_size": ("integer", 2), "num_layers": ("integer", 1),
              "num_heads": ("integer", 1), "num_kv_heads": ("integer", 1), "ffn_hidden_size": ("integer", 1),
              "seq_length": ("integer", 1), "norm_eps": ("number", None), "rope_theta": ("number", None),
              "init_std": ("number", None), "tie_embeddings": ("boolean", None),
              "attention_dropout": ("number", None), "hidden_dropout": ("number", None)},
    "data": {"document_masking": ("boolean", None), "eos_token": ("integer", 0), "pad_token": ("integer", 0)},
    "train": {"global_batch_size": ("integer", 1), "micro_batch_size": ("integer", 1),
              "loss_normalization": ("string", None)},
    "optim": {},
}

_OPTIONAL = ("attention_dropout", "hidden_dropout")


def _quoted(value: Any) -> str:
    """A value as a message quotes it: at most 40 characters (common/config.cpp quoted)."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _checked(origin: str, key: str, value: Any, kind: str, minimum: Any) -> None:
    if kind == "integer":
        # JSON true is a Python bool, which is an int: refuse it as the C++ config does.
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{origin}: {key} must be an integer, got {_quoted(value)}")
        if not minimum <= value <= MAX_COUNT:
            raise ValueError(f"{origin}: {key} must be in [{minimum}, {MAX_COUNT}] (got {_quoted(value)})")
    elif kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{origin}: {key} must be a number, got {_quoted(value)}")
        if not math.isfinite(value):
            raise ValueError(f"{origin}: {key} must be a finite number (got {value})")
    elif kind == "boolean" and not isinstance(value, bool):
        raise ValueError(f"{origin}: {key} must be a boolean, got {_quoted(value)}")
    elif kind == "string" and not isinstance(value, str):
        raise ValueError(f"{origin}: {key} must be a string, got {_quoted(value)}")


def parse_golden_config(text: str, path: str) -> Dict[str, Any]:
    """The config of the golden file at `path` from the JSON `text` of its attribute, every key the
    package reads checked (ValueError "<path> (attribute config): <key> ...")."""
    try:
        config = json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError(f"{path}: root attribute config is not valid JSON") from None
    if isinstance(config, dict):
        for section in _KEYS:
            if not isinstance(config.get(section), dict):
                raise ValueError(f"{path}: attribute config has no section '{section}'")
    check_config(config, f"{path} (attribute config)")
    return config


def check_config(config: Any, origin: str = "config") -> None:
    """Checks a full config (GoldenFile.config's layout): ValueError "<origin>: <key> ..."."""
    if not isinstance(config, Mapping):
        raise ValueError(f"{origin}: the config must be a JSON object")
    for section in _KEYS:
        if not isinstance(config.get(section), Mapping):
            raise ValueError(f"{origin}: the config has no section '{section}'")
    for section in ("data", "train"):
        _check_section(config[section], section, origin)
    check_model(config["model"], origin)
    m, d, t = config["model"], config["data"], config["train"]
    # The rules of common/config.cpp validate_config that the loss weights and the HF config depend on.
    _check_rules(origin, [
        (d["eos_token"] < m["vocab_size"], "data.eos_token", f"({d['eos_token']}) must be in [0, model.vocab_size)"),
        (d["pad_token"] < m["vocab_size"], "data.pad_token", f"({d['pad_token']}) must be in [0, model.vocab_size)"),
        (t["global_batch_size"] % t["micro_batch_size"] == 0, "train.global_batch_size",
         f"({t['global_batch_size']}) must be divisible by train.micro_batch_size ({t['micro_batch_size']})"),
        (t["loss_normalization"] in LOSS_NORMALIZATIONS, "train.loss_normalization",
         f"must be \"global_token_mean\" or \"per_microbatch_mean\", got {_quoted(t['loss_normalization'])}"),
    ])


def check_model(model: Any, origin: str = "config") -> None:
    """Checks the config's model section, which names and shapes are computed from."""
    if not isinstance(model, Mapping):
        raise ValueError(f"{origin}: model is not a mapping of the config's model keys")
    _check_section(model, "model", origin)
    m = model
    # The rules of common/config.cpp validate_config that the shapes depend on.
    _check_rules(origin, [
        (m["hidden_size"] % m["num_heads"] == 0, "model.hidden_size",
         f"({m['hidden_size']}) must be divisible by model.num_heads ({m['num_heads']})"),
        ((m["hidden_size"] // m["num_heads"]) % 2 == 0, "model.hidden_size",
         f"/ model.num_heads = head_dim {m['hidden_size'] // m['num_heads']} must be even (RoPE rotates pairs)"),
        (m["num_heads"] % m["num_kv_heads"] == 0, "model.num_kv_heads",
         f"({m['num_kv_heads']}) must be >= 1 and divide model.num_heads ({m['num_heads']})"),
        (m["norm_eps"] > 0, "model.norm_eps", f"must be > 0 (got {m['norm_eps']})"),
        (m["rope_theta"] > 0, "model.rope_theta", "must be > 0"),
        (m["init_std"] >= 0, "model.init_std", "must be >= 0"),
        (0 <= m.get("attention_dropout", 0.0) < 1, "model.attention_dropout",
         f"must be in [0, 1) (got {m.get('attention_dropout')})"),
        (0 <= m.get("hidden_dropout", 0.0) < 1, "model.hidden_dropout",
         f"must be in [0, 1) (got {m.get('hidden_dropout')})"),
    ])


def _check_section(values: Mapping, section: str, origin: str) -> None:
    for key, (kind, minimum) in _KEYS[section].items():
        if key in _OPTIONAL and key not in values:
            continue
        if key not in values:
            raise ValueError(f"{origin}: {section}.{key} is missing")
        _checked(origin, f"{section}.{key}", values[key], kind, minimum)


def _check_rules(origin: str, rules: list) -> None:
    for holds, key, what in rules:
        if not holds:
            raise ValueError(f"{origin}: {key} {what}")
