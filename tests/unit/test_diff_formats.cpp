// Tests of the diff's candidate readers below the command line: the safetensors parser (dtypes, and
// every malformed header or truncated file as an InputError), bf16 and half decoding, the linear_qkv
// layout conversion, the Hugging Face name mapping, and the HDF5 reader's stored types and optional
// attributes that the diff relies on.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/errors.h"
#include "common/h5_file.h"
#include "oracle/hf/hf_names.h"
#include "oracle/hf/safetensors.h"

namespace touchstone::diff {
namespace {

namespace fs = std::filesystem;

// Writes a safetensors file from a header text and raw data bytes.
std::string write_file(const std::string& name, const std::string& header, const std::string& data) {
  const fs::path path =
      fs::temp_directory_path() / ("touchstone_diff_" + std::to_string(getpid()) + "_" + name);
  std::ofstream out(path, std::ios::binary);
  const uint64_t size = header.size();
  out.write(reinterpret_cast<const char*>(&size), 8);
  out << header << data;
  return path.string();
}

template <typename T>
std::string bytes(std::initializer_list<T> values) {
  std::string out;
  for (T v : values) out.append(reinterpret_cast<const char*>(&v), sizeof(T));
  return out;
}

TEST(Safetensors, ReadsEveryFloatType) {
  const std::string data = bytes<double>({1.5, -2}) + bytes<float>({0.25f}) +
                           bytes<uint16_t>({0x3F80, 0xC000}) + bytes<uint16_t>({0x3C00, 0x0001});
  const std::string header =
      R"({"__metadata__": {"format": "pt"},
          "a": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]},
          "b": {"dtype": "F32", "shape": [1, 1], "data_offsets": [16, 20]},
          "c": {"dtype": "BF16", "shape": [2], "data_offsets": [20, 24]},
          "d": {"dtype": "F16", "shape": [2], "data_offsets": [24, 28]}})";
  const auto tensors = hf::read_safetensors(write_file("types.safetensors", header, data));
  EXPECT_EQ(tensors.at("a").values, (std::vector<double>{1.5, -2}));
  EXPECT_EQ(tensors.at("b").shape, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(tensors.at("b").values, (std::vector<double>{0.25}));
  EXPECT_EQ(tensors.at("c").values, (std::vector<double>{1.0, -2.0}));
  EXPECT_EQ(tensors.at("c").dtype, "bfloat16");
  EXPECT_EQ(tensors.at("d").values, (std::vector<double>{1.0, std::ldexp(1.0, -24)}));
  EXPECT_EQ(tensors.at("d").dtype, "float16");
}

TEST(Safetensors, HalfAndBfloat16SpecialValues) {
  EXPECT_TRUE(std::isnan(hf::float16_value(0x7E00)));
  EXPECT_EQ(hf::float16_value(0xFC00), -HUGE_VAL);
  EXPECT_EQ(hf::float16_value(0x7BFF), 65504.0);
  EXPECT_EQ(hf::bfloat16_value(0x7F80), HUGE_VAL);
  EXPECT_EQ(hf::bfloat16_value(0x0001), static_cast<double>(std::ldexp(1.0f, -133)));
}

TEST(Safetensors, MalformedFilesAreInputErrors) {
  const std::string one = bytes<float>({1.0f});
  const std::vector<std::pair<std::string, std::string>> bad_headers = {
      {"not json", one},
      {"[1, 2]", one},
      {R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", one},   // shape needs 8 bytes
      {R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}})", one},   // past the data
      {R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", one},   // end before begin
      {R"({"x": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 4]}})", one},    // unknown dtype
      {R"({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", one},  // negative extent
      {R"({"x": {"dtype": "F32", "shape": [1]}})", one},                           // no offsets
      {R"({"x": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 4]}})", one},
  };
  int i = 0;
  for (const auto& [header, data] : bad_headers) {
    const std::string path = write_file("bad" + std::to_string(i++) + ".safetensors", header, data);
    EXPECT_THROW(hf::read_safetensors(path), InputError) << header;
  }
  // Header length beyond the file, and a file shorter than the length field.
  const fs::path truncated =
      fs::temp_directory_path() / ("touchstone_diff_" + std::to_string(getpid()) + "_short");
  std::ofstream(truncated, std::ios::binary) << std::string("\xff\x00\x00\x00\x00\x00\x00\x00{}", 10);
  EXPECT_THROW(hf::read_safetensors(truncated.string()), InputError);
  std::ofstream(truncated, std::ios::binary) << "abc";
  EXPECT_THROW(hf::read_safetensors(truncated.string()), InputError);
  EXPECT_THROW(hf::read_safetensors("/nonexistent/file.safetensors"), InputError);
}

ModelConfig gqa_model() {
  ModelConfig m;
  m.hidden_size = 4;
  m.num_heads = 2;  // D = 2
  m.num_kv_heads = 1;
  m.ffn_hidden_size = 3;
  m.num_layers = 1;
  m.vocab_size = 5;
  return m;
}

