"""`touchstone export hf` (docs/diffing.md, "Exporting to Hugging Face").

For golden files of the default config, tied embeddings, 8 query heads on 2 KV heads and BF16, the
export's model.safetensors, read by a parser of this file's own, holds every Hugging Face Llama tensor
equal bit for bit to the golden tensor laid out by this file's own code (q/k/v cut from the grouped
linear_qkv rows as docs/golden-format.md's h5py example does, gate/up from linear_fc1), with contiguous
data in header order after a header whose length is a multiple of 8; `--step 2` exports
/steps/2/params; config.json holds exactly the keys transformers reads, with the golden config's
values. Every bad input (the output directory, the files in it, the golden file, the step, a config
with dropout, a golden tensor that cannot be read) exits 2 with one line naming the path or key,
leaves no file behind, and leaves a file already at the output as it was.

Usage: test_export_hf.py PATH_TO_TOUCHSTONE   (/usr/bin/python3 with numpy and h5py)
"""
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np

TOUCHSTONE = None
CONFIGS = {
    "default": [],
    "tied": ["--set", "model.tie_embeddings=true"],
    "gqa": ["--set", "model.num_heads=8", "--set", "model.num_kv_heads=2"],
    "bf16": ["--set", "precision=bf16"],
}
CONFIG_KEYS = {
    "architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps",
    "rope_theta", "rope_scaling", "tie_word_embeddings", "attention_bias", "mlp_bias", "hidden_act",
    "attention_dropout", "initializer_range", "pretraining_tp", "use_cache", "bos_token_id", "eos_token_id",
    "pad_token_id", "torch_dtype",
}


def run(args):
    return subprocess.run([TOUCHSTONE, *args], capture_output=True, text=True, timeout=300)


def make_golden(path, overrides):
    result = run(["golden", *overrides, "--out", path])
    assert result.returncode == 0, result.stderr
    return path


def read_safetensors(path):
    """(header in file order, {name: array}); checks the layout the format and the export promise."""
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    assert length % 8 == 0, f"header length {length} is not a multiple of 8"
    text = data[8:8 + length].decode("utf-8")
    assert text.rstrip(" ") == text.strip() and text.startswith("{"), "header padded other than with spaces"
    header = json.loads(text)  # dicts keep the file's order
    assert header.pop("__metadata__") == {"format": "pt"}
    dtypes = {"F64": "<f8", "F32": "<f4"}
    tensors, offset, body = {}, 0, data[8 + length:]
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        assert begin == offset, f"{name} starts at {begin}, not at {offset}: data not contiguous"
        array = np.frombuffer(body[begin:end], dtype=dtypes[entry["dtype"]])
        tensors[name] = array.reshape(entry["shape"])
        offset = end
    assert offset == len(body), f"{len(body) - offset} bytes after the last tensor"
    return header, tensors


def expected_hf_tensors(golden_path, group):
    """The golden parameters of `group` ("params/init", "steps/2/params") under Hugging Face names and
    layouts, computed here from the row layouts of docs/golden-format.md."""
    with h5py.File(golden_path, "r") as f:
        model = json.loads(f.attrs["config"])["model"]
        params = {name: dataset[()] for name, dataset in f[group].items()}
    H, NH, NKV, F = model["hidden_size"], model["num_heads"], model["num_kv_heads"], model["ffn_hidden_size"]
    D, G = H // NH, NH // NKV
    out = {"model.embed_tokens.weight": params.pop("embedding.word_embeddings.weight"),
           "model.norm.weight": params.pop("decoder.final_layernorm.weight")}
    if "output_layer.weight" in params:
        out["lm_head.weight"] = params.pop("output_layer.weight")
    for layer in range(model["num_layers"]):
        c, hf = f"decoder.layers.{layer}.", f"model.layers.{layer}."
        blocks = params.pop(c + "self_attention.linear_qkv.weight").reshape(NKV, G + 2, D, H)
        out[hf + "self_attn.q_proj.weight"] = blocks[:, :G].reshape(NH * D, H)  # query head g*G + j
        out[hf + "self_attn.k_proj.weight"] = blocks[:, G].reshape(NKV * D, H)
        out[hf + "self_attn.v_proj.weight"] = blocks[:, G + 1].reshape(NKV * D, H)
        out[hf + "self_attn.o_proj.weight"] = params.pop(c + "self_attention.linear_proj.weight")
        fc1 = params.pop(c + "mlp.linear_fc1.weight")
        out[hf + "mlp.gate_proj.weight"], out[hf + "mlp.up_proj.weight"] = fc1[:F], fc1[F:]
        out[hf + "mlp.down_proj.weight"] = params.pop(c + "mlp.linear_fc2.weight")
        out[hf + "input_layernorm.weight"] = params.pop(c + "input_layernorm.weight")
        out[hf + "post_attention_layernorm.weight"] = params.pop(c + "pre_mlp_layernorm.weight")
    assert not params, f"golden parameters without a Hugging Face name: {sorted(params)}"
    return out


