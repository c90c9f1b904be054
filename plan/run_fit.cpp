// The memory check before a run allocates: closed-form lower bound first, then the planner's per-rank
// replay, both against physical memory shared by the node's processes (or --memory-limit-gb).
#include "plan/run_fit.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/errors.h"
#include "plan/memory_model.h"
#include "plan/rank_memory.h"

namespace touchstone::plan {

namespace {

constexpr double kElement = 8.0;       // every trainer buffer is FP64
constexpr double kTokenFields = 16.0;  // tokens, targets, positions, document ids: int32 each
// Bookkeeping of one parameter tensor beyond its values (its entry in the parameter table and the
// shard plan, its name): a floor, so that a million tiny layers are not taken as free.
constexpr double kPerTensorBookkeeping = 64.0;
constexpr double kTensorsPerLayer = 9.0;  // two norms, qkv, proj, fc1, fc2 ... (model/param_table.h)

ModelShape shape_of(const Config& c) {
  const ModelConfig& m = c.model;
  return ModelShape{m.num_layers,      m.hidden_size, m.num_heads,  m.num_kv_heads,
                    m.ffn_hidden_size, m.vocab_size,  m.seq_length, m.tie_embeddings};
}

double full_weights_bytes(const Config& c) { return total_params(shape_of(c)) * kElement; }

bool single_rank(const Config& c) { return c.parallel.world_size() == 1; }

// What every process holds beside the trainer: every step's global batch (made before the first step),
// at least one packed window, the parameter bookkeeping, and with --envelope the full initial weights
// (PreparedRun), which the FP64 pass starts from again. Without it they are released once the trainer
// holds its copy (oracle/run.cpp), before the first step.
double beside_trainer_bytes(const Config& c, const RunOutputs& outputs) {
  const auto t = static_cast<double>(c.model.seq_length);
  const double batch = static_cast<double>(c.train.global_batch_size) * (8.0 + kTokenFields * t);
  return (outputs.envelope ? full_weights_bytes(c) : 0.0) + static_cast<double>(c.train.steps) * batch +
         kTokenFields * t +
         static_cast<double>(c.model.num_layers) * kTensorsPerLayer * kPerTensorBookkeeping;
}

// What world rank 0 holds for the outputs: one step's full gradients and parameters (and moments), and
// with --envelope every step's low-precision ones until the FP64 run has written them. A single rank
// writes its trainer's own gradients and parameters without a copy (oracle/run.cpp).
double output_bytes(const Config& c, const RunOutputs& outputs) {
  if (!outputs.golden) return 0.0;
  const double copies = (single_rank(c) ? 0.0 : 2.0) + (outputs.save_optimizer_state ? 2.0 : 0.0);
  const double kept = outputs.envelope ? 2.0 * static_cast<double>(c.train.steps) : 0.0;
  return full_weights_bytes(c) * (copies + kept);
}

// A Touchstone config of one step plans without AdamW's moments (MemoryPlanInput::moments_dropped); a
// run that saves them (a checkpoint, or the golden file's optimizer state) holds them as well.
double saved_moments_bytes(const Config& c, const RunOutputs& outputs) {
  const bool saved = outputs.save_optimizer_state || outputs.checkpoints;
  if (c.train.steps != 1 || !saved) return 0.0;
  const auto model_parallel = static_cast<double>(c.parallel.tp * c.parallel.pp);
  return 2.0 * full_weights_bytes(c) / model_parallel;
}

std::string gb(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g GB", bytes / 1e9);
  return text;
}

int processes_on_this_node(int world_size) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    if (const char* value = std::getenv(name)) {
      const int count = std::atoi(value);
      if (count >= 1) return count;
    }
  }
  return std::max(world_size, 1);
}

}  // namespace

MemoryBudget memory_budget(int world_size, double limit_gb) {
  if (!std::isfinite(limit_gb) || limit_gb < 0) {
    throw InputError("a memory limit must be a finite number of GB >= 0 (0: physical memory)");
  }
  if (limit_gb > 0) return MemoryBudget{limit_gb * 1e9, "the memory limit given"};
  const double physical =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  const int processes = processes_on_this_node(world_size);
  return MemoryBudget{physical / processes, "physical memory " + gb(physical) + " / " +
                                                std::to_string(processes) + " process(es) on this node"};
}

double lower_bound_bytes(const Config& c, const RunOutputs& outputs) {
  const ModelShape shape = shape_of(c);
  const auto model_parallel = static_cast<double>(c.parallel.tp * c.parallel.pp);
  const auto dp = static_cast<double>(c.parallel.dp * c.parallel.cp);  // ZeRO shards over dp x cp
  // Weights and gradients of the share, and the AdamW moments at their most sharded (none in a run of
  // one step that saves no optimizer state).
  const bool moments = c.train.steps > 1 || outputs.save_optimizer_state || outputs.checkpoints;
  const double state = total_params(shape) / model_parallel * kElement * (2.0 + (moments ? 2.0 / dp : 0.0));
  // Of the stored activations only one layer's attention log-sum-exp [b, heads, T]: the attention
  // kernels keep no [T, T] probabilities (they recompute them per tile), and the replay of
  // planned_bytes counts the rest.
  const double heads = static_cast<double>(c.model.num_heads) / static_cast<double>(c.parallel.tp);
  const auto t = static_cast<double>(c.model.seq_length / c.parallel.cp);  // this rank's positions
  const double lse = static_cast<double>(c.train.micro_batch_size) * heads * t * kElement;
  return beside_trainer_bytes(c, outputs) + state + lse + output_bytes(c, outputs);
}

double planned_bytes(const Config& config, const RunOutputs& outputs) {
  Config fp64 = config;  // the trainer's buffers are FP64 at every precision; the planner's recipe is
  fp64.precision = Precision::kFp64;
  const std::vector<RankMemory> ranks = predict_rank_memory(fp64);
  double largest = 0.0;
  for (const RankMemory& rank : ranks) {
    // Before the first step: the full initial weights and the trainer's copy of its share.
    const double construction = full_weights_bytes(config) + rank.state.weights;
    largest = std::max({largest, construction,
                        rank.total() + saved_moments_bytes(config, outputs) +
                            (rank.world_rank == 0 ? output_bytes(config, outputs) : 0.0)});
  }
  return largest + beside_trainer_bytes(config, outputs);
}

void check_run_fits(const Config& config, const RunOutputs& outputs, int world_size,
                    const MemoryBudget& budget) {
  validate_config(config, world_size);
  const auto refuse = [&](const std::string& what, double bytes) {
    throw InputError("config: the run needs " + what + gb(bytes) + " per process but " + gb(budget.bytes) +
                     " is available (" + budget.source +
                     "); shrink the model, batch or train.steps, or give a memory limit");
  };
  const double lower = lower_bound_bytes(config, outputs);
  if (lower > budget.bytes) refuse("at least ", lower);
  const double planned = planned_bytes(config, outputs);
  if (planned > budget.bytes) refuse("", planned);
}

}  // namespace touchstone::plan
