// The run loop shared by `touchstone train` and `touchstone golden`.
#include "oracle/run.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <ostream>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/fault_injection.h"
#include "checkpoint/ledger/ledger.h"
#include "common/errors.h"
#include "common/text_output.h"
#include "data/sources.h"
#include "kernels/cpu/parallel_for.h"
#include "model/params.h"
#include "oracle/checkpointing.h"
#include "oracle/gather.h"
#include "oracle/train_step.h"
#include "parallel/comm/context.h"
#include "parallel/comm/message_tags.h"
#include "parallel/comm/mpi_runtime.h"
#include "parallel/comm/trace.h"
#include "parallel/pipeline/timeline.h"

namespace touchstone {

namespace {

BackendOptions backend_options(const Config& config) {
  return BackendOptions{config.precision, config.train.grad_accumulation_fusion};
}

void prepare_checkpoints(const RunOptions& options, const Config& config, PreparedRun& run) {
  const CheckpointOptions& c = options.checkpoint;
  if (c.directory.empty()) return;
  if (options.envelope) {
    throw InputError(
        "an envelope run trains twice from the same weights: it cannot save or resume checkpoints");
  }
  if (!c.resume) return;
  if (!options.golden_path.empty()) {
    throw InputError(
        "a golden file records a whole run from its initial weights: a resumed run cannot write one");
  }
  const CheckpointStore store(c.directory, c.keep);
  const auto start = std::chrono::steady_clock::now();
  std::optional<LoadedCheckpoint> loaded = store.load_latest(config, c.fallback);
  if (!loaded) return;  // nothing saved yet: a fresh start
  run.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The path names the data, the fingerprint is its content: other tokens under the same data.source
  // would continue the run on data it never saw. A checkpoint without one predates the fingerprint.
  const std::string& saved = loaded->state.data_fingerprint;
  if (!saved.empty() && saved != run.data_fingerprint) {
    throw InputError(loaded->directory.string() + ": data.source " + config.data.source +
                     " has content fingerprint " + run.data_fingerprint +
                     ", the checkpoint was written reading " + saved +
                     "; a resumed run must continue on the same data");
  }
  run.resumed = std::move(loaded->state);
  run.resumed_from = loaded->directory.string();
  run.refused_checkpoints = std::move(loaded->skipped);
  run.initial_params = run.resumed->params;
}

}  // namespace

PreparedRun prepare_run(const Config& config, const RunOptions& options, int world_size) {
  validate_config(config, world_size);
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
  if (!options.checkpoint.directory.empty()) run.data_fingerprint = data::content_fingerprint(run.windows);
  for (int64_t s = 1; s <= config.train.steps; ++s) {
    run.batches.push_back(make_global_batch(run.windows, config.train.global_batch_size, s));
  }
  const ParamTable table(m);
  run.initial_params = options.init_from.empty()
                           ? init_parameters(table, m, static_cast<uint64_t>(config.train.seed))
                           : load_parameters(table, options.init_from, options.init_group);
  // The initial weights as the optimizer stores them (FP32 master weights unless FP64), so that the
  // golden file's /params/init is exactly where every precision's run starts.
  auto backend = make_cpu_backend(backend_options(config));
  for (auto& t : run.initial_params.tensors)
    backend->round(TensorRole::kState, t.data(), static_cast<int64_t>(t.size()));
  if (options.envelope && config.precision == Precision::kFp64) {
    throw InputError("an envelope measures a lower precision against FP64: set precision to bf16 or fp32");
  }
  check_backend_available(options.backend);
  prepare_checkpoints(options, config, run);
  return run;
}

int64_t first_update(const PreparedRun& run) { return run.resumed ? run.resumed->step + 1 : 1; }

const GlobalBatch& batch_of_update(const PreparedRun& run, int64_t update) {
  return run.batches.at(static_cast<size_t>(update - 1));
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

// The step's pipeline timeline of every stage (recorded on tp rank 0, cp rank 0, dp rank 0), on world rank 0.
std::vector<pipeline::TimelineEvent> gather_timeline(Trainer& trainer, const ParallelContext& context) {
  std::vector<double> mine = pipeline::encode_events(trainer.timeline().take_events());
  const bool source = context.tp.rank() == 0 && context.cp.rank() == 0 && context.dp.rank() == 0;
  const TransferSite site(context.world, "outputs: each stage's pipeline timeline to world rank 0");
  if (source && context.world.rank() != 0) {
    double length = static_cast<double>(mine.size());
    context.world.send(&length, 1, 0, message_tags::kTimelineLength, {1});
    context.world.send(mine.data(), static_cast<int64_t>(mine.size()), 0, message_tags::kTimelineEvents,
                       {static_cast<int64_t>(mine.size())});
    context.world.wait_sends();
  }
  if (context.world.rank() != 0) return {};
  std::vector<pipeline::TimelineEvent> all = pipeline::decode_events(mine);
  for (int stage = 1; stage < context.pp.size(); ++stage) {
    const int from = context.global_rank_of(0, 0, stage);
    double length = 0.0;
    context.world.recv(&length, 1, from, message_tags::kTimelineLength, {1});
    std::vector<double> values(static_cast<size_t>(length));
    context.world.recv(values.data(), static_cast<int64_t>(values.size()), from,
                       message_tags::kTimelineEvents, {static_cast<int64_t>(values.size())});
    for (const auto& event : pipeline::decode_events(values)) all.push_back(event);
  }
  return all;
}

// The full tensors of one step on world rank 0 (empty elsewhere). On a single rank `grads` and `params`
// point at the trainer's own tensors (no copy: at production widths each is 5.6 GB); otherwise at the
// tensors gathered from the shards. Not copyable: the pointers may point into it.
struct StepOutputs {
  StepRecord record;
  ParamTensors gathered_grads, gathered_params;
  const ParamTensors* grads = &gathered_grads;
  const ParamTensors* params = &gathered_params;
  AdamWState moments;

  StepOutputs() = default;
  StepOutputs(const StepOutputs&) = delete;
  StepOutputs& operator=(const StepOutputs&) = delete;
};

// A low-precision step kept for the envelope until the FP64 run reaches it: copies.
struct KeptStep {
  StepRecord record;
  ParamTensors grads, params;
};

// A golden file never holds a non-finite value, and a run that has diverged is no reference: the run
// stops (InputError, exit status 2) at the first non-finite loss, gradient norm or learning rate, which
// every rank holds, and, where world rank 0 has gathered them for the golden file, at the first
// non-finite value of a token loss, gradient, parameter or moment, naming the step and the tensor.
// Thrown before the step is written, so the golden file is never committed.
void require_finite(const StepOutputs& step, const ParamTable& table, Precision precision) {
  const StepRecord& r = step.record;
  const std::string where = "step " + std::to_string(r.step) + " (" + option_name(precision) + "): ";
  const auto refuse = [&](const std::string& what, double value) {
    const std::string text = std::isnan(value) ? "NaN" : value > 0 ? "+inf" : "-inf";
    throw InputError(where + what + " is " + text +
                     " (the run diverged; lower optim.lr or model.init_std); no golden file is written");
  };
  if (!std::isfinite(r.loss)) refuse("the loss", r.loss);
  if (!std::isfinite(r.grad_norm)) refuse("the gradient norm", r.grad_norm);
  if (!std::isfinite(r.lr)) refuse("the learning rate", r.lr);
  for (double v : r.token_losses) {
    if (!std::isfinite(v)) refuse("a token loss", v);
  }
  const auto check = [&](const ParamTensors& tensors, const std::string& kind) {
    for (size_t id = 0; id < tensors.tensors.size(); ++id) {
      for (double v : tensors.tensors[id]) {
        if (!std::isfinite(v)) refuse(kind + " " + table[static_cast<int>(id)].name, v);
      }
    }
  };
  check(*step.grads, "the gradient of");
  check(*step.params, "the updated parameter");
  check(step.moments.exp_avg, "the AdamW exp_avg of");
  check(step.moments.exp_avg_sq, "the AdamW exp_avg_sq of");
}

// Trains every step of `run` with `config` (which may differ from run.config in precision only) and
// calls `on_step` after each on every rank. `last_pass`: no later call trains from `run` again, so
// once the trainer holds its copy the run's full initial weights (and a checkpoint's state) are
// released: at production widths each copy is 5.6 GB.
void run_steps(PreparedRun& run, const Config& config, const RunOptions& options, int local_rank, Grid& grid,
               std::ostream& out, bool last_pass, const std::function<void(const StepOutputs&)>& on_step) {
  const ParallelContext context = context_of(grid);
  const bool writer_rank = grid.global_rank() == 0;
  const bool outputs = !options.golden_path.empty();
  auto backend = make_backend(options.backend, backend_options(config), local_rank);
  Trainer trainer(config, run.initial_params, *backend, context);
  const ParamTable table(config.model);
  if (run.resumed) {
    trainer.restore(run.resumed->step, run.resumed->params, run.resumed->exp_avg, run.resumed->exp_avg_sq);
  }
  if (last_pass) {
    run.initial_params = ParamTensors{};
    if (run.resumed) run.resumed->params = run.resumed->exp_avg = run.resumed->exp_avg_sq = ParamTensors{};
  }
  // Moments nobody reads after the last update are not kept (a one-step run never holds them).
  if (options.checkpoint.directory.empty() && !options.golden.save_optimizer_state)
    trainer.drop_final_moments();
  const auto steps = static_cast<int64_t>(run.batches.size());
  const int64_t first_step = first_update(run);
  std::unique_ptr<RunRecorder> recorder;
  if (!options.checkpoint.directory.empty()) {
    recorder = std::make_unique<RunRecorder>(options.checkpoint, config, context,
                                             static_cast<int64_t>(run.windows.size()), run.data_fingerprint,
                                             first_step, steps);
  }
  const auto start = std::chrono::steady_clock::now();
  int64_t tokens_done = 0;
  std::vector<pipeline::TimelineEvent> timeline;
  for (int64_t s = first_step; s <= steps; ++s) {
    const GlobalBatch& batch = batch_of_update(run, s);
    const auto step_start = std::chrono::steady_clock::now();
    const AttentionTileCount tiles_before = backend->attention_tiles();
    StepOutputs step;
    step.record = trainer.step(batch, outputs);
    const double step_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
    if (options.trace || !options.timeline_svg.empty()) timeline = gather_timeline(trainer, context);
    if (outputs && context.world.size() == 1) {
      step.grads = &step.record.grads;
      step.params = &trainer.params();
      if (options.golden.save_optimizer_state) step.moments = trainer.optimizer_moments();
    } else if (outputs) {
      context.set_phase(step.record.step, -1, "output");
      step.gathered_grads = gather_full_tensors(trainer.plan(), context, step.record.grads);
      step.gathered_params = gather_full_tensors(trainer.plan(), context, trainer.params());
      if (options.golden.save_optimizer_state) {
        const AdamWState local = trainer.optimizer_moments();
        step.moments.exp_avg = gather_full_tensors(trainer.plan(), context, local.exp_avg);
        step.moments.exp_avg_sq = gather_full_tensors(trainer.plan(), context, local.exp_avg_sq);
      }
    }
    require_finite(step, table, config.precision);
    on_step(step);
    if (recorder) recorder->after_step(trainer, batch, step.record, out);
    tokens_done += real_tokens(batch);
    if (!writer_rank) continue;
    const StepRecord& record = step.record;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // The share of this rank's attention tile pairs the masks left empty in this step (forward passes).
    const AttentionTileCount tiles_after = backend->attention_tiles();
    const int64_t computed = tiles_after.computed - tiles_before.computed,
                  skipped = tiles_after.skipped - tiles_before.skipped;
    const double skipped_share = computed + skipped > 0 ? 100.0 * static_cast<double>(skipped) /
                                                              static_cast<double>(computed + skipped)
                                                        : 0.0;
    char line[320];
    std::snprintf(line, sizeof line,
                  "step %lld/%lld | %s | loss %.6f | loss tokens %lld | grad norm %.4e | lr %.4e | %.3f s | "
                  "%.0f tok/s | attention tiles %.1f%% skipped | ETA %s",
                  static_cast<long long>(record.step), static_cast<long long>(steps),
                  option_name(config.precision).c_str(), record.loss,
                  static_cast<long long>(record.num_loss_tokens), record.grad_norm, record.lr, step_seconds,
                  static_cast<double>(tokens_done) / elapsed, skipped_share,
                  format_duration(elapsed / static_cast<double>(record.step - first_step + 1) *
                                  static_cast<double>(steps - record.step))
                      .c_str());
    out << line << std::endl;
    if (options.trace) {
      const int num_stages = static_cast<int>(grid.layout().pp);
      out << pipeline::render_timeline_text(timeline, num_stages);
      // The measured bubble of the step, to set next to the schedule's formula.
      if (num_stages > 1) out << pipeline::format_idle(pipeline::measure_idle(timeline, num_stages));
      out << std::flush;
    }
  }
  if (recorder) recorder->finish();
  if (options.trace) {  // every rank: the attention tile pairs its forward passes computed and skipped
    const AttentionTileCount tiles = backend->attention_tiles();
    out << "[rank " << grid.global_rank() << "] attention tile pairs: computed " << tiles.computed
        << ", skipped " << tiles.skipped << std::endl;
  }
  if (writer_rank && !options.timeline_svg.empty()) {
    write_text_file_atomically(options.timeline_svg,
                               pipeline::render_timeline_svg(timeline, static_cast<int>(grid.layout().pp)));
    out << "wrote " << options.timeline_svg << std::endl;
  }
}

}  // namespace

void execute_run(PreparedRun run, const RunOptions& options, Grid& grid, std::ostream& out) {
  const bool writer_rank = grid.global_rank() == 0;
  // The CPU kernels' threads share the machine's cores with the job's other ranks on it (collective).
  cpu::share_cores(node_local_ranks().size);
  // Which GPU this rank drives with --backend cuda (collective, so every rank asks here, once).
  const int local_rank = options.backend == BackendKind::kCpu ? 0 : node_local_rank();
  const std::string& checkpoint_dir = options.checkpoint.directory;
  if (!checkpoint_dir.empty()) std::filesystem::create_directories(checkpoint_dir);
  if (options.checkpoint.fail_at) {
    arm_process_fault(*options.checkpoint.fail_at, grid.global_rank(),
                      checkpoint_dir.empty()
                          ? ""
                          : (std::filesystem::path(checkpoint_dir) / ledger::kFaultsFileName).string());
  }
  if (writer_rank) {
    for (const std::string& refusal : run.refused_checkpoints)
      out << "skipped checkpoint: " << refusal << std::endl;
    if (run.resumed) {
      out << "resumed from " << run.resumed_from << " (after update " << run.resumed->step
          << ", next sample index " << run.resumed->consumed_samples << "; "
          << "loaded and verified " << throughput_text(directory_bytes(run.resumed_from), run.load_seconds)
          << ")" << std::endl;
      if (run.resumed->data_fingerprint.empty()) {
        out << "note: " << run.resumed_from
            << " records no data fingerprint (written before it was recorded): the data is not verified"
            << std::endl;
      }
    }
  }
  std::unique_ptr<TracePrinter> trace;
  if (options.trace) {
    trace = std::make_unique<TracePrinter>(out, grid);
    grid.set_observer(trace->observer());
  }
  // With --envelope the low-precision run goes first; the golden values are the FP64 run's.
  std::vector<KeptStep> low_precision;
  Config golden_config = run.config;
  if (options.envelope) {
    run_steps(run, run.config, options, local_rank, grid, out, false, [&](const StepOutputs& step) {
      if (writer_rank) low_precision.push_back(KeptStep{step.record, *step.grads, *step.params});
    });
    golden_config.precision = Precision::kFp64;
  }
  const ParamTable table(golden_config.model);
  std::unique_ptr<GoldenWriter> golden;
  if (!options.golden_path.empty() && writer_rank) {
    golden = std::make_unique<GoldenWriter>(options.golden_path, golden_config, table, run.batches,
                                            run.initial_params, options.golden,
                                            backend_description(options.backend, local_rank));
  }
  run_steps(run, golden_config, options, local_rank, grid, out, true, [&](const StepOutputs& step) {
    if (!golden) return;
    golden->write_step(step.record, *step.grads, *step.params, &step.moments);
    if (options.envelope) {
      const KeptStep& low = low_precision[static_cast<size_t>(step.record.step - 1)];
      golden->write_envelope_step(low.record, low.grads, low.params, step.record, *step.grads, *step.params);
    }
  });
  if (trace) {
    grid.set_observer(nullptr);
    trace->print_summary(out);
  }
  if (golden) {
    if (options.envelope) golden->write_tolerance_model(run.config);
    golden->commit();
    out << "wrote " << options.golden_path << std::endl;
  }
}

}  // namespace touchstone
