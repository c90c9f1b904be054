// The JSON view: every number of every entry (NaN and infinities become null, as JSON has neither).
#include <cmath>

#include "oracle/diff/report.h"

namespace touchstone::diff {

namespace {

nlohmann::json real(double value) {
  return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
}

nlohmann::json entry_json(const Entry& e) {
  nlohmann::json j = {
      {"path", e.path},
      {"step", e.step},
      {"group", e.group},
      {"name", e.name},
      {"layer", e.layer >= 0 ? nlohmann::json(e.layer) : nlohmann::json(nullptr)},
      {"kind", e.kind.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.kind)},
      {"status", e.status == Status::kPass ? "pass" : (e.status == Status::kFail ? "fail" : "not_compared")},
      {"reason", e.reason.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.reason)},
      {"tolerance",
       {{"relative_l2", e.tolerance.relative_l2}, {"max_abs_normalized", e.tolerance.max_abs_normalized}}},
      {"basis", basis_name(e.basis)}};
  if (e.status == Status::kNotCompared || (!e.reason.empty() && e.metrics.numel == 0)) return j;
  const TensorMetrics& m = e.metrics;
  j["metrics"] = {{"numel", m.numel},
                  {"relative_l2", real(m.relative_l2)},
                  {"max_abs_error", real(m.max_abs_error)},
                  {"max_abs_golden", real(m.max_abs_golden)},
                  {"max_abs_normalized", real(m.max_abs_normalized)},
                  {"cosine", real(m.cosine)},
                  {"over_tolerance", m.over_tolerance},
                  {"worst_index", m.worst_index},
                  {"worst_golden", real(m.worst_golden)},
                  {"worst_candidate", real(m.worst_candidate)},
                  {"max_ulp", m.has_ulp ? nlohmann::json(m.max_ulp) : nlohmann::json(nullptr)},
                  {"non_finite", m.non_finite},
                  {"bounded_elements", m.bounded},
                  {"worst_bound_ratio", real(m.worst_bound_ratio)},
                  {"tolerance_ratio", real(m.tolerance_ratio)}};
  if (e.trajectory) {
    j["trajectory"] = {{"relative_l2", real(e.trajectory->relative_l2)},
                       {"max_abs_normalized", real(e.trajectory->max_abs_normalized)},
                       {"tolerance_ratio", real(e.trajectory->tolerance_ratio)},
                       {"passes", e.trajectory_passes}};
  }
  return j;
}

}  // namespace

nlohmann::json to_json(const DiffResult& r) {
  nlohmann::json tolerance_model;
  try {
    tolerance_model = nlohmann::json::parse(r.tolerance_model);
  } catch (const nlohmann::json::exception&) {
    tolerance_model = r.tolerance_model;
  }
  nlohmann::json j = {
      {"golden", {{"path", r.golden_path}, {"precision", r.golden_precision}}},
      {"candidate",
       {{"path", r.candidate_path}, {"format", r.candidate_format}, {"generator", r.candidate_generator}}},
      {"tolerance",
       {{"kind", r.tolerance_kind},
        {"model", tolerance_model},
        {"description", r.tolerance_text},
        {"override",
         r.tolerance_override ? nlohmann::json(*r.tolerance_override) : nlohmann::json(nullptr)}}},
      {"summary",
       {{"passed", r.count(Status::kPass)},
        {"failed", r.count(Status::kFail)},
        {"not_compared", r.count(Status::kNotCompared)},
        {"exit_status", r.exit_status()}}},
      {"judgment", r.judgment},
      {"recompute_seconds", r.recompute_seconds},
      {"partial", r.partial},
      {"allow_partial", r.allow_partial},
      {"replicas_disagree", r.replicas_disagree},
      {"first_failure", r.first_failure >= 0
                            ? nlohmann::json(r.entries[static_cast<size_t>(r.first_failure)].path)
                            : nlohmann::json(nullptr)},
      {"verdicts", nlohmann::json::array()},
      {"notes", r.notes},
      {"tensors", nlohmann::json::array()}};
  for (const Verdict& v : r.verdicts) {
    j["verdicts"].push_back({{"signature", v.signature}, {"message", v.message}});
  }
  for (const Entry& e : r.entries) j["tensors"].push_back(entry_json(e));
  return j;
}

}  // namespace touchstone::diff
