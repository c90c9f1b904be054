"""touchstone.golden against the golden file itself, read independently with h5py."""

import json
import shutil

import h5py
import numpy as np
import pytest

from touchstone import GoldenFile, parameter_names


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


def _altered(source, target, key, value):
    shutil.copy(source, target)
    with h5py.File(target, "r+") as f:
        if key == "config" and callable(value):
            config = json.loads(f.attrs["config"])
            value(config)
            value = json.dumps(config)
        f.attrs[key] = value
    return target


def _without(section, key):
    return lambda config: config[section].pop(key)


def _setting(section, key, value):
    return lambda config: config[section].__setitem__(key, value)


# Each root attribute the reader uses, broken one way: (attribute, stored value, message).
BAD_ROOT_ATTRIBUTES = {
    "version_float": ("format_version", 1.7, "root attribute format_version: is not an integer"),
    "version_text": ("format_version", "one", "root attribute format_version: is not an integer"),
    "version_list": ("format_version", np.array([1, 2]), r"root attribute format_version: is not a single value"),
    "format_list": ("format", np.array([b"touchstone-golden"] * 2), "not a golden file"),
    "config_not_json": ("config", "{not json", "root attribute config is not valid JSON"),
    "config_a_list": ("config", "[1, 2]", r"\(attribute config\): the config must be a JSON object"),
    "config_an_integer": ("config", np.int64(3), "root attribute config: is not a string"),
    "no_num_layers": ("config", _without("model", "num_layers"), r"\(attribute config\): model.num_layers is missing"),
    "layers_text": ("config", _setting("model", "num_layers", "two"),
                    r"model.num_layers must be an integer, got \"two\""),
    "layers_bool": ("config", _setting("model", "num_layers", True), "model.num_layers must be an integer"),
    "no_heads": ("config", _setting("model", "num_heads", 0), r"model.num_heads must be in \[1, 2147483647\]"),
    "heads_indivisible": ("config", _setting("model", "num_kv_heads", 3), "model.num_kv_heads .3. must be >= 1"),
    "tie_text": ("config", _setting("model", "tie_embeddings", "no"), "model.tie_embeddings must be a boolean"),
    "train_a_list": ("config", _setting("train", "micro_batch_size", [2]), "train.micro_batch_size must be an integer"),
    "mbs_indivisible": ("config", _setting("train", "micro_batch_size", 3), "train.global_batch_size .8. must be divisible"),
    "normalization": ("config", _setting("train", "loss_normalization", "sum"), "train.loss_normalization must be"),
    "masking_number": ("config", _setting("data", "document_masking", 1), "data.document_masking must be a boolean"),
    "eps_text": ("config", _setting("model", "norm_eps", "1e-5"), "model.norm_eps must be a number"),
    "no_model": ("config", lambda config: config.pop("model"), "attribute config has no section 'model'"),
    "precision_other": ("precision", "fp8", 'root attribute precision: is "fp8"'),
    "precision_number": ("precision", np.int64(64), "root attribute precision: is not a string"),
    "tolerance_not_json": ("tolerance_model", "{", "root attribute tolerance_model: is not valid JSON"),
    "tolerance_a_list": ("tolerance_model", "[]", "root attribute tolerance_model: is not a JSON object"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROOT_ATTRIBUTES))
def test_bad_root_attributes_are_one_line_value_errors(golden_files, tmp_path, case):
    key, value, message = BAD_ROOT_ATTRIBUTES[case]
    path = _altered(golden_files["default"], tmp_path / f"{case}.h5", key, value)
    with pytest.raises(ValueError, match=f"^{path}.*{message}") as info:
        GoldenFile(path)
    assert "\n" not in str(info.value)


def test_format_version_of_another_integer_type_is_accepted(golden_files, tmp_path):
    """The C++ reader's rule: any integer type, one value (a one-element array included)."""
    for name, value in (("u8", np.uint8(1)), ("array", np.array([1], dtype=np.int32))):
        with GoldenFile(_altered(golden_files["default"], tmp_path / f"{name}.h5", "format_version", value)) as g:
            assert g.steps == [1, 2, 3]


