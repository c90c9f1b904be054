"""touchstone.golden against the golden file itself, read independently with h5py."""

import json
import shutil

import h5py
import numpy as np
import pytest

from touchstone import GoldenFile


def test_config_steps_and_names(golden_files):
    with GoldenFile(golden_files["default"]) as golden, h5py.File(golden_files["default"], "r") as raw:
        assert golden.config == json.loads(raw.attrs["config"])
        assert golden.steps == [1, 2, 3]
        assert set(golden.parameter_names()) == set(raw["params/init"])
        assert golden.param_dtype == np.float64
        for name, value in golden.init_params():
            assert np.array_equal(value, raw["params/init"][name][()]), name


def test_tied_model_has_no_output_layer(golden_files):
    with GoldenFile(golden_files["tied_pmm"]) as golden:
        assert "output_layer.weight" not in golden.parameter_names()
        with pytest.raises(ValueError, match="output_layer.weight"):
            golden.init_param("output_layer.weight")


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_micro_batches_in_megatron_order(golden_files, dp):
    with GoldenFile(golden_files["default"]) as golden:
        mbs, B = golden.micro_batch_size, 8
        batch = golden.batch(2)
        everything = golden.micro_batches(2, dp=dp)
        assert [m.rows for m in everything] == [range(k * mbs, (k + 1) * mbs) for k in range(B // mbs)]
        for r in range(dp):
            mine = golden.micro_batches(2, dp=dp, dp_rank=r)
            # micro-batch j of rank r holds rows j*mbs*dp + r*mbs ... + mbs - 1
            assert [list(m.rows) for m in mine] == \
                [list(range(j * mbs * dp + r * mbs, j * mbs * dp + (r + 1) * mbs)) for j in range(B // (mbs * dp))]
            for m in mine:
                assert np.array_equal(m.tokens, batch.tokens[m.rows.start:m.rows.stop])
                assert np.array_equal(m.targets, batch.targets[m.rows.start:m.rows.stop])


def test_micro_batches_refuse_a_layout_that_does_not_split(golden_files):
    with GoldenFile(golden_files["default"]) as golden:
        with pytest.raises(ValueError, match="does not split"):
            golden.micro_batches(1, dp=3)
        with pytest.raises(ValueError, match="dp_rank 2"):
            golden.micro_batches(1, dp=2, dp_rank=2)


@pytest.mark.parametrize("config", ["default", "tied_pmm"])
def test_loss_weights_give_the_recorded_objective(golden_files, config):
    """Summing each micro-batch's token losses times its loss_weight reproduces /steps/s/loss."""
    with GoldenFile(golden_files[config]) as golden:
        for step in golden.steps:
            expected = golden.expected(step)
            token_losses = expected.token_losses()
            objective = sum(token_losses[m.rows.start:m.rows.stop].sum() * m.loss_weight
                            for m in golden.micro_batches(step))
            # A sum of B*T = 512 terms of size ~5 in FP64 in another order: ~1e-14 relative.
            assert objective == pytest.approx(expected.loss, rel=1e-13)
            assert expected.num_loss_tokens == golden.batch(step).num_loss_tokens


def test_expected_values_match_the_file(golden_files):
    with GoldenFile(golden_files["default"]) as golden, h5py.File(golden_files["default"], "r") as raw:
        e = golden.expected(3)
        assert e.loss == raw["steps/3/loss"][()]
        assert e.lr == raw["steps/3/lr"][()]
        assert e.grad_norm == raw["steps/3/grad_norm"][()]
        name = "decoder.layers.1.mlp.linear_fc1.weight"
        assert np.array_equal(e.grad(name), raw[f"steps/3/grads/{name}"][()])
        assert np.array_equal(e.param(name), raw[f"steps/3/params/{name}"][()])
        assert [n for n, _ in golden.params(2)] == golden.parameter_names()


def test_bad_input_is_a_one_line_value_error(golden_files, tmp_path):
    not_hdf5 = tmp_path / "notes.txt"
    not_hdf5.write_text("not a golden file\n")
    with pytest.raises(ValueError, match="notes.txt: cannot be read as a golden file") as info:
        GoldenFile(not_hdf5)
    assert "\n" not in str(info.value)

    newer = tmp_path / "v2.h5"
    shutil.copy(golden_files["default"], newer)
    with h5py.File(newer, "r+") as f:
        f.attrs["format_version"] = 2
    with pytest.raises(ValueError, match=r"v2.h5: golden format_version 2 is not supported \(1 is\)"):
        GoldenFile(newer)

    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f.attrs["format"] = "something-else"
    with pytest.raises(ValueError, match="other.h5: not a golden file"):
        GoldenFile(other)

    with GoldenFile(golden_files["default"]) as golden:
        with pytest.raises(ValueError, match="step 9 is not recorded"):
            golden.expected(9)
        with pytest.raises(ValueError, match="decoder.layers.7.mlp.linear_fc1.weight: not a parameter"):
            golden.expected(1).grad("decoder.layers.7.mlp.linear_fc1.weight")
