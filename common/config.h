// The run configuration: every key of docs/config.md with its default, loading from JSON,
// command-line overrides, and validation before any compute.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/options.h"

namespace touchstone {

struct ModelConfig {
  int64_t vocab_size = 256;       // V
  int64_t hidden_size = 64;       // H
  int64_t num_layers = 2;         // L
  int64_t num_heads = 4;          // NH
  int64_t num_kv_heads = 2;       // NKV
  int64_t ffn_hidden_size = 176;  // F
  int64_t seq_length = 64;        // T
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool tie_embeddings = false;
  double init_std = 0.02;
  // Inverted dropout probabilities (Megatron-LM's --attention-dropout / --hidden-dropout); 0 disables.
  // attention_dropout: on the attention probabilities, before they multiply V; hidden_dropout: on each
  // block's output (after linear_proj, after linear_fc2), before the residual add.
  double attention_dropout = 0.0;
  double hidden_dropout = 0.0;

  int64_t head_dim() const { return hidden_size / num_heads; }  // D
  int64_t qkv_rows() const { return (num_heads + 2 * num_kv_heads) * head_dim(); }
};

struct DataConfig {
  std::string source = "builtin:acceptance";
  int64_t eos_token = 1;
  int64_t pad_token = 0;
  bool eos_loss = true;
  bool document_masking = true;
};

struct TrainConfig {
  int64_t global_batch_size = 8;  // B windows per optimizer step
  int64_t micro_batch_size = 2;   // mbs
  int64_t steps = 3;
  int64_t seed = 1234;
  LossNormalization loss_normalization = LossNormalization::kGlobalTokenMean;
  // BF16: add each micro-batch's FP32 weight gradient straight into the FP32 main gradient (true), or
  // round it to BF16 first (false, as Megatron-LM without gradient-accumulation fusion).
  bool grad_accumulation_fusion = true;
};

struct OptimConfig {
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_steps = 1;
  int64_t decay_steps = 4;
  double warmup_init = 0.0;  // the rate the linear warm-up starts from (Megatron-LM's --lr-warmup-init)
  ScheduleConvention schedule_convention = ScheduleConvention::kTouchstone;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double clip_grad = 1.0;
};

struct ParallelConfig {
  int64_t tp = 1;
  int64_t pp = 1;
  int64_t dp = 1;
  // Context parallelism (docs/parallelism.md): each window's positions split over cp ranks, two chunks
  // each (parallel/context/load_balanced_split.h); world = tp x cp x dp x pp.
  int64_t cp = 1;
  CpComm cp_comm = CpComm::kP2p;
  PipelineSchedule schedule = PipelineSchedule::kOneForwardOneBackward;
  bool sequence_parallel = false;      // shard norm and residual regions along the sequence over tp
  bool distributed_optimizer = false;  // ZeRO-1: optimizer state and master weights sharded over dp
  // ZeRO stage (docs/parallelism.md): 0 none, 1 the distributed optimizer, 2 also the gradients sharded,
  // 3 also the parameters (FSDP2). resolve_config makes the two keys agree: distributed_optimizer = true
  // is stage 1 (Megatron-LM's --use-distributed-optimizer), and every stage >= 1 sets it.
  int64_t zero_stage = 0;

  // The stage in effect, also for a config built in code that sets only distributed_optimizer.
  int64_t zero() const { return distributed_optimizer && zero_stage == 0 ? 1 : zero_stage; }
  // Interleaved 1F1B (Megatron-LM's virtual pipeline, docs/parallelism.md): model chunks per pipeline
  // stage. The model is cut into pp x virtual_stages virtual stages and stage s holds virtual stages
  // s, s + pp, s + 2 pp, ... (its chunks 0, 1, 2, ...). 1 is the plain pipeline.
  int64_t virtual_stages = 1;
  // Layers per virtual stage, in pipeline order (pp x virtual_stages entries; with virtual_stages = 1
  // the layers of each stage); empty: num_layers / (pp x virtual_stages) each.
  std::vector<int64_t> stage_layers;

  int64_t num_virtual_stages() const { return pp * virtual_stages; }
  // The processes the layout runs on, tp x cp x dp x pp; kMaxProcesses + 1 when that is more than
  // kMaxProcesses (each factor may be 2^20, so the product of all four would overflow int64_t).
  int64_t world_size() const;
};

// The BF16 tolerance model of `touchstone golden --envelope`: tolerance = k x (BF16-vs-FP64 error) + floor.
struct EnvelopeConfig {
  double k = 4.0;
  double floor = 1e-6;
};

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  OptimConfig optim;
  ParallelConfig parallel;
  Precision precision = Precision::kFp64;
  EnvelopeConfig envelope;

  int64_t num_micro_batches() const { return train.global_batch_size / train.micro_batch_size; }
  // The first layer of every virtual pipeline stage (every stage without virtual stages), and
  // num_layers at the end: [pp x virtual_stages + 1].
  std::vector<int64_t> stage_boundaries() const;
};

// The defaults as JSON: the reference for which keys exist and what type each has.
nlohmann::json default_config_json();

// Builds a config from defaults, then `file_json` (may be null), then "section.key=value" overrides
// in order. Throws InputError naming the key (its dotted path) for an unknown key or a value of the
// wrong type, and for a name a string option (options.h) does not know. `origin` names the config file
// in messages. Does not check cross-key constraints.
Config resolve_config(const nlohmann::json& file_json, const std::vector<std::string>& overrides,
                      const std::string& origin);

// Reads a JSON config file; throws InputError naming the file on a missing file or bad JSON.
nlohmann::json read_config_file(const std::string& path);

// The range of an integer key (of each entry, for a list). Counts stay below 2^31 (token ids and window
// positions are int32; a product of two counts fits an int64), process counts below 2^20 (tp x pp x dp
// fits an int64). Whether a run of these sizes fits the machine is the memory check's question
// (docs/config.md#limits).
struct IntegerLimit {
  const char* key;
  int64_t min, max;
};
constexpr int64_t kMaxCount = 2147483647;   // 2^31 - 1
constexpr int64_t kMaxProcesses = 1048576;  // 2^20
const std::vector<IntegerLimit>& integer_limits();

// Every integer key in its limits and every float key finite, then the cross-key checks
// (divisibility, ranges, token ids < vocab). Throws InputError naming the key, one short line.
// `world_size` is the number of processes the run was launched with.
void validate_config(const Config& config, int world_size);

// Context parallelism's rule on the window, for the trainer's config and the planners alike: with
// cp > 1 every window is cut into 2 x cp chunks (each rank holds two, which balances causal attention),
// so 2 x cp must divide the sequence length; cp = 1 cuts nothing and fits every length.
bool context_parallel_fits_window(int64_t cp, int64_t seq_length);

nlohmann::json to_json(const Config& config);

}  // namespace touchstone
