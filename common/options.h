// The string-valued config keys as enums, and the one table per key that spells the name of every
// value. The config reader, to_json, the messages listing the allowed values and every name printed
// in reports go through these tables, so each allowed set is spelled once (docs/config.md). Parsed
// once, when the config is loaded; code past that point compares enums, never strings.
#pragma once

#include <array>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "common/errors.h"

namespace touchstone {

// `precision`: the number formats of a run (kernels/precision.h rounds into them, docs/precision.md).
enum class Precision {
  kFp64,  // everything in double: the reference
  kFp32,  // everything in float
  kBf16,  // mixed precision as production runs it: BF16 weights and activations, FP32 accumulation,
          // FP32 softmax / norm statistics / cross entropy, FP32 main gradients, master weights, Adam
};

// `train.loss_normalization`: the objective of one global batch.
enum class LossNormalization {
  kGlobalTokenMean,    // sum of token losses over the global batch / loss tokens in the global batch
  kPerMicrobatchMean,  // mean over micro-batches of (micro-batch token-loss sum / max(its count, 1))
};

// `parallel.schedule`: the order of forwards and backwards on a pipeline stage
// (parallel/pipeline/schedule.h).
enum class PipelineSchedule {
  kOneForwardOneBackward,  // 1F1B with a flush (PipeDream-Flush, Megatron-LM's default)
  kAllForwardAllBackward,  // AFAB (GPipe)
  kZeroBubbleH1,           // ZB-H1: 1F1B with the backward split into input and weight gradients
};

// `parallel.cp_comm`: how context parallelism's attention passes keys and values between the cp ranks
// (parallel/context/context_attention.h).
enum class CpComm {
  kP2p,       // ring attention: cp point-to-point steps (Megatron-LM's default, --cp-comm-type p2p)
  kAllGather  // all-gather K and V, reduce-scatter dK and dV (Llama 3)
};

// `optim.schedule_convention`: which learning rate update s uses (optim/optimizer.h).
enum class ScheduleConvention {
  kTouchstone,  // update s uses the schedule at s (docs/contract.md)
  kMegatron,    // update s uses the schedule after s - 1 scheduler steps (Megatron-LM's
                // OptimizerParamScheduler, stepped after optimizer.step())
};

template <typename Option>
struct OptionName {
  Option value;
  std::string_view name;
};

// The config key an option type is read from and the name of each value, in the order messages list them.
template <typename Option>
struct OptionTable;

template <>
struct OptionTable<Precision> {
  static constexpr std::string_view key = "precision";
  static constexpr std::array<OptionName<Precision>, 3> names{
      {{Precision::kFp64, "fp64"}, {Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"}}};
};

template <>
struct OptionTable<LossNormalization> {
  static constexpr std::string_view key = "train.loss_normalization";
  static constexpr std::array<OptionName<LossNormalization>, 2> names{
      {{LossNormalization::kGlobalTokenMean, "global_token_mean"},
       {LossNormalization::kPerMicrobatchMean, "per_microbatch_mean"}}};
};

template <>
struct OptionTable<PipelineSchedule> {
  static constexpr std::string_view key = "parallel.schedule";
  static constexpr std::array<OptionName<PipelineSchedule>, 3> names{
      {{PipelineSchedule::kOneForwardOneBackward, "1f1b"},
       {PipelineSchedule::kAllForwardAllBackward, "afab"},
       {PipelineSchedule::kZeroBubbleH1, "zb_h1"}}};
};

template <>
struct OptionTable<CpComm> {
  static constexpr std::string_view key = "parallel.cp_comm";
  static constexpr std::array<OptionName<CpComm>, 2> names{
      {{CpComm::kP2p, "p2p"}, {CpComm::kAllGather, "allgather"}}};
};

template <>
struct OptionTable<ScheduleConvention> {
  static constexpr std::string_view key = "optim.schedule_convention";
  static constexpr std::array<OptionName<ScheduleConvention>, 2> names{
      {{ScheduleConvention::kTouchstone, "touchstone"}, {ScheduleConvention::kMegatron, "megatron"}}};
};

// The value's name, as configs, golden files and reports spell it.
template <typename Option>
std::string option_name(Option value) {
  for (const auto& entry : OptionTable<Option>::names) {
    if (entry.value == value) return std::string(entry.name);
  }
  throw std::invalid_argument(std::string(OptionTable<Option>::key) + ": not a value of this option");
}

// The value called `name`, or none for a name the table does not hold.
template <typename Option>
std::optional<Option> find_option(std::string_view name) {
  for (const auto& entry : OptionTable<Option>::names) {
    if (entry.name == name) return entry.value;
  }
  return std::nullopt;
}

// Every allowed name quoted, for messages: "fp64", "fp32" or "bf16".
template <typename Option>
std::string option_choices() {
  const auto& names = OptionTable<Option>::names;
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) text += i + 1 == names.size() ? " or " : ", ";
    text += "\"" + std::string(names[i].name) + "\"";
  }
  return text;
}

// The value called `name`; throws InputError naming the key and the allowed names, e.g.
// config: precision must be "fp64", "fp32" or "bf16" (got "fp16").
template <typename Option>
Option parse_option(std::string_view name) {
  if (const std::optional<Option> value = find_option<Option>(name)) return *value;
  throw InputError("config: " + std::string(OptionTable<Option>::key) + " must be " +
                   option_choices<Option>() + " (got \"" + std::string(name.substr(0, 40)) +
                   (name.size() > 40 ? "...\")" : "\")"));
}

// JSON holds an option as its name (the config file, `touchstone config`, the golden file's config).
void to_json(nlohmann::json& json, Precision value);
void to_json(nlohmann::json& json, LossNormalization value);
void to_json(nlohmann::json& json, PipelineSchedule value);
void to_json(nlohmann::json& json, CpComm value);
void to_json(nlohmann::json& json, ScheduleConvention value);
// A JSON string naming a value; throws InputError as parse_option does.
void from_json(const nlohmann::json& json, Precision& value);
void from_json(const nlohmann::json& json, LossNormalization& value);
void from_json(const nlohmann::json& json, PipelineSchedule& value);
void from_json(const nlohmann::json& json, CpComm& value);
void from_json(const nlohmann::json& json, ScheduleConvention& value);

}  // namespace touchstone