def bitwise_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def listing(directory):
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else None


class Shared:
    dir = None
    golden = {}

    @classmethod
    def make(cls):
        cls.dir = tempfile.TemporaryDirectory()
        for name, overrides in CONFIGS.items():
            cls.golden[name] = make_golden(os.path.join(cls.dir.name, name + ".h5"), overrides)


class ExportHf(unittest.TestCase):
    def setUp(self):
        self.scratch = tempfile.TemporaryDirectory()
        self.root = self.scratch.name

    def tearDown(self):
        self.scratch.cleanup()

    def export(self, golden, out, *extra):
        result = run(["export", "hf", "--golden", golden, "--out", out, *extra])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, "")
        return result

    def assert_same_tensors(self, golden, out, group):
        header, tensors = read_safetensors(os.path.join(out, "model.safetensors"))
        expected = expected_hf_tensors(golden, group)
        self.assertEqual(sorted(tensors), sorted(expected))
        for name, array in expected.items():
            self.assertTrue(bitwise_equal(tensors[name], array), name)
        return header

    def test_every_tensor_is_the_golden_one_laid_out_for_hugging_face(self):
        for name, golden in Shared.golden.items():
            with self.subTest(config=name):
                out = os.path.join(self.root, name)
                self.export(golden, out + "/")  # created, trailing slash and all
                self.assertEqual(listing(out), ["config.json", "model.safetensors"])
                header = self.assert_same_tensors(golden, out, "params/init")
                self.assertEqual("lm_head.weight" in header, name != "tied")
                dtype = "F32" if name == "bf16" else "F64"
                self.assertEqual({entry["dtype"] for entry in header.values()}, {dtype})
                # Data in the golden table's order: the embedding first, lm_head or the final norm last.
                self.assertEqual(next(iter(header)), "model.embed_tokens.weight")
                self.assertEqual(list(header)[-1], "model.norm.weight" if name == "tied" else "lm_head.weight")

    def test_step_exports_the_parameters_after_that_update(self):
        golden = Shared.golden["default"]
        out = os.path.join(self.root, "step2")
        result = self.export(golden, out, "--step", "2")
        self.assertIn("/steps/2/params", result.stdout)
        self.assert_same_tensors(golden, out, "steps/2/params")
        init = expected_hf_tensors(golden, "params/init")["model.embed_tokens.weight"]
        _, tensors = read_safetensors(os.path.join(out, "model.safetensors"))
        self.assertFalse(np.array_equal(tensors["model.embed_tokens.weight"], init))
        self.export(golden, out, "--step", "0")  # over the first export: /params/init
        self.assert_same_tensors(golden, out, "params/init")
        self.assertEqual(listing(out), ["config.json", "model.safetensors"])

    def test_config_json_holds_the_golden_config(self):
        for name, golden in Shared.golden.items():
            with self.subTest(config=name):
                out = os.path.join(self.root, name)
                self.export(golden, out)
                with open(os.path.join(out, "config.json")) as f:
                    text = f.read()
                config = json.loads(text)
                self.assertEqual(text, json.dumps(config, indent=2, sort_keys=True) + "\n")
                self.assertEqual(set(config), CONFIG_KEYS)
                with h5py.File(golden, "r") as f:
                    run_config = json.loads(f.attrs["config"])
                m, data = run_config["model"], run_config["data"]
                self.assertEqual(config, {
                    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                    "vocab_size": m["vocab_size"], "hidden_size": m["hidden_size"],
                    "intermediate_size": m["ffn_hidden_size"], "num_hidden_layers": m["num_layers"],
                    "num_attention_heads": m["num_heads"], "num_key_value_heads": m["num_kv_heads"],
                    "head_dim": m["hidden_size"] // m["num_heads"], "max_position_embeddings": m["seq_length"],
                    "rms_norm_eps": m["norm_eps"], "rope_theta": m["rope_theta"], "rope_scaling": None,
                    "tie_word_embeddings": m["tie_embeddings"], "attention_bias": False, "mlp_bias": False,
                    "hidden_act": "silu", "attention_dropout": 0.0, "initializer_range": m["init_std"],
                    "pretraining_tp": 1, "use_cache": False, "bos_token_id": None,
                    "eos_token_id": data["eos_token"], "pad_token_id": data["pad_token"],
                    "torch_dtype": "float32" if name == "bf16" else "float64"})
                self.assertEqual(config["tie_word_embeddings"], name == "tied")
                self.assertEqual(config["num_key_value_heads"], 2)
                self.assertEqual(config["num_attention_heads"], 8 if name == "gqa" else 4)

    def test_existing_files_are_replaced_and_others_left(self):
        out = os.path.join(self.root, "existing")
        os.mkdir(out)
        for name in ("config.json", "model.safetensors", "README.md"):
            with open(os.path.join(out, name), "w") as f:
                f.write("old")
        self.export(Shared.golden["tied"], out)
        self.assertEqual(listing(out), ["README.md", "config.json", "model.safetensors"])
        with open(os.path.join(out, "README.md")) as f:
            self.assertEqual(f.read(), "old")
        self.assert_same_tensors(Shared.golden["tied"], out, "params/init")

    def assert_refused(self, args, pieces, out):
        """Exit 2, one line naming every piece; what was in `out` (or its absence) is as it was."""
        before = listing(out)
        paths = [os.path.join(out, name) for name in before or []]
        contents = {path: read_bytes(path) for path in paths if os.path.isfile(path) and not os.path.islink(path)}
        result = run(["export", "hf", *args])
        label = " ".join(args)
        self.assertEqual(result.returncode, 2, label + "\n" + result.stderr + result.stdout)
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, label + "\n" + result.stderr)
        self.assertTrue(lines[0].startswith("touchstone: error: "), lines[0])
        for piece in pieces:
            self.assertIn(piece, lines[0], label)
        self.assertEqual(result.stdout, "")
        self.assertEqual(listing(out), before, label + ": the output directory changed")
        for path, content in contents.items():
            self.assertEqual(read_bytes(path), content, f"{label}: {path} changed")
        self.assertEqual([n for n in os.listdir(self.root) if ".tmp." in n or ".new." in n], [], label)

    def test_a_subdirectory_in_the_output_is_refused(self):
        # The directory is replaced as a whole; a subdirectory could not be carried into the new one.
        out = os.path.join(self.root, "with_subdirectory")
        os.makedirs(os.path.join(out, "tokenizer"))
        self.assert_refused(["--golden", Shared.golden["default"], "--out", out],
                            ["--out", out, "holds tokenizer", "not a regular file"], out)

    def pair_of(self, out):
        """The sha256 of (config.json, model.safetensors), after checking that the two agree."""
        with open(os.path.join(out, "config.json")) as f:
            config = json.load(f)
        header, _ = read_safetensors(os.path.join(out, "model.safetensors"))
        rows = [header[f"model.layers.0.self_attn.{p}_proj.weight"]["shape"][0] for p in "qk"]
        self.assertEqual(rows, [config["num_attention_heads"] * config["head_dim"],
                                config["num_key_value_heads"] * config["head_dim"]],
                         "config.json and model.safetensors come from different exports")
        return tuple(hashlib.sha256(read_bytes(os.path.join(out, name))).hexdigest()
                     for name in ("config.json", "model.safetensors"))

    def test_an_export_killed_at_any_rename_leaves_the_old_pair_or_the_new_one(self):
        # Each rename of the export (the safetensors and config.json temporaries into the fresh directory,
        # the fresh directory into place) is hit by SIGTERM (the handler removes what is in flight) and by
        # SIGKILL (nothing is removed): the output holds the old pair or the new pair, never a mix.
        if shutil.which("strace") is None:
            self.fail("strace is not installed (tools/install-deps.sh installs it)")
        renames = "rename,renameat,renameat2"
        old_golden, new_golden = Shared.golden["default"], Shared.golden["gqa"]
        reference = os.path.join(self.root, "reference")
        self.export(new_golden, reference)
        new_pair = self.pair_of(reference)
        log = os.path.join(self.root, "export.strace")
        out = os.path.join(self.root, "hf")
        command = [TOUCHSTONE, "export", "hf", "--golden", new_golden, "--out", out]
        self.export(old_golden, out)
        old_pair = self.pair_of(out)
        traced = subprocess.run(["strace", "-o", log, "-e", f"trace={renames}", *command], capture_output=True,
                                text=True, timeout=300)
        self.assertEqual(traced.returncode, 0, traced.stderr)
        with open(log) as f:
            calls = [line.split("(", 1)[0] for line in f if line.startswith("rename")]
        self.assertGreaterEqual(len(calls), 2, calls)  # at least the two files
        # SIGTERM: the handler's status 128 + 15; SIGKILL: strace dies of it as its tracee did.
        for signal, status in (("TERM", 128 + 15), ("KILL", -9)):
            for ordinal, name in enumerate(calls, start=1):
                count = calls[:ordinal].count(name)
                with self.subTest(signal=signal, call=ordinal, name=name):
                    self.export(old_golden, out)
                    for leftover in os.listdir(self.root):
                        if ".new." in leftover:  # a SIGKILL before leaves the fresh directory behind
                            shutil.rmtree(os.path.join(self.root, leftover))
                    killed = subprocess.run(["strace", "-o", os.devnull, "-e", f"trace={renames}", "-e",
                                             f"inject={name}:signal={signal}:when={count}", *command],
                                            capture_output=True, text=True, timeout=300)
                    self.assertEqual(killed.returncode, status, killed.stderr)
                    self.assertEqual(listing(out), ["config.json", "model.safetensors"])
                    self.assertIn(self.pair_of(out), (old_pair, new_pair))
                    if signal == "TERM":
                        self.assertEqual([n for n in os.listdir(self.root) if ".new." in n or ".tmp." in n], [])
                        self.assertEqual([n for n in os.listdir(out) if ".tmp." in n], [])
        # With no signal the new pair is in place.
        self.export(new_golden, out)
        self.assertEqual(self.pair_of(out), new_pair)

    def test_bad_output_paths_are_refused(self):
        golden = Shared.golden["default"]
        base = ["--golden", golden, "--out"]
        regular = os.path.join(self.root, "regular")
        with open(regular, "w") as f:
            f.write("kept")
        self.assert_refused([*base, regular], ["--out", regular, "is not a directory"], self.root)
        missing_parent = os.path.join(self.root, "no_such", "out")
        self.assert_refused([*base, missing_parent], ["--out", missing_parent, "does not exist"], self.root)
        self.assertFalse(os.path.exists(os.path.dirname(missing_parent)))
        target = os.path.join(self.root, "target")
        os.mkdir(target)
        link = os.path.join(self.root, "link")
        os.symlink(target, link)
        self.assert_refused([*base, link + "/"], ["--out", link, "symbolic link"], target)
        out = os.path.join(self.root, "out")
        os.mkdir(out)
        with open(os.path.join(out, "model.safetensors"), "w") as f:
            f.write("kept")
        inside = os.path.join(out, "config.json")
        os.symlink(regular, inside)
        self.assert_refused([*base, out], [inside, "symbolic link"], out)
        os.unlink(inside)
        os.mkfifo(inside)
        self.assert_refused([*base, out], [inside, "FIFO"], out)
        os.unlink(inside)
        os.mkdir(inside)
        self.assert_refused([*base, out], [inside, "directory"], out)
        os.rmdir(inside)
        os.unlink(os.path.join(out, "model.safetensors"))
        os.mkdir(os.path.join(out, "model.safetensors"))
        self.assert_refused([*base, out], [os.path.join(out, "model.safetensors"), "directory"], out)
        self.assert_refused([*base, ""], ["--out", "''", "empty path"], self.root)

    def test_bad_golden_files_steps_and_configs_are_refused(self):
        golden = Shared.golden["default"]
        out = os.path.join(self.root, "out")
        os.mkdir(out)
        with open(os.path.join(out, "config.json"), "w") as f:
            f.write("kept")
        fresh = os.path.join(self.root, "fresh")  # missing: must not be created by a failed export
        not_golden = os.path.join(self.root, "plain.h5")
        with h5py.File(not_golden, "w") as f:
            f["x"] = np.zeros(3)
        version_2 = os.path.join(self.root, "v2.h5")
        shutil.copy(golden, version_2)
        with h5py.File(version_2, "r+") as f:
            f.attrs["format_version"] = np.int64(2)
        not_finite = os.path.join(self.root, "nan.h5")  # found only while the tensors are streamed
        shutil.copy(golden, not_finite)
        with h5py.File(not_finite, "r+") as f:
            f["params/init/decoder.final_layernorm.weight"][3] = np.nan
        hidden = make_golden(os.path.join(self.root, "hidden.h5"), ["--set", "model.hidden_dropout=0.1"])
        attention = make_golden(os.path.join(self.root, "attention.h5"), ["--set", "model.attention_dropout=0.1"])
        cases = [
            (["--golden", not_golden], [not_golden, "not a golden file"]),
            (["--golden", version_2], [version_2, "format_version 2"]),
            (["--golden", os.path.join(self.root, "absent.h5")], ["absent.h5"]),
            (["--golden", golden, "--step", "4"], [golden, "step 4"]),
            (["--golden", golden, "--step", "-1"], ["step -1"]),
            (["--golden", hidden], [hidden, "model.hidden_dropout", "no hidden dropout"]),
            (["--golden", attention], [attention, "model.attention_dropout", "counter-based RNG"]),
            (["--golden", not_finite], [not_finite, "decoder.final_layernorm.weight", "non-finite"]),
        ]
        for args, pieces in cases:
            for where in (out, fresh):
                with self.subTest(args=args, out=where):
                    self.assert_refused([*args, "--out", where], pieces, where if where == out else self.root)
                    self.assertFalse(os.path.exists(fresh))
        self.assertEqual(listing(out), ["config.json"])


if __name__ == "__main__":
    TOUCHSTONE = os.path.abspath(sys.argv.pop(1))
    Shared.make()
    try:
        unittest.main(verbosity=2)
    finally:
        Shared.dir.cleanup()
