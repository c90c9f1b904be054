// The three views of a diff result: the terminal table, JSON with every number, and a self-contained
// HTML page (inline CSS and SVG, nothing fetched) with a chart of the error per layer and tensor kind.
// Each one states the tolerance in force and, when --tolerance was given, that it is an override.
#pragma once

#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>

#include "oracle/diff/diff.h"

namespace touchstone::diff {

// `colour`: ANSI colours (the caller decides: only on a terminal).
void print_table(const DiffResult& result, std::ostream& out, bool colour);

nlohmann::json to_json(const DiffResult& result);

std::string html_report(const DiffResult& result);

// SVG chart of the relative L2 error of one group ("grads", "params", "init") of one step, one series
// per tensor kind over the layers, with the tolerance; empty when the group has no compared tensor.
std::string error_chart_svg(const DiffResult& result, int64_t step, const std::string& group);

// Short texts shared by the views.
std::string status_text(Status status);
std::string short_path(const Entry& entry);        // "grads/output_layer.weight", "loss", "init/<name>"
std::string number(double value, int digits = 3);  // "1.23e-04"; "nan" and "inf" spelled out

}  // namespace touchstone::diff
