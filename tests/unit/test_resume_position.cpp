// Where a resumed run starts: after a checkpoint of update k, the run performs update k + 1 first, on
// global samples k*B ... k*B + B - 1 (sample j reading window j mod W), its dropout masks keyed by
// those sample indices, its learning rate and Adam bias correction those of update k + 1; and from
// there it is the uninterrupted run, bitwise. One process, a small model, a checkpoint written and
// read back through prepare_run exactly as `touchstone train --resume` does (first_update and
// batch_of_update are the functions the run loop uses). FP64 on one process: the same operations in
// the same order, so equality is exact.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numeric>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "kernels/backend.h"
#include "oracle/checkpointing.h"
#include "oracle/run.h"
#include "oracle/train_step.h"
#include "test_files.h"
#include "test_support.h"

namespace touchstone {
namespace {

constexpr int64_t kSteps = 5, kSavedAfter = 2;

// The built-in data at T = 16 with attention and hidden dropout on, B = 8 in micro-batches of 2.
Config resume_config() {
  Config c = touchstone::testing::small_model_config();
  c.model.attention_dropout = 0.1;
  c.model.hidden_dropout = 0.1;
  c.train.global_batch_size = 8;
  c.train.micro_batch_size = 2;
  c.train.steps = kSteps;
  return c;
}

std::vector<int64_t> consecutive(int64_t first, int64_t count) {
  std::vector<int64_t> v(static_cast<size_t>(count));
  std::iota(v.begin(), v.end(), first);
  return v;
}

// The batch's rows are the windows of its samples (j mod W), in order.
void expect_rows_are_windows(const GlobalBatch& batch, const std::vector<data::Window>& windows) {
  const auto W = static_cast<int64_t>(windows.size());
  for (int64_t r = 0; r < batch.windows; ++r) {
    const data::Window& w = windows[static_cast<size_t>(batch.sample_indices[static_cast<size_t>(r)] % W)];
    const auto row = [&](const std::vector<int32_t>& v) {
      return std::vector<int32_t>(v.begin() + r * batch.seq, v.begin() + (r + 1) * batch.seq);
    };
    EXPECT_EQ(row(batch.tokens), w.tokens) << "row " << r;
    EXPECT_EQ(row(batch.targets), w.targets) << "row " << r;
    EXPECT_EQ(row(batch.position_ids), w.position_ids) << "row " << r;
    EXPECT_EQ(row(batch.document_ids), w.document_ids) << "row " << r;
  }
}

struct StepResult {
  StepRecord record;
  ParamTensors params;  // after the update
};

// Trains kSteps updates uninterrupted, saving after kSavedAfter into `directory`, then resumes from there.
void check_resume(bool distributed_optimizer, const std::filesystem::path& directory) {
  Config config = resume_config();
  config.parallel.distributed_optimizer = distributed_optimizer;
  const int64_t B = config.train.global_batch_size;
  RunOptions resume;
  resume.checkpoint.directory = directory.string();
  resume.checkpoint.resume = true;

  // Nothing saved yet: --resume starts fresh, at update 1 on samples 0 ... B-1.
  const PreparedRun fresh = prepare_run(config, resume);
  ASSERT_FALSE(fresh.resumed.has_value());
  EXPECT_EQ(first_update(fresh), 1);
  const auto W = static_cast<int64_t>(fresh.windows.size());
  EXPECT_LT(W, kSteps * B) << "the run should wrap around the data, to check j mod W";

  // The uninterrupted run, saving after update k as the run recorder does.
  auto backend = make_cpu_backend();
  SingleProcessContext single;
  std::vector<StepResult> uninterrupted;
  {
    Trainer trainer(config, fresh.initial_params, *backend, single.context());
    const CheckpointStore store(resume.checkpoint.directory, 0);
    for (int64_t s = first_update(fresh); s <= kSteps; ++s) {
      const GlobalBatch& batch = batch_of_update(fresh, s);
      EXPECT_EQ(batch.sample_indices, consecutive((s - 1) * B, B)) << "update " << s;
      expect_rows_are_windows(batch, fresh.windows);
      StepResult step{trainer.step(batch), {}};
      step.params = trainer.params();
      if (s == kSavedAfter) save_checkpoint(trainer, single.context(), config, store, s, step.record.lr);
      uninterrupted.push_back(std::move(step));
    }
  }

  // The resumed run: update k + 1 on samples k*B ... (k+1)*B - 1.
  const PreparedRun resumed = prepare_run(config, resume);
  ASSERT_TRUE(resumed.resumed.has_value());
  EXPECT_EQ(resumed.resumed->step, kSavedAfter);
  EXPECT_EQ(resumed.resumed->consumed_samples, kSavedAfter * B);
  EXPECT_EQ(first_update(resumed), kSavedAfter + 1);
  const GlobalBatch& first = batch_of_update(resumed, first_update(resumed));
  EXPECT_EQ(first.sample_indices, consecutive(kSavedAfter * B, B));
  EXPECT_EQ(first.sample_indices.front(), resumed.resumed->consumed_samples);  // the next sample index
  expect_rows_are_windows(first, resumed.windows);

  Trainer trainer(config, resumed.initial_params, *backend, single.context());
  trainer.restore(resumed.resumed->step, resumed.resumed->params, resumed.resumed->exp_avg,
                  resumed.resumed->exp_avg_sq);
  EXPECT_EQ(trainer.steps_done(), kSavedAfter);
  for (int64_t s = first_update(resumed); s <= kSteps; ++s) {
    const StepRecord record = trainer.step(batch_of_update(resumed, s));
    const StepResult& want = uninterrupted[static_cast<size_t>(s - 1)];
    EXPECT_EQ(record.step, s);
    EXPECT_EQ(record.lr, want.record.lr) << "update " << s;  // the schedule's update number
    EXPECT_EQ(record.loss, want.record.loss) << "update " << s;
    EXPECT_EQ(record.num_loss_tokens, want.record.num_loss_tokens) << "update " << s;
    EXPECT_EQ(record.grads.tensors, want.record.grads.tensors) << "update " << s;
    EXPECT_EQ(trainer.params().tensors, want.params.tensors) << "update " << s;  // Adam's bias correction
  }
}

TEST(ResumePosition, AResumedRunStartsAtTheNextUpdateOnItsSamplesAndThenMatchesTheUninterruptedRun) {
  testing::ScratchDirectory scratch("touchstone_resume_position");
  // With and without the distributed optimizer, whose sharded AdamW keeps its own update count.
  for (bool distributed : {false, true}) {
    SCOPED_TRACE(distributed ? "distributed optimizer" : "replicated optimizer");
    check_resume(distributed, scratch.path() / (distributed ? "distributed" : "replicated"));
  }
}

// The equality above sees the dropout counters: the same windows and state under the sample indices of
// another update (other Philox counters, the same tokens) give another loss.
TEST(ResumeDropout, TheDropoutMasksFollowTheSampleIndicesOfTheResumedBatch) {
  const Config config = resume_config();
  const PreparedRun run = prepare_run(config, RunOptions{});
  GlobalBatch relabelled = batch_of_update(run, kSavedAfter + 1);
  for (int64_t& sample : relabelled.sample_indices) sample -= config.train.global_batch_size;
  auto backend = make_cpu_backend();
  SingleProcessContext single;
  Trainer right(config, run.initial_params, *backend, single.context());
  Trainer wrong(config, run.initial_params, *backend, single.context());
  const double loss = right.step(batch_of_update(run, kSavedAfter + 1), false).loss;
  const double loss_other_masks = wrong.step(relabelled, false).loss;
  // Measured relative change ~1e-2 (as test_dropout's 5e-3 to 5e-2); FP64 noise is 1e-16.
  EXPECT_GT(std::abs(loss - loss_other_masks) / loss, 1e-4);
}

}  // namespace
}  // namespace touchstone
