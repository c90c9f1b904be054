// The HTML view: one self-contained page (inline CSS and SVG, no scripts, nothing fetched), so it can be
// attached to a bug report or archived with a CI run.
#include "common/text_output.h"
#include "oracle/diff/report.h"

namespace touchstone::diff {

namespace {

const char* kStyle = R"(body{font-family:sans-serif;margin:24px;color:#222}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;font-size:12px}
td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:right}
td.l,th.l{text-align:left;font-family:monospace}table.info td{text-align:left}
tr.fail td{background:#fde8e8}tr.first td{background:#f9c5c5;font-weight:bold}tr.nc td{color:#999}
.pass{color:#1a7f37}.fail{color:#c62828;font-weight:bold}
.override{background:#fff3cd;border:1px solid #e0c36a;padding:8px;margin:12px 0}
.verdict{background:#eef4ff;border-left:4px solid #3b6fd8;padding:6px 10px;margin:6px 0}
)";

std::string cell(const std::string& text, bool left = false) {
  return std::string(left ? "<td class=\"l\">" : "<td>") + xml_escape(text) + "</td>";
}

}  // namespace

std::string html_report(const DiffResult& r) {
  std::string h =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>touchstone "
      "diff</title><style>";
  h += kStyle;
  h += "</style></head><body>\n<h1>touchstone diff: ";
  h += r.exit_status() == 0 ? "<span class=\"pass\">all compared tensors pass</span>"
       : r.count(Status::kFail) == 0
           ? std::string("<span class=\"fail\">partial candidate</span>")
           : "<span class=\"fail\">" + std::to_string(r.count(Status::kFail)) + " tensors fail</span>";
  h += "</h1>\n<table class=\"info\">";
  h += "<tr><th class=\"l\">golden</th>" +
       cell(r.golden_path + " (precision " + r.golden_precision + ")", true) + "</tr>";
  h += "<tr><th class=\"l\">candidate</th>" +
       cell(r.candidate_path + " (" + r.candidate_format +
                (r.candidate_generator.empty() ? "" : ", " + r.candidate_generator) + ")",
            true) +
       "</tr>";
  h += "<tr><th class=\"l\">tolerance</th>" + cell(r.tolerance_text, true) + "</tr>";
  h += "<tr><th class=\"l\">judged</th>" + cell(r.judgment, true) + "</tr>";
  h += "<tr><th class=\"l\">result</th>" +
       cell(std::to_string(r.count(Status::kPass)) + " pass, " + std::to_string(r.count(Status::kFail)) +
                " fail, " + std::to_string(r.count(Status::kNotCompared)) + " not compared",
            true) +
       "</tr></table>\n";
  if (r.tolerance_override) {
    h += "<div class=\"override\">The tolerance was overridden on the command line (" +
         number(*r.tolerance_override) + " for every tensor); the golden file's tolerance model is " +
         xml_escape(r.tolerance_model) + ".</div>\n";
  }
  for (const std::string& part : r.partial) {
    h += "<div class=\"override\">Partial candidate: " + xml_escape(part) + "</div>\n";
  }
  int64_t focus = r.entries.empty() ? 0 : r.entries.back().step;
  if (r.first_failure >= 0) {
    const Entry& first = r.entries[static_cast<size_t>(r.first_failure)];
    focus = first.step;
    h += "<h2>First failure</h2><p><code>" + xml_escape(first.path) + "</code>";
    if (first.reason.empty() && first.metrics.numel > 0) {
      std::string index;
      for (int64_t i : first.metrics.worst_index) index += (index.empty() ? "" : ", ") + std::to_string(i);
      h += ": relative L2 " + number(first.metrics.relative_l2) +
           (index.empty() ? std::string(", golden ") : ", worst element [" + index + "] golden ") +
           number(first.metrics.worst_golden, 10) + ", candidate " +
           number(first.metrics.worst_candidate, 10);
    } else {
      h += ": " + xml_escape(first.reason);
    }
    h += "</p>\n<h2>Verdict</h2>\n";
    for (const Verdict& v : r.verdicts) h += "<div class=\"verdict\">" + xml_escape(v.message) + "</div>\n";
    if (r.verdicts.empty()) h += "<p>No known signature matches; start from the first failure.</p>\n";
  }
  h += "<h2>Error per layer and tensor kind</h2>\n";
  for (const char* group : {"init", "grads", "params"}) {
    for (int64_t step : {int64_t{0}, focus}) {
      if ((step == 0) != (std::string(group) == "init")) continue;
      const std::string svg = error_chart_svg(r, step, group);
      if (!svg.empty()) h += "<div>" + svg + "</div>\n";
    }
  }
  h += "<h2>All tensors, in data-flow order</h2>\n<table><tr><th>step</th><th class=\"l\">tensor</th><th>rel "
       "L2</th>"
       "<th>tol</th><th>x tol</th><th class=\"l\">basis</th><th>max/max|g|</th><th>max "
       "abs</th><th>cosine</th><th>over tol</th><th class=\"l\">worst "
       "element "
       "(golden, candidate)</th><th>max ulp</th><th class=\"l\">result</th></tr>\n";
  for (size_t i = 0; i < r.entries.size(); ++i) {
    const Entry& e = r.entries[i];
    const bool first = static_cast<int>(i) == r.first_failure;
    h += std::string("<tr class=\"") +
         (first ? "first"
                : (e.status == Status::kFail ? "fail" : (e.status == Status::kNotCompared ? "nc" : ""))) +
         "\">" + cell(std::to_string(e.step)) + cell(short_path(e), true);
    const TensorMetrics& m = e.metrics;
    if (e.status != Status::kNotCompared && e.reason.empty()) {
      std::string index;
      for (int64_t k : m.worst_index) index += (index.empty() ? "" : ", ") + std::to_string(k);
      h += cell(number(m.relative_l2)) + cell(number(e.tolerance.relative_l2, 2)) +
           cell(number(m.tolerance_ratio, 2)) + cell(basis_name(e.basis), true) +
           cell(number(m.max_abs_normalized)) + cell(number(m.max_abs_error)) + cell(number(m.cosine, 10)) +
           cell(std::to_string(m.over_tolerance)) +
           cell("[" + index + "] " + number(m.worst_golden, 6) + ", " + number(m.worst_candidate, 6), true) +
           cell(m.has_ulp ? std::to_string(m.max_ulp) : "-") + cell(status_text(e.status), true);
    } else {
      h += "<td colspan=\"10\"></td>" + cell(status_text(e.status) + ": " + e.reason, true);
    }
    h += "</tr>\n";
  }
  h += "</table>\n";
  if (!r.notes.empty()) {
    h += "<h2>Notes</h2><ul>";
    for (const std::string& n : r.notes) h += "<li>" + xml_escape(n) + "</li>";
    h += "</ul>\n";
  }
  return h + "</body></html>\n";
}

}  // namespace touchstone::diff