def _replaced_dataset(source, target, key, value):
    shutil.copy(source, target)
    with h5py.File(target, "r+") as f:
        del f[key]
        f[key] = value
    return target


BAD_DATASETS = {
    "loss_text": ("steps/1/loss", np.array(b"low"), lambda g: g.expected(1).loss,
                  "/steps/1/loss: holds |S3 values"),
    "loss_vector": ("steps/1/loss", np.array([1.0, 2.0]), lambda g: g.expected(1).loss,
                    r"/steps/1/loss: has shape \[2\], not a single value"),
    "tokens_fraction": ("steps/1/num_loss_tokens", np.float64(4.5), lambda g: g.expected(1).num_loss_tokens, "num_loss_tokens: 4.5 is not a count"),
    "grad_integers": ("steps/1/grads/decoder.final_layernorm.weight", np.zeros(64, dtype=np.int64), lambda g: g.expected(1).grad("decoder.final_layernorm.weight"), "not floating-point ones"),
    "batch_floats": ("batch/tokens", np.zeros((3, 8, 64)), lambda g: g.batch(1),
                     "/batch/tokens: holds float64 values"),
    "batch_short": ("batch/targets", np.zeros((3, 8, 32), dtype=np.int32), lambda g: g.batch(1),
                    r"/batch/targets has shape \[3, 8, 32\], which holds no batch for step 1 of \[8, 64\]"),
    "tokens_out_of_range": ("batch/tokens", np.full((3, 8, 64), 999, dtype=np.int32), lambda g: g.micro_batches(1), r"/batch/tokens: step 1 holds 999, outside \[0, 256\)"),
    "token_losses_shape": ("steps/2/token_losses", np.zeros((2, 2)), lambda g: g.expected(2).token_losses(), r"token_losses has shape \[2, 2\]"),
}


@pytest.mark.parametrize("case", sorted(BAD_DATASETS))
def test_bad_datasets_are_one_line_value_errors(golden_files, tmp_path, case):
    key, value, read, message = BAD_DATASETS[case]
    path = _replaced_dataset(golden_files["default"], tmp_path / f"{case}.h5", key, value)
    with GoldenFile(path) as golden:
        with pytest.raises(ValueError, match=f"^{path}: .*{message}") as info:
            read(golden)
    assert "\n" not in str(info.value)


def test_bad_arguments_are_value_errors(golden_files):
    with pytest.raises(ValueError, match="not a file path"):
        GoldenFile(None)
    with GoldenFile(golden_files["default"]) as golden:
        with pytest.raises(ValueError, match="step '1' is not a step number"):
            golden.batch("1")
        with pytest.raises(ValueError, match="does not split"):
            golden.micro_batches(1, dp=1.5)
        with pytest.raises(ValueError, match="dp_rank"):
            golden.micro_batches(1, dp=2, dp_rank="0")


def test_config_mappings_given_to_the_helpers_are_checked(golden_files):
    """parameter_names, parameter_shape and hf_config_dict take a config from the caller too."""
    from touchstone.golden import parameter_shape
    from touchstone.hf import hf_config_dict

    with GoldenFile(golden_files["default"]) as golden:
        config = json.loads(json.dumps(golden.config))
    with pytest.raises(ValueError, match="model.num_layers must be an integer"):
        parameter_names(dict(config["model"], num_layers="2"))
    with pytest.raises(ValueError, match="model.hidden_size is missing"):
        parameter_shape({k: v for k, v in config["model"].items() if k != "hidden_size"}, "output_layer.weight")
    with pytest.raises(ValueError, match="model is not a mapping"):
        parameter_names(None)
    config["data"]["eos_token"] = {}
    with pytest.raises(ValueError, match="data.eos_token must be an integer"):
        hf_config_dict(config)
    config["data"]["eos_token"] = 1000
    with pytest.raises(ValueError, match=r"data.eos_token \(1000\) must be in \[0, model.vocab_size\)"):
        hf_config_dict(config)
