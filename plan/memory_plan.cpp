// Validation of a layout and the per-stage memory of one GPU.
#include "plan/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "common/config.h"
#include "common/errors.h"
#include "parallel/pipeline/schedule.h"
#include "plan/checked.h"
#include "plan/format.h"
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

// The trainer's rule (common/config.cpp): equal virtual stages unless every one's layers are listed;
// with v > 1 the interleaved schedule needs two stages and micro-batches in groups of pp.
void validate_stages(const MemoryPlanInput& in) {
  const int64_t layers = in.shape.layers, v = in.virtual_stages, stages = in.pp * in.virtual_stages;
  const std::string what =
      v == 1 ? "the pipeline-parallel size" : "the pipeline-parallel size x virtual stages";
  require(stages <= layers, what + " " + str(stages) + " is larger than the " + str(layers) +
                                " layers: every pipeline stage needs at least one layer");
  require(v == 1 || in.pp >= 2, "virtual stages need a pipeline of at least 2 stages, not " + str(in.pp));
  if (in.stage_layers.empty()) {
    require(layers % stages == 0, what + " (" + str(stages) + ") must divide the layers (" + str(layers) +
                                      ") unless the layers of each stage are listed");
    return;
  }
  const auto entries = static_cast<int64_t>(in.stage_layers.size());
  require(entries == stages,
          "the stage layer counts list " + str(entries) + " stages but " + what + " is " + str(stages));
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
    require(context_parallel_fits_window(in.cp, m.seq),
            "context parallelism: 2 x the context-parallel size (" + str(2 * in.cp) +
                ") must divide the sequence length (" + str(m.seq) + "), which is cut into 2 x cp chunks");
    require(in.cp == 1 || in.flash_attention || fp64,
            "context parallelism: the megatron-16bit model needs flash attention with a context-parallel "
            "size above 1 (Megatron-LM runs context-parallel attention through fused kernels only)");
    require(!in.sequence_parallel || (m.seq / in.cp * in.micro_batch) % in.tp == 0,
            "sequence parallelism: the tensor-parallel size (" + str(in.tp) +
                ") must divide the micro-batch's tokens on a rank (" + str(m.seq / in.cp * in.micro_batch) +
                ")");
  }
  require(!in.flash_attention || in.activations == ActivationModel::kMegatron16Bit,
          "flash attention applies to the megatron-16bit activation model only (Touchstone's trainer stores "
          "the attention probabilities)");
  if (!fp64) return;
  // The replay builds the trainer's own parameter table, whose sizes are 64-bit integers: bounded as
  // counts a double holds exactly, so that no tensor's size overflows.
  require(total_params(m) <= kMaxExactCount,
          "the touchstone-fp64 activation model replays the trainer's parameter table: " +
              scientific(total_params(m)) + " parameters is more than 2^53");
  require(in.trainer_precision == Precision::kFp64,
          "the touchstone-fp64 activation model replays the trainer in precision \"" +
              option_name(Precision::kFp64) + "\", not \"" + option_name(in.trainer_precision) +
              "\" (its emulation modes add conversion buffers)");
  require(in.recompute == Recompute::kNone,
          "activation recomputation: Touchstone's trainer does not recompute activations");
  require(in.vocab_multiple == 1, "vocabulary padding: Touchstone's trainer does not pad the vocabulary");
  require(m.vocab % in.tp == 0, "the tensor-parallel size (" + str(in.tp) + ") must divide the vocabulary (" +
                                    str(m.vocab) + ") for Touchstone's trainer");
  require(in.virtual_stages == 1 || in.schedule == PipelineSchedule::kOneForwardOneBackward,
          "virtual stages run interleaved 1F1B: the schedule must be \"" +
              option_name(PipelineSchedule::kOneForwardOneBackward) + "\"");
}

