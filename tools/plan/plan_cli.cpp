// Options and dispatch of `touchstone plan memory | scaling | calendar`.
#include "tools/plan/plan_cli.h"

#include <CLI/CLI.hpp>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <ostream>
#include <sstream>

#include "common/config.h"
#include "common/errors.h"
#include "common/options.h"
#include "common/text_output.h"
#include "plan/calendar_plan.h"
#include "plan/checked.h"
#include "plan/format.h"
#include "plan/fp64_trainer_memory.h"
#include "plan/memory_plan.h"
#include "plan/rank_memory.h"
#include "plan/scaling_plan.h"
#include "tools/cli/flag_values.h"
#include "tools/cli/run_flags.h"

namespace touchstone::plan {

namespace {

struct MemoryOptions {
  std::string config_path, params, recipe = "bf16", activations = "auto", recompute = "none", cp_comm = "p2p";
  std::vector<std::string> overrides;
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0, seq = 0;
  int64_t zero_stage = 0;
  bool tied = false, distributed_optimizer = false, sequence_parallel = false, flash_attention = false;
  bool breakdown = false, ranks = false;
  int64_t tp = 1, pp = 1, cp = 1, virtual_stages = 1, micro_batch = 1, global_batch = 0, vocab_multiple = 1;
  std::vector<int64_t> dps{1}, stage_layers;
  double gpu_memory_gb = 0;
};

struct ScalingOptions {
  std::string csv_path, svg_path;
  int64_t virtual_stages = 2;
};

struct CalendarOptions {
  std::string tokens, throughput, kind, efficiency, tokens_done = "0", start_date;
};

// --start-date: YYYY-MM-DD.
std::chrono::sys_days parse_start_date(const std::string& text) {
  int year = 0;
  unsigned month = 0, day = 0;
  char tail = 0;
  // Digits where the form has them: sscanf alone would also read "-001-01-01" or " 202-01-01".
  const auto digit = [&](size_t i) { return std::isdigit(static_cast<unsigned char>(text[i])) != 0; };
  const bool shaped = text.size() == 10 && text[4] == '-' && text[7] == '-' && digit(0) && digit(1) &&
                      digit(2) && digit(3) && digit(5) && digit(6) && digit(8) && digit(9);
  if (!shaped || std::sscanf(text.c_str(), "%4d-%2u-%2u%c", &year, &month, &day, &tail) != 3) {
    throw InputError("--start-date: \"" + text + "\" is not a date of the form YYYY-MM-DD");
  }
  const std::chrono::year_month_day date{std::chrono::year{year}, std::chrono::month{month},
                                         std::chrono::day{day}};
  if (!date.ok()) throw InputError("--start-date: \"" + text + "\" is not a valid date");
  return std::chrono::sys_days{date};
}

ThroughputKind parse_throughput_kind(const std::string& name) {
  if (name == "compute") return ThroughputKind::kCompute;
  if (name == "wall-clock") return ThroughputKind::kWallClock;
  throw InputError("--throughput-kind: unknown value \"" + name + "\" (compute or wall-clock)");
}

// --calendar-efficiency: "0.9" or "90%".
double parse_efficiency(const std::string& text) {
  const bool percent_sign = !text.empty() && text.back() == '%';
  const double value =
      parse_quantity(percent_sign ? text.substr(0, text.size() - 1) : text, "--calendar-efficiency");
  return percent_sign ? value / 100.0 : value;
}

// The calendar's flags parsed into a CalendarInput (each parse error names its flag); plan_calendar
// checks the values and words its refusals by meaning ("tokens done: ...").
CalendarInput calendar_input(const CalendarOptions& c, bool efficiency_given) {
  CalendarInput in;
  in.tokens = parse_quantity(c.tokens, "--tokens");
  in.tokens_done = parse_quantity(c.tokens_done, "--tokens-done");
  in.throughput = parse_quantity(c.throughput, "--throughput");
  in.kind = parse_throughput_kind(c.kind);
  if (efficiency_given) in.calendar_efficiency = parse_efficiency(c.efficiency);
  if (!c.start_date.empty()) in.start_date = parse_start_date(c.start_date);
  return in;
}

// --recompute: the name of an activation recomputation.
Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::kNone;
  if (name == "selective") return Recompute::kSelective;
  if (name == "full") return Recompute::kFull;
  throw InputError("--recompute: unknown value \"" + name + "\" (none, selective or full)");
}

// --cp-comm: how context-parallel attention moves the keys and values.
CpComm parse_cp_comm(const std::string& name) {
  if (const std::optional<CpComm> comm = find_option<CpComm>(name)) return *comm;
  throw InputError("--cp-comm: unknown value \"" + name + "\" (" + option_choices<CpComm>() + ")");
}

// --activations, but "auto" (resolved from the recipe and the shape by the caller).
ActivationModel parse_activation_model(const std::string& name) {
  if (name == "none") return ActivationModel::kNone;
  if (name == "megatron-16bit") return ActivationModel::kMegatron16Bit;
  if (name == "touchstone-fp64") return ActivationModel::kTouchstoneFp64;
  throw InputError("--activations: unknown model \"" + name + "\" (megatron-16bit, touchstone-fp64 or none)");
}

// The memory plan's flags one by one, checked here so that each error names its flag; validate()
// (plan/memory_plan.h) refuses the same values in its own words, and checks how they fit together
// (divisibility, stages, activation models) saying what each value means.
void check_memory_flags(const MemoryPlanInput& in) {
  // The trainer's limits (common/config.h): far past any cluster, and small enough that no product of
  // the plan overflows.
  const auto process_size = [](const char* flag, int64_t value) {
    checked_range(value, 1, kMaxProcesses, flag);
  };
  const auto count = [](const char* flag, int64_t value) { checked_range(value, 1, kMaxCount, flag); };
  process_size("--tp", in.tp);
  process_size("--pp", in.pp);
  process_size("--cp", in.cp);
  process_size("--virtual-stages", in.virtual_stages);
  if (in.dps.empty()) throw InputError("--dp: give at least one data-parallel size");
  for (int64_t dp : in.dps) {
    process_size("--dp", dp);
    checked_product({in.tp, in.cp, in.pp, dp}, kMaxProcesses, "--tp x --cp x --pp x --dp");
  }
  checked_product({in.pp, in.virtual_stages}, kMaxProcesses, "--pp x --virtual-stages");
  count("--micro-batch", in.micro_batch);
  for (int64_t layers : in.stage_layers) count("--stage-layers", layers);
  count("--vocab-multiple", in.vocab_multiple);
  const bool shaped = in.shape.known();
  if (!shaped && !(in.total_params > 0))
    throw InputError(
        "give --params or the model's shape (--layers, --hidden, --heads, --ffn, --vocab), or --config");
  if (!shaped && in.activations != ActivationModel::kNone) {
    throw InputError(
        "--activations needs the model's shape (--layers, --hidden, --heads, --ffn, --vocab, --seq-length)");
  }
  if (!shaped && !in.stage_layers.empty()) throw InputError("--stage-layers needs --layers");
  if (shaped) {
    const ModelShape& m = in.shape;
    count("--kv-heads", m.kv_heads);
    count("--ffn", m.ffn);
    count("--vocab", m.vocab);
    if (in.activations != ActivationModel::kNone && m.seq < 1)
      throw InputError("--seq-length: must be >= 1 to compute activations");
  }
}

class PlanCommandImpl final : public PlanCommand {
 public:
  explicit PlanCommandImpl(CLI::App& app);
  bool parsed() const override { return plan_->parsed(); }
  int run(std::ostream& out) const override;

