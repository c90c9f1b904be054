// Checkpoint saves and the consumed-sample gather of a run.
#include "oracle/checkpointing.h"

#include <chrono>
#include <cstdio>
#include <ostream>

#include "oracle/gather.h"
#include "parallel/comm/message_tags.h"

namespace touchstone {

namespace {}  // namespace

SaveReport save_checkpoint(const Trainer& trainer, const ParallelContext& context, const Config& config,
                           const CheckpointStore& store, int64_t step, double lr,
                           const std::string& data_fingerprint) {
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
    progress.data_fingerprint = data_fingerprint;
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
    report.bytes = directory_bytes(report.directory);
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
  const bool source = context.first_stage() && context.tp.rank() == 0 && context.cp.rank() == 0;
  const TransferSite site(context.world, "ledger: consumed sample indices to world rank 0");
  const auto count = static_cast<int64_t>(mine.size());
  if (source && context.world.rank() != 0) {
    context.world.send(mine.data(), count, 0, message_tags::kConsumedSamples, {count});
    context.world.wait_sends();
  }
  if (context.world.rank() != 0) return {};
  std::vector<std::vector<int64_t>> samples;
  for (int r = 0; r < context.dp.size(); ++r) {
    std::vector<double> theirs = mine;
    const int from = context.global_rank_of(0, r, 0);
    if (from != 0) context.world.recv(theirs.data(), count, from, message_tags::kConsumedSamples, {count});
    samples.emplace_back(theirs.begin(), theirs.end());
  }
  return samples;
}

std::string throughput_text(uintmax_t bytes, double seconds) {
  const double megabytes = static_cast<double>(bytes) / 1e6;
  char text[96];
  std::snprintf(text, sizeof text, "%.1f MB in %.2f s, %.0f MB/s", megabytes, seconds, megabytes / seconds);
  return text;
}

RunRecorder::RunRecorder(const CheckpointOptions& options, const Config& config,
                         const ParallelContext& context, int64_t num_windows,
                         const std::string& data_fingerprint, int64_t first_step, int64_t last_step)
    : options_(options),
      config_(config),
      context_(context),
      store_(options.directory, options.keep),
      data_fingerprint_(data_fingerprint),
      last_step_(last_step) {
  if (context.world.rank() != 0) return;
  store_.remove_partial_saves();  // left by a save that died: no save is in progress when a run starts
  ledger_ = std::make_unique<ledger::LedgerWriter>(
      (std::filesystem::path(options.directory) / ledger::kLedgerFileName).string());
  const int64_t resumed_from = first_step - 1;
  // The checkpoint just loaded and verified is the truth: if its attempt died between the commit and
  // the ledger line, the line is recorded now, before this attempt's start (docs/recovery.md).
  if (resumed_from > 0) {
    ledger_->record_recovered_checkpoint(resumed_from, CheckpointStore::step_directory_name(resumed_from));
  }
  const ParallelConfig& p = config.parallel;
  ledger_->start(
      ledger::StartInfo{first_step - 1,
                        ledger::Layout{static_cast<int>(p.world_size()), static_cast<int>(p.tp),
                                       static_cast<int>(p.cp), static_cast<int>(p.pp), static_cast<int>(p.dp),
                                       config.train.global_batch_size, config.train.micro_batch_size},
                        num_windows, last_step},
      data_fingerprint);
}

void RunRecorder::after_step(const Trainer& trainer, const GlobalBatch& batch, const StepRecord& record,
                             std::ostream& out) {
  const std::vector<std::vector<int64_t>> samples = gather_consumed_samples(batch, config_, context_);
  if (ledger_) {
    const ledger::StepTotals totals{record.loss, record.num_loss_tokens, record.grad_norm, record.lr};
    ledger_->step(record.step, samples, &totals);
  }
  const int64_t s = record.step;
  if (s != last_step_ && (options_.save_every == 0 || s % options_.save_every != 0)) return;
  const SaveReport saved =
      save_checkpoint(trainer, context_, config_, store_, s, record.lr, data_fingerprint_);
  if (!ledger_) return;
  ledger_->checkpoint(s, saved.directory.filename().string());
  out << "saved " << saved.directory.string() << " (" << throughput_text(saved.bytes, saved.seconds) << ")"
      << std::endl;
}

void RunRecorder::finish() {
  if (ledger_) ledger_->end(last_step_);
}

}  // namespace touchstone
