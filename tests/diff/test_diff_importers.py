"""Candidates from other trainers' files: Megatron-LM gradient and parameter dumps through
tools/import_megatron_dump.py, and safetensors files with Hugging Face Llama names, both written here
(torch.save of Megatron's dict layout; safetensors by the small writer below, as the safetensors
package is not a dependency), including malformed and truncated ones.

Usage: test_diff_importers.py PATH_TO_TOUCHSTONE PATH_TO_SOURCE_TREE
"""

import collections
import json
import os
import shutil
import struct
import sys
import unittest

import h5py
import numpy as np
import torch

import diff_common as common
import megatron_layout

TE_NAMES = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
            "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"}


def megatron_file_name(tp_rank, pp_rank, pp_size, ep_rank=0, ep_size=1):
    """save_grads' file name (megatron/training/checkpointing.py): mp_rank_{tp:02d}, _{pp:03d} when the
    pipeline size is > 1, _{ep:03d} when the expert-parallel size is > 1."""
    name = f"mp_rank_{tp_rank:02d}"
    if pp_size > 1:
        name += f"_{pp_rank:03d}"
    if ep_size > 1:
        name += f"_{ep_rank:03d}"
    return name + ".pth"


def write_megatron_dump(golden, directory, tp, stage_layers, group="steps/1/grads", tied=False, dtype=torch.float64,
                        te_names=True, module_prefix=False, expert_suffix=False, scale=1.0):
    """mp_rank_TT[_PPP][_EEE].pth files as Megatron-LM's --save-wgrads-interval writes them (train_step's
    _save_state_dict and save_grads): per-rank shards under the unwrapped model's parameter names,
    stage-local layer numbers, a tied embedding's gradient summed on both stages, torch.save of
    dict({"model_chunk0": {name: tensor}}). `scale` multiplies every value (a loss scale, applied in
    float64 before the cast to `dtype`); `expert_suffix` names the files as expert-parallel rank 0's;
    `module_prefix` prefixes the names of odd tp ranks with "module." (a wrapped model's names)."""
    pp = len(stage_layers)
    states = {(t, p): collections.defaultdict(dict) for t in range(tp) for p in range(pp)}
    with h5py.File(golden, "r") as g:
        for name, dataset in g[group].items():
            for stage, local in megatron_layout.placements(name, stage_layers, tied):
                match = megatron_layout.LAYER.match(local)
                if te_names and match and match.group(2) in TE_NAMES:
                    local = f"decoder.layers.{match.group(1)}.{TE_NAMES[match.group(2)]}"
                for t in range(tp):
                    array = np.ascontiguousarray(megatron_layout.shard(name, dataset[()] * scale, tp, t))
                    key = "module." + local if module_prefix and t % 2 else local
                    states[(t, stage)]["model_chunk0"][key] = torch.from_numpy(array).to(dtype)
    os.makedirs(directory, exist_ok=True)
    for (t, p), state in states.items():
        name = megatron_file_name(t, p, pp, 0, 2 if expert_suffix else 1)
        torch.save(dict(state), os.path.join(directory, name))
    return directory


def bfloat16_bytes(array):
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").tobytes()  # round to nearest even


ENCODERS = {"F64": lambda a: a.astype("<f8").tobytes(), "F32": lambda a: a.astype("<f4").tobytes(),
            "F16": lambda a: a.astype("<f2").tobytes(), "BF16": bfloat16_bytes}


