"""touchstone.hf names and layouts: round trips are bitwise, the q/k/v split is the per-KV-group one of
docs/golden-format.md, and names that match nothing are refused by name."""

import json
import subprocess

import numpy as np
import pytest
import torch

from touchstone import GoldenFile
from touchstone.hf import from_hf_state_dict, hf_config_dict, hf_config_of, to_hf_state_dict


@pytest.mark.parametrize("config", ["default", "tied_pmm", "gqa8"])
@pytest.mark.parametrize("as_torch", [False, True])
def test_round_trip_is_bitwise(golden_files, config, as_torch):
    with GoldenFile(golden_files[config]) as golden:
        contract = dict(golden.init_params())
        if as_torch:
            contract = {n: torch.from_numpy(t) for n, t in contract.items()}
        hf = to_hf_state_dict(contract, golden.model)
        assert ("lm_head.weight" in hf) == (not golden.model["tie_embeddings"])
        back = from_hf_state_dict(hf, golden.model)
        assert set(back) == set(contract)
        for name in contract:
            assert np.array_equal(np.asarray(back[name]), np.asarray(contract[name])), name


def test_qkv_split_per_kv_group(golden_files):
    """q, k, v as the h5py example of docs/golden-format.md reads them, computed here on its own."""
    with GoldenFile(golden_files["gqa8"]) as golden:
        m = golden.model
        H, NH, NKV = m["hidden_size"], m["num_heads"], m["num_kv_heads"]
        D, G = H // NH, NH // NKV
        qkv = golden.init_param("decoder.layers.1.self_attention.linear_qkv.weight")
        hf = to_hf_state_dict(golden.init_params(), m)
        for head in range(NH):  # query head h = g*G + j lives in block g at slot j
            g, j = divmod(head, G)
            start = (g * (G + 2) + j) * D
            assert np.array_equal(hf["model.layers.1.self_attn.q_proj.weight"][head * D:(head + 1) * D],
                                  qkv[start:start + D])
        for g in range(NKV):
            k_start = (g * (G + 2) + G) * D
            assert np.array_equal(hf["model.layers.1.self_attn.k_proj.weight"][g * D:(g + 1) * D],
                                  qkv[k_start:k_start + D])
            assert np.array_equal(hf["model.layers.1.self_attn.v_proj.weight"][g * D:(g + 1) * D],
                                  qkv[k_start + D:k_start + 2 * D])
        fc1 = golden.init_param("decoder.layers.0.mlp.linear_fc1.weight")
        F = m["ffn_hidden_size"]
        assert np.array_equal(hf["model.layers.0.mlp.gate_proj.weight"], fc1[:F])
        assert np.array_equal(hf["model.layers.0.mlp.up_proj.weight"], fc1[F:])


def test_bare_llama_model_names_and_tied_lm_head(golden_files):
    with GoldenFile(golden_files["tied_pmm"]) as golden:
        hf = to_hf_state_dict(golden.init_params(), golden.model)
        bare = {name[len("model."):]: t for name, t in hf.items()}
        bare["lm_head.weight"] = hf["model.embed_tokens.weight"]  # a tied model's state_dict() has it
        assert set(from_hf_state_dict(bare, golden.model)) == set(golden.parameter_names())


def test_bad_names_and_shapes(golden_files):
    with GoldenFile(golden_files["default"]) as golden:
        m = golden.model
        hf = to_hf_state_dict(golden.init_params(), m)
        with pytest.raises(ValueError, match="model.layers.0.self_attn.qkv_proj.weight: matches no Hugging Face"):
            from_hf_state_dict({**hf, "model.layers.0.self_attn.qkv_proj.weight": np.zeros(1)}, m)
        with pytest.raises(ValueError, match="model.layers.5.mlp.up_proj.weight: matches no"):
            from_hf_state_dict({**hf, "model.layers.5.mlp.up_proj.weight": np.zeros(1)}, m)
        partial = {k: v for k, v in hf.items() if k != "model.layers.1.self_attn.k_proj.weight"}
        with pytest.raises(ValueError, match="model.layers.1.self_attn.k_proj.weight: missing"):
            from_hf_state_dict(partial, m)
        with pytest.raises(ValueError, match=r"model.norm.weight: shape \[3\]"):
            from_hf_state_dict({**hf, "model.norm.weight": np.zeros(3)}, m)
        without = {k: v for k, v in hf.items() if k != "lm_head.weight"}
        with pytest.raises(ValueError, match="output_layer.weight: no Hugging Face tensor gives it"):
            from_hf_state_dict(without, m)
        assert "output_layer.weight" not in from_hf_state_dict(without, m, strict=False)


