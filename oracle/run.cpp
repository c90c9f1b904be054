// The run loop shared by `touchstone train` and `touchstone golden`.
#include "oracle/run.h"

#include <chrono>
#include <cstdio>
#include <ostream>

#include "data/sources.h"
#include "model/errors.h"
#include "model/params.h"
#include "oracle/train_step.h"

namespace touchstone {

PreparedRun prepare_run(const Config& config, const RunOptions& options) {
  validate_config(config, /*world_size=*/1);
  PreparedRun run;
  run.config = config;
  const ModelConfig& m = config.model;
  const DataConfig& d = config.data;
  const data::SourceOptions source{d.source, static_cast<int>(m.vocab_size), static_cast<int>(m.seq_length),
                                   static_cast<int32_t>(d.eos_token), static_cast<int32_t>(d.pad_token)};
  const data::PackingOptions packing{static_cast<int>(m.seq_length), static_cast<int32_t>(d.eos_token),
                                     static_cast<int32_t>(d.pad_token), d.eos_loss, d.document_masking};
  run.windows = data::pack_documents(data::load_documents(source), packing);
  if (run.windows.empty()) throw InputError(d.source + ": the data set packs into no windows");
  for (int64_t s = 1; s <= config.train.steps; ++s) {
    run.batches.push_back(make_global_batch(run.windows, config.train.global_batch_size, s));
  }
  const ParamTable table(m);
  run.initial_params = options.init_from.empty()
                           ? init_parameters(table, m, static_cast<uint64_t>(config.train.seed))
                           : load_parameters(table, options.init_from, options.init_group);
  return run;
}

namespace {

std::string format_duration(double seconds) {
  const auto total = static_cast<long>(seconds + 0.5);
  char text[32];
  std::snprintf(text, sizeof text, "%02ld:%02ld:%02ld", total / 3600, total / 60 % 60, total % 60);
  return text;
}

int64_t real_tokens(const GlobalBatch& batch) {
  int64_t n = 0;
  for (int32_t doc : batch.document_ids) n += doc != data::kPaddingDocument;
  return n;
}

}  // namespace

void execute_run(const PreparedRun& run, const RunOptions& options, std::ostream& out) {
  auto backend = make_cpu_backend();
  Trainer trainer(run.config, run.initial_params, *backend);
  std::unique_ptr<GoldenWriter> golden;
  if (!options.golden_path.empty()) {
    golden = std::make_unique<GoldenWriter>(options.golden_path, run.config, trainer.table(), run.batches,
                                            run.initial_params, options.golden);
  }
  const auto steps = static_cast<int64_t>(run.batches.size());
  const auto start = std::chrono::steady_clock::now();
  int64_t tokens_done = 0;
  for (const GlobalBatch& batch : run.batches) {
    const auto step_start = std::chrono::steady_clock::now();
    const StepRecord record = trainer.step(batch);
    const double step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
    if (golden) golden->write_step(record, trainer.params(), trainer.optimizer_state());
    tokens_done += real_tokens(batch);
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    char line[256];
    std::snprintf(line, sizeof line,
                  "step %lld/%lld | loss %.6f | loss tokens %lld | grad norm %.4e | lr %.4e | %.3f s | %.0f tok/s | ETA %s",
                  static_cast<long long>(record.step), static_cast<long long>(steps), record.objective.loss,
                  static_cast<long long>(record.objective.num_loss_tokens), record.grad_norm, record.lr,
                  step_seconds, static_cast<double>(tokens_done) / elapsed,
                  format_duration(elapsed / static_cast<double>(record.step) *
                                  static_cast<double>(steps - record.step))
                      .c_str());
    out << line << std::endl;
  }
  if (golden) {
    golden->commit();
    out << "wrote " << options.golden_path << std::endl;
  }
}

}  // namespace touchstone
