"""tools/import_megatron_dump.py refuses hostile and malformed dumps with exit status 2 and one line: a
pickle that would run code (it is never run unless --trusted-dump), and values that are not dense
floating-point tensors (sparse, meta, integer tensors, and values that are no tensors at all), each
named. The dumps are written here with torch.save; no golden file is needed, as every refusal comes
before the dump is compared with anything.

Usage: test_diff_megatron_refusals.py PATH_TO_TOUCHSTONE PATH_TO_SOURCE_TREE
"""

import os
import sys
import unittest

import torch

import diff_common as common


class PlantsAFile:
    """Unpickling this runs os.system(touch PATH): what a hostile dump can do under torch.load."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


class MegatronRefusals(unittest.TestCase):
    def setUp(self):
        self.scratch = common.tempfile.TemporaryDirectory()

    def tearDown(self):
        self.scratch.cleanup()

    def path(self, *parts):
        return os.path.join(self.scratch.name, *parts)

    def dump(self, name, value):
        """A one-rank gradient dump whose output_layer.weight is `value`."""
        directory = self.path(name, "wgrads", "iter_0000001")
        os.makedirs(directory)
        tensors = {"embedding.word_embeddings.weight": torch.zeros(8, 4), "output_layer.weight": value,
                   "decoder.final_layernorm.weight": torch.ones(4)}
        for suffix, shape in (("input_layernorm.weight", (4,)), ("self_attention.linear_qkv.weight", (8, 4)),
                              ("self_attention.linear_proj.weight", (4, 4)), ("pre_mlp_layernorm.weight", (4,)),
                              ("mlp.linear_fc1.weight", (8, 4)), ("mlp.linear_fc2.weight", (4, 4))):
            tensors[f"decoder.layers.0.{suffix}"] = torch.zeros(shape)
        torch.save({"model_chunk0": tensors}, os.path.join(directory, "mp_rank_00.pth"))
        return directory

    def run_import(self, dump, *extra):
        script = os.path.join(common.SOURCE, "tools", "import_megatron_dump.py")
        return common.run([common.PYTHON, script, dump, "--out", os.path.join(os.path.dirname(dump), "out"),
                           *extra])

    def assert_refused(self, result, *words):
        self.assertEqual(result.returncode, 2, result.stderr + result.stdout)
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertTrue(lines[0].startswith("import_megatron_dump.py: error: "), lines[0])
        for word in words:
            self.assertIn(word, lines[0])

    def test_a_pickle_that_runs_code_is_refused_before_it_runs(self):
        planted = self.path("planted")
        dump = self.dump("hostile", PlantsAFile(planted))
        self.assert_refused(self.run_import(dump), "mp_rank_00.pth", "--trusted-dump", "posix.system")
        self.assertFalse(os.path.exists(planted), "the dump's code ran")
        # Trusted, it is loaded (and its code runs); the value it leaves is then refused as no tensor.
        self.assert_refused(self.run_import(dump, "--trusted-dump"), "output_layer.weight", "not a tensor")
        self.assertTrue(os.path.exists(planted))

    def test_a_trusted_dump_of_tensors_imports(self):
        dump = self.dump("trusted", torch.zeros(8, 4))
        result = self.run_import(dump, "--trusted-dump")
        self.assertEqual(result.returncode, 0, result.stderr)

    def test_values_that_are_not_dense_tensors_are_named(self):
        # --trusted-dump: torch 1.13's weights_only unpickler refuses a float (torch 2 does not), and the
        # refusal of each value by name must not depend on that.
        cases = {
            "sparse": (torch.zeros(8, 4).to_sparse(), "a sparse_coo tensor, not a dense one"),
            "meta": (torch.zeros(8, 4, device="meta"), "a meta tensor"),
            "integers": (torch.zeros(8, 4, dtype=torch.int64), "holds int64 values, not floating-point ones"),
            "number": (3.0, "a value of type float, not a tensor"),
        }
        for name, (value, words) in cases.items():
            with self.subTest(name):
                dump = self.dump(name, value)
                self.assert_refused(self.run_import(dump, "--trusted-dump"), "output_layer.weight", words)
                if torch.is_tensor(value):  # loaded alike without it
                    self.assert_refused(self.run_import(dump), "output_layer.weight", words)


if __name__ == "__main__":
    common.setup_from_argv()
    unittest.main(verbosity=1)
