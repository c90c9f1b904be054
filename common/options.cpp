// Options in JSON: each value written as its name, read back through its key's table (options.h).
#include "common/options.h"

#include <nlohmann/json.hpp>

namespace touchstone {

namespace {

template <typename Option>
Option option_from_json(const nlohmann::json& json) {
  if (!json.is_string()) {
    throw InputError("config: " + std::string(OptionTable<Option>::key) + " must be a string, got " +
                     json.dump().substr(0, 40));
  }
  return parse_option<Option>(json.get<std::string>());
}

}  // namespace

void to_json(nlohmann::json& json, Precision value) { json = option_name(value); }
void to_json(nlohmann::json& json, LossNormalization value) { json = option_name(value); }
void to_json(nlohmann::json& json, PipelineSchedule value) { json = option_name(value); }
void to_json(nlohmann::json& json, CpComm value) { json = option_name(value); }
void to_json(nlohmann::json& json, ScheduleConvention value) { json = option_name(value); }

void from_json(const nlohmann::json& json, Precision& value) { value = option_from_json<Precision>(json); }
void from_json(const nlohmann::json& json, LossNormalization& value) {
  value = option_from_json<LossNormalization>(json);
}
void from_json(const nlohmann::json& json, PipelineSchedule& value) {
  value = option_from_json<PipelineSchedule>(json);
}
void from_json(const nlohmann::json& json, CpComm& value) { value = option_from_json<CpComm>(json); }
void from_json(const nlohmann::json& json, ScheduleConvention& value) {
  value = option_from_json<ScheduleConvention>(json);
}

}  // namespace touchstone
