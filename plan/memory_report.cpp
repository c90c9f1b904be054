// The printed report of `touchstone plan memory`.
#include <algorithm>
#include <cstdio>
#include <ostream>

#include "plan/format.h"
#include "plan/memory_plan.h"

namespace touchstone::plan {

namespace {

// Decimal units: GB for real models, MB or kB for the small configs the trainer runs.
struct Unit {
  const char* name;
  double scale;
  std::string operator()(double bytes) const { return fixed(bytes / scale, 2); }
};

Unit unit_for(double largest_bytes) {
  if (largest_bytes >= 1e9) return {"GB", 1e9};
  if (largest_bytes >= 1e6) return {"MB", 1e6};
  return {"kB", 1e3};
}

// Parameter counts: exact below ten million, scientific above.
std::string count(double value) { return value < 1e7 ? grouped(value) : scientific(value, 5); }

std::string rtrim(std::string text) {
  while (!text.empty() && (text.back() == ' ' || text.back() == '\n')) text.pop_back();
  return text + "\n";
}

std::string activation_description(const MemoryPlanInput& in) {
  switch (in.activations) {
    case ActivationModel::kNone:
      return "not computed (no layer shapes)";
    case ActivationModel::kMegatron16Bit:
      return "16-bit, Korthikanti et al. 2022, recomputation " + to_string(in.recompute) +
             (in.sequence_parallel ? ", sequence parallel" : "") +
             (in.flash_attention ? ", flash attention" : "");
    case ActivationModel::kTouchstoneFp64:
      return "Touchstone's FP64 trainer, replayed allocation by allocation" +
             std::string(in.sequence_parallel ? ", sequence parallel" : "");
  }
  return "";
}

// "  -60.63  DOES NOT FIT" or "   21.41  fits"; empty without --gpu-memory-gb.
std::string fit_column(const MemoryPlanInput& in, double bytes) {
  if (in.gpu_memory_gb <= 0) return "";
  const double free_gb = in.gpu_memory_gb - bytes / 1e9;
  char text[64];
  std::snprintf(text, sizeof text, "%8s  %-12s", fixed(free_gb, 2).c_str(),
                free_gb < 0 ? "DOES NOT FIT" : "fits");
  return text;
}

std::string fit_header(const MemoryPlanInput& in) {
  if (in.gpu_memory_gb <= 0) return "";
  char text[64];
  std::snprintf(text, sizeof text, "%8s  %-12s", "free",
                ("of " + fixed(in.gpu_memory_gb, 0) + " GB").c_str());
  return text;
}

void print_state_table(const MemoryPlanInput& in, const std::vector<LayoutPlan>& plans, const Unit& u,
                       std::ostream& out) {
  out << "\nModel state per GPU of the largest stage (" << u.name << " = " << scientific(u.scale)
      << " bytes; before activations, communication buffers and uneven stages):\n";
  char line[256];
  std::snprintf(line, sizeof line, "%6s %12s %9s %9s %9s %9s %9s %s\n", "DP", "bytes/param", "weights",
                "grads", "master", "moments", "total", fit_header(in).c_str());
  out << rtrim(line);
  for (const LayoutPlan& plan : plans) {
    const ModelState& s = plan.largest().state;
    std::snprintf(line, sizeof line, "%6lld %12s %9s %9s %9s %9s %9s %s\n", static_cast<long long>(plan.dp),
                  fixed(s.bytes_per_param(), 3).c_str(), u(s.weights).c_str(), u(s.grads).c_str(),
                  u(s.master_weights + s.master_grads).c_str(), u(s.moments).c_str(), u(s.total()).c_str(),
                  fit_column(in, s.total()).c_str());
    out << rtrim(line);
  }
  for (size_t i = 1; i < plans.size(); ++i) {
    const double saved = plans[0].largest().state.total() - plans[i].largest().state.total();
    out << "DP " << plans[i].dp << (saved >= 0 ? " leaves " : " takes ") << u(std::abs(saved)) << " "
        << u.name << " per GPU " << (saved >= 0 ? "more" : "less") << " room than DP " << plans[0].dp
        << ".\n";
  }
}

void print_stage_table(const MemoryPlanInput& in, const LayoutPlan& plan, const Unit& u, std::ostream& out) {
  out << "\nDP " << plan.dp << ": per GPU of each stage, " << u.name;
  if (plan.micro_batches > 0) out << " (" << plan.micro_batches << " micro-batches per replica per update)";
  out << ":\n";
  char line[512];
  std::snprintf(line, sizeof line, "%6s %7s %11s %9s %7s %12s %9s %9s %s  %s\n", "stage", "layers", "params",
                "state", "flight", "activations", "peak", "total", fit_header(in).c_str(), "peak at");
  out << rtrim(line);
  for (const StageMemory& s : plan.stages) {
    std::snprintf(line, sizeof line, "%6lld %7lld %11s %9s %7lld %12s %9s %9s %s  %s\n",
                  static_cast<long long>(s.stage), static_cast<long long>(s.layers),
                  count(s.state.params).c_str(), u(s.state.total()).c_str(),
                  static_cast<long long>(s.in_flight), u(s.activations).c_str(), u(s.peak.bytes).c_str(),
                  u(s.total()).c_str(), fit_column(in, s.total()).c_str(), s.peak.name.c_str());
    out << rtrim(line);
  }
}

void print_breakdown(const StageMemory& s, std::ostream& out) {
  out << "\nStage " << s.stage << ": stored per micro-batch, layer " << s.first_layer
      << " (bytes; with virtual stages, of the stage's first chunk):\n";
  for (const NamedBytes& t : s.stored_per_layer) out << "  " << t.name << ": " << grouped(t.bytes) << "\n";
  out << "Stage output and head (bytes):\n";
  for (const NamedBytes& t : s.stored_head) out << "  " << t.name << ": " << grouped(t.bytes) << "\n";
  out << "Peak: model state " << grouped(s.state.total()) << " + " << grouped(s.peak.bytes) << " at "
      << s.peak.name << " = " << grouped(s.total()) << " bytes\n";
}

}  // namespace

void print_memory_plan(const MemoryPlanInput& in, std::ostream& out) {
  validate(in);
  check_fp64_replay_size(in);
  std::vector<LayoutPlan> plans;
  for (int64_t dp : in.dps) plans.push_back(plan_layout(in, dp));
  const double params = in.total_params > 0 ? in.total_params : total_params(in.shape);
  out << "Memory plan: " << count(params) << " parameters" << (in.total_params > 0 ? " (given)" : "")
      << ", TP " << in.tp << (in.cp > 1 ? " x CP " + std::to_string(in.cp) : "") << " x PP " << in.pp
      << (in.virtual_stages > 1
              ? " (" + std::to_string(in.virtual_stages) + " virtual stages each, interleaved 1F1B)"
              : "")
      << ", recipe " << in.recipe.name << ", distributed optimizer "
      << (in.distributed_optimizer ? "on" : "off");
  if (in.zero_stage >= 2) out << ", ZeRO stage " << in.zero_stage;
  out << "\n";
  if (in.cp > 1) {
    out << "  context parallel: each GPU holds T / " << in.cp << " positions of every sequence ("
        << option_name(in.cp_comm) << " attention); the optimizer shards over DP x CP (" << in.cp
        << " x each DP below)\n";
  }
  out << "  recipe " << in.recipe.name << ": " << in.recipe.description << "\n";
  out << "  bytes per parameter: " << bytes_per_param_formula(in.recipe, in.distributed_optimizer);
  if (in.zero_stage >= 2) {
    out << " at stage 1; stage " << in.zero_stage << " also shards the "
        << (in.zero_stage == 2 ? "gradients" : "gradients and weights") << " over DP";
  } else if (in.distributed_optimizer) {
    out << " (master weights, master grads and moments sharded over DP; "
        << bytes_per_param_formula(in.recipe, false) << " without)";
  }
  out << "\n";
  if (in.moments_dropped) {
    out << "  train.steps = 1: the update forms AdamW's moments piece by piece and keeps none (a run that "
           "saves a checkpoint or the optimizer state in its golden file holds them as well)\n";
  }
  if (in.total_params > 0) {
    out << "  parameters per GPU: " << count(plans[0].stages[0].state.params) << " = " << count(params)
        << " / (TP " << in.tp << " x PP " << in.pp << "), every stage alike\n";
  } else {
    out << "  parameters per GPU: " << count(plans[0].largest().state.params) << " on the largest stage\n";
  }
  out << "  activations: " << activation_description(in) << "\n";
  double largest = 0;
  for (const LayoutPlan& plan : plans) largest = std::max(largest, plan.largest().total());
  const Unit unit = unit_for(largest);
  print_state_table(in, plans, unit, out);
  if (in.shape.known()) {
    for (const LayoutPlan& plan : plans) print_stage_table(in, plan, unit, out);
  } else {
    out << "Per-stage activations need the layer shapes (layers, hidden size, heads, ffn size, "
           "vocabulary, sequence length).\n";
  }
  if (in.gpu_memory_gb <= 0) return;
  for (const LayoutPlan& plan : plans) {
    for (const StageMemory& s : plan.stages) {
      if (s.total() / 1e9 <= in.gpu_memory_gb) continue;
      out << "DOES NOT FIT: DP " << plan.dp
          << (in.shape.known() ? ", stage " + std::to_string(s.stage) : ", every stage") << " needs "
          << gigabytes(s.total()) << " GB of " << fixed(in.gpu_memory_gb, 0) << " GB\n";
      if (!in.shape.known()) break;
    }
  }
}

void print_memory_breakdown(const MemoryPlanInput& in, std::ostream& out) {
  validate(in);
  check_fp64_replay_size(in);
  for (const StageMemory& s : plan_layout(in, in.dps.front()).stages) print_breakdown(s, out);
}

}  // namespace touchstone::plan
