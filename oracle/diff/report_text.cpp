// The terminal view: a header with the inputs and the tolerance, one row per tensor in data-flow order
// (a group missing from the candidate folded into one row), the first failure marked, then verdicts.
#include <cmath>
#include <cstdio>
#include <ostream>

#include "oracle/diff/report.h"

namespace touchstone::diff {

namespace {

struct Colours {
  const char *red = "", *green = "", *yellow = "", *bold = "", *reset = "";
};

std::string index_text(const std::vector<int64_t>& index) {
  std::string text = "[";
  for (size_t i = 0; i < index.size(); ++i) text += (i ? ", " : "") + std::to_string(index[i]);
  return text + "]";
}

// Whether every entry of (step, group) from `i` on is not compared for the same reason; `end` is past
// the group.
bool whole_group_not_compared(const std::vector<Entry>& entries, size_t i, size_t& end) {
  end = i;
  bool all = true;
  while (end < entries.size() && entries[end].step == entries[i].step &&
         entries[end].group == entries[i].group) {
    all = all && entries[end].status == Status::kNotCompared && entries[end].reason == entries[i].reason;
    ++end;
  }
  return all && end - i > 1;
}

// Huge distances (a value against zero, or across signs) are shown in powers of ten to keep the column.
std::string ulp_text(const TensorMetrics& m) {
  if (!m.has_ulp) return "-";
  return m.max_ulp < 100000000 ? std::to_string(m.max_ulp) : number(static_cast<double>(m.max_ulp), 2);
}

std::string ratio_text(double ratio) {
  if (!std::isfinite(ratio)) return "inf";
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), ratio < 10 ? "%.2f" : "%.3g", ratio);
  return buffer;
}

const char* basis_short(Basis basis) {
  return basis == Basis::kReanchored ? "re" : basis == Basis::kOptimizer ? "opt" : "traj";
}

}  // namespace

std::string status_text(Status status) {
  switch (status) {
    case Status::kPass:
      return "pass";
    case Status::kFail:
      return "FAIL";
    case Status::kNotCompared:
      return "not compared";
  }
  return "";
}

std::string short_path(const Entry& e) {
  if (e.step == 0) return "init/" + e.name;
  const std::string prefix = "steps/" + std::to_string(e.step) + "/";
  return e.path.rfind(prefix, 0) == 0 ? e.path.substr(prefix.size()) : e.path;
}

std::string number(double value, int digits) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[48];
  std::snprintf(buffer, sizeof(buffer), "%.*e", digits - 1, value);
  return buffer;
}

