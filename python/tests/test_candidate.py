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


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for arguments, message in (((("",), {}), "the candidate's output path is empty"),
                               ((("dir/",), {}), "dir/: names a directory"),
                               ((("c.h5",), {"dtype": "nonsense"}), "c.h5: dtype 'nonsense' is not a numpy dtype"),
                               ((("c.h5",), {"golden": "golden.h5"}), "golden is of type str, not GoldenFile"),
                               ((("c.h5",), {"generator": 3}), "generator is of type int")):
        args, kwargs = arguments
        with pytest.raises(ValueError, match=message):
            CandidateWriter(*args, **kwargs)
    with pytest.raises(ValueError, match="not a file path"):
        CandidateWriter(None)
    assert list(tmp_path.iterdir()) == []


def test_a_directory_it_cannot_write_in_is_a_value_error(tmp_path):
    # /proc refuses new files to every user, root included (a chmod'ed directory does not stop root).
    with pytest.raises(ValueError, match="^/proc/candidate.h5: cannot be written"):
        CandidateWriter("/proc/candidate.h5")


BAD_STEP_ARGUMENTS = {
    "loss_vector": ({"loss": np.array([1.0, 2.0])}, r"steps/1/loss: is not a single number \(shape \[2\]\)"),
    "loss_text": ({"loss": "low"}, "steps/1/loss: holds <U3 values, not real numbers"),
    "count_negative": ({"num_loss_tokens": -3}, "num_loss_tokens -3.0 is not a whole number"),
    "token_losses_1d": ({"token_losses": np.zeros(4)}, r"token_losses has shape \[4\], not \[B, T\]"),
    "sparse": ({"grads": {"decoder.final_layernorm.weight": torch.zeros(64).to_sparse()}},
               "grads/decoder.final_layernorm.weight: a torch.sparse_coo tensor, not a dense one"),
    "meta": ({"grads": {"decoder.final_layernorm.weight": torch.zeros(64, device="meta")}},
             "grads/decoder.final_layernorm.weight: a meta tensor"),
    "strings": ({"params": {"decoder.final_layernorm.weight": np.array(["x"] * 64)}}, "not real numbers"),
    "name_not_text": ({"grads": {3: np.zeros(64)}}, "tensor name 3 is not a parameter name"),
    "name_a_path": ({"grads": {"a/b": np.zeros(64)}}, "tensor name 'a/b' is not a parameter name"),
    "not_pairs": ({"grads": [np.zeros(64)]}, r"holds a ndarray, not a \(name, tensor\) pair"),
    "not_tensors": ({"grads": 5}, "steps/1/grads: is of type int"),
    "step_text": ({"step": "1"}, "step '1' is not a step number"),
}


@pytest.mark.parametrize("case", sorted(BAD_STEP_ARGUMENTS))
def test_bad_step_arguments_are_value_errors_and_nothing_is_written(tmp_path, case):
    arguments, message = BAD_STEP_ARGUMENTS[case]
    arguments = dict(arguments)
    step = arguments.pop("step", 1)
    out = tmp_path / "c.h5"
    with pytest.raises(ValueError, match=message) as info:
        with CandidateWriter(out) as c:
            c.write_step(step, loss=1.0 if "loss" not in arguments else arguments.pop("loss"), **arguments)
    assert str(info.value).startswith(f"{out}: ") and "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_a_planted_temporary_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"keep")
    os.symlink(target, tmp_path / f"c.h5.tmp.{os.getpid()}")
    with pytest.raises(ValueError, match="exists already"):
        CandidateWriter(tmp_path / "c.h5")
    assert target.read_bytes() == b"keep"
