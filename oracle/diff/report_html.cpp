// The HTML view: one self-contained page (inline CSS and SVG, no scripts, nothing fetched), so it can be
// attached to a bug report or archived with a CI run.
#include "common/markup.h"
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

// One row of the summary table at the top: a name and its value.
void info_row(markup::Html& page, const std::string& name, const std::string& value) {
  page.raw("<tr>").element("th", name, "l").element("td", value, "l").raw("</tr>");
}

std::string joined(const std::vector<int64_t>& index) {
  std::string text;
  for (int64_t i : index) text += (text.empty() ? "" : ", ") + std::to_string(i);
  return text;
}

// The row of one tensor in the table of all tensors.
void tensor_row(markup::Html& page, const Entry& e, bool first) {
  const char* row_class = first                              ? "first"
                          : e.status == Status::kFail        ? "fail"
                          : e.status == Status::kNotCompared ? "nc"
                                                             : "";
  page.raw(std::string("<tr class=\"") + row_class + "\">");
  const auto cell = [&](const std::string& text) { page.element("td", text); };
  const auto left_cell = [&](const std::string& text) { page.element("td", text, "l"); };
  cell(std::to_string(e.step));
  left_cell(short_path(e));
  const TensorMetrics& m = e.metrics;
  if (e.status != Status::kNotCompared && e.reason.empty()) {
    cell(number(m.relative_l2));
    cell(number(e.tolerance.relative_l2, 2));
    cell(number(m.tolerance_ratio, 2));
    left_cell(basis_name(e.basis));
    cell(number(m.max_abs_normalized));
    cell(number(m.max_abs_error));
    cell(number(m.cosine, 10));
    cell(std::to_string(m.over_tolerance));
    left_cell("[" + joined(m.worst_index) + "] " + number(m.worst_golden, 6) + ", " +
              number(m.worst_candidate, 6));
    cell(m.has_ulp ? std::to_string(m.max_ulp) : "-");
    left_cell(status_text(e.status));
  } else {
    page.raw("<td colspan=\"10\"></td>");
    left_cell(status_text(e.status) + ": " + e.reason);
  }
  page.raw("</tr>\n");
}

}  // namespace

std::string html_report(const DiffResult& r) {
  markup::Html h("touchstone diff", kStyle);
  h.raw("<h1>touchstone diff: ");
  if (r.exit_status() == 0) {
    h.element("span", "all compared tensors pass", "pass");
  } else if (r.count(Status::kFail) == 0) {
    h.element("span", r.replicas_disagree.empty() ? "partial candidate" : "replicas disagree", "fail");
  } else {
    h.element("span", std::to_string(r.count(Status::kFail)) + " tensors fail", "fail");
  }
  h.raw("</h1>\n<table class=\"info\">");
  info_row(h, "golden", r.golden_path + " (precision " + r.golden_precision + ")");
  info_row(h, "candidate",
           r.candidate_path + " (" + r.candidate_format +
               (r.candidate_generator.empty() ? "" : ", " + r.candidate_generator) + ")");
  info_row(h, "tolerance", r.tolerance_text);
  info_row(h, "judged", r.judgment);
  info_row(h, "result",
           std::to_string(r.count(Status::kPass)) + " pass, " + std::to_string(r.count(Status::kFail)) +
               " fail, " + std::to_string(r.count(Status::kNotCompared)) + " not compared");
  h.raw("</table>\n");
  if (r.tolerance_override) {
    h.element("div",
              "The tolerance was overridden on the command line (" + number(*r.tolerance_override) +
                  " for every tensor); the golden file's tolerance model is " + r.tolerance_model + ".",
              "override")
        .raw("\n");
  }
  for (const std::string& part : r.partial)
    h.element("div", "Partial candidate: " + part, "override").raw("\n");
  for (const std::string& copy : r.replicas_disagree)
    h.element("div", "Replicas disagree: " + copy, "override").raw("\n");
  int64_t focus = r.entries.empty() ? 0 : r.entries.back().step;
  if (r.first_failure >= 0) {
    const Entry& first = r.entries[static_cast<size_t>(r.first_failure)];
    focus = first.step;
    h.raw("<h2>First failure</h2><p>").element("code", first.path);
    if (first.reason.empty() && first.metrics.numel > 0) {
      const std::string index = joined(first.metrics.worst_index);
      h.text(": relative L2 " + number(first.metrics.relative_l2) +
             (index.empty() ? std::string(", golden ") : ", worst element [" + index + "] golden ") +
             number(first.metrics.worst_golden, 10) + ", candidate " +
             number(first.metrics.worst_candidate, 10));
    } else {
      h.text(": " + first.reason);
    }
    h.raw("</p>\n<h2>Verdict</h2>\n");
    for (const Verdict& v : r.verdicts) h.element("div", v.message, "verdict").raw("\n");
    if (r.verdicts.empty()) h.raw("<p>No known signature matches; start from the first failure.</p>\n");
  }
  h.raw("<h2>Error per layer and tensor kind</h2>\n");
  for (const char* group : {"init", "grads", "params"}) {
    for (int64_t step : {int64_t{0}, focus}) {
      if ((step == 0) != (std::string(group) == "init")) continue;
      const std::string svg = error_chart_svg(r, step, group);
      if (!svg.empty()) h.raw("<div>" + svg + "</div>\n");
    }
  }
  h.raw(
      "<h2>All tensors, in data-flow order</h2>\n<table><tr><th>step</th><th class=\"l\">tensor</th><th>rel "
      "L2</th><th>tol</th><th>x tol</th><th class=\"l\">basis</th><th>max/max|g|</th><th>max "
      "abs</th><th>cosine</th><th>over tol</th><th class=\"l\">worst element (golden, candidate)</th><th>max "
      "ulp</th><th class=\"l\">result</th></tr>\n");
  for (size_t i = 0; i < r.entries.size(); ++i)
    tensor_row(h, r.entries[i], static_cast<int>(i) == r.first_failure);
  h.raw("</table>\n");
  if (!r.notes.empty()) {
    h.raw("<h2>Notes</h2><ul>");
    for (const std::string& n : r.notes) h.element("li", n);
    h.raw("</ul>\n");
  }
  return h.str();
}

}  // namespace touchstone::diff
