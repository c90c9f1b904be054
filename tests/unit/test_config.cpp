// Config resolution and validation: every key has a default, unknown keys and wrong types are errors
// naming the key, overrides apply in order, impossible shapes are refused before any compute, and
// string options become enums at load, every value spelled by one table (common/options.h).
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>

#include "common/config.h"
#include "common/errors.h"
#include "common/options.h"
#include "test_files.h"

namespace touchstone {
namespace {

using testing::error_of;

TEST(Config, EmptyObjectIsTheDefaults) {
  const Config config = resolve_config(nlohmann::json::object(), {}, "c.json");
  EXPECT_EQ(to_json(config), default_config_json());
  EXPECT_NO_THROW(validate_config(config, 1));
}

TEST(Config, FileAndOverridesApplyInOrder) {
  const nlohmann::json file = {{"model", {{"hidden_size", 32}, {"norm_eps", 1}}}, {"precision", "fp64"}};
  const Config config = resolve_config(
      file, {"model.hidden_size=48", "data.source=docs.jsonl", "optim.lr=0.5", "model.tie_embeddings=true"},
      "c.json");
  EXPECT_EQ(config.model.hidden_size, 48);
  EXPECT_EQ(config.model.norm_eps, 1.0);  // an integer is accepted for a float key
  EXPECT_EQ(config.data.source, "docs.jsonl");
  EXPECT_EQ(config.optim.lr, 0.5);
  EXPECT_TRUE(config.model.tie_embeddings);
}

TEST(Config, UnknownKeysAndWrongTypesNameTheKey) {
  EXPECT_EQ(error_of([] {
              resolve_config({{"model", {{"hiden_size", 3}}}}, {}, "c.json");
            }),
            "c.json: unknown config key 'model.hiden_size'");
  EXPECT_EQ(error_of([] {
              resolve_config({{"modle", {}}}, {}, "c.json");
            }),
            "c.json: unknown config key 'modle'");
  EXPECT_EQ(error_of([] {
              resolve_config({{"model", {{"hidden_size", 3.5}}}}, {}, "c.json");
            }),
            "c.json: model.hidden_size must be an integer, got 3.5");
  EXPECT_EQ(error_of([] {
              resolve_config({{"model", 3}}, {}, "c.json");
            }),
            "c.json: model must be a JSON object");
  EXPECT_EQ(error_of([] { resolve_config(nullptr, {"train.stepz=3"}, "c"); }),
            "override 'train.stepz=3': unknown config key 'train.stepz'");
  EXPECT_EQ(error_of([] { resolve_config(nullptr, {"train.steps=three"}, "c"); }),
            "override 'train.steps=three': train.steps must be an integer, got \"three\"");
  EXPECT_EQ(error_of([] { resolve_config(nullptr, {"train"}, "c"); }),
            "override 'train': expected section.key=value");
  EXPECT_EQ(error_of([] { resolve_config(nullptr, {"train=1"}, "c"); }),
            "override 'train=1': 'train' is a section, not a key");
  // Found by fuzz_config: an override that is not UTF-8 could not be quoted in the type error.
  EXPECT_EQ(error_of([] { resolve_config(nullptr, {"model.hidden_size=1\xd3"}, "c"); }),
            "override 'model.hidden_size=1\xd3': the value is not valid UTF-8");
  EXPECT_EQ(error_of([] { resolve_config(nullptr, {"data.source=docs\xd3.jsonl"}, "c"); }),
            "override 'data.source=docs\xd3.jsonl': the value is not valid UTF-8");
}

TEST(Config, TheDistributedOptimizerIsZeroStage1) {
  EXPECT_EQ(resolve_config(nullptr, {"parallel.distributed_optimizer=true"}, "c").parallel.zero_stage, 1);
  EXPECT_TRUE(resolve_config(nullptr, {"parallel.zero_stage=3"}, "c").parallel.distributed_optimizer);
  EXPECT_FALSE(resolve_config(nullptr, {}, "c").parallel.distributed_optimizer);
  Config in_code;  // built without resolve_config: zero() still reads the flag
  in_code.parallel.distributed_optimizer = true;
  EXPECT_EQ(in_code.parallel.zero(), 1);
}

TEST(Config, ImpossibleShapesAreRefused) {
  auto invalid = [](const std::string& assignment, int world_size = 1) {
    return error_of([&] { validate_config(resolve_config(nullptr, {assignment}, "c"), world_size); });
  };
  // Context parallelism: two chunks per rank, and with sequence parallelism each rank's T / cp rows split
  // over tp; a layout of four factors whose product would overflow is refused, not wrapped.
  const auto invalid_all = [](const std::vector<std::string>& assignments, int world_size) {
    return error_of([&] { validate_config(resolve_config(nullptr, assignments, "c"), world_size); });
  };
  EXPECT_EQ(
      invalid_all({"parallel.cp=2", "model.seq_length=66"}, 2),
      "config: parallel.cp (2) needs model.seq_length (66) divisible by 2 x parallel.cp: each cp rank holds "
      "two chunks of every window");
  EXPECT_EQ(
      invalid_all({"parallel.cp=2", "model.seq_length=12", "parallel.tp=4", "model.num_kv_heads=4",
                   "parallel.sequence_parallel=true"},
                  8),
      "config: parallel.sequence_parallel needs model.seq_length / parallel.cp divisible by parallel.tp");
  EXPECT_EQ(invalid_all({"parallel.cp=2", "model.seq_length=12"}, 2), "");
  EXPECT_EQ(invalid_all({"model.seq_length=17"}, 1), "")
      << "an odd window is fine without context parallelism";
  // Every factor 2^20, every other rule met (without reaching any allocation): 2^80 ranks.
  EXPECT_EQ(
      invalid_all({"parallel.cp=1048576", "parallel.tp=1048576", "parallel.pp=1048576", "parallel.dp=1048576",
                   "model.seq_length=2097152", "model.num_layers=1048576", "model.hidden_size=2097152",
                   "model.num_heads=1048576", "model.num_kv_heads=1048576", "model.ffn_hidden_size=1048576",
                   "model.vocab_size=1048576", "train.global_batch_size=1048576", "train.micro_batch_size=1",
                   "optim.decay_steps=10"},
                  1),
      "config: parallel tp x cp x pp x dp = more than 2^63 but the run has 1 process(es) (launch with mpirun "
      "-np more than 2^63)");
  // The layout's world size, saturated just above the bound rather than overflowing.
  ParallelConfig layout;
  layout.tp = layout.cp = layout.pp = layout.dp = kMaxProcesses;
  EXPECT_EQ(layout.world_size(), kMaxProcesses + 1);
  layout.tp = 2, layout.cp = 2, layout.pp = 4, layout.dp = 3;
  EXPECT_EQ(layout.world_size(), 48);
  layout.dp = kMaxProcesses / 16;
  EXPECT_EQ(layout.world_size(), kMaxProcesses);
  EXPECT_EQ(invalid("parallel.cp_comm=ring"),
            "config: parallel.cp_comm must be \"p2p\" or \"allgather\" (got \"ring\")");
  EXPECT_NE(
      invalid("model.num_heads=3").find("model.hidden_size (64) must be divisible by model.num_heads (3)"),
      std::string::npos);
  EXPECT_NE(
      invalid("model.num_kv_heads=3").find("model.num_kv_heads (3) must be >= 1 and divide model.num_heads"),
      std::string::npos);
  EXPECT_NE(invalid("model.hidden_size=12").find("head_dim 3 must be even"), std::string::npos);
  EXPECT_NE(invalid("train.micro_batch_size=3").find("train.global_batch_size (8) must be divisible"),
            std::string::npos);
  EXPECT_NE(invalid("data.eos_token=256").find("data.eos_token (256) must be in [0, model.vocab_size)"),
            std::string::npos);
  EXPECT_NE(invalid("data.pad_token=1").find("data.pad_token must differ from data.eos_token"),
            std::string::npos);
  EXPECT_NE(invalid("train.loss_normalization=mean").find("train.loss_normalization"), std::string::npos);
  EXPECT_NE(invalid("optim.decay_steps=0").find("optim.decay_steps must be >= optim.warmup_steps"),
            std::string::npos);
  EXPECT_NE(invalid("parallel.schedule=gpipe").find("parallel.schedule"), std::string::npos);
  EXPECT_NE(invalid("parallel.zero_stage=4").find("parallel.zero_stage"), std::string::npos);
  // ZeRO-3 runs with ZB-H1: the last deferred W of each unit reduce-scatters its gradients.
  EXPECT_EQ(error_of([] {
              validate_config(
                  resolve_config(nullptr, {"parallel.zero_stage=3", "parallel.schedule=zb_h1"}, "c"), 1);
            }),
            "");
  EXPECT_EQ(invalid("optim.warmup_init=0.5"), "config: optim.warmup_init must be in [0, optim.lr] (got 0.5)");
  EXPECT_EQ(invalid("optim.warmup_init=-1e-9"),
            "config: optim.warmup_init must be in [0, optim.lr] (got -1e-09)");
  EXPECT_EQ(invalid("optim.warmup_init=0.0005"), "");
  EXPECT_EQ(invalid("optim.schedule_convention=megatron"), "");
  EXPECT_EQ(invalid("optim.decay_steps=1"), "");  // touchstone: a jump to min_lr after the warm-up
  EXPECT_EQ(
      error_of([] {
        validate_config(
            resolve_config(nullptr, {"optim.schedule_convention=megatron", "optim.decay_steps=1"}, "c"), 1);
      }),
      "config: optim.decay_steps must be > optim.warmup_steps under optim.schedule_convention \"megatron\" "
      "(Megatron-LM requires its lr-decay-iters > lr-warmup-iters)");
  EXPECT_NE(invalid("parallel.tp=2").find("tp x cp x pp x dp = 2 but the run has 1 process"),
            std::string::npos);
  EXPECT_NE(invalid("parallel.pp=3").find("parallel.pp (3) must divide model.num_layers (2)"),
            std::string::npos);
  EXPECT_NE(invalid("precision=fp16").find("precision must be"), std::string::npos);
  EXPECT_NE(invalid("model.norm_eps=0").find("model.norm_eps must be > 0"), std::string::npos);
  EXPECT_EQ(invalid("model.attention_dropout=1"),
            "config: model.attention_dropout must be in [0, 1) (got 1)");
  EXPECT_EQ(invalid("model.hidden_dropout=-0.5"),
            "config: model.hidden_dropout must be in [0, 1) (got -0.5)");
  EXPECT_EQ(invalid("model.hidden_dropout=0.999"), "");
}

// Every value of a string option: name -> enum -> name, directly and through the config reader and
// to_json (the JSON of `touchstone config` and of a golden file's config spells the name).
template <typename Option>
void expect_every_value_round_trips(const std::function<Option(const Config&)>& read) {
  const std::string key(OptionTable<Option>::key);
  std::string pointer = "/" + key;
  for (char& c : pointer) c = c == '.' ? '/' : c;
  std::set<std::string> names;
  std::set<Option> values;
  for (const auto& entry : OptionTable<Option>::names) {
    const std::string name(entry.name);
    SCOPED_TRACE(key + " = " + name);
    names.insert(name);
    values.insert(entry.value);
    EXPECT_EQ(parse_option<Option>(name), entry.value);
    EXPECT_EQ(option_name(parse_option<Option>(name)), name);
    EXPECT_EQ(find_option<Option>(name), entry.value);
    const Config config = resolve_config(nullptr, {key + "=" + name}, "c");
    EXPECT_EQ(read(config), entry.value);
    EXPECT_EQ(to_json(config).at(nlohmann::json::json_pointer(pointer)), name);
  }
  EXPECT_EQ(names.size(), OptionTable<Option>::names.size()) << key << ": a name spelled twice";
  EXPECT_EQ(values.size(), OptionTable<Option>::names.size()) << key << ": a value named twice";
}

TEST(ConfigOptions, EveryValueRoundTripsNameToEnumToName) {
  expect_every_value_round_trips<Precision>([](const Config& c) { return c.precision; });
  expect_every_value_round_trips<LossNormalization>(
      [](const Config& c) { return c.train.loss_normalization; });
  expect_every_value_round_trips<PipelineSchedule>([](const Config& c) { return c.parallel.schedule; });
  expect_every_value_round_trips<ScheduleConvention>(
      [](const Config& c) { return c.optim.schedule_convention; });
  EXPECT_EQ(option_choices<ScheduleConvention>(), "\"touchstone\" or \"megatron\"");
  EXPECT_EQ(option_choices<Precision>(), "\"fp64\", \"fp32\" or \"bf16\"");
  EXPECT_EQ(option_choices<PipelineSchedule>(), "\"1f1b\", \"afab\" or \"zb_h1\"");
}

TEST(ConfigOptions, AnUnknownNameIsRefusedAtLoadNamingTheKey) {
  EXPECT_EQ(error_of([] { resolve_config(nullptr, {"precision=fp16"}, "c"); }),
            "config: precision must be \"fp64\", \"fp32\" or \"bf16\" (got \"fp16\")");
  EXPECT_EQ(error_of([] { resolve_config(nullptr, {"train.loss_normalization=mean"}, "c"); }),
            "config: train.loss_normalization must be \"global_token_mean\" or \"per_microbatch_mean\" "
            "(got \"mean\")");
  EXPECT_EQ(error_of([] {
              resolve_config({{"parallel", {{"schedule", "gpipe"}}}}, {}, "c.json");
            }),
            "config: parallel.schedule must be \"1f1b\", \"afab\" or \"zb_h1\" (got \"gpipe\")");
  // Names are exact: no case folding.
  EXPECT_FALSE(find_option<Precision>("FP64").has_value());
  EXPECT_EQ(error_of([] { parse_option<Precision>("FP64"); }),
            "config: precision must be \"fp64\", \"fp32\" or \"bf16\" (got \"FP64\")");
  // A value of another type is still a type error naming the file.
  EXPECT_EQ(error_of([] {
              resolve_config({{"precision", 64}}, {}, "c.json");
            }),
            "c.json: precision must be a string, got 64");
}

// Interleaved 1F1B (parallel.virtual_stages): each rule of docs/config.md is one error naming its key.
TEST(Config, VirtualStagesConstraints) {
  const auto with = [](std::vector<std::string> sets, int world) {
    return error_of([&] { validate_config(resolve_config(nullptr, sets, "c"), world); });
  };
  // The default batch: 8 windows of 2, 4 micro-batches; 2 layers.
  EXPECT_EQ(with({"parallel.pp=2", "parallel.virtual_stages=2", "model.num_layers=4"}, 2), "");
  EXPECT_EQ(with({"parallel.pp=2", "parallel.virtual_stages=2", "model.num_layers=6"}, 2),
            "config: parallel.virtual_stages (parallel.pp x parallel.virtual_stages = 4) must divide "
            "model.num_layers (6) unless parallel.stage_layers lists the layers of each virtual stage");
  EXPECT_EQ(with({"parallel.pp=2", "parallel.virtual_stages=2", "model.num_layers=6",
                  "parallel.stage_layers=[1,2,2,1]"},
                 2),
            "");
  EXPECT_EQ(with({"parallel.pp=2", "parallel.virtual_stages=2", "model.num_layers=6",
                  "parallel.stage_layers=[3,3]"},
                 2),
            "config: parallel.stage_layers has 2 entries but parallel.pp x parallel.virtual_stages is 4");
  EXPECT_EQ(with({"parallel.virtual_stages=2"}, 1),
            "config: parallel.virtual_stages > 1 needs parallel.pp >= 2 (it interleaves pipeline stages)");
  EXPECT_EQ(
      with({"parallel.pp=2", "parallel.virtual_stages=2", "model.num_layers=4", "parallel.schedule=zb_h1"},
           2),
      "config: parallel.virtual_stages > 1 runs interleaved 1F1B: parallel.schedule must be \"1f1b\"");
  EXPECT_EQ(with({"parallel.pp=4", "parallel.virtual_stages=2", "model.num_layers=8"}, 4), "");
  EXPECT_EQ(
      with({"parallel.pp=4", "parallel.virtual_stages=2", "model.num_layers=8", "train.micro_batch_size=4"},
           4),
      "config: parallel.virtual_stages > 1 needs the micro-batches per data-parallel rank "
      "(train.global_batch_size / (train.micro_batch_size x parallel.dp) = 2) to be a multiple of "
      "parallel.pp (4), as Megatron-LM's interleaved schedule does");
  EXPECT_EQ(with({"parallel.pp=2", "parallel.dp=2", "parallel.virtual_stages=2", "model.num_layers=4",
                  "parallel.zero_stage=3"},
                 4),
            "");  // ZeRO-3's per-unit hooks run on every chunk
  EXPECT_EQ(
      with({"parallel.pp=2", "parallel.virtual_stages=2", "model.num_layers=4", "train.micro_batch_size=1"},
           2),
      "");  // 8 micro-batches
  EXPECT_NE(with({"parallel.virtual_stages=0"}, 1).find("parallel.virtual_stages"), std::string::npos);
}

}  // namespace
}  // namespace touchstone
