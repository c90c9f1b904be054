// Tests of the Hugging Face layer below the command line: contract -> HF names and layouts (q/k/v split
// per KV group, gate/up split, renames, no lm_head when tied) and its round trip through hf_to_contract,
// the streaming safetensors writer read back by the reader, config.json's keys, and the refusals of
// configs the HF Llama cannot express.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <tuple>

#include "common/errors.h"
#include "model/param_table.h"
#include "oracle/hf/export.h"
#include "oracle/hf/hf_names.h"
#include "oracle/hf/safetensors.h"
#include "tests/unit/test_files.h"

namespace touchstone::hf {
namespace {

namespace fs = std::filesystem;

ModelConfig small_model(int64_t num_heads, int64_t num_kv_heads, bool tied) {
  ModelConfig m;
  m.vocab_size = 11;
  m.hidden_size = 8;
  m.num_layers = 2;
  m.num_heads = num_heads;
  m.num_kv_heads = num_kv_heads;
  m.ffn_hidden_size = 5;
  m.tie_embeddings = tied;
  return m;
}

// Every parameter of the model at `group`, each element a distinct double (negative zero and
// subnormals included, so that a conversion through another type would show).
TensorMap contract_tensors(const ModelConfig& m, const std::string& group) {
  TensorMap out;
  double next = 0.0;
  const ParamTable table(m);
  for (const ParamSpec& spec : table.specs()) {
    Recorded r{spec.shape, {}, "float64"};
    for (int64_t i = 0; i < spec.numel(); ++i) r.values.push_back(next += 0.1);
    r.values[0] = spec.numel() % 2 ? -0.0 : 4.9e-324;
    out.emplace(group + "/" + spec.name, std::move(r));
  }
  return out;
}

bool bitwise_equal(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

class RoundTrip : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, bool>> {};

TEST_P(RoundTrip, ContractToHfToContractIsBitwiseIdentity) {
  const auto [num_heads, num_kv_heads, tied] = GetParam();
  const ModelConfig m = small_model(num_heads, num_kv_heads, tied);
  const TensorMap contract = contract_tensors(m, "params/init");
  const std::map<std::string, Recorded> llama = contract_to_hf(contract, m, "params/init");
  EXPECT_EQ(llama.count("lm_head.weight"), tied ? 0u : 1u);
  EXPECT_EQ(llama.size(),
            static_cast<size_t>(9 * m.num_layers + 2 + (tied ? 0 : 1)));  // 9 HF tensors per layer
  const int64_t D = m.head_dim();
  EXPECT_EQ(llama.at("model.layers.1.self_attn.q_proj.weight").shape,
            (std::vector<int64_t>{m.num_heads * D, m.hidden_size}));
  EXPECT_EQ(llama.at("model.layers.1.self_attn.k_proj.weight").shape,
            (std::vector<int64_t>{m.num_kv_heads * D, m.hidden_size}));
  EXPECT_EQ(llama.at("model.layers.0.mlp.up_proj.weight").shape,
            (std::vector<int64_t>{m.ffn_hidden_size, m.hidden_size}));

  std::vector<std::string> ignored;
  const TensorMap back = hf_to_contract(llama, m, "params/init", ignored);
  EXPECT_TRUE(ignored.empty());
  ASSERT_EQ(back.size(), contract.size());
  for (const auto& [path, tensor] : contract) {
    ASSERT_TRUE(back.count(path)) << path;
    EXPECT_EQ(back.at(path).shape, tensor.shape) << path;
    EXPECT_TRUE(bitwise_equal(back.at(path).values, tensor.values)) << path;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, RoundTrip,
                         ::testing::Values(std::make_tuple(4, 2, false), std::make_tuple(4, 2, true),
                                           std::make_tuple(4, 4, false), std::make_tuple(4, 4, true),
                                           std::make_tuple(8, 1, false)));

TEST(ContractToHf, SplitsQkvPerKvGroupAndFc1IntoGateAndUp) {
  // NH = 4, NKV = 2, D = 2, G = 2: grouped rows [q0 q1 k0 v0 | q2 q3 k1 v1], 2 rows per head.
  const ModelConfig m = small_model(4, 2, false);
  const int64_t H = m.hidden_size, F = m.ffn_hidden_size;
  TensorMap contract;
  Recorded qkv{{m.qkv_rows(), H}, {}, "float64"};
  for (int64_t i = 0; i < m.qkv_rows() * H; ++i) qkv.values.push_back(static_cast<double>(i / H));  // row
  contract["g/decoder.layers.0.self_attention.linear_qkv.weight"] = qkv;
  Recorded fc1{{2 * F, H}, {}, "float64"};
  for (int64_t i = 0; i < 2 * F * H; ++i) fc1.values.push_back(static_cast<double>(i / H));
  contract["g/decoder.layers.0.mlp.linear_fc1.weight"] = fc1;
  const auto llama = contract_to_hf(contract, m, "g");
  ASSERT_EQ(llama.size(), 5u);
  const auto row = [&](const std::string& name, int64_t r) { return llama.at(name).values.at(r * H); };
  const std::string attn = "model.layers.0.self_attn.";
  // q head 1 is grouped rows 2-3, q head 2 rows 8-9; k head 1 rows 12-13; v head 0 rows 6-7.
  EXPECT_EQ(row(attn + "q_proj.weight", 2), 2);
  EXPECT_EQ(row(attn + "q_proj.weight", 4), 8);
  EXPECT_EQ(row(attn + "q_proj.weight", 7), 11);
  EXPECT_EQ(row(attn + "k_proj.weight", 2), 12);
  EXPECT_EQ(row(attn + "v_proj.weight", 0), 6);
  EXPECT_EQ(row(attn + "v_proj.weight", 3), 15);
  EXPECT_EQ(row("model.layers.0.mlp.gate_proj.weight", F - 1), F - 1);
  EXPECT_EQ(row("model.layers.0.mlp.up_proj.weight", 0), F);
  EXPECT_EQ(llama.at("model.layers.0.mlp.up_proj.weight").dtype, "float64");
}

TEST(ContractToHf, RefusesUnknownNamesAndWrongShapes) {
  const ModelConfig m = small_model(4, 2, true);
  EXPECT_TRUE(hf_parts_of("output_layer.weight", m).empty());  // tied: embed_tokens holds it
  testing::expect_input_error([&] { (void)hf_parts_of("decoder.layers.2.input_layernorm.weight", m); },
                              {"decoder.layers.2.input_layernorm.weight", "layer 2"});
  testing::expect_input_error([&] { (void)hf_parts_of("decoder.layers.0.mystery.weight", m); },
                              {"decoder.layers.0.mystery.weight"});
  TensorMap contract;
  contract["g/decoder.final_layernorm.weight"] = Recorded{{3}, {1, 2, 3}, "float64"};
  testing::expect_input_error([&] { (void)contract_to_hf(contract, m, "g"); },
                              {"g/decoder.final_layernorm.weight", "[3]", "[8]"});
}

// The header as written: its length field, the JSON, and the data size after it.
struct WrittenFile {
  uint64_t header_length = 0;
  nlohmann::ordered_json header;
  uint64_t data_bytes = 0;
};

WrittenFile read_written(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  WrittenFile file;
  in.read(reinterpret_cast<char*>(&file.header_length), 8);
  std::string text(file.header_length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  file.header = nlohmann::ordered_json::parse(text);
  file.data_bytes = fs::file_size(path) - 8 - file.header_length;
  return file;
}

TEST(SafetensorsWriter, WritesWhatTheReaderReadsBitwise) {
  testing::ScratchDirectory scratch("touchstone_hf");
  const fs::path path = scratch.path() / "model.safetensors";
  const std::vector<double> wide = {1.0 / 3.0, -0.0, 4.9e-324, -1e300, 7.0, 8.0};
  const std::vector<double> narrow = {0.1f, -2.5f, 1e-45f};  // float values: F32 holds them exactly
  const std::vector<SafetensorsEntry> entries = {{"b.wide", "F64", {2, 3}},
                                                 {"a.narrow", "F32", {3}},
                                                 {"c.scalar", "F64", {}},
                                                 {"d.empty", "F32", {0, 4}}};
  {
    SafetensorsWriter writer(path.string(), entries, {{"format", "pt"}});
    EXPECT_FALSE(fs::exists(path));  // only the temporary until commit
    writer.write(wide);
    writer.write(narrow);
    const double scalar = 42.0;
    writer.write(std::span<const double>(&scalar, 1));
    writer.write({});
    writer.commit();
    EXPECT_EQ(writer.bytes(), fs::file_size(path));
  }
  const auto tensors = read_safetensors(path.string());
  ASSERT_EQ(tensors.size(), 4u);
  EXPECT_TRUE(bitwise_equal(tensors.at("b.wide").values, wide));
  EXPECT_EQ(tensors.at("b.wide").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(tensors.at("b.wide").dtype, "float64");
  EXPECT_TRUE(bitwise_equal(tensors.at("a.narrow").values, narrow));
  EXPECT_EQ(tensors.at("a.narrow").dtype, "float32");
  EXPECT_EQ(tensors.at("c.scalar").values, (std::vector<double>{42.0}));
  EXPECT_TRUE(tensors.at("c.scalar").shape.empty());
  EXPECT_EQ(tensors.at("d.empty").shape, (std::vector<int64_t>{0, 4}));

  // Header length a multiple of 8, metadata first, then the entries in order with contiguous offsets
  // from 0 to the end of the file.
  const WrittenFile file = read_written(path);
  EXPECT_EQ(file.header_length % 8, 0u);
  auto item = file.header.begin();
  EXPECT_EQ(item.key(), "__metadata__");
  EXPECT_EQ(item.value(), (nlohmann::ordered_json{{"format", "pt"}}));
  uint64_t offset = 0;
  for (const SafetensorsEntry& entry : entries) {
    ++item;
    ASSERT_NE(item, file.header.end());
    EXPECT_EQ(item.key(), entry.name);
    EXPECT_EQ(item.value()["data_offsets"][0].get<uint64_t>(), offset);
    offset = item.value()["data_offsets"][1].get<uint64_t>();
  }
  EXPECT_EQ(offset, file.data_bytes);
  EXPECT_EQ(std::distance(fs::directory_iterator(scratch.path()), fs::directory_iterator()), 1);
}

TEST(SafetensorsWriter, HeaderIsPaddedWithSpacesToAMultipleOf8) {
  for (size_t length = 1; length <= 9; ++length) {
    const std::string header =
        safetensors_header({{std::string(length, 'x'), "F32", {1}}}, {{"format", "pt"}});
    EXPECT_EQ(header.size() % 8, 0u) << header;
    const size_t end = header.find_last_not_of(' ');
    EXPECT_EQ(header[end], '}');
    EXPECT_LT(header.size() - end - 1, 8u);
  }
  EXPECT_THROW((void)safetensors_header({{"x", "BF16", {1}}}, {}), std::invalid_argument);
  EXPECT_THROW((void)safetensors_header({{"x", "F32", {1}}, {"x", "F64", {1}}}, {}), std::invalid_argument);
}

TEST(SafetensorsWriter, LeavesNothingBehindWithoutCommit) {
  testing::ScratchDirectory scratch("touchstone_hf");
  const fs::path path = scratch.path() / "model.safetensors";
  std::ofstream(path) << "before";
  {
    SafetensorsWriter writer(path.string(), {{"x", "F64", {2}}}, {});
    EXPECT_THROW(writer.write(std::vector<double>{1.0}), std::invalid_argument);  // 2 values needed
    EXPECT_THROW(writer.commit(), std::invalid_argument);                         // x not written
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(scratch.path()), fs::directory_iterator()), 1);
  std::ifstream in(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "before");
  // A directory at the path is not replaced; the temporary goes.
  fs::remove(path);
  fs::create_directory(path);
  {
    SafetensorsWriter writer(path.string(), {{"x", "F64", {1}}}, {});
    writer.write(std::vector<double>{1.0});
    testing::expect_input_error([&] { writer.commit(); }, {path.string(), "directory"});
  }
  EXPECT_TRUE(fs::is_directory(path));
  EXPECT_EQ(std::distance(fs::directory_iterator(scratch.path()), fs::directory_iterator()), 1);
}

TEST(LlamaConfig, HoldsExactlyTheKeysTransformersReads) {
  Config config;
  config.model.tie_embeddings = true;
  config.precision = Precision::kBf16;
  const nlohmann::json json = llama_config(config);
  std::set<std::string> keys;
  for (const auto& [key, value] : json.items()) keys.insert(key);
  EXPECT_EQ(keys, (std::set<std::string>{"architectures",
                                         "model_type",
                                         "vocab_size",
                                         "hidden_size",
                                         "intermediate_size",
                                         "num_hidden_layers",
                                         "num_attention_heads",
                                         "num_key_value_heads",
                                         "head_dim",
                                         "max_position_embeddings",
                                         "rms_norm_eps",
                                         "rope_theta",
                                         "rope_scaling",
                                         "tie_word_embeddings",
                                         "attention_bias",
                                         "mlp_bias",
                                         "hidden_act",
                                         "attention_dropout",
                                         "initializer_range",
                                         "pretraining_tp",
                                         "use_cache",
                                         "bos_token_id",
                                         "eos_token_id",
                                         "pad_token_id",
                                         "torch_dtype"}));
  EXPECT_EQ(json["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(json["head_dim"], config.model.hidden_size / config.model.num_heads);
  EXPECT_EQ(json["intermediate_size"], config.model.ffn_hidden_size);
  EXPECT_EQ(json["max_position_embeddings"], config.model.seq_length);
  EXPECT_EQ(json["rms_norm_eps"], config.model.norm_eps);
  EXPECT_EQ(json["tie_word_embeddings"], true);
  EXPECT_TRUE(json["rope_scaling"].is_null());
  EXPECT_TRUE(json["bos_token_id"].is_null());
  EXPECT_EQ(json["eos_token_id"], config.data.eos_token);
  EXPECT_EQ(json["torch_dtype"], "float32");
  config.precision = Precision::kFp64;
  EXPECT_EQ(llama_config(config)["torch_dtype"], "float64");
}

TEST(LlamaConfig, RefusesDropoutNamingTheKey) {
  Config config;
  EXPECT_NO_THROW(check_expressible(config, "g.h5"));
  config.model.hidden_dropout = 0.1;
  testing::expect_input_error([&] { check_expressible(config, "g.h5"); },
                              {"g.h5", "model.hidden_dropout", "0.1", "no hidden dropout"});
  config.model.hidden_dropout = 0;
  config.model.attention_dropout = 0.25;
  testing::expect_input_error([&] { check_expressible(config, "g.h5"); },
                              {"g.h5", "model.attention_dropout", "0.25", "counter-based RNG"});
}

TEST(ExportDirectory, RefusesWhatItCannotWriteIn) {
  testing::ScratchDirectory scratch("touchstone_hf");
  const std::string dir = (scratch.path() / "out").string();
  EXPECT_NO_THROW(check_export_directory(dir, ""));        // missing: created by the export
  EXPECT_NO_THROW(check_export_directory(dir + "/", ""));  // the same
  testing::expect_input_error([&] { check_export_directory(dir + "/deeper", "--out"); },
                              {"--out " + dir + "/deeper", dir, "does not exist"});
  std::ofstream(dir) << "x";
  testing::expect_input_error([&] { check_export_directory(dir, ""); }, {dir, "not a directory"});
  testing::expect_input_error([&] { check_export_directory(dir + "/x", ""); }, {dir + " is not a directory"});
  fs::remove(dir);
  fs::create_directory(scratch.path() / "real");
  fs::create_directory_symlink(scratch.path() / "real", dir);
  testing::expect_input_error([&] { check_export_directory(dir + "/", ""); }, {dir, "symbolic link"});
  fs::remove(dir);
  fs::create_directory(dir);
  EXPECT_NO_THROW(check_export_directory(dir, ""));
  fs::create_directory(dir + "/config.json");
  testing::expect_input_error([&] { check_export_directory(dir, ""); }, {dir + "/config.json", "directory"});
  fs::remove(dir + "/config.json");
  fs::create_symlink("elsewhere", dir + "/model.safetensors");
  testing::expect_input_error([&] { check_export_directory(dir, "--out"); },
                              {"--out " + dir + "/model.safetensors", "symbolic"});
}

}  // namespace
}  // namespace touchstone::hf