// The trainer's own limits (common/config.h) on every count and process size, then the products the
// plan sizes its vectors and loops with: checked before any is formed, so none overflows and the plan
// stays a size a report can hold.
void check_sizes(const MemoryPlanInput& in) {
  checked_range(in.tp, 1, kMaxProcesses, "the tensor-parallel size");
  checked_range(in.cp, 1, kMaxProcesses, "the context-parallel size");
  checked_range(in.pp, 1, kMaxProcesses, "the pipeline-parallel size");
  checked_range(in.virtual_stages, 1, kMaxProcesses, "the virtual stages");
  for (int64_t dp : in.dps) {
    checked_range(dp, 1, kMaxProcesses, "a data-parallel size");
    checked_product({in.tp, in.cp, in.pp, dp}, kMaxProcesses, "the GPUs tp x cp x pp x dp");
  }
  checked_product({in.pp, in.virtual_stages}, kMaxProcesses, "the virtual stages pp x virtual stages");
  // One row per stage and DP size: 2^16 rows print in a second; a million would take minutes to read.
  checked_product({in.pp, static_cast<int64_t>(in.dps.size())}, int64_t{1} << 16,
                  "the report's stage rows pp x data-parallel sizes");
  checked_range(in.micro_batch, 1, kMaxCount, "the micro-batch size");
  checked_range(in.global_batch, 0, kMaxCount, "the global batch");
  checked_range(in.vocab_multiple, 1, kMaxCount, "the vocabulary multiple");
  checked_finite(in.total_params, kMaxExactCount, "the parameter count");
  checked_finite(in.gpu_memory_gb, kMaxExactCount, "the GPU memory in GB");
  const ModelShape& m = in.shape;
  for (const int64_t count : {m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.vocab, m.seq})
    checked_range(count, 0, kMaxCount,
                  "a model size (layers, hidden, heads, KV heads, ffn, vocabulary, sequence)");
  for (const int64_t layers : in.stage_layers) checked_range(layers, 1, kMaxCount, "a stage layer count");
}

// The replayed schedules (interleaved 1F1B, and every schedule of the FP64 trainer) take one step per
// chunk and micro-batch on every stage: their sum is bounded so that a plan never runs for hours.
void check_replay_size(const MemoryPlanInput& in) {
  const bool replayed = in.activations == ActivationModel::kTouchstoneFp64 ||
                        (in.activations == ActivationModel::kMegatron16Bit && in.virtual_stages > 1);
  if (!replayed) return;
  for (int64_t dp : in.dps) {
    const int64_t micro_batches = in.global_batch > 0 ? in.global_batch / (dp * in.micro_batch) : 2 * in.pp;
    const int64_t per_stage = checked_add(in.shape.layers,
                                          checked_product({micro_batches, in.virtual_stages}, kMaxReplaySteps,
                                                          "the replay: micro-batches x virtual stages"),
                                          "the replay: layers + micro-batches x virtual stages");
    checked_product({in.pp, per_stage}, kMaxReplaySteps,
                    "the replay: pp x (layers + micro-batches x virtual stages)");
  }
}

}  // namespace

int64_t fp64_replayed_layer_micro_batches(const MemoryPlanInput& in, int64_t dp) {
  const std::vector<int64_t> layers = virtual_stage_layer_counts(in);
  int64_t largest = 0;
  for (int64_t stage = 0; stage < in.pp; ++stage) {
    int64_t sum = 0;
    for (int64_t c = 0; c < in.virtual_stages; ++c) sum += layers[static_cast<size_t>(c * in.pp + stage)];
    largest = std::max(largest, sum);
  }
  const int64_t m = in.global_batch > 0 ? in.global_batch / (dp * in.micro_batch) : in.pp;
  return checked_product({largest, std::max<int64_t>(m, 1)}, std::numeric_limits<int64_t>::max(),
                         "the FP64 replay: layers x micro-batches");
}

void check_fp64_replay_size(const MemoryPlanInput& in) {
  if (!in.shape.known() || in.activations != ActivationModel::kTouchstoneFp64) return;
  for (int64_t dp : in.dps) {
    checked_product({fp64_replayed_layer_micro_batches(in, dp)}, kMaxFp64ReplayedLayerMicroBatches,
                    "the touchstone-fp64 replay: the layers of a stage x the micro-batches per replica");
  }
}

