"""Per-rank shards (the "shards" candidate format): round trips of every sharded tensor kind at TP 1, 2
and 4 and PP 1 and 2 (uneven stages both ways, tied embeddings), from shards written here in Megatron-
LM's layout (megatron_layout.py); a corrupted shard named as one; inconsistent shard sets refused.

Usage: test_diff_shards.py PATH_TO_TOUCHSTONE PATH_TO_SOURCE_TREE
"""

import json
import os
import unittest

import h5py
import numpy as np

import diff_common as common
import megatron_layout

GROUPS = ("params/init", "steps/1/grads", "steps/1/params")
SCALARS = ("steps/1/loss", "steps/1/num_loss_tokens", "steps/1/grad_norm", "steps/1/lr")


def write_shards(golden, directory, tp, stage_layers, tied=False, tied_grads="partial", layout_extra=None,
                 change=None):
    """Writes shards.json and rank_tp{t}_pp{p}.h5 from the golden tensors. `change(group, stage, rank,
    local_name, array) -> array or None` may alter or drop (None) a shard."""
    pp = len(stage_layers)
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(7)
    files = {(t, p): h5py.File(os.path.join(directory, f"rank_tp{t}_pp{p}.h5"), "w")
             for t in range(tp) for p in range(pp)}
    with h5py.File(golden, "r") as g:
        for group in GROUPS:
            for name, dataset in g[group].items():
                full = dataset[()]
                places = megatron_layout.placements(name, stage_layers, tied)
                parts = [full] * len(places)
                if len(places) == 2 and group.endswith("grads") and tied_grads == "partial":
                    # Each stage's own part, split exactly (Sterbenz: split within a factor 2 of full),
                    # as a real run's two parts add up to the gradient its optimizer consumed.
                    split = full * rng.uniform(0.5, 1.0, full.shape)
                    parts = [full - split, split]
                for (stage, local), part in zip(places, parts):
                    for t in range(tp):
                        array = megatron_layout.shard(name, part, tp, t)
                        if change is not None:
                            array = change(group, stage, t, local, array)
                        if array is not None:
                            files[(t, stage)].create_dataset(f"{group}/{local}", data=array)
        for path in SCALARS:
            files[(0, pp - 1)].create_dataset(path, data=g[path][()])
    for f in files.values():
        f.close()
    layout = {"format": "touchstone-shards", "format_version": 1, "tp": tp, "pp": pp, "stage_layers": stage_layers,
              "tied_embedding_grads": tied_grads}
    layout.update(layout_extra or {})
    with open(os.path.join(directory, "shards.json"), "w") as f:
        json.dump(layout, f)
    return directory


class ShardReassembly(common.ShardableGoldens):
    def directory(self, name):
        return os.path.join(self.scratch.name, name)

    def assert_round_trip(self, golden, directory, exact=True):
        status, output, report = common.diff(golden, directory)
        self.assertEqual(status, 0, output)
        tensors = common.compared(report)
        self.assertEqual(len(tensors), len(report["tensors"]), output)
        with h5py.File(golden, "r") as g:
            expected = sum(len(g[group]) for group in GROUPS) + len(SCALARS)
        self.assertEqual(len(tensors), expected, "every golden tensor of the shards is compared")
        worst = max(t["metrics"]["relative_l2"] for t in tensors)
        self.assertLessEqual(worst, 0.0 if exact else 1e-15, output)

    def test_every_kind_at_tp_1_2_4_and_pp_1_2(self):
        for tp in (1, 2, 4):
            for stages in ([3], [1, 2], [2, 1]):
                with self.subTest(tp=tp, stage_layers=stages):
                    name = f"tp{tp}_pp{len(stages)}_{'_'.join(map(str, stages))}"
                    self.assert_round_trip(self.golden, write_shards(self.golden, self.directory(name), tp, stages))

    def test_tied_embeddings(self):
        for tp, stages, tied_grads, exact in ((2, [1, 2], "partial", True), (4, [2, 1], "summed", True),
                                              (2, [3], "partial", True)):
            with self.subTest(tp=tp, stage_layers=stages, tied_embedding_grads=tied_grads):
                name = f"tied_tp{tp}_{'_'.join(map(str, stages))}_{tied_grads}"
                directory = write_shards(self.tied, self.directory(name), tp, stages, tied=True, tied_grads=tied_grads)
                self.assert_round_trip(self.tied, directory, exact)

    def test_partial_tied_gradient_without_the_last_stage_copy_is_refused(self):
        drop = lambda group, stage, t, local, a: None if stage == 1 and local == "output_layer.weight" else a
        directory = write_shards(self.tied, self.directory("tied_missing"), 2, [1, 2], tied=True, change=drop)
        status, output, _ = common.diff(self.tied, directory)
        self.assertEqual(status, 2, output)
        self.assertIn("output_layer.weight", output)

    def test_one_corrupted_shard_is_named(self):
        def zero(group, stage, t, local, array):
            hit = (group == "steps/1/grads" and stage == 0 and t == 1
                   and local == "decoder.layers.1.self_attention.linear_qkv.weight")
            return np.zeros_like(array) if hit else array
        directory = write_shards(self.golden, self.directory("corrupt"), 4, [2, 1], change=zero)
        status, output, report = common.diff(self.golden, directory)
        self.assertEqual(status, 1, output)
        self.assertEqual(report["first_failure"], "steps/1/grads/decoder.layers.1.self_attention.linear_qkv.weight")
        messages = [v["message"] for v in report["verdicts"] if v["signature"] == "tp_shard"]
        self.assertEqual(len(messages), 1, output)
        self.assertIn("only tp rank 1 of 4 (rows [16, 32)) differs", messages[0])

    def test_inconsistent_shards_are_bad_input(self):
        cases = {
            "wrong_shape": dict(change=lambda g, s, t, local, a: a[:-1] if local.endswith("linear_fc2.weight") else a),
            "stage_layers_sum": dict(layout_extra={"stage_layers": [1, 1]}),
            "tie_mismatch": dict(layout_extra={"tie_embeddings": True}),
            "missing_on_one_rank":
                dict(change=lambda g, s, t, local, a: None if t == 1 and local.endswith("fc1.weight") else a),
            "bad_format": dict(layout_extra={"format_version": 2}),
            "bad_tp": dict(layout_extra={"tp": "two"}),
        }
        for name, options in cases.items():
            with self.subTest(case=name):
                directory = write_shards(self.golden, self.directory("bad_" + name), 2, [1, 2], **options)
                status, output, _ = common.diff(self.golden, directory)
                self.assertEqual(status, 2, output)
                self.assertEqual(len(output.strip().splitlines()), 1, output)
        directory = write_shards(self.golden, self.directory("missing_file"), 2, [1, 2])
        os.remove(os.path.join(directory, "rank_tp1_pp1.h5"))
        status, output, _ = common.diff(self.golden, directory)
        self.assertEqual(status, 2, output)
        self.assertIn("rank_tp1_pp1.h5", output)

    def test_layer_number_outside_its_stage_is_bad_input(self):
        rename = lambda g, s, t, local, a: a
        directory = write_shards(self.golden, self.directory("global_numbers"), 1, [1, 2], change=rename)
        with h5py.File(os.path.join(directory, "rank_tp0_pp1.h5"), "a") as f:
            f["steps/1/grads"].move("decoder.layers.1.mlp.linear_fc2.weight", "decoder.layers.2.mlp.linear_fc2.weight")
        status, output, _ = common.diff(self.golden, directory)
        self.assertEqual(status, 2, output)
        self.assertIn("local to the stage", output)


if __name__ == "__main__":
    common.setup_from_argv()
    unittest.main()
