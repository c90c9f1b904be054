// `touchstone plan memory`: the stage-3 acceptance numbers, every recipe, the published activation
// formulas, layout errors, and the FP64 trainer prediction against the peak heap a real training step
// measures with the allocation tracker (linked into this test only).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>

#include "common/config.h"
#include "common/errors.h"
#include "kernels/backend.h"
#include "oracle/run.h"
#include "oracle/train_step.h"
#include "parallel/comm/context.h"
#include "parallel/data/dim0_shard.h"
#include "parallel/pipeline/schedule.h"
#include "plan/alloc_tracker.h"
#include "plan/format.h"
#include "plan/fp64_trainer_memory.h"
#include "plan/memory_plan.h"
#include "plan/rank_memory.h"

namespace touchstone::plan {
namespace {

MemoryPlanInput acceptance_500b() {
  MemoryPlanInput in;
  in.total_params = 500e9;
  in.tp = 8;
  in.pp = 8;
  in.dps = {1, 8, 80};
  in.recipe = find_recipe("bf16");
  in.distributed_optimizer = true;
  return in;
}

TEST(PlanMemory, Stage3AcceptanceNumbers) {
  const MemoryPlanInput in = acceptance_500b();
  validate(in);
  std::vector<std::string> totals;
  std::vector<double> bytes;
  for (int64_t dp : in.dps) {
    const LayoutPlan plan = plan_layout(in, dp);
    ASSERT_EQ(plan.stages.size(), 8u);
    for (const StageMemory& s : plan.stages) {
      EXPECT_EQ(s.state.params, 7.8125e9);
      EXPECT_EQ(s.state.total(), plan.stages[0].state.total());  // no shapes: every stage alike
    }
    EXPECT_EQ(scientific(plan.stages[0].state.params), "7.8125e9");
    EXPECT_DOUBLE_EQ(plan.stages[0].state.total(), 7.8125e9 * (6.0 + 12.0 / static_cast<double>(dp)));
    totals.push_back(gigabytes(plan.stages[0].state.total()));
    bytes.push_back(plan.stages[0].state.total());
  }
  EXPECT_EQ(totals, (std::vector<std::string>{"140.63", "58.59", "48.05"}));
  EXPECT_LT(bytes[1], bytes[0]);  // DP8 leaves more room than DP1
}

TEST(PlanMemory, RecipesReproduceTheDistributedOptimizerTable) {
  struct Expected {
    const char* name;
    double plain, replicated, sharded;
    const char* formula;
  };
  for (const Expected& e :
       {Expected{"bf16", 18, 6, 12, "6 + 12/DP"}, Expected{"fp16", 20, 4, 16, "4 + 16/DP"},
        Expected{"fp32", 16, 8, 8, "8 + 8/DP"}, Expected{"fp64", 32, 16, 16, "16 + 16/DP"}}) {
    const Recipe& r = find_recipe(e.name);
    EXPECT_EQ(model_state(1.0, r, false, 8).total(), e.plain) << e.name;
    for (int64_t d : {1, 2, 8, 80}) {
      EXPECT_DOUBLE_EQ(model_state(1.0, r, true, d).total(),
                       e.replicated + e.sharded / static_cast<double>(d))
          << e.name << " d=" << d;
    }
    EXPECT_EQ(bytes_per_param_formula(r, true), e.formula);
    EXPECT_EQ(bytes_per_param_formula(r, false), fixed(e.plain, 0));
  }
  EXPECT_THROW(find_recipe("int8"), InputError);
}

TEST(PlanMemory, KorthikantiFormulas) {
  // GPT-3 175B of the paper: s = 2048, h = 12288, a = 96, b = 1, t = 8.
  ModelShape m;
  m.layers = 96, m.hidden = 12288, m.heads = 96, m.kv_heads = 96, m.ffn = 4 * 12288, m.vocab = 51200,
  m.seq = 2048;
  const double s = 2048, b = 1, h = 12288, a = 96, t = 8, sbh = s * b * h;
  const auto layer = [&](int64_t tp, bool sp, Recompute r) {
    return megatron_layer_activation_bytes(m, 1, tp, sp, r, false);
  };
  EXPECT_DOUBLE_EQ(layer(1, false, Recompute::kNone), sbh * (34 + 5 * a * s / h));
  EXPECT_DOUBLE_EQ(layer(8, false, Recompute::kNone), sbh * (10 + 24 / t + 5 * a * s / (h * t)));
  EXPECT_DOUBLE_EQ(layer(8, true, Recompute::kNone), sbh / t * (34 + 5 * a * s / h));
  EXPECT_DOUBLE_EQ(layer(8, false, Recompute::kSelective), sbh * (10 + 24 / t));
  EXPECT_DOUBLE_EQ(layer(8, true, Recompute::kSelective), sbh * 34 / t);
  EXPECT_DOUBLE_EQ(layer(8, false, Recompute::kFull), 2 * sbh);
  EXPECT_DOUBLE_EQ(layer(8, true, Recompute::kFull), 2 * sbh / t);
  // Flash attention never stores the scores; selective recomputation then has nothing left to drop.
  EXPECT_DOUBLE_EQ(megatron_layer_activation_bytes(m, 1, 8, true, Recompute::kNone, true), sbh * 34 / t);
  EXPECT_DOUBLE_EQ(megatron_recompute_working_bytes(m, 1, 8, true, Recompute::kSelective, false),
                   5 * a * s * s * b / t);
  EXPECT_DOUBLE_EQ(megatron_recompute_working_bytes(m, 1, 8, true, Recompute::kSelective, true), 0);
  // Section 4.3 extras: embedding dropout sbh/t per in-flight micro-batch, head 4sbh/t (1 + v/h).
  EXPECT_DOUBLE_EQ(megatron_embedding_activation_bytes(m, 1, 8, true), sbh / t);
  EXPECT_DOUBLE_EQ(megatron_head_activation_bytes(m, 1, 8, true, 51200), 4 * sbh / t * (1 + 51200 / h));
}

TEST(PlanMemory, InFlightMicroBatchesMatchThe1F1BSchedule) {
  for (int p : {1, 2, 4, 8}) {
    for (int m : {1, 3, 8, 24}) {
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(in_flight_micro_batches(s, p, m), pipeline::peak_in_flight(pipeline::build_schedule(
                                                        PipelineSchedule::kOneForwardOneBackward, p, s, m)))
            << "p=" << p << " m=" << m << " s=" << s;
      }
    }
  }
}

MemoryPlanInput shaped_input() {
  MemoryPlanInput in;
  in.shape = ModelShape{8, 64, 4, 2, 176, 256, 64, false};
  in.recipe = find_recipe("bf16");
  in.tp = 2;
  in.pp = 4;
  in.dps = {2};
  in.micro_batch = 1;
  in.global_batch = 16;
  in.activations = ActivationModel::kMegatron16Bit;
  return in;
}

TEST(PlanMemory, FirstAndLastStagesHoldEmbeddingAndOutputLayer) {
  MemoryPlanInput in = shaped_input();
  const LayoutPlan plan = plan_layout(in, 2);
  const double layer = layer_params_per_rank(in.shape, 2), vocab_rows = 256.0 / 2 * 64;
  EXPECT_DOUBLE_EQ(plan.stages[0].state.params, 2 * layer + vocab_rows);
  EXPECT_DOUBLE_EQ(plan.stages[1].state.params, 2 * layer);
  EXPECT_DOUBLE_EQ(plan.stages[3].state.params, 2 * layer + 64 + vocab_rows);
  EXPECT_EQ(plan.micro_batches, 8);
  EXPECT_EQ(plan.stages[0].in_flight, 4);
  EXPECT_EQ(plan.stages[3].in_flight, 1);
  in.shape.tied_embeddings = true;  // several stages: the last keeps its own copy (Megatron-LM)
  EXPECT_DOUBLE_EQ(plan_layout(in, 2).stages[3].state.params, 2 * layer + 64 + vocab_rows);
  in.pp = 1;
  EXPECT_DOUBLE_EQ(plan_layout(in, 2).stages[0].state.params, 8 * layer + vocab_rows + 64);
  EXPECT_DOUBLE_EQ(total_params(ModelShape{2, 64, 4, 2, 176, 256, 64, false}),
                   2 * 256 * 64 + 64 + 2 * (8 * 16 * 64 + 64 * 64 + 2 * 176 * 64 + 64 * 176 + 2 * 64));
}

// Context parallelism in the 16-bit model: each rank stores the activations of s / cp positions, and
// while a layer's attention runs it holds K and V blocks besides: the ring the one it computes with and
// the one arriving (2 x 2 b (s / cp) (kv heads / t) d x 2 bytes), the all-gather K and V of the whole
// sequence (2 b s (kv heads / t) d x 2 bytes).
TEST(PlanMemory, KorthikantiActivationsOverContextParallelRanks) {
  MemoryPlanInput in = shaped_input();  // s = 64, h = 64, 2 KV heads of d = 16, t = 2, b = 1
  in.flash_attention = true;
  const StageMemory whole = plan_layout(in, 2).stages[0];
  in.cp = 2;
  const StageMemory ring = plan_layout(in, 2).stages[0];
  in.cp_comm = CpComm::kAllGather;
  const StageMemory gathered = plan_layout(in, 2).stages[0];
  const double kv_per_position = 2.0 * (2 / 2) * 16 * 2;
  EXPECT_DOUBLE_EQ(ring.activations, whole.activations / 2);
  EXPECT_DOUBLE_EQ(ring.peak.bytes, ring.activations + 2 * kv_per_position * 64 / 2);
  EXPECT_DOUBLE_EQ(gathered.peak.bytes, ring.activations + kv_per_position * 64);
  EXPECT_NE(ring.peak.name.find("context-parallel K/V buffers"), std::string::npos);
  // The optimizer shards over dp x cp: at dp 2 and cp 2 the distributed optimizer's state is dp 4's.
  in.distributed_optimizer = true;
  EXPECT_DOUBLE_EQ(plan_layout(in, 2).stages[0].state.total(),
                   model_state(plan_layout(in, 2).stages[0].state.params, in.recipe, 1, 4).total());
}

std::string error_of(const MemoryPlanInput& in) {
  try {
    validate(in);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// Korthikanti et al. 2022, section 4.2.3: with the interleaved schedule the first stage stores
// L (1 + (p - 1) / (p v)) layers' activations per micro-batch, where 1F1B stores L (p layers of L / p
// each): its warm-up of (p - 1) 2 + (v - 1) p forwards plus the steady state's one, each of L / (p v)
// layers. Here L = 16 layers, p = 4, v = 2, micro-batches a multiple of p and large enough (m = 8).
TEST(PlanMemory, InterleavedFirstStageStoresKorthikantisLayerCount) {
  MemoryPlanInput in = shaped_input();
  in.shape.layers = 16;
  in.tp = 1;
  in.global_batch = 16;  // m = 16 / (dp 2 x b 1) = 8
  const double layer = megatron_layer_activation_bytes(in.shape, 1, 1, false, Recompute::kNone, false);
  const double head = megatron_head_activation_bytes(in.shape, 1, 1, false, 256);
  const LayoutPlan one_f_one_b = plan_layout(in, 2);
  in.virtual_stages = 2;
  ASSERT_EQ(error_of(in), "");
  const LayoutPlan interleaved = plan_layout(in, 2);
  const StageMemory& first = interleaved.stages[0];
  EXPECT_EQ(first.layers, 4);
  EXPECT_EQ(first.in_flight, 11);  // (4 - 1) 2 + (2 - 1) 4 + 1 chunk sets of 2 layers
  // Stage 0 keeps the embedding dropout mask of each micro-batch its chunk 0 holds: the 11 sets are at
  // most 8 of chunk 0 (micro-batches 0-7, once the forward of micro-batch 7 ran; chunk 0's backwards come
  // last) and 3 of chunk 1.
  const double embedding = megatron_embedding_activation_bytes(in.shape, 1, 1, false);
  EXPECT_DOUBLE_EQ(first.activations, 16 * (1 + 3.0 / 8) * layer + 8 * embedding);
  EXPECT_DOUBLE_EQ(one_f_one_b.stages[0].activations, 16 * layer + 4 * embedding);
  // The last stage: its warm-up is (v - 1) p = 4 forwards, and the head only in its last chunk.
  EXPECT_EQ(interleaved.stages[3].in_flight, 5);
  EXPECT_DOUBLE_EQ(interleaved.stages[3].activations, 5 * 2 * layer + 1 * head);
  // Parameters follow the layers: 2 chunks of 2 on every stage, embedding on 0, head on 3.
  for (int s = 0; s < 4; ++s)
    EXPECT_DOUBLE_EQ(interleaved.stages[s].state.params, one_f_one_b.stages[s].state.params);
}

TEST(PlanMemory, InvalidLayoutsAreInputErrors) {
  MemoryPlanInput in = shaped_input();
  in.pp = 16;
  EXPECT_EQ(
      error_of(in),
      "the pipeline-parallel size 16 is larger than the 8 layers: every pipeline stage needs at least one "
      "layer");
  in = shaped_input();
  in.dps = {3};
  EXPECT_EQ(error_of(in), "the global batch 16 is not divisible by DP 3 x micro-batch 1 = 3");
  in = shaped_input();
  in.pp = 3;
  EXPECT_NE(error_of(in).find("the pipeline-parallel size (3) must divide the layers (8)"),
            std::string::npos);
  in.stage_layers = {2, 3, 3};
  EXPECT_EQ(error_of(in), "");
  in.stage_layers = {2, 3, 2};
  EXPECT_EQ(error_of(in), "the stage layer counts add up to 7 layers, not the model's 8");
  in = shaped_input();  // pp 4, 8 layers, 8 micro-batches per replica
  in.virtual_stages = 2;
  EXPECT_EQ(error_of(in), "");
  in.virtual_stages = 3;
  EXPECT_EQ(
      error_of(in),
      "the pipeline-parallel size x virtual stages 12 is larger than the 8 layers: every pipeline stage "
      "needs at least one layer");
  in.shape.layers = 24;
  in.global_batch = 12;  // 6 micro-batches per replica
  EXPECT_EQ(error_of(in),
            "interleaved 1F1B: the 6 micro-batches per replica at DP 2 are not a multiple of the "
            "pipeline-parallel size 4");
  in = shaped_input();
  in.virtual_stages = 2;
  in.stage_layers = {1, 1, 1, 1, 1, 1, 2};
  EXPECT_EQ(error_of(in),
            "the stage layer counts list 7 stages but the pipeline-parallel size x virtual stages is 8");
  in.stage_layers.clear();
  in.pp = 1;
  EXPECT_EQ(error_of(in), "virtual stages need a pipeline of at least 2 stages, not 1");
  in = shaped_input();
  in.tp = 8;
  EXPECT_NE(error_of(in).find("the tensor-parallel size (8) must divide the heads (4)"), std::string::npos);
  in = MemoryPlanInput{};
  EXPECT_NE(error_of(in).find("the plan needs the parameter count or the model's shape"), std::string::npos);
  in = shaped_input();
  in.tp = 0;
  EXPECT_EQ(error_of(in), "the tensor-parallel size must be >= 1, got 0");
  in = shaped_input();
  in.cp = 0;
  EXPECT_EQ(error_of(in), "the context-parallel size must be >= 1, got 0");
  in.cp = 3;  // 64 positions are not 6 chunks
  EXPECT_EQ(error_of(in),
            "context parallelism: 2 x the context-parallel size (6) must divide the sequence length (64), "
            "which is cut into 2 x cp chunks");
  in.cp = 2;
  EXPECT_EQ(error_of(in),
            "context parallelism: the megatron-16bit model needs flash attention with a context-parallel "
            "size above 1 (Megatron-LM runs context-parallel attention through fused kernels only)");
  in.flash_attention = true;
  EXPECT_EQ(error_of(in), "");
}

// Context parallelism's rule (common/config.h) cuts windows only when cp > 1: at cp = 1 an odd window
// is planned as the trainer's config accepts it, by both activation models and by the prediction that
// `touchstone golden` checks its memory with.
TEST(PlanMemory, WindowOfAnyLengthFitsWithoutContextParallelism) {
  MemoryPlanInput in = shaped_input();
  in.shape.seq = 63;
  EXPECT_EQ(error_of(in), "");
  in.activations = ActivationModel::kTouchstoneFp64;
  in.recipe = find_recipe("fp64");
  in.tp = 1;
  EXPECT_EQ(error_of(in), "");
  in.cp = 2;
  EXPECT_NE(error_of(in).find("2 x the context-parallel size (4) must divide the sequence length (63)"),
            std::string::npos);
  Config config;
  config.model.seq_length = 17;
  EXPECT_NO_THROW(predict_single_process_step(config));
}

// Every size is bounded and every product checked before a vector is sized or a number printed: none
// overflows into a wrong plan, an allocation failure or a negative count in a message.
TEST(PlanMemory, SizesAndProductsAreCheckedBeforeAnyIsFormed) {
  MemoryPlanInput in = acceptance_500b();
  in.pp = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(error_of(in), "the pipeline-parallel size: must be in [1, 1048576], got 9223372036854775807");
  in = acceptance_500b();
  in.tp = in.pp = 1024;
  in.dps = {2};
  EXPECT_EQ(error_of(in), "the GPUs tp x cp x pp x dp: 1024 x 1 x 1024 x 2 is more than 1048576");
  in = shaped_input();
  in.virtual_stages = int64_t{1} << 62;
  EXPECT_EQ(error_of(in), "the virtual stages: must be in [1, 1048576], got 4611686018427387904");
  in.virtual_stages = 2048;
  in.pp = 1024;
  in.tp = 1;
  in.dps = {1};
  EXPECT_EQ(error_of(in), "the virtual stages pp x virtual stages: 1024 x 2048 is more than 1048576");
  in = shaped_input();
  in.vocab_multiple = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(error_of(in), "the vocabulary multiple: must be in [1, 2147483647], got 9223372036854775807");
  EXPECT_THROW(padded_vocab(256, std::numeric_limits<int64_t>::max(), 2), InputError);
  EXPECT_EQ(padded_vocab(250, 128, 2), 256);
  in = acceptance_500b();
  in.total_params = 1e300;
  EXPECT_EQ(error_of(in), "the parameter count: 1e300 is more than 9.007199254740992e15");
  in = acceptance_500b();
  in.gpu_memory_gb = std::nan("");
  EXPECT_EQ(error_of(in), "the GPU memory must be > 0");
  in.gpu_memory_gb = std::numeric_limits<double>::infinity();
  EXPECT_EQ(error_of(in), "the GPU memory in GB: inf is not a finite number");
  // One printed row per stage and DP size: at most 2^16.
  in = acceptance_500b();
  in.tp = 1;
  in.pp = 65536;
  in.dps = {1, 2};
  EXPECT_EQ(error_of(in), "the report's stage rows pp x data-parallel sizes: 65536 x 2 is more than 65536");
  in.dps = {1};
  EXPECT_EQ(error_of(in), "");
  EXPECT_EQ(plan_layout(in, 1).stages.back().stage, 65535);
  // The FP64 trainer's replay grows with the square of a stage's layers x micro-batches: 32 layers of
  // 256 micro-batches took a minute and a half, and are refused.
  Config config;
  config.model.num_layers = 32;
  config.train.global_batch_size = 512;
  config.train.micro_batch_size = 2;
  EXPECT_EQ(error_of(plan_input_from_config(config)), "");  // a run's own memory check replays it
  try {
    check_fp64_replay_size(plan_input_from_config(config));
    ADD_FAILURE() << "8192 layer-micro-batches were not refused";
  } catch (const InputError& e) {
    EXPECT_STREQ(
        e.what(),
        "the touchstone-fp64 replay: the layers of a stage x the micro-batches per replica: 8192 is more "
        "than 1024");
  }
  EXPECT_THROW(check_rank_replay_size(config), InputError);
  config.parallel.pp = 2;
  EXPECT_EQ(fp64_replayed_layer_micro_batches(plan_input_from_config(config), 1), 16 * 256);
  // The interleaved schedule is replayed step by step: a batch of 2^31 micro-batches is refused.
  in = shaped_input();
  in.virtual_stages = 2;
  in.tp = 1;
  in.dps = {1};
  in.global_batch = kMaxCount - 1;
  EXPECT_NE(
      error_of(in).find("the replay: micro-batches x virtual stages: 2147483646 x 2 is more than 16777216"),
      std::string::npos)
      << error_of(in);
}

// ---- the FP64 trainer: prediction against the measured peak --------------------------------------------

// The heap bytes the config's train.steps Trainer::steps (two, or one) add on top of what existed
// before the Trainer: its parameter copy, Adam moments, the activation arena's block, and the steps'
// gradients, activations and temporaries. A one-step run drops its final moments, as the run loop does
// for a golden file without optimizer state.
double measured_step_peak(const Config& config) {
  const PreparedRun run = prepare_run(config, RunOptions{});
  auto backend = make_cpu_backend();
  SingleProcessContext single;
  const int64_t before = alloc_tracker::live_bytes();
  alloc_tracker::reset_peak();
  double peak = 0;
  {
    Trainer trainer(config, run.initial_params, *backend, single.context());
    if (config.train.steps == 1) {  // on the heap, no moments kept, no block laid out after it
      trainer.drop_final_moments();
      trainer.step(run.batches.front());
      EXPECT_EQ(trainer.arena().stats().block_bytes, 0) << "a one-step run laid out a block";
    } else {
      // Two steps: the first takes the passes' buffers from the heap, the second from the arena block
      // laid out at the first one's end (common/activation_arena.h); the prediction is the larger peak.
      trainer.step(run.batches.front());
      trainer.step(run.batches.front());
      EXPECT_EQ(trainer.arena().stats().heap, 0) << "the second step left the arena's layout";
      EXPECT_GT(trainer.arena().stats().planned, 0);
    }
    peak = static_cast<double>(alloc_tracker::peak_bytes() - before);
  }
  return peak;
}

// The prediction counts every buffer of the step at its exact size and nothing else, so the measured
// peak can only be higher, by the bookkeeping the replay leaves out: vector headers, parameter names,
// the schedule's action list (measured: 4-10 kB, 0.004-0.11% of these peaks). 1% is ten times that,
// and a missed [N,H] buffer of the default config (65 kB, 0.85%) still shows as a jump in the printed
// differences.
constexpr double kMeasuredMargin = 0.01;

struct Variation {
  const char* name;
  void (*apply)(Config&);
};

// Prints the predicted and the measured peak of the config and checks the measured one lies within
// kMeasuredMargin above the prediction.
void expect_prediction_matches_measured_peak(const char* name, const Config& config,
                                             const StepPeakPrediction& predicted) {
  const double measured = measured_step_peak(config);
  const double difference = (measured - predicted.total) / measured;
  std::printf("%-42s predicted %12.0f  measured %12.0f  difference %+.3f%%  (peak at %s)\n", name,
              predicted.total, measured, 100 * difference, predicted.stage.peak.name.c_str());
  EXPECT_GE(measured, predicted.total) << name << ": the trainer no longer allocates a predicted buffer";
  EXPECT_LE(difference, kMeasuredMargin) << name;
}

TEST(PlanMemory, Fp64PredictionMatchesTheMeasuredPeak) {
  const Variation variations[] = {
      {"default config", [](Config&) {}},
      {"T = 128, b = 1", [](Config& c) { c.model.seq_length = 128, c.train.micro_batch_size = 1; }},
      {"h = 128, 8 heads, 4 KV heads, F = 352",
       [](Config& c) {
         c.model.hidden_size = 128, c.model.num_heads = 8, c.model.num_kv_heads = 4,
         c.model.ffn_hidden_size = 352;
       }},
      {"b = B = 4 (one micro-batch)",
       [](Config& c) { c.train.global_batch_size = 4, c.train.micro_batch_size = 4; }},
      {"T = 32, b = 4, tied embeddings, 3 layers",
       [](Config& c) {
         c.model.seq_length = 32, c.train.micro_batch_size = 4, c.model.tie_embeddings = true,
         c.model.num_layers = 3;
       }},
      // The model state dominates; the update holds nothing beside the arena (AdamW scales the gradient
      // in its kernel), so the peak is the backward's, with the flat gradient in the arena's layout.
      {"T = 16, b = 1, h = 256, V = 4096 (a large model state)",
       [](Config& c) {
         c.model.seq_length = 16, c.train.micro_batch_size = 1, c.model.hidden_size = 256,
         c.model.ffn_hidden_size = 704, c.model.vocab_size = 4096;
       }},
      {"distributed optimizer (DP 1)", [](Config& c) { c.parallel.distributed_optimizer = true; }},
      {"sequence parallel (TP 1)", [](Config& c) { c.parallel.sequence_parallel = true; }},
      {"attention and hidden dropout",
       [](Config& c) { c.model.attention_dropout = 0.1, c.model.hidden_dropout = 0.1; }},
      {"hidden dropout only", [](Config& c) { c.model.hidden_dropout = 0.1; }},
  };
  for (const Variation& v : variations) {
    Config config;
    config.train.steps = 2;  // the two steps measured_step_peak runs
    v.apply(config);
    expect_prediction_matches_measured_peak(v.name, config, predict_single_process_step(config));
  }
}

// A run of one update that saves no optimizer state (a golden file without --save-optimizer-state)
// holds no AdamW moments and lays out no arena block: its peak is the first step's, on the heap, and
// the planner says so for a config with train.steps = 1 (MemoryPlanInput::moments_dropped).
TEST(PlanMemory, OneStepRunWithoutMomentsMatchesTheMeasuredPeak) {
  const std::vector<Variation> variations = {
      {"default config", [](Config&) {}},
      {"T = 16, b = 1, h = 256, V = 4096 (update peak)",
       [](Config& c) {
         c.model.seq_length = 16, c.train.micro_batch_size = 1, c.model.hidden_size = 256,
         c.model.ffn_hidden_size = 704, c.model.vocab_size = 4096;
       }},
      {"distributed optimizer (DP 1)", [](Config& c) { c.parallel.distributed_optimizer = true; }},
  };
  for (const Variation& v : variations) {
    Config config;
    config.train.steps = 1;
    v.apply(config);
    const StepPeakPrediction predicted = predict_single_process_step(config);
    EXPECT_EQ(predicted.state.moments, 0) << v.name;
    expect_prediction_matches_measured_peak(v.name, config, predicted);
  }
}

// ---- every rank of a layout: the terms of the per-rank prediction ------------------------------------

// The model memory_per_rank measures (tests/parallel/layout_matrix.json): V 256, h 64, 6 layers, 8
// heads, 4 KV heads, F 176, T 64, B 8, b 2.
Config layout_config(const std::vector<std::string>& layout) {
  std::vector<std::string> overrides{"model.num_heads=8", "model.num_kv_heads=4", "model.num_layers=6"};
  overrides.insert(overrides.end(), layout.begin(), layout.end());
  return resolve_config(nlohmann::json(), overrides, "test");
}

double staging_named(const RankMemory& rank, const std::string& name) {
  double bytes = 0;
  for (const NamedBytes& b : rank.peak.staging_buffers) bytes += b.name == name ? b.bytes : 0.0;
  return bytes;
}

TEST(PlanMemory, ZeroStagesShardTheStateAsDocumented) {
  // docs/parallelism.md: FP64 holds 8 + 8 + 16 bytes per parameter; stage 1 shards the moments, stage 2
  // also the gradients, stage 3 also the weights.
  const Recipe& fp64 = find_recipe("fp64");
  EXPECT_EQ(model_state(1.0, fp64, 0, 4).total(), 32.0);
  EXPECT_EQ(model_state(1.0, fp64, 1, 4).total(), 8.0 + 8.0 + 16.0 / 4);
  EXPECT_EQ(model_state(1.0, fp64, 2, 4).total(), 8.0 + (8.0 + 16.0) / 4);
  EXPECT_EQ(model_state(1.0, fp64, 3, 4).total(), 32.0 / 4);
  // Per rank at zero stage 3: weights and moments of the padded dim-0 shards (parallel/data/dim0_shard.h,
  // an independent count), and no gradients in the state (the replay holds the step's shards).
  const Config config = layout_config({"parallel.dp=4", "parallel.zero_stage=3"});
  const ParamTable table(config.model);
  const ShardPlan shard_plan(table, config, 0, 1, 0);
  double shard_elements = 0;
  for (const Dim0Shard& s : dim0_shards(shard_plan, 4))
    shard_elements += static_cast<double>(s.shard_numel());
  for (const RankMemory& r : predict_rank_memory(config)) {
    EXPECT_EQ(r.state.weights, 8.0 * shard_elements);
    EXPECT_EQ(r.state.moments, 16.0 * shard_elements);
    EXPECT_EQ(r.state.grads, 0.0);
  }
}

TEST(PlanMemory, RankPredictionTermsAddUpOnEveryRank) {
  const Config config = layout_config({"parallel.tp=2", "parallel.pp=2", "parallel.dp=2"});
  const std::vector<RankMemory> ranks = predict_rank_memory(config);
  ASSERT_EQ(ranks.size(), 8u);
  const MemoryPlanInput in = plan_input_from_config(config);
  const LayoutPlan stages = plan_layout(in, 2);
  for (const RankMemory& r : ranks) {
    SCOPED_TRACE("rank " + std::to_string(r.world_rank));
    double named = 0;
    for (const NamedBytes& b : r.peak.staging_buffers) named += b.bytes;
    EXPECT_DOUBLE_EQ(named, r.peak.staging);
    EXPECT_DOUBLE_EQ(r.total(),
                     r.state.total() + r.activations() + r.transient() + r.arena_free() + r.peak.staging);
    // Every peak here is in a backward, with all the schedule's in-flight micro-batches stored.
    EXPECT_EQ(r.in_flight, pipeline::peak_in_flight(pipeline::build_schedule(
                               PipelineSchedule::kOneForwardOneBackward, 2, static_cast<int>(r.stage), 2)));
    EXPECT_EQ(r.peak.stored_micro_batches, r.in_flight);
    EXPECT_GT(r.transient(), 0);
    EXPECT_GE(r.total_sends_held, r.total());
    // The per-stage plan is tp rank 0, dp rank 0 of the stage; here every tp and dp rank holds the same.
    EXPECT_DOUBLE_EQ(r.total(), stages.stages[static_cast<size_t>(r.stage)].total());
    EXPECT_DOUBLE_EQ(r.state.params, stages.stages[static_cast<size_t>(r.stage)].state.params);
  }
}

// Context parallelism: a cp rank holds T / cp positions of every window, and every tensor the layers and
// the head store is linear in its positions (rows N = b T / cp, the log-sum-exp [b, heads, T / cp]). So
// one micro-batch's stored bytes are D / cp + A, with A the arena's per-buffer headers (the same buffers
// at every cp): going from cp 1 to 2 saves D / 2, from 2 to 4 D / 4. The optimizer shards over dp x cp.
TEST(PlanMemory, ContextParallelismDividesTheStoredActivations) {
  const auto stored = [](const std::vector<std::string>& layout) {
    return predict_rank_memory(layout_config(layout)).front().stored_per_micro_batch;
  };
  for (const char* comm : {"parallel.cp_comm=p2p", "parallel.cp_comm=allgather"}) {
    SCOPED_TRACE(comm);
    const double one = stored({}), two = stored({"parallel.cp=2", comm}),
                 four = stored({"parallel.cp=4", comm});
    EXPECT_DOUBLE_EQ(one - two, 2 * (two - four));
    const double headers = one - 2 * (one - two);  // A = s1 - D
    EXPECT_GT(headers, 0);
    EXPECT_LT(headers, 0.01 * one);
  }
  // ZeRO-1 at cp = 2: AdamW's moments of one half of the 310,080 parameters (8 bytes each, two moments).
  for (const RankMemory& r : predict_rank_memory(layout_config({"parallel.cp=2", "parallel.zero_stage=1"}))) {
    EXPECT_DOUBLE_EQ(r.state.moments, 16 * 310080 / 2.0);
  }
}

// The cp group's own buffers against hand arithmetic. Per rank N = b T / cp = 2 x 64 / 2 = 64 rows, and
// one of K or V is n_kv = N x 4 KV heads x 8 = 2,048 doubles: the ring's send copy is K and V of one
// block (2 n_kv); the all-gather's backward reduce-scatters 2 n_kv per rank through an exchange buffer
// of cp x 2 n_kv. Gradients are reduced over dp x cp (the dp_cp group) through its padded copy and its
// exchange of the whole flat gradient.
TEST(PlanMemory, ContextParallelBuffersHaveTheirClosedForm) {
  const double n_kv = 64 * 4 * 8, flat = 310080 * 8.0;
  for (const RankMemory& r : predict_rank_memory(layout_config({"parallel.cp=2"}))) {
    EXPECT_DOUBLE_EQ(staging_named(r, "cp send copy: K/V block"), 2 * n_kv * 8);
    EXPECT_DOUBLE_EQ(staging_named(r, "dp_cp all-reduce padded copy"), flat);
  }
  for (const RankMemory& r :
       predict_rank_memory(layout_config({"parallel.cp=2", "parallel.cp_comm=allgather"}))) {
    EXPECT_DOUBLE_EQ(staging_named(r, "cp reduce-scatter exchange"), 2 * 2 * n_kv * 8);
    EXPECT_DOUBLE_EQ(staging_named(r, "cp send copy: K/V block"), 0);
  }
}

// AFAB keeps all 4 micro-batches' activations to the backward, 1F1B at most 2 on stage 0: the arena's
// block, and with it the peak, holds that many micro-batches' stored activations. (The peak's moment is
// not the test: in the steady step the block's bytes are fixed and the heap's buffers decide where the
// total is largest, here a pipeline send copy alive during micro-batch 1's backward.)
TEST(PlanMemory, AfabStoresEveryMicroBatch) {
  const std::vector<RankMemory> afab =
      predict_rank_memory(layout_config({"parallel.pp=2", "parallel.schedule=afab"}));
  const std::vector<RankMemory> one_f_one_b = predict_rank_memory(layout_config({"parallel.pp=2"}));
  for (size_t i = 0; i < afab.size(); ++i) {
    const RankMemory& r = afab[i];
    EXPECT_EQ(r.in_flight, 4);
    EXPECT_GE(r.peak.at.bytes, 4 * r.stored_per_micro_batch);
    EXPECT_GT(r.total(), one_f_one_b[i].total());
  }
  EXPECT_LT(one_f_one_b[0].peak.at.bytes, 4 * one_f_one_b[0].stored_per_micro_batch);
}

// The communication layer's scratch at the peak against hand arithmetic, with N h = 128 x 64 elements
// and the flat gradient of 310,080 parameters (8 bytes each).
TEST(PlanMemory, CommunicationScratchHasItsClosedForm) {
  const double flat = 310080 * 8.0, rows = 128 * 64 * 8.0, world = 2 * 8.0;
  const auto only = [](const Config& config) { return predict_rank_memory(config); };
  for (const RankMemory& r : only(layout_config({"parallel.dp=2"}))) {
    EXPECT_DOUBLE_EQ(staging_named(r, "dp all-reduce padded copy"), flat);
    EXPECT_DOUBLE_EQ(staging_named(r, "dp reduce-scatter exchange"), flat);
    EXPECT_DOUBLE_EQ(r.peak.staging, 2 * flat + 2 * world);
  }
  for (const RankMemory& r : only(layout_config({"parallel.dp=2", "parallel.distributed_optimizer=true"}))) {
    EXPECT_DOUBLE_EQ(r.peak.staging, flat + 2 * world);  // the reduce-scatter needs no padded copy
    EXPECT_DOUBLE_EQ(r.state.moments, 16 * 310080 / 2.0);
  }
  for (const RankMemory& r : only(layout_config({"parallel.tp=2"}))) {
    EXPECT_DOUBLE_EQ(r.peak.staging, 2 * rows + 2 * world);
  }
  // Sequence parallelism: the reduce-scatter of N h; the padded copy serves the head's sums of N.
  for (const RankMemory& r : only(layout_config({"parallel.tp=2", "parallel.sequence_parallel=true"}))) {
    EXPECT_DOUBLE_EQ(r.peak.staging, rows + 128 * 8.0 + 2 * world);
  }
}

// Keeps the compiler from pairing a new with its delete and eliding both (allowed since C++14).
void* volatile g_escape = nullptr;

TEST(PlanMemory, AllocationTrackerCountsEveryForm) {
  struct alignas(64) Wide {
    double x[8];
  };
  constexpr auto kExpected = static_cast<int64_t>(8 + 800 + sizeof(Wide));
  // Read every counter before asserting: the assertions themselves allocate.
  const int64_t before = alloc_tracker::live_bytes();
  alloc_tracker::reset_peak();
  auto* one = new double(1.0);
  g_escape = one;
  auto* many = new double[100];
  g_escape = many;
  auto* wide = new Wide;
  g_escape = wide;
  const int64_t live_with_all = alloc_tracker::live_bytes() - before;
  const bool aligned = reinterpret_cast<uintptr_t>(wide) % 64 == 0;
  delete wide;
  delete[] many;
  delete one;
  const int64_t live_after = alloc_tracker::live_bytes() - before;
  const int64_t peak = alloc_tracker::peak_bytes() - before;
  EXPECT_TRUE(aligned);
  EXPECT_EQ(live_with_all, kExpected);
  EXPECT_EQ(live_after, 0);
  EXPECT_EQ(peak, kExpected);
}

}  // namespace
}  // namespace touchstone::plan