void validate(const MemoryPlanInput& in) {
  require(in.tp >= 1, "the tensor-parallel size must be >= 1, got " + str(in.tp));
  require(in.cp >= 1, "the context-parallel size must be >= 1, got " + str(in.cp));
  require(in.pp >= 1, "the pipeline-parallel size must be >= 1, got " + str(in.pp));
  require(in.virtual_stages >= 1, "the virtual stages must be >= 1, got " + str(in.virtual_stages));
  require(!in.dps.empty(), "no data-parallel size given");
  for (int64_t dp : in.dps) require(dp >= 1, "a data-parallel size must be >= 1, got " + str(dp));
  require(in.micro_batch >= 1, "the micro-batch size must be >= 1, got " + str(in.micro_batch));
  require(in.global_batch >= 0, "the global batch must be >= 1, got " + str(in.global_batch));
  require(in.gpu_memory_gb >= 0, "the GPU memory must be > 0");
  require(in.vocab_multiple >= 1, "the vocabulary multiple must be >= 1, got " + str(in.vocab_multiple));
  require(in.total_params >= 0, "the parameter count must be > 0");
  check_sizes(in);
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
  if (shaped) check_replay_size(in);
  if (in.global_batch > 0) {
    for (int64_t dp : in.dps) {
      require(in.global_batch % (dp * in.micro_batch) == 0,
              "the global batch " + str(in.global_batch) + " is not divisible by DP " + str(dp) +
                  " x micro-batch " + str(in.micro_batch) + " = " + str(dp * in.micro_batch));
      // Megatron-LM's interleaved schedule runs micro-batches in groups of pp (parallel/pipeline/schedule.h).
      const int64_t micro_batches = in.global_batch / (dp * in.micro_batch);
      require(in.virtual_stages == 1 || micro_batches % in.pp == 0,
              "interleaved 1F1B: the " + str(micro_batches) + " micro-batches per replica at DP " + str(dp) +
                  " are not a multiple of the pipeline-parallel size " + str(in.pp));
    }
  }
}

std::vector<int64_t> virtual_stage_layer_counts(const MemoryPlanInput& in) {
  if (!in.stage_layers.empty()) return in.stage_layers;
  const int64_t stages = in.pp * in.virtual_stages;
  return std::vector<int64_t>(static_cast<size_t>(stages), in.shape.known() ? in.shape.layers / stages : 0);
}

const StageMemory& LayoutPlan::largest() const {
  return *std::max_element(stages.begin(), stages.end(),
                           [](const StageMemory& a, const StageMemory& b) { return a.total() < b.total(); });
}

namespace {

// Interleaved 1F1B holds sets of one chunk's activations of one micro-batch: the schedule of this stage
// (m unknown: 2 pp, enough that the warm-up count is not cut short) says which are live at once.
void add_interleaved_megatron_activations(const MemoryPlanInput& in, int64_t micro_batches,
                                          const std::vector<double>& chunk_bytes, StageMemory& s) {
  const int64_t m = micro_batches > 0 ? micro_batches : 2 * in.pp;
  const std::vector<pipeline::Action> actions =
      pipeline::build_interleaved_schedule(static_cast<int>(in.pp), static_cast<int>(in.virtual_stages),
                                           static_cast<int>(s.stage), static_cast<int>(m));
  s.in_flight = pipeline::peak_in_flight(actions);
  double live = 0;
  for (const pipeline::Action& action : actions) {
    const double bytes = chunk_bytes[static_cast<size_t>(action.chunk)];
    if (action.kind == pipeline::ActionKind::kForward) s.activations = std::max(s.activations, live += bytes);
    if (action.kind == pipeline::ActionKind::kBackward) live -= bytes;
  }
}

// Context parallelism's K/V buffers while one layer's attention runs, 16-bit: the ring holds the block
// it computes with and the one arriving (K and V of its T / cp positions each); the all-gather holds K
// and V of the whole window.
double megatron_context_kv_bytes(const MemoryPlanInput& in) {
  if (in.cp == 1) return 0;
  const ModelShape& m = in.shape;
  const double kv_per_position = 2.0 * static_cast<double>(m.kv_heads / in.tp * m.head_dim()) * 2.0;
  const double positions = static_cast<double>(in.micro_batch * m.seq);
  return in.cp_comm == CpComm::kAllGather ? kv_per_position * positions
                                          : 2.0 * kv_per_position * positions / static_cast<double>(in.cp);
}

void add_megatron_activations(const MemoryPlanInput& in, int64_t micro_batches,
                              const std::vector<int64_t>& chunk_layers, StageMemory& s) {
  // Each rank stores the activations of its T / cp positions.
  ModelShape m = in.shape;
  m.seq /= in.cp;
  const int64_t vocab = padded_vocab(m.vocab, in.vocab_multiple, in.tp);
  const double layer = megatron_layer_activation_bytes(m, in.micro_batch, in.tp, in.sequence_parallel,
                                                       in.recompute, in.flash_attention);
  // One micro-batch's bytes in each chunk: the embedding in the pipeline's first chunk, the head in its last.
  std::vector<double> chunk_bytes;
  for (size_t c = 0; c < chunk_layers.size(); ++c) {
    double bytes = static_cast<double>(chunk_layers[c]) * layer;
    if (s.first && c == 0)
      bytes += megatron_embedding_activation_bytes(m, in.micro_batch, in.tp, in.sequence_parallel);
    if (s.last && c + 1 == chunk_layers.size())
      bytes += megatron_head_activation_bytes(m, in.micro_batch, in.tp, in.sequence_parallel, vocab);
    chunk_bytes.push_back(bytes);
  }
  if (in.virtual_stages > 1) {
    add_interleaved_megatron_activations(in, micro_batches, chunk_bytes, s);
  } else {
    s.activations = static_cast<double>(s.in_flight) * chunk_bytes.front();
  }
  const double working = megatron_recompute_working_bytes(m, in.micro_batch, in.tp, in.sequence_parallel,
                                                          in.recompute, in.flash_attention);
  const double context_kv = megatron_context_kv_bytes(in);
  s.peak = {(working > 0 ? "backward, recomputing one layer"
                         : "all in-flight micro-batches stored (" +
                               std::string(in.virtual_stages > 1 ? "interleaved 1F1B" : "1F1B") + ")") +
                std::string(context_kv > 0 ? ", with the context-parallel K/V buffers of one layer" : ""),
            s.activations + working + context_kv};
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
  s.activations = replay.stored_at_peak;
  s.peak = replay.peak.at;
  s.stored_per_layer = replay.stored_per_layer;
  s.stored_head = replay.stored_head;
}

}  // namespace

