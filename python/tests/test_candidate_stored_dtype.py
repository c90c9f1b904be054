"""touchstone.candidate: torch bfloat16 and float16 parameters are written as 16-bit copies (the
stored_dtype attribute), gradients are not, and `touchstone diff` then compares the golden parameters
rounded by torch exactly against the reference rounded the same way, while a wrong tensor still fails."""

import json
import subprocess

import h5py
import numpy as np
import pytest
import torch

from touchstone import CandidateWriter, GoldenFile


def diff(touchstone, golden, candidate, tmp_path):
    report = tmp_path / "report.json"
    result = subprocess.run([touchstone, "diff", str(golden), str(candidate), "--json", str(report)],
                            capture_output=True, text=True)
    return result, (json.loads(report.read_text()) if report.exists() else None)


def test_the_attribute_marks_parameters_only(tmp_path):
    out = tmp_path / "c.h5"
    with CandidateWriter(out, dtype=np.float32) as c:
        c.write_init({"embedding.word_embeddings.weight": torch.ones(2, 2, dtype=torch.bfloat16)})
        c.write_step(1, grads={"embedding.word_embeddings.weight": torch.ones(2, 2, dtype=torch.bfloat16)},
                     params={"embedding.word_embeddings.weight": torch.full((2, 2), 0.1, dtype=torch.float16),
                             "output_layer.weight": torch.ones(2, 2, dtype=torch.float32)})
    with h5py.File(out, "r") as f:
        assert f["params/init/embedding.word_embeddings.weight"].attrs["stored_dtype"] == "bfloat16"
        copy = f["steps/1/params/embedding.word_embeddings.weight"]
        assert copy.attrs["stored_dtype"] == "float16"
        assert copy.dtype == np.float32 and copy[0, 0] == np.float32(np.float16(0.1))  # widened exactly
        assert "stored_dtype" not in f["steps/1/grads/embedding.word_embeddings.weight"].attrs
        assert "stored_dtype" not in f["steps/1/params/output_layer.weight"].attrs


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sixteen_bit_parameters_pass_exactly_and_a_wrong_one_fails(touchstone, golden_files, tmp_path, dtype):
    # torch rounds float64 to bfloat16 through float32 as the diff's reference does (round_to_bf16), but
    # float64 to float16 through float32 too, where the diff rounds once (round_to_fp16): float16 copies
    # are made with numpy's single rounding here, so that both sides are the same numbers.
    def copy(t):
        return torch.from_numpy(t.astype(np.float16)) if dtype == torch.float16 else torch.from_numpy(t).to(dtype)

    golden_path = golden_files["default"]
    out = tmp_path / "copies.h5"
    with GoldenFile(golden_path) as golden, CandidateWriter(out, golden=golden) as c:
        c.write_step(1, params={n: copy(t) for n, t in golden.expected(1).params()})
    result, report = diff(touchstone, golden_path, out, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    compared = [t for t in report["tensors"] if t["status"] != "not_compared"]
    assert compared and all(t["metrics"]["relative_l2"] == 0 and t["metrics"]["max_ulp"] == 0 for t in compared)
    name = "bfloat16" if dtype == torch.bfloat16 else "float16"
    assert any(note.startswith(f"steps/1/params: {name} copies") for note in report["notes"]), report["notes"]
    # The same copies, one linear_fc1 left at its initial value: that tensor fails.
    wrong = "decoder.layers.1.mlp.linear_fc1.weight"
    with GoldenFile(golden_path) as golden, CandidateWriter(out, golden=golden) as c:
        init = dict(golden.init_params())
        c.write_step(1, params={n: copy(init[n] if n == wrong else t) for n, t in golden.expected(1).params()})
    result, report = diff(touchstone, golden_path, out, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert [t["path"] for t in report["tensors"] if t["status"] == "fail"] == [f"steps/1/params/{wrong}"]
