// Checkpoint saves and the consumed-sample gather of a run.
#include "oracle/checkpointing.h"

#include <chrono>

#include "oracle/gather.h"

namespace touchstone {

namespace {

constexpr int kSamplesTag = (1 << 20) + 3;  // world-group tag of the consumed-sample gather

}  // namespace

SaveReport save_checkpoint(const Trainer& trainer, const ParallelContext& context, const Config& config,
                           const CheckpointStore& store, int64_t step, double lr) {
  const auto start = std::chrono::steady_clock::now();
  const bool writer_rank = context.world.rank() == 0;
  const ParamTable& table = trainer.table();
  const ParamTensors params = gather_full_tensors(trainer.plan(), context, trainer.params());
  SaveReport report;
  std::unique_ptr<CheckpointFileWriter> writer;
  if (writer_rank) {
    writer = std::make_unique<CheckpointFileWriter>(store.begin_save(step).string(), config);
    TrainingState progress;
    progress.step = step;
    progress.consumed_samples = step * config.train.global_batch_size;
    progress.lr = lr;
    writer->write_progress(config, progress);
    writer->write_tensors("/params", table, params);
  }
  context.set_phase(step, -1, "save");
  const AdamWState moments = trainer.optimizer_moments();  // gathered over dp when distributed
  const ParamTensors exp_avg = gather_full_tensors(trainer.plan(), context, moments.exp_avg);
  const ParamTensors exp_avg_sq = gather_full_tensors(trainer.plan(), context, moments.exp_avg_sq);
  if (writer_rank) {
    writer->write_tensors("/optimizer/exp_avg", table, exp_avg);
    writer->write_tensors("/optimizer/exp_avg_sq", table, exp_avg_sq);
    writer->commit();
    report.directory = store.commit_save(step);
    for (const auto& entry : std::filesystem::directory_iterator(report.directory)) {
      report.bytes += static_cast<int64_t>(entry.file_size());
    }
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return report;
}

std::vector<std::vector<int64_t>> gather_consumed_samples(const GlobalBatch& batch, const Config& config,
                                                          const ParallelContext& context) {
  const int64_t mbs = config.train.micro_batch_size;
  std::vector<double> mine;  // sample indices are far below 2^53: exact as doubles
  for (int64_t start : micro_batch_starts(batch.windows, mbs, context.dp.size(), context.dp.rank())) {
    for (int64_t i = start; i < start + mbs; ++i) {
      mine.push_back(static_cast<double>(batch.sample_indices[static_cast<size_t>(i)]));
    }
  }
  const bool source = context.first_stage() && context.tp.rank() == 0;
  const auto count = static_cast<int64_t>(mine.size());
  if (source && context.world.rank() != 0) {
    context.world.send(mine.data(), count, 0, kSamplesTag, {count});
    context.world.wait_sends();
  }
  if (context.world.rank() != 0) return {};
  std::vector<std::vector<int64_t>> samples;
  for (int r = 0; r < context.dp.size(); ++r) {
    std::vector<double> theirs = mine;
    const int from = context.global_rank_of(0, r, 0);
    if (from != 0) context.world.recv(theirs.data(), count, from, kSamplesTag, {count});
    samples.emplace_back(theirs.begin(), theirs.end());
  }
  return samples;
}

}  // namespace touchstone
