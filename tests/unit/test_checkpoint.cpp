// Tests of the checkpoint format and directory: bitwise round trip, the latest record, keeping the
// last K, partial saves never read, and every kind of damaged or foreign checkpoint refused with its
// own one-line message (falling back to the previous complete one only when asked).
#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "checkpoint/checkpoint_store.h"
#include "common/hash.h"
#include "model/params.h"
#include "optim/optimizer.h"
#include "test_files.h"

namespace touchstone {
namespace {

namespace fs = std::filesystem;
using testing::expect_input_error;

Config small_config() {
  Config c;
  c.model.hidden_size = 32;
  c.model.ffn_hidden_size = 64;
  return c;
}

// A state whose every tensor differs from every other (moments from other seeds).
TrainingState state_at(const Config& config, int64_t step) {
  const ParamTable table(config.model);
  TrainingState state;
  state.step = step;
  state.consumed_samples = step * config.train.global_batch_size;
  state.lr = learning_rate(config.optim, step);
  state.params = init_parameters(table, config.model, 100 + static_cast<uint64_t>(step));
  state.exp_avg = init_parameters(table, config.model, 200 + static_cast<uint64_t>(step));
  state.exp_avg_sq = init_parameters(table, config.model, 300 + static_cast<uint64_t>(step));
  return state;
}

void save(const CheckpointStore& store, const Config& config, const TrainingState& state) {
  CheckpointFileWriter writer(store.begin_save(state.step).string(), config);
  writer.write_progress(config, state);
  const ParamTable table(config.model);
  writer.write_tensors("/params", table, state.params);
  writer.write_tensors("/optimizer/exp_avg", table, state.exp_avg);
  writer.write_tensors("/optimizer/exp_avg_sq", table, state.exp_avg_sq);
  writer.commit();
  store.commit_save(state.step);
}

void expect_same(const TrainingState& a, const TrainingState& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.consumed_samples, b.consumed_samples);
  EXPECT_EQ(a.lr, b.lr);
  EXPECT_EQ(a.params.tensors, b.params.tensors);  // bitwise: stored as float64
  EXPECT_EQ(a.exp_avg.tensors, b.exp_avg.tensors);
  EXPECT_EQ(a.exp_avg_sq.tensors, b.exp_avg_sq.tensors);
}

// The byte offset of a contiguous dataset's data in its file.
uint64_t data_offset(const fs::path& file, const std::string& dataset) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  const haddr_t offset = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(f);
  return offset;
}

void flip_byte(const fs::path& file, uint64_t offset) {
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(offset));
  char byte = 0;
  io.read(&byte, 1);
  byte = static_cast<char>(byte ^ 0x10);
  io.seekp(static_cast<std::streamoff>(offset));
  io.write(&byte, 1);
}

// Edits a committed checkpoint file in place with `edit` (an open HDF5 file id) and rewrites the
// manifest, as a faulty writer would have produced it: the files agree with their manifest, the
// content is wrong.
template <typename Edit>
void rewrite(const fs::path& directory, int64_t step, Edit edit) {
  const fs::path file = directory / "state.h5";
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  edit(f);
  H5Fclose(f);
  write_manifest(directory, step);
}

class CheckpointTest : public ::testing::Test {
 protected:
  testing::ScratchDirectory scratch_{"touchstone_checkpoint"};
  Config config_ = small_config();
  CheckpointStore store_{scratch_.path() / "ckpt", 0};
  const std::string embedding_ = "embedding.word_embeddings.weight";

  fs::path step_dir(int64_t step) const {
    return store_.directory() / CheckpointStore::step_directory_name(step);
  }
};

TEST_F(CheckpointTest, RoundTripIsBitwiseAndLatestIsTheNewest) {
  EXPECT_FALSE(store_.load_latest(config_, false).has_value());  // nothing saved: a fresh start
  save(store_, config_, state_at(config_, 2));
  save(store_, config_, state_at(config_, 4));
  const auto loaded = store_.load_latest(config_, false);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->directory, step_dir(4));
  expect_same(loaded->state, state_at(config_, 4));
  EXPECT_EQ(store_.latest_step(), 4);
}

