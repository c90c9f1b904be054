// `touchstone plan memory`: per-GPU memory of every pipeline stage of a TP x PP x DP layout, for one
// or several DP sizes. Model state comes from the precision recipe, activations from the chosen
// activation model (the published 16-bit formulas, or Touchstone's own FP64 trainer, whose tensors are
// enumerated in fp64_trainer_memory.h). The single-process prediction that the unit test compares with
// a measured peak goes through the same stage function with TP = PP = DP = 1.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "common/options.h"
#include "plan/memory_model.h"

namespace touchstone::plan {

enum class ActivationModel {
  kNone,            // no layer shapes given: model state only
  kMegatron16Bit,   // Korthikanti et al. 2022, 16-bit activations
  kTouchstoneFp64,  // Touchstone's FP64 trainer, tensor by tensor
};

struct MemoryPlanInput {
  ModelShape shape;         // shape.known() false: only total_params is known
  double total_params = 0;  // > 0: the parameter count to plan with (overrides the shape's own count)
  Recipe recipe;
  bool distributed_optimizer = false;
  // ZeRO stage (docs/parallelism.md): 1 is the distributed optimizer; 2 also shards the gradients over
  // dp, 3 also the weights. The FP64 trainer's replay follows each (kTouchstoneFp64).
  int64_t zero_stage = 0;
  int64_t tp = 1, pp = 1;
  std::vector<int64_t> dps{1};
  // Context parallelism (docs/parallelism.md): every window's positions split over cp ranks, so each
  // holds the activations of T / cp of them; the gradients are reduced and ZeRO shards the optimizer
  // over dp x cp. cp_comm: how the attention gathers the other ranks' keys and values.
  int64_t cp = 1;
  CpComm cp_comm = CpComm::kP2p;
  // Interleaved 1F1B (parallel.virtual_stages): each stage holds v model chunks, chunk c of stage s being
  // virtual stage c x pp + s (Megatron-LM's assignment).
  int64_t virtual_stages = 1;
  // The layers of each virtual stage, pp x virtual_stages entries; empty: layers / (pp x v) on each.
  std::vector<int64_t> stage_layers;
  // The FP64 trainer's pipeline schedule (a Touchstone config's parallel.schedule).
  PipelineSchedule schedule = PipelineSchedule::kOneForwardOneBackward;
  int64_t micro_batch = 1;   // b, sequences per micro-batch
  int64_t global_batch = 0;  // sequences per update; 0: unknown (1F1B then holds pp - stage)
  bool sequence_parallel = false;
  // The FP64 trainer with model.hidden_dropout > 0: it keeps each mask from the forward to the backward
  // (kTouchstoneFp64 activations only; the attention dropout mask is drawn inside the kernels).
  bool hidden_dropout = false;
  // The FP64 trainer's CPU kernel threads, each with its attention tile scratch (kTouchstoneFp64 only):
  // those of the process that plans, unless set.
  int64_t kernel_threads = 1;
  // The FP64 trainer runs one update and saves no optimizer state (no checkpoint, no moments in the
  // golden file): it never holds AdamW's moments (each piece's are formed in scratch) and lays out no
  // arena block after its only step (oracle/train_step.h drop_final_moments). A Touchstone config with
  // train.steps = 1 plans so; a run that saves the state holds the moments as well.
  bool moments_dropped = false;
  Recompute recompute = Recompute::kNone;
  bool flash_attention = false;  // 16-bit model: attention scores never stored
  ActivationModel activations = ActivationModel::kNone;
  // A Touchstone config's precision (--config).
  Precision trainer_precision = Precision::kFp64;
  int64_t vocab_multiple = 1;  // pad the vocabulary to a multiple of this x tp (Megatron: 128)
  double gpu_memory_gb = 0;    // > 0: flag stages that do not fit
};

// Schedule steps a plan replays (one per chunk and micro-batch on every stage it replays, plus one per
// layer): at most 2^24, a few seconds, so that no plan runs for hours.
inline constexpr int64_t kMaxReplaySteps = int64_t{1} << 24;

// The FP64 trainer's replay visits the buffers it has tallied at each allocation, so its time grows
// with the square of the layer-micro-batches a stage replays: its layers x the micro-batches per
// replica (m unknown counts as pp). The largest stage's count, for one DP size.
int64_t fp64_replayed_layer_micro_batches(const MemoryPlanInput& input, int64_t dp);
// At most 1024 in one plan (about a second; 2048 took 6 s, 8192 a minute and a half), and 1024^2 for
// their squares summed over --ranks.
inline constexpr int64_t kMaxFp64ReplayedLayerMicroBatches = 1024;

// Throws InputError when the FP64 trainer's replay of `input` would pass that bound (the planner's
// commands; the memory check before a run replays whatever its run is).
void check_fp64_replay_size(const MemoryPlanInput& input);

// Throws InputError for an impossible layout (PP larger than the layers, DP not dividing the batch, a
// head count TP does not divide, ...), saying what each value means (the tensor-parallel size, ...).
void validate(const MemoryPlanInput& input);

// Bytes with the name of what they are, or of the moment they are live.
struct NamedBytes {
  std::string name;
  double bytes = 0;
};

struct StageMemory {
  int64_t stage = 0, first_layer = 0, layers = 0;
  bool first = false, last = false;
  ModelState state;        // weights, grads, master weights, optimizer moments
  int64_t in_flight = 0;   // micro-batches stored at once (FP64: under its schedule; else 1F1B)
  double activations = 0;  // bytes stored for the backward pass, all in-flight micro-batches
  NamedBytes peak;         // the step's largest live bytes beyond the model state, and when
  std::vector<NamedBytes> stored_per_layer;  // FP64 trainer: one layer's stored tensors (breakdown)
  std::vector<NamedBytes> stored_head;       // FP64 trainer: the stage output and head tensors
  double total() const { return state.total() + peak.bytes; }
};

struct LayoutPlan {
  int64_t dp = 1;
  int64_t micro_batches = 0;  // per replica per update; 0 when the global batch is unknown
  std::vector<StageMemory> stages;
  const StageMemory& largest() const;
};

// One GPU of every stage (tensor-parallel rank 0; the others hold the same amounts).
LayoutPlan plan_layout(const MemoryPlanInput& input, int64_t dp);

// The layer counts of the pp x v virtual stages: input.stage_layers, or layers / (pp x v) each.
std::vector<int64_t> virtual_stage_layer_counts(const MemoryPlanInput& input);

// The whole report of `touchstone plan memory`.
void print_memory_plan(const MemoryPlanInput& input, std::ostream& out);
// FP64 trainer: the stored tensors of each stage and where its peak is (first DP size only).
void print_memory_breakdown(const MemoryPlanInput& input, std::ostream& out);

}  // namespace touchstone::plan
