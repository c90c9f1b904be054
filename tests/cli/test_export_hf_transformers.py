"""`touchstone export hf` loaded by Hugging Face transformers itself: for golden files with untied and
tied embeddings and with 8 query heads on 2 KV heads, `LlamaForCausalLM.from_pretrained(DIR,
torch_dtype=torch.float64)` reports no missing, unexpected or mismatched key, and every parameter of the
loaded model equals the golden one bit for bit, after test_export_hf.py's own Hugging Face layout of the
golden tensors (a tied lm_head is the embedding itself). And the loaded model computes what Touchstone
computed: on step 1's batch of a golden file without document masking (a plain causal mask, which is
what LlamaForCausalLM applies), its cross entropy of every position equals /steps/1/token_losses within
1e-5. Hugging Face computes the RoPE angles in float32 whatever the model's dtype, which moves the losses
by about 6e-8 here; a rotary convention or a key-head order other than Touchstone's moves them by 2e-3.

transformers 4.47.1 comes from PYTHONPATH (CTest sets it to TOUCHSTONE_PYTHON_DEPS, which
tools/install-deps.sh fills); without it this test fails, it does not skip.

Usage: test_export_hf_transformers.py PATH_TO_TOUCHSTONE   (/usr/bin/python3 with torch, numpy, h5py)
"""
import os
import subprocess
import sys
import tempfile
import unittest

import h5py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_export_hf  # noqa: E402  (the golden files and the test's own Hugging Face layout)

TOUCHSTONE = None
VERSION = "4.47.1"
CONFIGS = {name: test_export_hf.CONFIGS[name] for name in ("default", "tied", "gqa")}
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory only: nothing is fetched
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def import_transformers():
    """(torch, transformers, LlamaForCausalLM), or a failure saying how to install them."""
    where = os.environ.get("PYTHONPATH", "(PYTHONPATH not set)")
    try:
        import torch
        import transformers
        from transformers import LlamaForCausalLM
    except Exception as error:  # ImportError, or transformers' RuntimeError naming a missing module
        raise AssertionError(f"cannot import transformers' LlamaForCausalLM from {where}: {error}; "
                             "run tools/install-deps.sh (it installs transformers into build/python-deps)")
    if transformers.__version__ != VERSION:
        raise AssertionError(f"transformers {transformers.__version__} from {transformers.__file__}, this test "
                             f"needs {VERSION}: run tools/install-deps.sh")
    return torch, transformers, LlamaForCausalLM


class LoadedByTransformers(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.torch, cls.transformers, cls.llama = import_transformers()
        cls.dir = tempfile.TemporaryDirectory()
        test_export_hf.TOUCHSTONE = TOUCHSTONE

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_from_pretrained_holds_exactly_the_golden_parameters(self):
        torch = self.torch
        for name, overrides in CONFIGS.items():
            with self.subTest(config=name):
                golden = test_export_hf.make_golden(os.path.join(self.dir.name, name + ".h5"), overrides)
                out = os.path.join(self.dir.name, name)
                result = subprocess.run([TOUCHSTONE, "export", "hf", "--golden", golden, "--out", out],
                                        capture_output=True, text=True, timeout=300)
                self.assertEqual(result.returncode, 0, result.stderr)
                model, info = self.llama.from_pretrained(out, torch_dtype=torch.float64, output_loading_info=True)
                self.assertEqual(info["missing_keys"], [])
                self.assertEqual(info["unexpected_keys"], [])
                self.assertEqual(info["mismatched_keys"], [])
                self.assertEqual(info["error_msgs"], [])
                expected = test_export_hf.expected_hf_tensors(golden, "params/init")
                parameters = model.state_dict()  # every name, a tied lm_head.weight included
                self.assertEqual(sorted(parameters), sorted({*expected, "lm_head.weight"}))
                tied = name == "tied"
                self.assertEqual(model.lm_head.weight is model.model.embed_tokens.weight, tied)
                for key, parameter in parameters.items():
                    want = expected["model.embed_tokens.weight" if tied and key == "lm_head.weight" else key]
                    got = parameter.detach().numpy()
                    self.assertEqual(got.dtype, "float64", key)
                    self.assertEqual(got.shape, want.shape, key)
                    self.assertEqual(got.tobytes(), want.astype("float64").tobytes(), key)
                config = model.config
                self.assertEqual((config.num_attention_heads, config.num_key_value_heads),
                                 (8, 2) if name == "gqa" else (4, 2))
                self.assertEqual(config.tie_word_embeddings, tied)

    def test_forward_pass_gives_the_golden_token_losses(self):
        torch = self.torch
        golden = test_export_hf.make_golden(os.path.join(self.dir.name, "causal.h5"),
                                            ["--set", "data.document_masking=false"])
        out = os.path.join(self.dir.name, "causal")
        result = subprocess.run([TOUCHSTONE, "export", "hf", "--golden", golden, "--out", out],
                                capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr)
        model = self.llama.from_pretrained(out, torch_dtype=torch.float64).eval()
        with h5py.File(golden, "r") as f:
            tokens, targets, positions = (torch.from_numpy(f["batch/" + name][0]).long()
                                          for name in ("tokens", "targets", "position_ids"))
            golden_losses = f["steps/1/token_losses"][()]
        with torch.no_grad():
            logits = model(input_ids=tokens, position_ids=positions).logits
        losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100,
                                                   reduction="none").reshape(targets.shape).numpy()
        worst = float(abs(losses - golden_losses).max())
        self.assertLess(worst, 1e-5, "the loaded model's token losses differ from the golden file's")


if __name__ == "__main__":
    TOUCHSTONE = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
