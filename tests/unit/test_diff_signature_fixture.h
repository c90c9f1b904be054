// The golden runs and synthetic candidates of the diff's signature tests (test_diff_signatures*.cpp):
// a two-layer GQA model at T = 16 trained for two FP64 steps on one process through the library
// (prepare_run, Trainer, GoldenWriter, as `touchstone golden` does on one rank), documents chosen so
// that windows hold several documents, the last window ends in padding and the two micro-batches of a
// step hold different numbers of loss tokens; candidates written as HDF5 in the golden schema and
// judged by run_analysis exactly as `touchstone diff golden.h5 candidate.h5` judges them.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/h5_file.h"
#include "kernels/backend.h"
#include "kernels/precision.h"
#include "oracle/diff/candidate.h"
#include "oracle/diff/diff.h"
#include "oracle/golden/golden_writer.h"
#include "oracle/hf/hf_names.h"
#include "oracle/run.h"
#include "oracle/train_step.h"
#include "parallel/comm/context.h"
#include "test_support.h"

namespace touchstone::diff::testing {

namespace fs = std::filesystem;

// Every signature the diff can name: each case below expects an exact subset of these.
inline const std::set<std::string>& all_signatures() {
  static const std::set<std::string> names = {"loss_normalization",
                                              "document_mask_missing",
                                              "document_mask_missing_positions_not_reset",
                                              "document_mask_applied",
                                              "qkv_grouping",
                                              "qkv_conversion",
                                              "token_count",
                                              "qkv_layout",
                                              "tp_shard",
                                              "gradient_scale",
                                              "one_layer",
                                              "fp32_in_fp64",
                                              "attention_mask_added",
                                              "rope_adjacent_pairs",
                                              "rope_cosine_only",
                                              "targets_shifted_twice",
                                              "optimizer_bias_correction",
                                              "optimizer_weight_decay",
                                              "optimizer_clipping",
                                              "learning_rate_behind",
                                              "learning_rate_ahead"};
  return names;
}

// V = 32, H = 16, 2 layers, 4 query heads over 2 KV groups (so that [q; k; v] order differs from the
// grouped one), F = 24, T = 16, B = 4 windows in 2 micro-batches, 2 steps, FP64. clip_grad is well
// below the gradient norm (measured 2.4 to 2.8 at both steps): clipping acts at every update, with a
// coefficient (~0.12) far from the ratios that other optimizer mistakes cause (lr(2)/lr(1) = 0.775,
// lr(3)/lr(2) = 0.42, the bias correction's 0.45 at step 1), so no two optimizer rules coincide.
inline Config signature_config(const std::string& documents) {
  Config c = touchstone::testing::small_model_config();  // visibly non-linear: every rule changes the loss by
                                                         // 1e-3 or more
  c.model.vocab_size = 32;
  c.data.source = documents;
  c.train.global_batch_size = 4;
  c.train.micro_batch_size = 2;
  c.train.steps = 2;
  c.optim.clip_grad = 0.3;
  return c;
}

// Eight documents (55 tokens with their EOS) packed into 4 windows of 16: every window holds two or
// more documents, the last ends in 9 padding positions, so micro-batch 0 (windows 0, 1) and micro-batch
// 1 (windows 2, 3) hold different numbers of loss tokens and the two normalisations differ. With B = 4
// both steps read the same four windows.
inline void write_documents(const fs::path& path) {
  const std::vector<int> lengths = {6, 9, 4, 11, 7, 5, 3, 2};
  std::ofstream out(path);
  int token = 2;
  for (int length : lengths) {
    out << "{\"tokens\": [";
    for (int i = 0; i < length; ++i) {
      out << (i ? ", " : "") << token;
      token = 2 + (token * 7 + 3) % 30;  // ids 2..31: never EOS (1) or padding (0)
    }
    out << "]}\n";
  }
}

// The datasets of one step as a candidate records them (every group complete).
inline TensorMap step_datasets(const ParamTable& table, const StepRecord& record, const ParamTensors* params,
                               int64_t windows, int64_t seq) {
  const std::string s = "steps/" + std::to_string(record.step) + "/";
  TensorMap out;
  out[s + "loss"] = Recorded{{}, {record.loss}, "float64"};
  out[s + "num_loss_tokens"] = Recorded{{}, {static_cast<double>(record.num_loss_tokens)}, "int64"};
  out[s + "token_losses"] = Recorded{{windows, seq}, record.token_losses, "float64"};
  out[s + "grad_norm"] = Recorded{{}, {record.grad_norm}, "float64"};
  for (int id = 0; id < table.size(); ++id) {
    out[s + "grads/" + table[id].name] = Recorded{table[id].shape, record.grads[id], "float64"};
  }
  if (params != nullptr) {
    out[s + "lr"] = Recorded{{}, {record.lr}, "float64"};
    for (int id = 0; id < table.size(); ++id) {
      out[s + "params/" + table[id].name] = Recorded{table[id].shape, (*params)[id], "float64"};
    }
  }
  return out;
}

inline void write_candidate(const std::string& path, const TensorMap& tensors) {
  h5::H5Writer writer(path);
  writer.set_attribute("/", "generator", std::string("signature test"));
  for (const auto& [name, t] : tensors) {
    if (t.dtype == "int64") {
      writer.write_scalar_i64("/" + name, static_cast<int64_t>(t.values.at(0)));
    } else {
      writer.write_f64("/" + name, t.values.data(), t.shape);
    }
  }
  writer.commit();
}

// Every dataset of a golden file a candidate can hold (/params/init and /steps), as stored.
inline TensorMap golden_datasets(const std::string& path) {
  const h5::H5Reader file(path);
  TensorMap out;
  for (const char* group : {"/params/init", "/steps"}) {
    for (const std::string& dataset : file.datasets_below(group)) out[dataset] = read_recorded(file, dataset);
  }
  return out;
}

// A golden file written through the library, with what a test needs to build candidates from it.
struct GoldenRun {
  Config config;
  std::string path;
  std::vector<GlobalBatch> batches;
  ParamTensors init;
  std::vector<StepRecord> records;   // [step - 1]
  std::vector<ParamTensors> params;  // [step - 1]: after the update
  std::unique_ptr<ParamTable> table;