TEST(QkvLayout, GroupedRowsComeFromTheirHeads) {
  ModelConfig m = gqa_model();
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.hidden_size = 8;  // D = 2, G = 2: separate [q0 q1 q2 q3 | k0 k1 | v0 v1], 2 rows per head
  const std::vector<int64_t> rows = hf::qkv_separate_row_of_grouped(m);
  // Group 0: q0, q1, k0, v0; group 1: q2, q3, k1, v1.
  const std::vector<int64_t> expected = {0, 1, 2, 3, 8, 9, 12, 13, 4, 5, 6, 7, 10, 11, 14, 15};
  EXPECT_EQ(rows, expected);
  std::vector<double> values(static_cast<size_t>(m.qkv_rows() * 3));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(i);
  EXPECT_EQ(hf::qkv_separate_from_grouped(m, hf::qkv_grouped_from_separate(m, values, 3), 3), values);
}

TEST(HfNames, ConvertsLlamaNamesAndLayouts) {
  const ModelConfig m = gqa_model();  // H = 4, D = 2, NH = 2, NKV = 1, F = 3
  auto filled = [](std::vector<int64_t> shape, double start) {
    Recorded r{shape, {}, "float32"};
    for (int64_t i = 0; i < shape[0] * (shape.size() > 1 ? shape[1] : 1); ++i) {
      r.values.push_back(start + static_cast<double>(i));
    }
    return r;
  };
  std::map<std::string, Recorded> llama = {
      {"model.layers.0.self_attn.q_proj.weight", filled({4, 4}, 0)},
      {"model.layers.0.self_attn.k_proj.weight", filled({2, 4}, 100)},
      {"model.layers.0.self_attn.v_proj.weight", filled({2, 4}, 200)},
      {"model.layers.0.mlp.gate_proj.weight", filled({3, 4}, 300)},
      {"model.layers.0.mlp.up_proj.weight", filled({3, 4}, 400)},
      {"model.layers.0.post_attention_layernorm.weight", filled({4}, 1)},
      {"model.norm.weight", filled({4}, 1)},
      {"model.rotary_emb.inv_freq", filled({1}, 0)},
  };
  std::vector<std::string> ignored;
  const TensorMap out = hf::hf_to_contract(llama, m, "steps/1/grads", ignored);
  EXPECT_EQ(ignored, (std::vector<std::string>{"model.rotary_emb.inv_freq"}));
  const Recorded& qkv = out.at("steps/1/grads/decoder.layers.0.self_attention.linear_qkv.weight");
  EXPECT_EQ(qkv.shape, (std::vector<int64_t>{8, 4}));
  // One KV group: q heads 0 and 1 (rows 0-3 of q_proj), then k, then v.
  EXPECT_EQ(qkv.values[0], 0);
  EXPECT_EQ(qkv.values[4 * 4], 100);
  EXPECT_EQ(qkv.values[6 * 4], 200);
  const Recorded& fc1 = out.at("steps/1/grads/decoder.layers.0.mlp.linear_fc1.weight");
  EXPECT_EQ(fc1.shape, (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(fc1.values[3 * 4], 400);
  EXPECT_TRUE(out.count("steps/1/grads/decoder.layers.0.pre_mlp_layernorm.weight"));
  EXPECT_TRUE(out.count("steps/1/grads/decoder.final_layernorm.weight"));

  llama.erase("model.layers.0.self_attn.k_proj.weight");
  EXPECT_THROW(hf::hf_to_contract(llama, m, "g", ignored), InputError);
  llama["model.layers.0.self_attn.k_proj.weight"] = filled({3, 4}, 0);  // wrong shape
  EXPECT_THROW(hf::hf_to_contract(llama, m, "g", ignored), InputError);
  llama["model.layers.0.self_attn.k_proj.weight"] = filled({2, 4}, 0);
  llama["model.layers.7.input_layernorm.weight"] = filled({4}, 0);  // beyond the model
  EXPECT_THROW(hf::hf_to_contract(llama, m, "g", ignored), InputError);
}

TEST(H5Reader, StoredTypesAndOptionalAttributes) {
  const std::string path =
      (fs::temp_directory_path() / ("touchstone_diff_" + std::to_string(getpid()) + "_types.h5")).string();
  {
    h5::H5Writer writer(path);
    const double values[2] = {1.0, 2.0};
    const int64_t count = 3;
    writer.write_f64("/a", values, {2});
    writer.write_f32("/b", values, {2});
    writer.write_i64("/c", &count, {});
    writer.set_attribute("/", "kind", std::string("x"));
    writer.commit();
  }
  const h5::H5Reader reader(path);
  EXPECT_EQ(reader.element_type("/a"), "float64");
  EXPECT_EQ(reader.element_type("/b"), "float32");
  EXPECT_EQ(reader.element_type("/c"), "int64");
  EXPECT_THROW(reader.element_type("/missing"), InputError);
  EXPECT_TRUE(reader.has_attribute("/", "kind"));
  EXPECT_FALSE(reader.has_attribute("/", "tolerance_model"));
  EXPECT_FALSE(reader.has_attribute("/missing", "kind"));
  fs::remove(path);
}

}  // namespace
}  // namespace touchstone::diff
