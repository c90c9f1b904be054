"""Per-rank shards (the "shards" candidate format): round trips of every sharded tensor kind at TP 1, 2
and 4 and PP 1 and 2 (uneven stages both ways, tied embeddings) and CP 2 and 4 (the copies checked, the
token losses of each cp rank's rows put back in place), from shards written here in Megatron-LM's
layout (megatron_layout.py); a corrupted shard named as one; a cp copy that differs named; inconsistent
shard sets refused.

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


def load_balanced_positions(T, cp, rank):
    """The window positions of cp rank `rank`'s rows: chunks rank and 2cp-1-rank of the window cut in 2cp."""
    chunk = T // (2 * cp)
    return [p for c in (rank, 2 * cp - 1 - rank) for p in range(c * chunk, (c + 1) * chunk)]


def write_shards(golden, directory, tp, stage_layers, tied=False, tied_grads="partial", layout_extra=None,
                 change=None, cp=1, copy_change=None):
    """Writes shards.json and rank_tp{t}_pp{p}.h5 (rank_tp{t}_cp{c}_pp{p}.h5 with cp > 1) from the golden
    tensors. `change(group, stage, rank, local_name, array) -> array or None` may alter or drop (None) a
    shard; `copy_change(cp_rank, group, stage, rank, local_name, array)` does the same to the copies of cp
    ranks > 0. With cp > 1 every cp rank holds the same shards and the token losses of its own rows."""
    pp = len(stage_layers)
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(7)
    name = lambda t, c, p: f"rank_tp{t}_cp{c}_pp{p}.h5" if cp > 1 else f"rank_tp{t}_pp{p}.h5"
    all_files = {(t, c, p): h5py.File(os.path.join(directory, name(t, c, p)), "w")
                 for t in range(tp) for c in range(cp) for p in range(pp)}
    files = {(t, p): all_files[(t, 0, p)] for t in range(tp) for p in range(pp)}
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
                        if array is None:
                            continue
                        files[(t, stage)].create_dataset(f"{group}/{local}", data=array)
                        for c in range(1, cp):
                            copy = array if copy_change is None else copy_change(c, group, stage, t, local, array)
                            if copy is not None:
                                all_files[(t, c, stage)].create_dataset(f"{group}/{local}", data=copy)
        for path in SCALARS:
            files[(0, pp - 1)].create_dataset(path, data=g[path][()])
        if cp > 1:
            token_losses = g["steps/1/token_losses"][()]
            for c in range(cp):
                rows = token_losses[:, load_balanced_positions(token_losses.shape[1], cp, c)]
                all_files[(0, c, pp - 1)].create_dataset("steps/1/token_losses", data=rows)
    for f in all_files.values():
        f.close()
    layout = {"format": "touchstone-shards", "format_version": 1, "tp": tp, "pp": pp, "stage_layers": stage_layers,
              "tied_embedding_grads": tied_grads}
    if cp > 1:
        layout["cp"] = cp
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

    def test_context_parallel_copies_and_token_losses(self):
        # Each cp rank holds the same shards and its own rows' token losses ([B, T/cp], load-balanced
        # rows): the copies agree, the token losses go back to their positions, everything equals the golden.
        for tp, cp in ((1, 2), (2, 2), (2, 4)):
            with self.subTest(tp=tp, cp=cp):
                directory = write_shards(self.golden, self.directory(f"cp{cp}_tp{tp}"), tp, [1, 2], cp=cp)
                status, output, report = common.diff(self.golden, directory)
                self.assertEqual(status, 0, output)
                self.assertIn(f"cp {cp}", report["candidate"]["format"], output)
                token_losses = [t for t in report["tensors"] if t["path"] == "steps/1/token_losses"]
                self.assertEqual([t["status"] for t in token_losses], ["pass"], output)
                self.assertEqual(token_losses[0]["metrics"]["relative_l2"], 0.0, output)
                self.assertEqual(report["replicas_disagree"], [], output)

    def test_context_parallel_copy_that_differs_is_named(self):
        # cp rank 1's gradient of one tensor is its own rows' share (half, say): not all-reduced over cp.
        # Rank 0's copy is the golden one, so every compared tensor passes; the disagreement fails the run.
        target = "decoder.layers.0.mlp.linear_fc1.weight"
        halve = lambda c, group, stage, t, local, a: (a * 0.5 if group == "steps/1/grads" and stage == 0
                                                      and local == target else a)
        directory = write_shards(self.golden, self.directory("cp_disagree"), 2, [1, 2], cp=2, copy_change=halve)
        status, output, report = common.diff(self.golden, directory)
        self.assertEqual(status, 1, output)
        self.assertEqual(report["summary"]["failed"], 0, output)
        self.assertEqual(len(report["replicas_disagree"]), 2, output)  # both tp ranks' shards
        self.assertTrue(all(f"steps/1/grads/{target}: cp rank 1's copy" in d for d in report["replicas_disagree"]),
                        output)
        self.assertIn("cp_replicas_disagree", common.signatures(report), output)
        # Without the difference the same candidate passes (the test can tell the two apart).
        same = write_shards(self.golden, self.directory("cp_agree"), 2, [1, 2], cp=2)
        self.assertEqual(common.diff(self.golden, same)[0], 0)

    def test_inconsistent_context_parallel_shards_are_bad_input(self):
        drop = lambda c, group, stage, t, local, a: None if local.endswith("fc2.weight") else a
        directory = write_shards(self.golden, self.directory("cp_missing_copy"), 1, [3], cp=2, copy_change=drop)
        status, output, _ = common.diff(self.golden, directory)
        self.assertEqual(status, 2, output)
        self.assertIn("which cp rank 0 holds", output)
        directory = write_shards(self.golden, self.directory("cp_missing_file"), 1, [3], cp=2)
        os.remove(os.path.join(directory, "rank_tp0_cp1_pp0.h5"))
        status, output, _ = common.diff(self.golden, directory)
        self.assertEqual((status, len(output.strip().splitlines())), (2, 1), output)
        self.assertIn("rank_tp0_cp1_pp0.h5", output)
        directory = write_shards(self.golden, self.directory("cp_token_losses"), 1, [3], cp=2)
        with h5py.File(os.path.join(directory, "rank_tp0_cp1_pp0.h5"), "a") as f:
            rows = f["steps/1/token_losses"][()]
            del f["steps/1/token_losses"]
            f["steps/1/token_losses"] = rows[:, :-1]
        status, output, _ = common.diff(self.golden, directory)
        self.assertEqual(status, 2, output)
        self.assertIn("cp rank 1 holds shape", output)
        directory = write_shards(self.golden, self.directory("cp_not_dividing"), 1, [3], layout_extra={"cp": 3})
        status, output, _ = common.diff(self.golden, directory)
        self.assertEqual(status, 2, output)
        self.assertIn("parallel.cp", output)

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
