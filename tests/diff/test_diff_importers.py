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
            self.assertEqual(json.load(f)["loss_scale_removed"], 65536)
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
        # Parameters are dumped after optimizer.step(): float16 ones need no loss scale and take none.
        params = write_megatron_dump(self.golden, self.path("fp16", "params", "iter_0000001"), 2, [1, 2],
                                     group="steps/1/params", dtype=torch.float16)
        self.assertEqual(self.import_dump(params, self.path("fp16", "params_shards")).returncode, 0)
        self.assert_passes(self.golden, self.path("fp16", "params_shards"), "--tolerance", "2e-3", exact=False)
        line = self.assert_refused(self.import_dump(params, self.path("fp16", "params_bad"), "--loss-scale", "8"))
        self.assertIn("--loss-scale is for gradient dumps", line)

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
        for dtype, tolerance in (("BF16", "1e-2"), ("F16", "1e-3")):
            with self.subTest(dtype=dtype):
                init = write_safetensors(self.path(f"init_{dtype}.safetensors"),
                                         hf_tensors(self.golden, "params/init"), dtype)
                report = self.assert_passes(self.golden, init, "--candidate-kind", "params", "--step", "0",
                                            "--tolerance", tolerance, exact=False)
                self.assertTrue(all(t["metrics"]["max_ulp"] is None for t in common.compared(report)))

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