  int64_t windows() const { return config.train.global_batch_size; }
  int64_t seq() const { return config.model.seq_length; }
  const GlobalBatch& batch(int64_t step) const { return batches.at(static_cast<size_t>(step - 1)); }
  const StepRecord& record(int64_t step) const { return records.at(static_cast<size_t>(step - 1)); }
  const ParamTensors& params_after(int64_t step) const {
    return step == 0 ? init : params.at(static_cast<size_t>(step - 1));
  }
  // Step `step` of the golden file as a candidate records it (with the updated parameters and the rate).
  TensorMap step_datasets(int64_t step) const {
    return testing::step_datasets(*table, record(step), &params_after(step), windows(), seq());
  }
};

inline GoldenRun write_golden(const fs::path& path, const Config& config) {
  GoldenRun g;
  g.config = config;
  g.path = path.string();
  const PreparedRun run = prepare_run(config, RunOptions{});
  g.batches = run.batches;
  g.init = run.initial_params;
  g.table = std::make_unique<ParamTable>(config.model);
  auto backend = make_cpu_backend();
  SingleProcessContext single;
  Trainer trainer(config, run.initial_params, *backend, single.context());
  GoldenWriter writer(g.path, config, *g.table, run.batches, run.initial_params, GoldenOptions{}, "cpu");
  for (int64_t s = 1; s <= config.train.steps; ++s) {
    StepRecord record = trainer.step(batch_of_update(run, s), true);
    writer.write_step(record, record.grads, trainer.params(), nullptr);
    g.records.push_back(std::move(record));
    g.params.push_back(trainer.params());
  }
  writer.commit();
  return g;
}

// Step `step` of `config` (which may differ from the golden run's in one rule) computed by the trainer
// from `params` on `batch`: what a candidate with that mistake records.
inline StepRecord trainer_step(const Config& config, const ParamTensors& params, int64_t step,
                               const GlobalBatch& batch) {
  const auto backend =
      make_cpu_backend(BackendOptions{config.precision, config.train.grad_accumulation_fusion});
  SingleProcessContext single;
  Trainer trainer(config, params, *backend, single.context());
  const AdamWState zeros = AdamWState::zeros_like(params);
  ParamTensors master = params;
  for (auto& t : master.tensors) backend->round(TensorRole::kState, t.data(), static_cast<int64_t>(t.size()));
  trainer.restore(step - 1, master, zeros.exp_avg, zeros.exp_avg_sq);
  return trainer.step(batch, true);
}

// A directory shared by the tests of one executable, removed when it ends.
class SuiteDirectory {
 public:
  explicit SuiteDirectory(const std::string& prefix)
      : path_(fs::temp_directory_path() / (prefix + "_" + std::to_string(getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~SuiteDirectory() { fs::remove_all(path_); }
  SuiteDirectory(const SuiteDirectory&) = delete;
  SuiteDirectory& operator=(const SuiteDirectory&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// A suite's three golden files of signature_config, written once per test suite in its own directory
// (Tag::kDirectory): document masking on (masked_), off (unmasked_), and per_microbatch_mean
// (per_microbatch_).
template <typename Tag>
class ThreeGoldenFiles : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = std::make_unique<SuiteDirectory>(Tag::kDirectory);
    const fs::path documents = directory_->path() / "documents.jsonl";
    write_documents(documents);
    Config config = signature_config(documents.string());
    masked_ = std::make_unique<GoldenRun>(write_golden(directory_->path() / "golden.h5", config));
    config.data.document_masking = false;
    unmasked_ = std::make_unique<GoldenRun>(write_golden(directory_->path() / "golden_unmasked.h5", config));
    config.data.document_masking = true;
    config.train.loss_normalization = LossNormalization::kPerMicrobatchMean;
    per_microbatch_ =
        std::make_unique<GoldenRun>(write_golden(directory_->path() / "golden_per_microbatch.h5", config));
  }
  static void TearDownTestSuite() {
    masked_.reset();
    unmasked_.reset();
    per_microbatch_.reset();
    directory_.reset();
  }

  // What a forward/backward dump of step 1 holds: loss, count, token losses, gradients and their norm.
  static TensorMap dump(const GoldenRun& golden, const StepRecord& record) {
    return step_datasets(*golden.table, record, nullptr, golden.windows(), golden.seq());
  }
  static std::vector<const GoldenRun*> goldens() {
    return {masked_.get(), unmasked_.get(), per_microbatch_.get()};
  }

  static inline std::unique_ptr<SuiteDirectory> directory_;
  static inline std::unique_ptr<GoldenRun> masked_, unmasked_, per_microbatch_;
};

// The candidate written next to the golden file and diffed with the default options.
inline DiffResult analyse(const GoldenRun& golden, const TensorMap& candidate, const std::string& name) {
  const std::string path = (fs::path(golden.path).parent_path() / (name + ".h5")).string();
  write_candidate(path, candidate);
  return run_analysis(golden.path, path, AnalysisOptions{});
}

inline std::set<std::string> signatures_of(const DiffResult& result) {
  std::set<std::string> names;
  for (const Verdict& v : result.verdicts) names.insert(v.signature);
  return names;
}

inline std::string describe(const DiffResult& result) {
  std::string text = "first failure: " + (result.first_failure >= 0
                                              ? result.entries[static_cast<size_t>(result.first_failure)].path
                                              : std::string("none"));
  for (const Verdict& v : result.verdicts) text += "\n  " + v.signature + ": " + v.message;
  for (const std::string& note : result.notes) text += "\n  note: " + note;
  return text;
}

// The candidate fails (exit status 1) with exactly `expected` among the verdicts: the rule meant for the
// case fires, and every other rule of all_signatures() stays silent on it.
inline void expect_verdicts(const DiffResult& result, const std::set<std::string>& expected) {
  EXPECT_EQ(result.exit_status(), 1) << describe(result);
  for (const std::string& name : expected) ASSERT_TRUE(all_signatures().count(name)) << name;
  EXPECT_EQ(signatures_of(result), expected) << describe(result);
}

// The entry of `path` in a result (fails the test when absent).
inline const Entry& entry_of(const DiffResult& result, const std::string& path) {
  for (const Entry& e : result.entries) {
    if (e.path == path) return e;
  }
  ADD_FAILURE() << "no entry " << path;
  static const Entry none;
  return none;
}

}  // namespace touchstone::diff::testing