 private:
  void add_memory_options();
  bool has_config() const { return !m_.config_path.empty() || !m_.overrides.empty(); }
  Config config() const;
  MemoryPlanInput memory_input() const;
  int run_memory(std::ostream& out) const;
  int run_scaling(std::ostream& out) const;
  int run_calendar(std::ostream& out) const;
  bool given(const char* name) const { return memory_->count(name) > 0; }

  CLI::App* plan_;
  CLI::App* memory_;
  CLI::App* scaling_;
  CLI::App* calendar_;
  MemoryOptions m_;
  ScalingOptions s_;
  CalendarOptions c_;
};

PlanCommandImpl::PlanCommandImpl(CLI::App& app) {
  plan_ = app.add_subcommand("plan", "Plan memory, scaling and calendar time of a large run (no GPU needed)");
  plan_->require_subcommand(1);
  memory_ = plan_->add_subcommand("memory",
                                  "Per-GPU memory of every pipeline stage: model state by precision "
                                  "recipe, activations, peak (docs/planning.md)");
  add_memory_options();

  scaling_ = plan_->add_subcommand("scaling",
                                   "Scaling table (tokens/s, speedup, efficiency, bubble) of measured "
                                   "runs from a CSV, with comparability warnings");
  scaling_->add_option("--csv", s_.csv_path, std::string("Runs, one per row; header: ") + kScalingCsvHeader)
      ->required();
  add_output_option(scaling_, "--svg", s_.svg_path,
                    "Also write a chart of tokens/s and efficiency against GPUs (SVG)");
  scaling_
      ->add_option("--virtual-stages", s_.virtual_stages,
                   "Model chunks per pipeline stage of the interleaved 1F1B bubble column (>= 2)")
      ->capture_default_str();

  calendar_ = plan_->add_subcommand("calendar",
                                    "Pure compute days, calendar days and end date of the remaining "
                                    "tokens");
  calendar_->add_option("--tokens", c_.tokens, "Tokens of the main run (e.g. 10T or 1e13)")->required();
  calendar_->add_option("--throughput", c_.throughput, "Non-padding tokens/s (e.g. 1.6M)")->required();
  calendar_
      ->add_option("--throughput-kind", c_.kind,
                   "compute: measured over training time only; wall-clock: over whole wall-clock time, "
                   "losses included (never discounted again)")
      ->required();
  calendar_->add_option("--calendar-efficiency", c_.efficiency,
                        "Share of wall-clock time spent training, e.g. 0.9 or 90% (compute throughput only)");
  calendar_->add_option("--tokens-done", c_.tokens_done, "Tokens already trained")->capture_default_str();
  calendar_->add_option("--start-date", c_.start_date, "Start, YYYY-MM-DD (00:00 UTC), for the end date");
}

void PlanCommandImpl::add_memory_options() {
  CLI::App* c = memory_;
  c->add_option("--config", m_.config_path,
                "A Touchstone JSON config: shapes, batch and layout from it (fp64)");
  c->add_option("--set", m_.overrides, "Override one config key: --set section.key=value (repeatable)")
      ->allow_extra_args(false);
  c->add_option("--params", m_.params,
                "Total parameters (e.g. 500e9 or 500B); stages then hold equal shares");
  c->add_option("--layers", m_.layers, "Decoder layers");
  c->add_option("--hidden", m_.hidden, "Hidden size h");
  c->add_option("--heads", m_.heads, "Attention heads a");
  c->add_option("--kv-heads", m_.kv_heads, "KV heads (default: --heads)");
  c->add_option("--ffn", m_.ffn, "SwiGLU ffn size");
  c->add_option("--vocab", m_.vocab, "Vocabulary size");
  c->add_option("--seq-length", m_.seq, "Tokens per sequence s");
  c->add_flag("--tied-embeddings", m_.tied, "The output layer is the embedding");
  c->add_option("--tp", m_.tp, "Tensor-parallel size")->capture_default_str();
  c->add_option("--pp", m_.pp, "Pipeline-parallel size")->capture_default_str();
  c->add_option("--cp", m_.cp,
                "Context-parallel size: each sequence split over cp GPUs, the optimizer sharded over DP x CP")
      ->capture_default_str();
  c->add_option("--cp-comm", m_.cp_comm,
                "How context-parallel attention moves keys and values: p2p (a ring) or allgather")
      ->capture_default_str();
  c->add_option("--dp", m_.dps, "Data-parallel size, or several: --dp 1,8,80")
      ->delimiter(',')
      ->allow_extra_args(false)
      ->capture_default_str();
  c->add_option("--virtual-stages", m_.virtual_stages,
                "Model chunks per pipeline stage (interleaved 1F1B; Megatron-LM's virtual pipeline size)")
      ->capture_default_str();
  c->add_option("--stage-layers", m_.stage_layers,
                "Layers of each stage, e.g. 11,13,13,11 (default: equal); with --virtual-stages v, pp x v "
                "entries, one per virtual stage")
      ->delimiter(',')
      ->allow_extra_args(false);
  c->add_option("--micro-batch", m_.micro_batch, "Sequences per micro-batch b")->capture_default_str();
  c->add_option("--global-batch", m_.global_batch, "Sequences per update (for the micro-batch count m)");
  c->add_option("--recipe", m_.recipe, "Precision recipe: bf16, fp16, fp32, fp64")->capture_default_str();
  c->add_flag("--distributed-optimizer", m_.distributed_optimizer,
              "Shard master weights and moments over DP");
  c->add_option("--zero-stage", m_.zero_stage,
                "ZeRO stage: 1 the distributed optimizer, 2 also gradients, 3 also weights sharded over DP")
      ->check(CLI::Range(0, 3));
  c->add_flag("--sequence-parallel", m_.sequence_parallel, "Sequence parallelism (Megatron-LM)");
  c->add_flag("--flash-attention", m_.flash_attention, "16-bit model: attention scores are never stored");
  c->add_option("--recompute", m_.recompute, "Activation recomputation: none, selective, full")
      ->capture_default_str();
  c->add_option("--activations", m_.activations,
                "megatron-16bit, touchstone-fp64, none; auto: touchstone-fp64 for --recipe fp64, else "
                "megatron-16bit (none without shapes)")
      ->capture_default_str();
  c->add_option("--vocab-multiple", m_.vocab_multiple,
                "Pad the vocabulary to a multiple of this x TP (Megatron: 128)")
      ->capture_default_str();
  c->add_option("--gpu-memory-gb", m_.gpu_memory_gb,
                "GPU memory in GB (1e9 bytes): flag stages that do not fit");
  c->add_flag("--breakdown", m_.breakdown,
              "Touchstone FP64 trainer: list stored tensors and the peak moment");
  c->add_flag("--ranks", m_.ranks,
              "Touchstone FP64 trainer, layout from --config / --set: every rank's predicted peak, term "
              "by term, with the communication buffers");
}

Config PlanCommandImpl::config() const {
  Config config = resolve_config_flags(m_.config_path, m_.overrides);
  // The plan is of the layout the config asks for, whatever runs it: only its size is bounded here.
  const int64_t processes = config.parallel.world_size();
  if (processes > kMaxProcesses) {
    throw InputError("config: parallel: tp x cp x pp x dp is more than " + std::to_string(kMaxProcesses) +
                     " processes");
  }
  validate_config(config, static_cast<int>(processes));
  return config;
}

MemoryPlanInput PlanCommandImpl::memory_input() const {
  MemoryPlanInput in;
  const auto recipe_flag = [&] { return naming_flag("--recipe", [&] { return find_recipe(m_.recipe); }); };
  in.recipe = recipe_flag();
  if (has_config()) {
    in = plan_input_from_config(config());
    if (given("--recipe")) in.recipe = recipe_flag();
  }
  // A flag given is checked when read: a value out of range is refused, never read as "not given".
  const auto count_flag = [&](const char* flag, int64_t value, int64_t& into) {
    if (given(flag)) into = checked_range(value, 1, kMaxCount, flag);
  };
  ModelShape& s = in.shape;
  count_flag("--layers", m_.layers, s.layers);
  count_flag("--hidden", m_.hidden, s.hidden);
  count_flag("--heads", m_.heads, s.heads);
  count_flag("--kv-heads", m_.kv_heads, s.kv_heads);
  count_flag("--ffn", m_.ffn, s.ffn);
  count_flag("--vocab", m_.vocab, s.vocab);
  count_flag("--seq-length", m_.seq, s.seq);
  if (given("--tied-embeddings")) s.tied_embeddings = m_.tied;
  if (s.kv_heads == 0) s.kv_heads = s.heads;
  if (s.known() && (s.ffn == 0 || s.vocab == 0)) {
    throw InputError("--ffn and --vocab are needed with --layers, --hidden and --heads");
  }
  if (given("--params")) {
    in.total_params = checked_finite(parse_quantity(m_.params, "--params"), kMaxExactCount, "--params");
    if (!(in.total_params > 0)) throw InputError("--params: must be > 0, got " + m_.params);
  }
  if (given("--tp")) in.tp = m_.tp;
  if (given("--pp")) in.pp = m_.pp;
  if (given("--cp")) in.cp = m_.cp;
  if (given("--cp-comm")) in.cp_comm = parse_cp_comm(m_.cp_comm);
  if (given("--virtual-stages")) in.virtual_stages = m_.virtual_stages;
  if (given("--dp")) in.dps = m_.dps;
  if (given("--stage-layers")) in.stage_layers = m_.stage_layers;
  if (given("--micro-batch")) in.micro_batch = m_.micro_batch;
  count_flag("--global-batch", m_.global_batch, in.global_batch);
  if (given("--distributed-optimizer")) in.distributed_optimizer = true;
  if (given("--zero-stage")) {
    in.zero_stage = m_.zero_stage;
    in.distributed_optimizer = m_.zero_stage >= 1;
  }
  if (given("--sequence-parallel")) in.sequence_parallel = true;
  in.recompute = parse_recompute(m_.recompute);
  in.flash_attention = m_.flash_attention;
  in.vocab_multiple = m_.vocab_multiple;
  if (given("--gpu-memory-gb")) {
    in.gpu_memory_gb = checked_finite(m_.gpu_memory_gb, kMaxExactCount, "--gpu-memory-gb");
    if (!(in.gpu_memory_gb > 0))
      throw InputError("--gpu-memory-gb: must be > 0, got " + fixed(m_.gpu_memory_gb, 2));
  }
  if (m_.activations == "auto") {
    in.activations = !s.known()                 ? ActivationModel::kNone
                     : in.recipe.name == "fp64" ? ActivationModel::kTouchstoneFp64
                                                : ActivationModel::kMegatron16Bit;
  } else {
    in.activations = parse_activation_model(m_.activations);
  }
  check_memory_flags(in);
  return in;
}

int PlanCommandImpl::run_memory(std::ostream& out) const {
  if (m_.ranks) {
    if (!has_config())
      throw InputError("--ranks needs a Touchstone config: --config FILE and/or --set key=value");
    for (const char* option : {"--layers",
                               "--hidden",
                               "--heads",
                               "--kv-heads",
                               "--ffn",
                               "--vocab",
                               "--seq-length",
                               "--tied-embeddings",
                               "--tp",
                               "--pp",
                               "--cp",
                               "--cp-comm",
                               "--virtual-stages",
                               "--dp",
                               "--stage-layers",
                               "--micro-batch",
                               "--global-batch",
                               "--distributed-optimizer",
                               "--sequence-parallel",
                               "--recipe"}) {
      if (given(option)) {
        throw InputError(std::string("--ranks takes the layout and shapes from the config; instead of ") +
                         option + ", use --set (e.g. --set parallel.tp=2)");
      }
    }
  }
  const MemoryPlanInput in = memory_input();
  // The whole report is made before any of it is printed: a refusal of --ranks or --breakdown leaves no
  // partial report.
  std::ostringstream report;
  print_memory_plan(in, report);
  if (m_.ranks) {
    const Config layout = config();
    check_rank_replay_size(layout);
    print_rank_memory(predict_rank_memory(layout), report);
  }
  if (m_.breakdown) {
    if (in.activations != ActivationModel::kTouchstoneFp64) {
      throw InputError("--breakdown lists the tensors of --activations touchstone-fp64 only");
    }
    print_memory_breakdown(in, report);
  }
  out << report.str();
  return 0;
}

int PlanCommandImpl::run_scaling(std::ostream& out) const {
  if (s_.virtual_stages < 2 || s_.virtual_stages > kMaxVirtualStages) {
    throw InputError("--virtual-stages: must lie in [2, " + std::to_string(kMaxVirtualStages) + "], got " +
                     std::to_string(s_.virtual_stages));
  }
  const ScalingTable table = scaling_table(read_scaling_csv(s_.csv_path), s_.virtual_stages);
  if (!s_.svg_path.empty()) check_output_path(s_.svg_path, "--svg");
  print_scaling_table(table, out);
  if (!s_.svg_path.empty()) {
    write_text_file_atomically(s_.svg_path, scaling_chart_svg(table));
    out << "wrote " << s_.svg_path << "\n";
  }
  return 0;
}

int PlanCommandImpl::run_calendar(std::ostream& out) const {
  const CalendarInput in = calendar_input(c_, calendar_->count("--calendar-efficiency") > 0);
  print_calendar(in, plan_calendar(in), out);
  return 0;
}

int PlanCommandImpl::run(std::ostream& out) const {
  if (memory_->parsed()) return run_memory(out);
  if (scaling_->parsed()) return run_scaling(out);
  return run_calendar(out);
}

}  // namespace

std::unique_ptr<PlanCommand> add_plan_commands(CLI::App& app) {
  return std::make_unique<PlanCommandImpl>(app);
}

}  // namespace touchstone::plan