TEST_F(CheckpointTest, KeepsTheLastK) {
  const CheckpointStore store(scratch_.path() / "keep", 2);
  for (int64_t step : {1, 2, 3, 4}) save(store, config_, state_at(config_, step));
  EXPECT_EQ(store.complete_steps(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(store.latest_step(), 4);
}

TEST_F(CheckpointTest, APartialSaveIsNeverRead) {
  save(store_, config_, state_at(config_, 2));
  // A save that died after writing the parameters: its partial directory holds an unfinished file.
  CheckpointFileWriter unfinished(store_.begin_save(3).string(), config_);
  unfinished.write_progress(config_, state_at(config_, 3));
  EXPECT_EQ(store_.latest_step(), 2);
  EXPECT_EQ(store_.complete_steps(), (std::vector<int64_t>{2}));
  expect_same(store_.load_latest(config_, false)->state, state_at(config_, 2));
  store_.remove_partial_saves();
  for (const auto& entry : fs::directory_iterator(store_.directory())) {
    EXPECT_NE(entry.path().filename().string().rfind(".partial-", 0), 0u) << entry.path();
  }
}

TEST_F(CheckpointTest, TruncatedFileIsRefused) {
  save(store_, config_, state_at(config_, 2));
  const fs::path file = step_dir(2) / "state.h5";
  fs::resize_file(file, fs::file_size(file) / 2);
  expect_input_error([&] { store_.load_latest(config_, false); }, {file.string(), "truncated"});
}

TEST_F(CheckpointTest, FlippedByteIsRefusedBeforeParsingAndNamesTheTensorWhenRead) {
  save(store_, config_, state_at(config_, 2));
  const fs::path file = step_dir(2) / "state.h5";
  const std::string dataset = "/optimizer/exp_avg_sq/" + embedding_;
  flip_byte(file, data_offset(file, dataset) + 12345);
  // A load checks the whole file's bytes before HDF5 parses any of them; reading the file itself
  // still finds the tensor by its own checksum.
  expect_input_error([&] { store_.load_latest(config_, false); },
                     {file.string(), "corrupted", "file checksum"});
  expect_input_error([&] { read_checkpoint_file(file.string(), config_); },
                     {file.string(), dataset, "corrupted", "checksum"});
}

TEST_F(CheckpointTest, FlippedByteOutsideTheTensorsIsCaughtByTheFileChecksum) {
  save(store_, config_, state_at(config_, 2));
  const fs::path file = step_dir(2) / "state.h5";
  // A byte of the `generator` attribute's text: metadata HDF5 reads without complaint and no tensor
  // checksum covers, so only the whole-file checksum of the manifest can see it.
  std::ifstream in(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = bytes.find("touchstone ");
  ASSERT_NE(at, std::string::npos);
  flip_byte(file, at + 3);
  expect_input_error([&] { store_.load_latest(config_, false); },
                     {file.string(), "corrupted", "file checksum"});
}

TEST_F(CheckpointTest, MissingTensorIsRefused) {
  save(store_, config_, state_at(config_, 2));
  const std::string dataset = "/optimizer/exp_avg/decoder.layers.1.mlp.linear_fc2.weight";
  rewrite(step_dir(2), 2, [&](hid_t f) { ASSERT_GE(H5Ldelete(f, dataset.c_str(), H5P_DEFAULT), 0); });
  expect_input_error([&] { store_.load_latest(config_, false); }, {"missing " + dataset});
}

TEST_F(CheckpointTest, WrongShapeTensorIsRefused) {
  save(store_, config_, state_at(config_, 2));
  const std::string dataset = "/params/decoder.final_layernorm.weight";
  rewrite(step_dir(2), 2, [&](hid_t f) {
    ASSERT_GE(H5Ldelete(f, dataset.c_str(), H5P_DEFAULT), 0);
    const hsize_t dims[1] = {16};
    const hid_t space = H5Screate_simple(1, dims, nullptr);
    const hid_t d =
        H5Dcreate2(f, dataset.c_str(), H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    const std::vector<double> ones(16, 1.0);
    H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, ones.data());
    H5Dclose(d);
    H5Sclose(space);
  });
  expect_input_error([&] { store_.load_latest(config_, false); },
                     {dataset, "shape [16]", "the model needs [32]"});
}

TEST_F(CheckpointTest, CheckpointOfAnotherModelIsRefused) {
  save(store_, config_, state_at(config_, 2));
  Config other = config_;
  other.model.hidden_size = 64;
  other.model.ffn_hidden_size = 128;
  expect_input_error([&] { store_.load_latest(other, false); }, {"model.ffn_hidden_size", "64", "128"});
  Config other_optimizer = config_;
  other_optimizer.optim.lr = 2e-3;
  expect_input_error([&] { store_.load_latest(other_optimizer, false); }, {"optim.lr"});
}

TEST_F(CheckpointTest, ALayoutChangeIsAccepted) {
  save(store_, config_, state_at(config_, 2));
  Config other_layout = config_;
  other_layout.parallel.tp = 2;
  other_layout.parallel.dp = 4;
  other_layout.train.steps = 10;
  expect_same(store_.load_latest(other_layout, false)->state, state_at(config_, 2));
  // Other micro-batches are another objective under per_microbatch_mean.
  Config per_microbatch = config_;
  per_microbatch.train.loss_normalization = LossNormalization::kPerMicrobatchMean;
  save(store_, per_microbatch, state_at(per_microbatch, 3));
  per_microbatch.train.micro_batch_size = 4;
  expect_input_error([&] { store_.load_latest(per_microbatch, false); }, {"train.micro_batch_size"});
}

TEST_F(CheckpointTest, MissingManifestAndMissingDirectoryAreRefused) {
  save(store_, config_, state_at(config_, 2));
  save(store_, config_, state_at(config_, 4));
  fs::remove(step_dir(4) / "manifest.json");
  expect_input_error([&] { store_.load_latest(config_, false); }, {"manifest", "missing"});
  fs::remove_all(step_dir(4));
  expect_input_error([&] { store_.load_latest(config_, false); }, {step_dir(4).string(), "missing"});
}

TEST_F(CheckpointTest, FallbackLoadsThePreviousCompleteOne) {
  save(store_, config_, state_at(config_, 2));
  save(store_, config_, state_at(config_, 4));
  const fs::path file = step_dir(4) / "state.h5";
  flip_byte(file, data_offset(file, "/params/" + embedding_));
  const auto loaded = store_.load_latest(config_, true);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->directory, step_dir(2));
  expect_same(loaded->state, state_at(config_, 2));
  ASSERT_EQ(loaded->skipped.size(), 1u);
  EXPECT_NE(loaded->skipped[0].find(file.string() + ": corrupted (file checksum"), std::string::npos)
      << loaded->skipped[0];
  // Nothing loads: the error names the last refusal.
  fs::resize_file(step_dir(2) / "state.h5", 100);
  expect_input_error([&] { store_.load_latest(config_, true); }, {"no complete checkpoint", "truncated"});
}

TEST(Fnv1a, KnownAnswersAndSingleByteSensitivity) {
  // Published FNV-1a 64 test vectors.
  EXPECT_EQ(hex64(fnv1a64("", 0)), "cbf29ce484222325");
  EXPECT_EQ(hex64(fnv1a64("a", 1)), "af63dc4c8601ec8c");
  EXPECT_EQ(hex64(fnv1a64("foobar", 6)), "85944171f73967e8");
  std::vector<unsigned char> bytes(4096, 7);
  const uint64_t reference = fnv1a64(bytes.data(), bytes.size());
  for (size_t i = 0; i < bytes.size(); i += 97) {
    bytes[i] ^= 1;
    EXPECT_NE(fnv1a64(bytes.data(), bytes.size()), reference) << i;
    bytes[i] ^= 1;
  }
}

}  // namespace
}  // namespace touchstone
