// Reading the tolerance model of a golden file and resolving the tolerance of each dataset.
#include "oracle/diff/tolerance.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/markup.h"

namespace touchstone::diff {

namespace {

double positive_number(const nlohmann::json& json, const std::string& key, const std::string& where) {
  if (!json.contains(key) || !json[key].is_number()) {
    throw InputError(where + ": \"" + key + "\" must be a number");
  }
  const double value = json[key].get<double>();
  if (!std::isfinite(value) || value < 0) throw InputError(where + ": \"" + key + "\" must be >= 0");
  return value;
}

}  // namespace

ToleranceModel::ToleranceModel(const h5::H5Reader& golden, std::optional<double> override_value)
    : golden_(golden), override_(override_value) {
  if (override_ && (!std::isfinite(*override_) || *override_ < 0)) {
    throw InputError("the tolerance override must be a finite number >= 0");
  }
  from_file_ = golden.has_attribute("/", "tolerance_model");
  json_ = from_file_ ? golden.string_attribute("/", "tolerance_model")
                     : nlohmann::json{{"kind", "fp64"}, {"relative_l2", kFp64Tolerance}}.dump();
  const std::string where = golden.path() + ": attribute tolerance_model";
  nlohmann::json model;
  try {
    model = nlohmann::json::parse(json_);
  } catch (const nlohmann::json::exception&) {
    throw InputError(where + " is not valid JSON");
  }
  if (!model.is_object()) throw InputError(where + " must be a JSON object");
  kind_ = model.contains("kind") && model["kind"].is_string() ? model["kind"].get<std::string>() : "unnamed";
  if (golden.has_attribute("/", "precision")) {
    const std::string name = golden.string_attribute("/", "precision");
    const std::optional<Precision> precision = find_option<Precision>(name);
    if (!precision) {
      throw InputError(golden.path() + ": attribute precision must be " + option_choices<Precision>() +
                       " (got \"" + name + "\")");
    }
    master_precision_ = *precision;
  }
  // An envelope that names its precision can be measured again at other parameters (re-anchoring).
  if (kind_ == "envelope" && model.contains("precision")) {
    EnvelopeModel envelope;
    const std::optional<Precision> precision =
        model["precision"].is_string() ? find_option<Precision>(model["precision"].get<std::string>())
                                       : std::nullopt;
    if (!precision || *precision == Precision::kFp64) {
      throw InputError(where + ": \"precision\" must be \"" + option_name(Precision::kBf16) + "\" or \"" +
                       option_name(Precision::kFp32) + "\" for an envelope");
    }
    envelope.precision = *precision;
    if (model.contains("grad_accumulation_fusion")) {
      if (!model["grad_accumulation_fusion"].is_boolean()) {
        throw InputError(where + ": \"grad_accumulation_fusion\" must be true or false");
      }
      envelope.grad_accumulation_fusion = model["grad_accumulation_fusion"].get<bool>();
    }
    envelope.k = positive_number(model, "k", where);
    envelope.floor = positive_number(model, "floor", where);
    envelope_ = envelope;
    master_precision_ = envelope.precision;
  }
  if (model.contains("relative_l2")) {
    const double relative = positive_number(model, "relative_l2", where);
    default_ = Tolerance{relative, model.contains("max_abs_normalized")
                                       ? positive_number(model, "max_abs_normalized", where)
                                       : relative};
  }
}

std::optional<Tolerance> ToleranceModel::for_path(const std::string& path, bool integer) const {
  if (integer) return Tolerance{0.0, 0.0};
  if (override_) return Tolerance{*override_, *override_};
  const std::string envelope = "/envelope/tolerance/" + path;
  if (!golden_.exists(envelope)) return default_;
  const std::vector<double> values = golden_.read_f64(envelope);
  if (values.size() != 2 || !std::isfinite(values[0]) || !std::isfinite(values[1]) || values[0] < 0 ||
      values[1] < 0) {
    throw InputError(golden_.path() + ": " + envelope + " must hold two finite tolerances >= 0");
  }
  return Tolerance{values[0], values[1]};
}

std::string ToleranceModel::describe() const {
  std::string text = kind_ + (default_ ? " (relative L2 " + markup::significant(default_->relative_l2, 3) +
                                             ", max-abs/max|ref| " +
                                             markup::significant(default_->max_abs_normalized, 3) + ")"
                                       : std::string(" (no default tolerance)"));
  if (!from_file_) text += ", the FP64 default: the golden file records no tolerance_model";
  if (golden_.exists("/envelope/tolerance")) text += ", per-tensor envelope tolerances";
  if (override_)
    text += "; OVERRIDDEN on the command line: " + markup::significant(*override_, 3) + " for every tensor";
  return text;
}

}  // namespace touchstone::diff