def write_safetensors(path, tensors, dtype="F64", header_patch=None, cut=0):
    """The safetensors layout: u64 little-endian header size, JSON header, raw little-endian data."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, array in tensors.items():
        data = ENCODERS[dtype](np.asarray(array))
        header[name] = {"dtype": dtype, "shape": list(np.shape(array)), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if header_patch:
        header_patch(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    content = struct.pack("<Q", len(text)) + text + b"".join(blobs)
    with open(path, "wb") as f:
        f.write(content[:len(content) - cut])
    return path


def hf_tensors(golden, group, tied=False):
    """The golden tensors of `group` under Hugging Face Llama names and layouts."""
    with h5py.File(golden, "r") as g:
        m = json.loads(g.attrs["config"])["model"]
        NH, NKV, H, F = m["num_heads"], m["num_kv_heads"], m["hidden_size"], m["ffn_hidden_size"]
        D, G = H // NH, NH // NKV
        out = {}
        for name, dataset in g[group].items():
            t = dataset[()]
            match = megatron_layout.LAYER.match(name)
            if not match:
                out[{"embedding.word_embeddings.weight": "model.embed_tokens.weight",
                     "output_layer.weight": "lm_head.weight",
                     "decoder.final_layernorm.weight": "model.norm.weight"}[name]] = t
                continue
            prefix, suffix = f"model.layers.{match.group(1)}.", match.group(2)
            if suffix == "self_attention.linear_qkv.weight":
                blocks = t.reshape(NKV, G + 2, D, H)
                out[prefix + "self_attn.q_proj.weight"] = blocks[:, :G].reshape(NH * D, H)
                out[prefix + "self_attn.k_proj.weight"] = blocks[:, G].reshape(NKV * D, H)
                out[prefix + "self_attn.v_proj.weight"] = blocks[:, G + 1].reshape(NKV * D, H)
            elif suffix == "mlp.linear_fc1.weight":
                out[prefix + "mlp.gate_proj.weight"], out[prefix + "mlp.up_proj.weight"] = t[:F], t[F:]
            else:
                out[prefix + {"input_layernorm.weight": "input_layernorm.weight",
                              "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
                              "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
                              "mlp.linear_fc2.weight": "mlp.down_proj.weight"}[suffix]] = t
        if tied:
            out["lm_head.weight"] = out["model.embed_tokens.weight"]
        return out


class Importers(common.ShardableGoldens):
    def path(self, *parts):
        return os.path.join(self.scratch.name, *parts)

    def import_dump(self, dump, out, *args):
        script = os.path.join(common.SOURCE, "tools", "import_megatron_dump.py")
        return common.run([common.PYTHON, script, dump, "--out", out, *args])

    def assert_passes(self, golden, candidate, *args, exact=True):
        status, output, report = common.diff(golden, candidate, *args)
        self.assertEqual(status, 0, output)
        self.assertTrue(all(t["status"] != "fail" for t in report["tensors"]), output)
        if exact:
            self.assertEqual(max(t["metrics"]["relative_l2"] for t in common.compared(report)), 0.0, output)
        return report

    def assert_refused(self, result):
        """The importer's refusal: exit status 2 and one line; returns that line."""
        self.assertEqual(result.returncode, 2, result.stderr + result.stdout)
        self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
        self.assertTrue(result.stderr.startswith("import_megatron_dump.py: error: "), result.stderr)
        return result.stderr

    # ---- Megatron-LM dumps ----
    def test_megatron_gradient_dump(self):
        cases = ((2, [1, 2], {}), (4, [3], {}), (1, [2, 1], {}), (2, [3], dict(expert_suffix=True)),
                 (2, [2, 1], dict(te_names=False, module_prefix=True)))
        for tp, stages, options in cases:
            with self.subTest(tp=tp, stage_layers=stages, **options):
                name = f"tp{tp}_{'_'.join(map(str, stages))}_{'_'.join(options)}"
                dump = write_megatron_dump(self.golden, self.path(name, "wgrads", "iter_0000001"), tp, stages,
                                           **options)
                expected = {megatron_file_name(t, p, len(stages), 0, 2 if options.get("expert_suffix") else 1)
                            for t in range(tp) for p in range(len(stages))}
                self.assertEqual(set(os.listdir(dump)), expected)
                result = self.import_dump(dump, self.path(name, "shards"))
                self.assertEqual(result.returncode, 0, result.stderr)
                report = self.assert_passes(self.golden, self.path(name, "shards"))
                grads = [t for t in common.compared(report) if t["group"] == "grads"]
                self.assertEqual(len(grads), 2 + 6 * 3 + 1)

    def test_megatron_expert_parallel_files(self):
        # The _EEE suffix of expert-parallel rank 0 is read; any other expert rank, or an expert
        # parameter under the two-number name (pipeline size 1, expert size > 1), is a mixture of experts.
        dump = write_megatron_dump(self.golden, self.path("ep", "wgrads", "iter_0000001"), 2, [1, 2],
                                   expert_suffix=True)
        self.assertIn("mp_rank_01_001_000.pth", os.listdir(dump))
        self.assertEqual(self.import_dump(dump, self.path("ep", "shards")).returncode, 0)
        self.assert_passes(self.golden, self.path("ep", "shards"))
        for p in range(2):
            shutil.copy(os.path.join(dump, megatron_file_name(0, p, 2, 0, 2)),
                        os.path.join(dump, megatron_file_name(0, p, 2, 1, 2)))
        line = self.assert_refused(self.import_dump(dump, self.path("ep", "moe_shards")))
        self.assertIn("expert-parallel rank 1", line)
        self.assertIn("no experts", line)
        dump = write_megatron_dump(self.golden, self.path("ep2", "wgrads", "iter_0000001"), 1, [3])
        path = os.path.join(dump, "mp_rank_00.pth")
        state = torch.load(path)
        state["model_chunk0"]["decoder.layers.1.mlp.experts.linear_fc1.weight0"] = torch.zeros(4, 4)
        os.rename(path, os.path.join(dump, "mp_rank_00_000.pth"))
        torch.save(state, os.path.join(dump, "mp_rank_00_001.pth"))
        line = self.assert_refused(self.import_dump(dump, self.path("ep2", "shards")))
        self.assertIn("mixture-of-experts parameter", line)

    def test_megatron_loss_scale(self):
        # A dump taken before optimizer.step() unscales: every gradient times the loss scale (2^16).
        dump = write_megatron_dump(self.golden, self.path("scaled", "wgrads", "iter_0000001"), 2, [1, 2],
                                   scale=2.0 ** 16)
        self.assertEqual(self.import_dump(dump, self.path("scaled", "raw")).returncode, 0)
        status, output, report = common.diff(self.golden, self.path("scaled", "raw"))
        self.assertEqual(status, 1, output)
        self.assertIn("gradient_scale", common.signatures(report), output)
        message = next(v["message"] for v in report["verdicts"] if v["signature"] == "gradient_scale")
        self.assertIn("candidate = 65536 x golden", message)
        result = self.import_dump(dump, self.path("scaled", "unscaled"), "--loss-scale", "65536")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("divided by loss scale 65536", result.stdout)
        self.assert_passes(self.golden, self.path("scaled", "unscaled"))
        with open(self.path("scaled", "unscaled", "shards.json")) as f:
            self.assertEqual(json.load(f)["imports"][0]["loss_scale_removed"], 65536)
        for bad in ("0", "-2", "nan", "inf"):
            with self.subTest(loss_scale=bad):
                line = self.assert_refused(self.import_dump(dump, self.path("scaled", "bad"), f"--loss-scale={bad}"))
                self.assertIn("must be a finite number > 0", line)

    def test_megatron_fp16_dump_needs_the_loss_scale(self):
        # --fp16 without --accumulate-allreduce-grads-in-fp32: main_grad is float16 and scaled.
        dump = write_megatron_dump(self.golden, self.path("fp16", "wgrads", "iter_0000001"), 2, [1, 2],
                                   dtype=torch.float16, scale=2.0 ** 16)
        line = self.assert_refused(self.import_dump(dump, self.path("fp16", "refused")))
        self.assertIn("is float16: a --fp16 run", line)
        self.assertIn("pass --loss-scale X", line)
        self.assertIn("4294967296 = 2^32", line)
        self.assertFalse(os.path.exists(self.path("fp16", "refused")), "nothing is written")
        result = self.import_dump(dump, self.path("fp16", "shards"), "--loss-scale", "65536")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("note:", result.stdout)
        status, output, _ = common.diff(self.golden, self.path("fp16", "shards"))
        self.assertEqual(status, 1, output)  # float16 rounding is far outside the FP64 tolerance
        self.assert_passes(self.golden, self.path("fp16", "shards"), "--tolerance", "2e-3", exact=False)
        # An iteration that overflowed holds inf: imported, with a note, and failed by the diff.
        path = os.path.join(dump, "mp_rank_00_000.pth")
        state = torch.load(path)
        state["model_chunk0"]["embedding.word_embeddings.weight"][0, 0] = float("inf")
        torch.save(state, path)
        result = self.import_dump(dump, self.path("fp16", "overflow"), "--loss-scale", "65536")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("note: 1 gradients hold inf or NaN (embedding.word_embeddings.weight, ...)", result.stdout)
        status, output, _ = common.diff(self.golden, self.path("fp16", "overflow"), "--tolerance", "2e-3")
        self.assertEqual(status, 1, output)
        # Parameters are dumped after optimizer.step(): float16 ones need no loss scale and take none. They
        # are the model's float16 copy, compared with the golden parameters rounded to float16. torch
        # rounds float64 to float16 through float32 (two roundings) and the diff once, so the two differ
        # by one float16 ulp where the float32 step lands on a float16 midpoint (about 1 element in 15000).
        params = write_megatron_dump(self.golden, self.path("fp16", "params", "iter_0000001"), 2, [1, 2],
                                     group="steps/1/params", dtype=torch.float16)
        self.assertEqual(self.import_dump(params, self.path("fp16", "params_shards")).returncode, 0)
        with h5py.File(self.path("fp16", "params_shards", "rank_tp0_pp0.h5"), "r") as f:
            dataset = f["steps/1/params/embedding.word_embeddings.weight"]
            self.assertEqual((dataset.dtype, dataset.attrs["stored_dtype"]), (np.float32, "float16"))
        report = self.assert_passes(self.golden, self.path("fp16", "params_shards"), exact=False)
        tensors = common.compared(report)
        self.assertEqual({t["group"] for t in tensors}, {"params"})
        self.assertLessEqual(max(t["metrics"]["max_ulp"] for t in tensors), 1)
        self.assertLess(max(t["metrics"]["relative_l2"] for t in tensors), 2.0 ** -11 / 10)
        line = self.assert_refused(self.import_dump(params, self.path("fp16", "params_bad"), "--loss-scale", "8"))
        self.assertIn("--loss-scale is for gradient dumps", line)

    # ---- 16-bit parameter copies and two dumps in one directory ----
    @classmethod
    def bf16_envelope(cls):
        """A BF16-envelope golden file of the SHARDABLE model (FP64 values, per-dataset BF16 tolerances)."""
        path = os.path.join(cls.scratch.name, "golden_bf16.h5")
        if not os.path.exists(path):
            command = [common.TOUCHSTONE, "golden", "--out", path, "--set", "precision=bf16", "--envelope"]
            for key, value in common.SMALL.items():
                command += ["--set", f"{key}={value}"]
            for key, value in common.SHARDABLE.items():
                command += ["--set", f"{key.replace('__', '.')}={value}"]
            result = common.run(command)
            assert result.returncode == 0, result.stderr + result.stdout
        return path

    def independent(self, golden, name, *bugs):
        """tests/python/independent_candidate.py in its BF16 mode (FP32 master weights, FP32 gradients)."""
        out = self.path(f"{name}.h5")
        result = common.run([common.PYTHON, os.path.join(common.SOURCE, "tests", "python", "independent_candidate.py"),
                             golden, "--out", out, "--precision", "bf16", "--steps", "1",
                             *(["--inject", ",".join(bugs)] if bugs else [])])
        self.assertEqual(result.returncode, 0, result.stderr + result.stdout)
        return out

    def bf16_params_file(self, source, name, replace=None):
        """steps/1/params of `source` rounded to bfloat16 with torch (a golden-schema file; `replace`:
        {tensor: values} put in first)."""
        out = self.path(f"{name}.h5")
        with h5py.File(source, "r") as f, h5py.File(out, "w") as g:
            for tensor, dataset in f["steps/1/params"].items():
                values = (replace or {}).get(tensor, dataset[()])
                rounded = torch.from_numpy(np.asarray(values)).to(torch.bfloat16).float().numpy()
                g.create_dataset(f"steps/1/params/{tensor}", data=rounded)
        return out

    def test_megatron_bf16_params_dump_of_the_golden_parameters(self):
        # (a) --bf16's param.data of the golden step-1 parameters: compared with the golden ones rounded to
        # bfloat16 (through float32, as torch rounds float64 here), exactly, without --tolerance.
        dump = write_megatron_dump(self.golden, self.path("bf16", "params", "iter_0000001"), 2, [1, 2],
                                   group="steps/1/params", dtype=torch.bfloat16)
        result = self.import_dump(dump, self.path("bf16", "shards"))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("(bfloat16 copies, stored_dtype set)", result.stdout)
        with h5py.File(self.path("bf16", "shards", "rank_tp1_pp1.h5"), "r") as f:
            dataset = f["steps/1/params/output_layer.weight"]
            self.assertEqual((dataset.dtype, dataset.attrs["stored_dtype"]), (np.float32, "bfloat16"))
        report = self.assert_passes(self.golden, self.path("bf16", "shards"))
        tensors = common.compared(report)
        self.assertEqual(len(tensors), 2 + 6 * 3 + 1)
        self.assertTrue(all(t["metrics"]["max_ulp"] == 0 for t in tensors))
        self.assertIn("steps/1/params: bfloat16 copies, compared with the reference rounded to bfloat16 "
                      "(tolerance + one bfloat16 rounding on each side)", report["notes"])
        # Without the attribute the same numbers are float32 values and fail the FP64 tolerance.
        for t in range(2):
            for p in range(2):
                with h5py.File(self.path("bf16", "shards", f"rank_tp{t}_pp{p}.h5"), "a") as f:
                    for dataset in f["steps/1/params"].values():
                        del dataset.attrs["stored_dtype"]
        status, output, _ = common.diff(self.golden, self.path("bf16", "shards"))
        self.assertEqual(status, 1, output)

    def test_megatron_bf16_params_of_an_independent_bf16_run(self):
        # (b) the independent candidate's FP32 master parameters after update 1 rounded to bfloat16, as a
        # --bf16 run dumps them, against a BF16-envelope golden file.
        golden = self.bf16_envelope()
        source = self.bf16_params_file(self.independent(golden, "independent_correct"), "independent_bf16")
        dump = write_megatron_dump(source, self.path("ind", "params", "iter_0000001"), 2, [1, 2],
                                   group="steps/1/params", dtype=torch.bfloat16)
        self.assertEqual(self.import_dump(dump, self.path("ind", "shards")).returncode, 0)
        report = self.assert_passes(golden, self.path("ind", "shards"), exact=False)
        tensors = common.compared(report)
        self.assertEqual(len(tensors), 2 + 6 * 3 + 1)
        worst = max(tensors, key=lambda t: t["metrics"]["tolerance_ratio"])
        print(f"\n(b) BF16 params of the independent BF16 run: worst relative L2 "
              f"{max(t['metrics']['relative_l2'] for t in tensors):.3g}, worst max ulp "
              f"{max(t['metrics']['max_ulp'] for t in tensors)}, worst tolerance ratio "
              f"{worst['metrics']['tolerance_ratio']:.3g} ({worst['name']})", file=sys.stderr)

    def test_megatron_bf16_params_with_one_update_wrong(self):
        # (c) one tensor's parameters left at their initial values: that tensor fails, and only it.
        wrong = "decoder.layers.1.mlp.linear_fc1.weight"
        with h5py.File(self.golden, "r") as f:
            init = f[f"params/init/{wrong}"][()]
        source = self.bf16_params_file(self.golden, "one_wrong", {wrong: init})
        dump = write_megatron_dump(source, self.path("wrong", "params", "iter_0000001"), 2, [1, 2],
                                   group="steps/1/params", dtype=torch.bfloat16)
        self.assertEqual(self.import_dump(dump, self.path("wrong", "shards")).returncode, 0)
        status, output, report = common.diff(self.golden, self.path("wrong", "shards"))
        self.assertEqual(status, 1, output)
        self.assertEqual([t["path"] for t in report["tensors"] if t["status"] == "fail"], [f"steps/1/params/{wrong}"])
        self.assertEqual(report["first_failure"], f"steps/1/params/{wrong}")

    def two_dumps(self, golden, candidate, name):
        """wgrads/ (float32) and params/ (bfloat16) of iteration 1 imported into one shard directory."""
        grads = write_megatron_dump(candidate, self.path(name, "wgrads", "iter_0000001"), 2, [1, 2],
                                    dtype=torch.float32)
        params = write_megatron_dump(candidate, self.path(name, "params", "iter_0000001"), 2, [1, 2],
                                     group="steps/1/params", dtype=torch.bfloat16)
        out = self.path(name, "shards")
        result = self.import_dump(grads, out, "--loss-scale", "1")
        self.assertEqual(result.returncode, 0, result.stderr)
        result = self.import_dump(params, out)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertTrue(result.stdout.startswith(f"added to {out}: "), result.stdout)
        with open(os.path.join(out, "shards.json")) as f:
            imports = json.load(f)["imports"]
        self.assertEqual([(i["kind"], i["step"], i.get("loss_scale_removed")) for i in imports],
                         [("grads", 1, 1), ("params", 1, None)])
        return out

    def test_megatron_gradients_and_bf16_params_in_one_directory(self):
        # (d) the optimizer check on the candidate's own FP32 gradients and its BF16 copy of the update.
        golden = self.bf16_envelope()
        out = self.two_dumps(golden, self.independent(golden, "independent_two"), "two")
        status, output, report = common.diff(golden, out)
        self.assertEqual(status, 0, output)
        self.assertEqual(report["judgment"], "re-anchored at the candidate's parameters: steps 1; updated "
                         "parameters by the optimizer check: steps 1")
        groups = {(t["group"], t["basis"]) for t in common.compared(report)}
        self.assertEqual(groups, {("grads", "re-anchored"), ("params", "optimizer")})
        # A Megatron-LM schedule in a run whose golden file has Touchstone's: update 1 at the rate of
        # update 0 (the independent candidate's schedule_megatron), named through the BF16 copy.
        out = self.two_dumps(golden, self.independent(golden, "independent_behind", "schedule_megatron"), "behind")
        status, output, report = common.diff(golden, out)
        self.assertEqual(status, 1, output)
        self.assertIn("learning_rate_behind", common.signatures(report), output)
        self.assertTrue(report["first_failure"].startswith("steps/1/params/"), output)

    def test_megatron_append_refusals_leave_out_unchanged(self):
        # (e) a second dump added to OUT: refused with one line, every byte of OUT as it was.
        def snapshot(directory):
            state = {}
            for entry in sorted(os.listdir(directory)):
                path = os.path.join(directory, entry)
                if os.path.islink(path):
                    state[entry] = ("link", os.readlink(path))
                elif os.path.isfile(path):
                    with open(path, "rb") as f:
                        state[entry] = ("file", f.read())
                else:
                    state[entry] = ("other", os.stat(path).st_mode)
            return state

        grads = write_megatron_dump(self.golden, self.path("append", "wgrads", "iter_0000001"), 2, [1, 2])
        params = write_megatron_dump(self.golden, self.path("append", "params", "iter_0000001"), 2, [1, 2],
                                     group="steps/1/params", dtype=torch.bfloat16)
        other = write_megatron_dump(self.golden, self.path("append", "other", "params", "iter_0000001"), 1, [3],
                                    group="steps/1/params", dtype=torch.bfloat16)
        out = self.path("append", "shards")
        self.assertEqual(self.import_dump(grads, out).returncode, 0)
        before = snapshot(out)
        line = self.assert_refused(self.import_dump(other, out))
        self.assertIn("tp 2, but the dump has tp 1", line)
        self.assertEqual(snapshot(out), before)
        line = self.assert_refused(self.import_dump(grads, out))
        self.assertIn("steps/1/grads/", line)
        self.assertIn("is already there", line)
        self.assertEqual(snapshot(out), before)
        line = self.assert_refused(self.import_dump(grads, out, "--tied-embedding-grads", "partial"))
        self.assertIn("tied_embedding_grads", line)
        self.assertEqual(snapshot(out), before)
        # A symbolic link where a rank file was: refused, never replaced or written through.
        target = self.path("append", "elsewhere.h5")
        os.rename(os.path.join(out, "rank_tp1_pp0.h5"), target)
        os.symlink(target, os.path.join(out, "rank_tp1_pp0.h5"))
        def read(path):
            with open(path, "rb") as f:
                return f.read()
        before, target_bytes = snapshot(out), read(target)
        line = self.assert_refused(self.import_dump(params, out))
        self.assertIn("rank_tp1_pp0.h5: exists and is not a regular file", line)
        self.assertEqual(snapshot(out), before)
        self.assertEqual(read(target), target_bytes)
        # A FIFO at shards.json of a fresh directory, and the append that finally succeeds.
        fresh = self.path("append", "fifo")
        os.makedirs(fresh)
        os.mkfifo(os.path.join(fresh, "shards.json"))
        line = self.assert_refused(self.import_dump(grads, fresh))
        self.assertIn("shards.json: exists and is not a regular file", line)
        self.assertEqual(sorted(os.listdir(fresh)), ["shards.json"])
        os.remove(os.path.join(out, "rank_tp1_pp0.h5"))
        os.rename(target, os.path.join(out, "rank_tp1_pp0.h5"))
        self.assertEqual(self.import_dump(params, out).returncode, 0)
        report = self.assert_passes(self.golden, out, exact=False)
        self.assertEqual({t["group"] for t in common.compared(report)}, {"grads", "params"})

    def test_megatron_not_a_dump(self):
        versions = "--save-wgrads-interval (Megatron-Core core_v0.16.0 and later) and --save-params-interval " \
                   "(core_v0.18.0 and later)"
        expected = "no mp_rank_TT.pth, mp_rank_TT_PPP.pth or mp_rank_TT_PPP_EEE.pth files"

        def refused(name, files=(), directories=()):
            dump = self.path("not_a_dump", name, "wgrads", "iter_0000001")
            os.makedirs(dump)
            for entry in files:
                with open(os.path.join(dump, entry), "wb") as f:
                    f.write(b"x")
            for entry in directories:
                os.makedirs(os.path.join(dump, entry))
            line = self.assert_refused(self.import_dump(dump, self.path("not_a_dump", name, "shards")))
            self.assertIn(f"error: {dump}: {expected}", line)
            self.assertIn(versions, line)
            return line

        self.assertIn("it is empty", refused("empty"))
        self.assertIn("it holds grads_00.pt, mp_rank_0.pth, mp_rank_00.pt, mp_rank_00_00.pth",
                      refused("wrong_names", ["grads_00.pt", "mp_rank_0.pth", "mp_rank_00.pt", "mp_rank_00_00.pth"]))
        self.assertIn("checkpoint written by --save", refused("legacy_checkpoint", directories=["mp_rank_00_000"]))
        self.assertIn("checkpoint written by --save", refused("dist_checkpoint", ["__0_0.distcp", "common.pt"]))
        line = self.assert_refused(self.import_dump(self.path("not_a_dump", "absent", "wgrads", "iter_0000001"),
                                                    self.path("not_a_dump", "absent", "shards")))
        self.assertIn("cannot read the directory", line)
        parent = self.path("not_a_dump", "parent", "wgrads")
        os.makedirs(os.path.join(parent, "iter_0000001"))
        line = self.assert_refused(self.import_dump(parent, self.path("not_a_dump", "parent", "shards"),
                                                    "--kind", "grads", "--step", "1"))
        self.assertIn("iter_NNNNNNN directories: give one of them", line)
        # Two name forms in one directory would put two files in one place.
        dump = write_megatron_dump(self.golden, self.path("not_a_dump", "mixed", "wgrads", "iter_0000001"), 1, [3])
        shutil.copy(os.path.join(dump, "mp_rank_00.pth"), os.path.join(dump, "mp_rank_00_000.pth"))
        line = self.assert_refused(self.import_dump(dump, self.path("not_a_dump", "mixed", "shards")))
        self.assertIn("mp_rank_00.pth and mp_rank_00_000.pth are both tp 0 pp 0", line)
        os.rename(os.path.join(dump, "mp_rank_00_000.pth"), os.path.join(dump, "mp_rank_01_000.pth"))
        line = self.assert_refused(self.import_dump(dump, self.path("not_a_dump", "mixed", "shards")))
        self.assertIn("file names of different forms", line)

    def test_megatron_tied_embedding_and_params_dump(self):
        dump = write_megatron_dump(self.tied, self.path("tied", "wgrads", "iter_0000001"), 2, [1, 2], tied=True)
        self.assertEqual(self.import_dump(dump, self.path("tied", "grads")).returncode, 0)
        self.assert_passes(self.tied, self.path("tied", "grads"))
        dump = write_megatron_dump(self.tied, self.path("tied", "params", "iter_0000001"), 2, [1, 2],
                                   group="steps/1/params", tied=True)
        self.assertEqual(self.import_dump(dump, self.path("tied", "params_shards")).returncode, 0)
        report = self.assert_passes(self.tied, self.path("tied", "params_shards"))
        self.assertTrue(all(t["group"] == "params" for t in common.compared(report)))

    def test_megatron_fp32_dump_needs_a_tolerance_for_fp32(self):
        dump = write_megatron_dump(self.golden, self.path("fp32", "wgrads", "iter_0000001"), 2, [3],
                                   dtype=torch.float32)
        self.assertEqual(self.import_dump(dump, self.path("fp32", "shards")).returncode, 0)
        status, output, _ = common.diff(self.golden, self.path("fp32", "shards"))
        self.assertEqual(status, 1, output)
        self.assert_passes(self.golden, self.path("fp32", "shards"), "--tolerance", "1e-6", exact=False)

    def test_megatron_bad_dumps(self):
        def refused(name, edit):
            dump = write_megatron_dump(self.golden, self.path(name, "wgrads", "iter_0000001"), 2, [1, 2])
            edit(dump)
            result = self.import_dump(dump, self.path(name, "shards"))
            self.assertEqual(result.returncode, 2, result.stderr)
            self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
            return result.stderr

        def rewrite(dump, change):
            path = os.path.join(dump, "mp_rank_00_000.pth")
            state = torch.load(path)
            change(state)
            torch.save(state, path)

        self.assertIn("virtual pipeline", refused("chunks", lambda d: rewrite(d, lambda s: s.update(model_chunk1={}))))
        bias = lambda s: s["model_chunk0"].update({"decoder.layers.0.mlp.linear_fc1.bias": torch.zeros(32)})
        self.assertIn("linear_fc1.bias", refused("bias", lambda d: rewrite(d, bias)))
        remove = lambda dump: os.remove(os.path.join(dump, "mp_rank_01_001.pth"))
        self.assertIn("missing rank files", refused("missing", remove))

        def truncate(dump):
            with open(os.path.join(dump, "mp_rank_00_000.pth"), "r+b") as f:
                f.truncate(100)
        self.assertIn("cannot load", refused("truncated", truncate))
        dump = write_megatron_dump(self.golden, self.path("no_iter", "somewhere"), 1, [3])
        result = self.import_dump(dump, self.path("no_iter", "shards"))
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("--kind and --step", result.stderr)

    # ---- safetensors ----
    def test_safetensors_gradients_and_parameters(self):
        grads = write_safetensors(self.path("grads.safetensors"), hf_tensors(self.golden, "steps/1/grads"))
        report = self.assert_passes(self.golden, grads, "--candidate-kind", "grads", "--step", "1")
        self.assertEqual({t["group"] for t in common.compared(report)}, {"grads"})
        self.assertIn("not_compared", {t["status"] for t in report["tensors"]}, "the loss and params are reported")
        params = write_safetensors(self.path("params.safetensors"), hf_tensors(self.golden, "steps/1/params"), "F32")
        status, output, _ = common.diff(self.golden, params, "--candidate-kind", "params")
        self.assertEqual(status, 1, output)
        self.assert_passes(self.golden, params, "--candidate-kind", "params", "--tolerance", "1e-6", exact=False)

    def test_safetensors_without_the_model_prefix_is_partial(self):
        # A bare LlamaModel saves its tensors without "model."; only lm_head.weight then matches a golden
        # name. Passing on that one tensor would hide that nothing else was checked.
        bare = {(n[len("model."):] if n.startswith("model.") else n): t
                for n, t in hf_tensors(self.golden, "steps/1/grads").items()}
        path = write_safetensors(self.path("bare.safetensors"), bare)
        status, output, report = common.diff(self.golden, path, "--candidate-kind", "grads")
        self.assertEqual(status, 1, output)
        self.assertEqual(report["summary"]["failed"], 0, output)
        self.assertTrue(report["partial"][0].startswith("steps/1/grads: "), report["partial"])
        self.assertIn("likely cause", output)
        self.assertIn("'model.' prefix", output)
        status, output, _ = common.diff(self.golden, path, "--candidate-kind", "grads", "--allow-partial")
        self.assertEqual(status, 0, output)

    def test_safetensors_low_precision_initial_weights(self):
        # BF16 through float32 (bfloat16_bytes) and F16 in one rounding (numpy), as the diff rounds its
        # reference: exactly equal, in ulps of the 16-bit type, without a --tolerance.
        for dtype, name in (("BF16", "bfloat16"), ("F16", "float16")):
            with self.subTest(dtype=dtype):
                init = write_safetensors(self.path(f"init_{dtype}.safetensors"),
                                         hf_tensors(self.golden, "params/init"), dtype)
                report = self.assert_passes(self.golden, init, "--candidate-kind", "params", "--step", "0")
                self.assertTrue(all(t["metrics"]["max_ulp"] == 0 for t in common.compared(report)))
                self.assertIn(f"params/init: {name} copies, compared with the reference rounded to {name} "
                              f"(tolerance + one {name} rounding on each side)", report["notes"])
                # One element one ulp off is seen, in those ulps.
                tensors = hf_tensors(self.golden, "params/init")
                tensors["model.norm.weight"] = tensors["model.norm.weight"].copy()
                tensors["model.norm.weight"][3] = 1.0 + 2.0 ** (-7 if dtype == "BF16" else -10)  # golden: 1
                off = write_safetensors(self.path(f"init_{dtype}_off.safetensors"), tensors, dtype)
                status, output, report = common.diff(self.golden, off, "--candidate-kind", "params", "--step", "0")
                norm = next(t for t in report["tensors"] if t["name"] == "decoder.final_layernorm.weight")
                self.assertEqual(norm["metrics"]["max_ulp"], 1, output)

    def test_safetensors_sharded_checkpoint_and_tied_head(self):
        tensors = hf_tensors(self.tied, "steps/1/grads", tied=True)
        tensors["model.rotary_emb.inv_freq"] = np.ones(2)
        names = sorted(tensors)
        directory = self.path("sharded_checkpoint")
        os.makedirs(directory)
        for index, part in enumerate((names[:9], names[9:]), start=1):
            write_safetensors(os.path.join(directory, f"model-0000{index}-of-00002.safetensors"),
                              {n: tensors[n] for n in part})
        report = self.assert_passes(self.tied, directory, "--candidate-kind", "grads")
        self.assertTrue(any("lm_head.weight" in note for note in report["notes"]))
        self.assertTrue(any("model.rotary_emb.inv_freq" in note for note in report["notes"]))

    def test_malformed_safetensors_are_bad_input(self):
        tensors = hf_tensors(self.golden, "steps/1/grads")
        q = "model.layers.0.self_attn.q_proj.weight"

        def patch(key, value):
            return lambda header: header[q].__setitem__(key, value)
        cases = {
            "truncated_data": dict(cut=8),
            "offsets_disagree_with_shape": dict(header_patch=patch("shape", [31, 32])),
            "unknown_dtype": dict(header_patch=patch("dtype", "F8_E4M3")),
            "negative_extent": dict(header_patch=patch("shape", [-1, 32])),
            "offsets_outside": dict(header_patch=patch("data_offsets", [0, 1 << 40])),
            "entry_without_offsets": dict(header_patch=lambda h: h[q].pop("data_offsets")),
        }
        for name, options in cases.items():
            with self.subTest(case=name):
                path = write_safetensors(self.path(f"bad_{name}.safetensors"), tensors, **options)
                self.assert_bad(path, "--candidate-kind", "grads")
        wrong_shape = dict(tensors)
        wrong_shape[q] = tensors[q][:-4]
        self.assert_bad(write_safetensors(self.path("bad_q_shape.safetensors"), wrong_shape),
                        "--candidate-kind", "grads")
        no_k = {n: t for n, t in tensors.items() if "k_proj" not in n}
        self.assert_bad(write_safetensors(self.path("bad_no_k.safetensors"), no_k), "--candidate-kind", "grads")
        good = write_safetensors(self.path("good.safetensors"), tensors)
        self.assertIn("say what the safetensors tensors are with --candidate-kind grads|params",
                      self.assert_bad(good))  # no --candidate-kind
        self.assertIn("--step 0 is not a step with grads", self.assert_bad(good, "--candidate-kind", "grads",
                                                                           "--step", "0"))
        raw = {"header_not_json": struct.pack("<Q", 4) + b"{abc",
               "header_longer_than_file": struct.pack("<Q", 1 << 20) + b"{}",
               "shorter_than_8_bytes": b"\x01\x02",
               "header_not_object": struct.pack("<Q", 2) + b"[]",
               "no_known_tensor": struct.pack("<Q", 2) + b"{}"}
        for name, content in raw.items():
            with self.subTest(case=name):
                path = self.path(f"raw_{name}.safetensors")
                with open(path, "wb") as f:
                    f.write(content)
                self.assert_bad(path, "--candidate-kind", "grads")

    def assert_bad(self, candidate, *args):
        status, output, report = common.diff(self.golden, candidate, *args)
        self.assertEqual(status, 2, output)
        self.assertEqual(len(output.strip().splitlines()), 1, output)
        self.assertIsNone(report, "no report is written for bad input")
        return output


if __name__ == "__main__":
    common.setup_from_argv()
    unittest.main()
