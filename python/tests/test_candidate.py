"""touchstone.candidate: a candidate written from the golden values passes `touchstone diff`; bad
names, shapes and paths are refused before anything appears at the output path."""

import os
import subprocess

import numpy as np
import pytest
import torch

from touchstone import CandidateWriter, GoldenFile


def diff(touchstone, golden, candidate, *extra):
    return subprocess.run([touchstone, "diff", str(golden), str(candidate), *extra],
                          capture_output=True, text=True)


def write_golden_as_candidate(golden_path, out, steps=None, as_torch=False):
    with GoldenFile(golden_path) as golden, CandidateWriter(out, golden=golden, generator="test") as c:
        convert = (lambda pairs: ((n, torch.from_numpy(t)) for n, t in pairs)) if as_torch else (lambda p: p)
        c.write_init(convert(golden.init_params()))
        for step in steps or golden.steps:
            e = golden.expected(step)
            c.write_step(step, loss=e.loss, num_loss_tokens=e.num_loss_tokens, grad_norm=e.grad_norm, lr=e.lr,
                         grads=convert(e.grads()), params=dict(convert(e.params())))


@pytest.mark.parametrize("as_torch", [False, True])
def test_golden_values_pass_the_diff(touchstone, golden_files, tmp_path, as_torch):
    out = tmp_path / "candidate.h5"
    write_golden_as_candidate(golden_files["default"], out, as_torch=as_torch)
    result = diff(touchstone, golden_files["default"], out)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_gradient_fails_the_diff(touchstone, golden_files, tmp_path):
    """The diff sees what the writer wrote: a gradient doubled is caught (the test can fail)."""
    out = tmp_path / "doubled.h5"
    with GoldenFile(golden_files["default"]) as golden, CandidateWriter(out, golden=golden) as c:
        e = golden.expected(1)
        c.write_step(1, loss=e.loss, num_loss_tokens=e.num_loss_tokens,
                     grads={n: (2 * g if n == "output_layer.weight" else g) for n, g in e.grads()})
    result = diff(touchstone, golden_files["default"], out)
    assert result.returncode == 1
    assert "output_layer.weight" in result.stdout


def test_bfloat16_tensors_are_widened(tmp_path):
    out = tmp_path / "c.h5"
    with CandidateWriter(out, dtype=np.float32) as c:
        c.write_init({"embedding.word_embeddings.weight": torch.ones(2, 2, dtype=torch.bfloat16)})
    import h5py
    with h5py.File(out, "r") as f:
        assert f["params/init/embedding.word_embeddings.weight"].dtype == np.float32


def test_names_and_shapes_are_checked(golden_files, tmp_path):
    out = tmp_path / "c.h5"
    with GoldenFile(golden_files["default"]) as golden:
        with pytest.raises(ValueError, match="candidate tensor steps/1/grads/model.layers.0.mlp.up_proj.weight "
                                             "matches no parameter"):
            with CandidateWriter(out, golden=golden) as c:
                c.write_step(1, grads={"model.layers.0.mlp.up_proj.weight": np.zeros((176, 64))})
        assert not out.exists()
        with pytest.raises(ValueError, match=r"has shape \[3, 3\], the golden tensor is \[64\]"):
            with CandidateWriter(out, golden=golden) as c:
                c.write_step(1, grads={"decoder.final_layernorm.weight": np.zeros((3, 3))})
        with pytest.raises(ValueError, match="num_loss_tokens 446.4 is not a whole number"):
            with CandidateWriter(out, golden=golden) as c:
                c.write_step(1, num_loss_tokens=446.4)
        with pytest.raises(ValueError, match="steps/1/loss is written twice"):
            with CandidateWriter(out, golden=golden) as c:
                c.write_step(1, loss=1.0)
                c.write_step(1, loss=1.0)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no temporaries left


def test_a_failed_write_leaves_an_existing_file_alone(tmp_path):
    out = tmp_path / "c.h5"
    out.write_bytes(b"earlier")
    with pytest.raises(RuntimeError):
        with CandidateWriter(out) as c:
            c.write_step(1, loss=2.0)
            raise RuntimeError("the trainer failed")
    assert out.read_bytes() == b"earlier"


def test_non_regular_outputs_are_refused(tmp_path):
    (tmp_path / "dir.h5").mkdir()
    with pytest.raises(ValueError, match="dir.h5: exists and is not a regular file"):
        CandidateWriter(tmp_path / "dir.h5")
    target = tmp_path / "target.h5"
    target.write_bytes(b"keep")
    os.symlink(target, tmp_path / "link.h5")
    with pytest.raises(ValueError, match="link.h5: exists and is not a regular file"):
        CandidateWriter(tmp_path / "link.h5")
    assert target.read_bytes() == b"keep"
    os.mkfifo(tmp_path / "fifo.h5")
    with pytest.raises(ValueError, match="fifo.h5: exists and is not a regular file"):
        CandidateWriter(tmp_path / "fifo.h5")
    with pytest.raises(ValueError, match="does not exist"):
        CandidateWriter(tmp_path / "missing" / "c.h5")