LayoutPlan plan_layout(const MemoryPlanInput& in, int64_t dp) {
  LayoutPlan plan;
  plan.dp = dp;
  plan.micro_batches = in.global_batch > 0 ? in.global_batch / (dp * in.micro_batch) : 0;
  const std::vector<int64_t> layers = virtual_stage_layer_counts(in);
  const int64_t vocab = in.shape.known() ? padded_vocab(in.shape.vocab, in.vocab_multiple, in.tp) : 0;
  int64_t first_layer = 0;  // summed as the stages go: summing every stage's predecessors is O(pp^2)
  for (int64_t stage = 0; stage < in.pp; ++stage) {
    StageMemory s;
    s.stage = stage;
    s.first_layer = first_layer;
    first_layer += layers[static_cast<size_t>(stage)];
    std::vector<int64_t> chunk_layers;  // chunk c is virtual stage c x pp + stage
    for (int64_t c = 0; c < in.virtual_stages; ++c)
      chunk_layers.push_back(layers[static_cast<size_t>(c * in.pp + stage)]);
    s.layers = std::accumulate(chunk_layers.begin(), chunk_layers.end(), int64_t{0});
    s.first = stage == 0;
    s.last = stage == in.pp - 1;
    double params = 0;
    if (in.total_params > 0) {
      // No shapes: every stage alike.
      params =
          in.total_params / static_cast<double>(checked_product({in.tp, in.pp}, kMaxProcesses, "tp x pp"));
    } else {
      params = static_cast<double>(s.layers) * layer_params_per_rank(in.shape, in.tp);
      if (s.first) params += embedding_params_per_rank(in.shape, in.tp, vocab);
      if (s.last) params += head_params_per_rank(in.shape, in.tp, vocab, s.first);
    }
    // The optimizer shards over dp x cp (the gradients are reduced over both).
    s.state = model_state(params, in.recipe,
                          std::max<int64_t>(in.zero_stage, in.distributed_optimizer ? 1 : 0), dp * in.cp);
    if (in.moments_dropped) s.state.moments = 0;
    s.in_flight = in_flight_micro_batches(stage, in.pp, plan.micro_batches);
    if (in.activations == ActivationModel::kMegatron16Bit)
      add_megatron_activations(in, plan.micro_batches, chunk_layers, s);
    if (in.activations == ActivationModel::kTouchstoneFp64)
      add_fp64_activations(in, dp, plan.micro_batches, s);
    plan.stages.push_back(s);
  }
  return plan;
}

}  // namespace touchstone::plan