void print_table(const DiffResult& r, std::ostream& out, bool colour) {
  const Colours c = colour ? Colours{"\033[31m", "\033[32m", "\033[33m", "\033[1m", "\033[0m"} : Colours{};
  out << c.bold << "touchstone diff" << c.reset << "\n";
  out << "  golden     " << r.golden_path << " (precision " << r.golden_precision << ")\n";
  out << "  candidate  " << r.candidate_path << " (" << r.candidate_format
      << (r.candidate_generator.empty() ? "" : ", " + r.candidate_generator) << ")\n";
  out << "  tolerance  " << (r.tolerance_override ? c.yellow : "") << r.tolerance_text << c.reset << "\n";
  out << "  judged     " << r.judgment << "\n\n";

  char line[512];
  std::snprintf(line, sizeof(line), "  %4s  %-58s %9s %10s %9s %12s %6s %8s %8s %-5s  %s\n", "step", "tensor",
                "rel L2", "max/max|g|", "max abs", "cosine", "over", "max ulp", "x tol", "basis", "result");
  out << line;
  for (size_t i = 0; i < r.entries.size(); ++i) {
    const Entry& e = r.entries[i];
    size_t end = i;
    if (e.status == Status::kNotCompared && whole_group_not_compared(r.entries, i, end)) {
      const std::string what =
          (e.step == 0 ? "init" : e.group) + "/* (" + std::to_string(end - i) + " tensors)";
      std::snprintf(line, sizeof(line), "  %4lld  %-58s %snot compared: %s%s\n",
                    static_cast<long long>(e.step), what.c_str(), c.yellow, e.reason.c_str(), c.reset);
      out << line;
      i = end - 1;
      continue;
    }
    const bool first = static_cast<int>(i) == r.first_failure;
    const bool measured = e.status != Status::kNotCompared && e.reason.empty();
    const TensorMetrics& m = e.metrics;
    const char* colour_on =
        e.status == Status::kPass ? c.green : (e.status == Status::kFail ? c.red : c.yellow);
    if (measured) {
      std::snprintf(line, sizeof(line), "%s %4lld  %-58s %9s %10s %9s %12.9f %6lld %8s %8s %-5s  %s%s%s\n",
                    first ? ">" : " ", static_cast<long long>(e.step), short_path(e).c_str(),
                    number(m.relative_l2, 2).c_str(), number(m.max_abs_normalized, 2).c_str(),
                    number(m.max_abs_error, 2).c_str(), m.cosine, static_cast<long long>(m.over_tolerance),
                    ulp_text(m).c_str(), ratio_text(m.tolerance_ratio).c_str(), basis_short(e.basis),
                    first ? c.bold : "", colour_on,
                    (status_text(e.status) + (first ? "  <- first failure" : "")).c_str());
    } else {
      std::snprintf(line, sizeof(line), "%s %4lld  %-58s %s%s%s: %s\n", first ? ">" : " ",
                    static_cast<long long>(e.step), short_path(e).c_str(), first ? c.bold : "", colour_on,
                    status_text(e.status).c_str(), e.reason.c_str());
    }
    out << line << c.reset;
    if (e.status == Status::kFail && measured && m.numel > 0) {
      out << "        " << (m.worst_index.empty() ? "" : "worst element " + index_text(m.worst_index) + ": ")
          << "reference " << number(m.worst_golden, 10) << ", candidate " << number(m.worst_candidate, 10)
          << "; tolerance rel L2 " << number(e.tolerance.relative_l2, 2) << ", max/max|g| "
          << number(e.tolerance.max_abs_normalized, 2)
          << (m.bounded > 0 ? ", " + std::to_string(m.bounded) + " elements on their own bound (worst " +
                                  ratio_text(m.worst_bound_ratio) + " of it)"
                            : std::string())
          << "\n";
    }
  }
  out << "\n";
  if (r.first_failure >= 0) {
    const Entry& f = r.entries[static_cast<size_t>(r.first_failure)];
    out << c.bold << c.red << "first failure: " << f.path << c.reset << "\n";
  }
  for (const Verdict& v : r.verdicts) out << c.bold << "verdict: " << c.reset << v.message << "\n";
  if (r.first_failure >= 0 && r.verdicts.empty()) {
    out << "verdict: no known signature matches; start from the first failure above\n";
  }
  for (const std::string& note : r.notes) out << "note: " << note << "\n";
  for (const std::string& part : r.partial) {
    out << (r.allow_partial ? c.yellow : c.red) << "partial candidate: " << part << c.reset << "\n";
  }
  for (const std::string& copy : r.replicas_disagree) {
    out << c.red << "replicas disagree: " << copy << c.reset << "\n";
  }
  if (r.refused_as_partial()) {
    out << c.red
        << "the candidate holds only part of a group it records: exit status 1 (partial candidates not "
           "accepted)"
        << c.reset << "\n";
  }
  if (r.tolerance_override) {
    out << c.yellow << "note: tolerance overridden on the command line" << c.reset << "\n";
  }
  const int compared = r.count(Status::kPass) + r.count(Status::kFail);
  out << (r.exit_status() == 0 ? c.green : c.red) << compared << " compared: " << r.count(Status::kPass)
      << " pass, " << r.count(Status::kFail) << " fail; " << r.count(Status::kNotCompared) << " not compared"
      << c.reset << "\n";
}

}  // namespace touchstone::diff
