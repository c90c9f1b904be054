// Validation of a layout and the per-stage memory of one GPU.
#include "plan/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "common/errors.h"
#include "plan/fp64_trainer_memory.h"

namespace touchstone::plan {

namespace {

void require(bool condition, const std::string& message) {
  if (!condition) throw InputError(message);
}

std::string str(int64_t value) { return std::to_string(value); }

void validate_shape(const MemoryPlanInput& in) {
  const ModelShape& m = in.shape;
  require(m.kv_heads >= 1 && m.ffn >= 1 && m.vocab >= 1,
          "the KV heads, ffn size and vocabulary must be >= 1");
  require(m.hidden % m.heads == 0,
          "the heads (" + str(m.heads) + ") must divide the hidden size (" + str(m.hidden) + ")");
  require(m.heads % m.kv_heads == 0,
          "the KV heads (" + str(m.kv_heads) + ") must divide the heads (" + str(m.heads) + ")");
  require(m.heads % in.tp == 0 && m.kv_heads % in.tp == 0,
          "the tensor-parallel size (" + str(in.tp) + ") must divide the heads (" + str(m.heads) +
              ") and the KV heads (" + str(m.kv_heads) + "): tensor parallelism splits whole query groups");
  require(m.ffn % in.tp == 0,
          "the tensor-parallel size (" + str(in.tp) + ") must divide the ffn size (" + str(m.ffn) + ")");
}

// The trainer's rule (common/config.cpp): equal stages unless every stage's layers are listed.
void validate_stages(const MemoryPlanInput& in) {
  const int64_t layers = in.shape.layers;
  require(in.pp <= layers, "the pipeline-parallel size " + str(in.pp) + " is larger than the " + str(layers) +
                               " layers: every pipeline stage needs at least one layer");
  if (in.stage_layers.empty()) {
    require(layers % in.pp == 0, "the pipeline-parallel size (" + str(in.pp) + ") must divide the layers (" +
                                     str(layers) + ") unless the layers of each stage are listed");
    return;
  }
  const auto entries = static_cast<int64_t>(in.stage_layers.size());
  require(entries == in.pp, "the stage layer counts list " + str(entries) +
                                " stages but the pipeline-parallel size is " + str(in.pp));
  for (int64_t stage : in.stage_layers) require(stage >= 1, "stage layer counts: every stage needs a layer");
  const int64_t sum = std::accumulate(in.stage_layers.begin(), in.stage_layers.end(), int64_t{0});
  require(sum == layers,
          "the stage layer counts add up to " + str(sum) + " layers, not the model's " + str(layers));
}

void validate_activations(const MemoryPlanInput& in) {
  const ModelShape& m = in.shape;
  const bool fp64 = in.activations == ActivationModel::kTouchstoneFp64;
  if (in.activations != ActivationModel::kNone) {
    require(m.seq >= 1, "the sequence length must be >= 1 to compute activations");
    require(!in.sequence_parallel || (m.seq * in.micro_batch) % in.tp == 0,
            "sequence parallelism: the tensor-parallel size (" + str(in.tp) +
                ") must divide the micro-batch's tokens (" + str(m.seq * in.micro_batch) + ")");
  }
  require(!in.flash_attention || in.activations == ActivationModel::kMegatron16Bit,
          "flash attention applies to the megatron-16bit activation model only (Touchstone's trainer stores "
          "the attention probabilities)");
  if (!fp64) return;
  require(in.trainer_precision == Precision::kFp64,
          "the touchstone-fp64 activation model replays the trainer in precision \"" +
              option_name(Precision::kFp64) + "\", not \"" + option_name(in.trainer_precision) +
              "\" (its emulation modes add conversion buffers)");
  require(in.recompute == Recompute::kNone,
          "activation recomputation: Touchstone's trainer does not recompute activations");
  require(in.vocab_multiple == 1, "vocabulary padding: Touchstone's trainer does not pad the vocabulary");
  require(m.vocab % in.tp == 0, "the tensor-parallel size (" + str(in.tp) + ") must divide the vocabulary (" +
                                    str(m.vocab) + ") for Touchstone's trainer");
}

}  // namespace

void validate(const MemoryPlanInput& in) {
  require(in.tp >= 1, "the tensor-parallel size must be >= 1, got " + str(in.tp));
  require(in.pp >= 1, "the pipeline-parallel size must be >= 1, got " + str(in.pp));
  require(!in.dps.empty(), "no data-parallel size given");
  for (int64_t dp : in.dps) require(dp >= 1, "a data-parallel size must be >= 1, got " + str(dp));
  require(in.micro_batch >= 1, "the micro-batch size must be >= 1, got " + str(in.micro_batch));
  require(in.global_batch >= 0, "the global batch must be >= 1, got " + str(in.global_batch));
  require(in.gpu_memory_gb >= 0, "the GPU memory must be > 0");
  require(in.vocab_multiple >= 1, "the vocabulary multiple must be >= 1, got " + str(in.vocab_multiple));
  require(in.total_params >= 0, "the parameter count must be > 0");
  const bool shaped = in.shape.known();
  require(shaped || in.total_params > 0,
          "the plan needs the parameter count or the model's shape (layers, hidden size, heads, ffn size, "
          "vocabulary)");
  require(shaped || in.activations == ActivationModel::kNone,
          "activations need the model's shape (layers, hidden size, heads, ffn size, vocabulary, sequence "
          "length)");
  require(shaped || in.stage_layers.empty(), "stage layer counts need the model's layers");
  if (shaped) {
    validate_shape(in);
    validate_stages(in);
    validate_activations(in);
  }
  if (in.global_batch > 0) {
    for (int64_t dp : in.dps) {
      require(in.global_batch % (dp * in.micro_batch) == 0,
              "the global batch " + str(in.global_batch) + " is not divisible by DP " + str(dp) +
                  " x micro-batch " + str(in.micro_batch) + " = " + str(dp * in.micro_batch));
    }
  }
}

std::vector<int64_t> stage_layer_counts(const MemoryPlanInput& in) {
  if (!in.stage_layers.empty()) return in.stage_layers;
  return std::vector<int64_t>(static_cast<size_t>(in.pp), in.shape.known() ? in.shape.layers / in.pp : 0);
}

const StageMemory& LayoutPlan::largest() const {
  return *std::max_element(stages.begin(), stages.end(),
                           [](const StageMemory& a, const StageMemory& b) { return a.total() < b.total(); });
}

namespace {

void add_megatron_activations(const MemoryPlanInput& in, StageMemory& s) {
  const ModelShape& m = in.shape;
  const int64_t vocab = padded_vocab(m.vocab, in.vocab_multiple, in.tp);
  double per_micro_batch = static_cast<double>(s.layers) *
                           megatron_layer_activation_bytes(m, in.micro_batch, in.tp, in.sequence_parallel,
                                                           in.recompute, in.flash_attention);
  if (s.first)
    per_micro_batch += megatron_embedding_activation_bytes(m, in.micro_batch, in.tp, in.sequence_parallel);
  if (s.last)
    per_micro_batch += megatron_head_activation_bytes(m, in.micro_batch, in.tp, in.sequence_parallel, vocab);
  s.activations = static_cast<double>(s.in_flight) * per_micro_batch;
  const double working = megatron_recompute_working_bytes(m, in.micro_batch, in.tp, in.sequence_parallel,
                                                          in.recompute, in.flash_attention);
  s.peak = {working > 0 ? "backward, recomputing one layer" : "all in-flight micro-batches stored (1F1B)",
            s.activations + working};
}

void add_fp64_activations(const MemoryPlanInput& in, int64_t dp, int64_t micro_batches, StageMemory& s) {
  const Fp64Rank rank = fp64_rank(in, dp, micro_batches > 0 ? micro_batches : in.pp, s.stage, 0, 0);
  // The state above counts the stage's parameters by formula, the replay takes them from the trainer's
  // ShardPlan: a disagreement is a bug in one of them, not bad input.
  if (std::abs(rank.params() - s.state.params) > 0.5) {
    throw std::logic_error("stage " + str(s.stage) + ": the parameter formula counts " +
                           std::to_string(s.state.params) + " parameters, the ShardPlan " +
                           std::to_string(rank.params()));
  }
  const Fp64StepReplay replay = replay_fp64_step(rank);
  s.in_flight = replay.in_flight;
  s.activations = static_cast<double>(s.in_flight) * replay.stored_per_micro_batch;
  s.peak = replay.peak.at;
  s.stored_per_layer = replay.stored_per_layer;
  s.stored_head = replay.stored_head;
}

}  // namespace

LayoutPlan plan_layout(const MemoryPlanInput& in, int64_t dp) {
  LayoutPlan plan;
  plan.dp = dp;
  plan.micro_batches = in.global_batch > 0 ? in.global_batch / (dp * in.micro_batch) : 0;
  const std::vector<int64_t> layers = stage_layer_counts(in);
  const int64_t vocab = in.shape.known() ? padded_vocab(in.shape.vocab, in.vocab_multiple, in.tp) : 0;
  int64_t first_layer = 0;
  for (int64_t stage = 0; stage < in.pp; ++stage) {
    StageMemory s;
    s.stage = stage;
    s.first_layer = first_layer;
    s.layers = layers[static_cast<size_t>(stage)];
    first_layer += s.layers;
    s.first = stage == 0;
    s.last = stage == in.pp - 1;
    double params = 0;
    if (in.total_params > 0) {
      params = in.total_params / static_cast<double>(in.tp * in.pp);  // no shapes: every stage alike
    } else {
      params = static_cast<double>(s.layers) * layer_params_per_rank(in.shape, in.tp);
      if (s.first) params += embedding_params_per_rank(in.shape, in.tp, vocab);
      if (s.last) params += head_params_per_rank(in.shape, in.tp, vocab, s.first);
    }
    s.state = model_state(params, in.recipe,
                          std::max<int64_t>(in.zero_stage, in.distributed_optimizer ? 1 : 0), dp);
    if (in.moments_dropped) s.state.moments = 0;
    s.in_flight = in_flight_micro_batches(stage, in.pp, plan.micro_batches);
    if (in.activations == ActivationModel::kMegatron16Bit) add_megatron_activations(in, s);
    if (in.activations == ActivationModel::kTouchstoneFp64)
      add_fp64_activations(in, dp, plan.micro_batches, s);
    plan.stages.push_back(s);
  }
  return plan;
}

}  // namespace touchstone::plan