def test_config_refuses_what_llama_cannot_express(golden_files):
    with GoldenFile(golden_files["default"]) as golden:
        config = json.loads(json.dumps(golden.config))
    assert hf_config_dict(config)["num_key_value_heads"] == 2
    config["model"]["hidden_dropout"] = 0.1
    with pytest.raises(ValueError, match="model.hidden_dropout is 0.1, and Hugging Face's Llama has no hidden"):
        hf_config_dict(config)
    config["model"]["hidden_dropout"], config["model"]["attention_dropout"] = 0.0, 0.2
    with pytest.raises(ValueError, match="model.attention_dropout is 0.2: Touchstone's dropout masks"):
        hf_config_dict(config)


@pytest.mark.parametrize("config", ["default", "tied_pmm"])
def test_export_writes_the_same_config_and_tensors(touchstone, golden_files, tmp_path, config):
    """`touchstone export hf` (C++) and this package (Python) agree on config.json and every tensor."""
    out = tmp_path / "hf"
    subprocess.run([touchstone, "export", "hf", "--golden", str(golden_files[config]), "--out", str(out)],
                   check=True, capture_output=True)
    with GoldenFile(golden_files[config]) as golden:
        assert json.loads((out / "config.json").read_text()) == hf_config_of(golden)
        exported = read_safetensors(out / "model.safetensors")
        assert set(exported) == set(to_hf_state_dict(golden.init_params(), golden.model))
        for name, tensor in to_hf_state_dict(golden.init_params(), golden.model).items():
            assert np.array_equal(exported[name], tensor), name


def read_safetensors(path):
    """An independent reader of the format: 8-byte header length, JSON header, raw data."""
    raw = path.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + length])
    header.pop("__metadata__", None)
    dtypes = {"F64": np.float64, "F32": np.float32}
    return {name: np.frombuffer(raw[8 + length + e["data_offsets"][0]:8 + length + e["data_offsets"][1]],
                                dtype=dtypes[e["dtype"]]).reshape(e["shape"]) for name, e in header.items()}


def test_python_and_command_line_refuse_with_the_same_words(touchstone, golden_dir):
    """A config Llama cannot express: `touchstone export hf` (exit 2) and the package (ValueError) say
    the same line."""
    from conftest import make_golden

    golden_path = make_golden(golden_dir, "hidden_dropout", ["model.hidden_dropout=0.1", "train.steps=1"])
    result = subprocess.run([touchstone, "export", "hf", "--golden", str(golden_path), "--out",
                             str(golden_dir / "refused")], capture_output=True, text=True)
    assert result.returncode == 2 and not (golden_dir / "refused").exists()
    with GoldenFile(golden_path) as golden, pytest.raises(ValueError) as info:
        hf_config_of(golden)
    assert result.stderr.strip() == f"touchstone: error: {info.value}"


def test_another_format_version_is_refused_with_the_same_words(touchstone, golden_files, tmp_path):
    import shutil

    import h5py

    newer = tmp_path / "v2.h5"
    shutil.copy(golden_files["default"], newer)
    with h5py.File(newer, "r+") as f:
        f.attrs["format_version"] = 2
    result = subprocess.run([touchstone, "export", "hf", "--golden", str(newer), "--out", str(tmp_path / "x")],
                            capture_output=True, text=True)
    assert result.returncode == 2
    with pytest.raises(ValueError) as info:
        GoldenFile(newer)
    assert result.stderr.strip() == f"touchstone: error: {info.value}"


def test_bad_arguments_are_value_errors(golden_files):
    from touchstone.hf import hf_grads, load_golden_into

    with GoldenFile(golden_files["default"]) as golden:
        m = golden.model
        with pytest.raises(ValueError, match="decoder.final_layernorm.weight: a value of type list"):
            to_hf_state_dict({"decoder.final_layernorm.weight": [0.0] * 64}, m)
        with pytest.raises(ValueError, match="model.norm.weight: a torch.sparse_coo tensor"):
            from_hf_state_dict({"model.norm.weight": torch.zeros(64).to_sparse()}, m, strict=False)
        with pytest.raises(ValueError, match="7: a tensor name must be a str"):
            from_hf_state_dict({7: np.zeros(64)}, m, strict=False)
        with pytest.raises(ValueError, match="golden is of type str, not GoldenFile"):
            load_golden_into(torch.nn.Linear(2, 2), str(golden_files["default"]))
        with pytest.raises(ValueError, match="hf_model is of type dict, not a torch module"):
            list(hf_grads({}))
