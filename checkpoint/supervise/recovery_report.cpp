// JSON, SVG and text forms of the recovery report (see recovery_report.h).
#include "checkpoint/supervise/recovery_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "checkpoint/ledger/ledger_report.h"
#include "common/text_output.h"

namespace touchstone::supervise {

namespace {

using nlohmann::json;

std::string fixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", decimals, value);
  return buffer;
}

std::string end_text(const AttemptRecord& a) {
  switch (a.end) {
    case WaitEnd::kStalled:
      return "stalled (no output line), then " + a.exit.describe();
    case WaitEnd::kInterrupted:
      return "interrupted, " + a.exit.describe();
    case WaitEnd::kExited:
      break;
  }
  return a.exit.success() ? "succeeded" : a.exit.describe();
}

// The failure of `attempt` and what the following attempt (if any) did about it.
struct Failure {
  const AttemptRecord* attempt;
  const AttemptRecord* restart;           // the next launch, or null
  const ledger::AttemptSummary* resumed;  // the next launch's ledger attempt, or null
  double failure_time;                    // the injected failure's time, else the detection time
};

std::vector<Failure> failures(const RecoveryReport& r) {
  std::vector<Failure> list;
  for (size_t i = 0; i < r.attempts.size(); ++i) {
    const AttemptRecord& a = r.attempts[i];
    if (!a.failed()) continue;
    const AttemptRecord* restart = i + 1 < r.attempts.size() ? &r.attempts[i + 1] : nullptr;
    list.push_back(Failure{&a, restart, restart != nullptr ? ledger_attempt(r, *restart) : nullptr,
                           a.injected ? a.injected->time : a.detection_time});
  }
  return list;
}

json optional_number(bool present, double value) { return present ? json(value) : json(); }

json failure_json(const Failure& f) {
  const AttemptRecord& a = *f.attempt;
  json out{
      {"attempt", a.number},
      {"failure_time", f.failure_time},
      {"failure_time_source", a.injected ? "faults.jsonl" : "detection"},
      {"injected_failure",
       a.injected ? json{{"step", a.injected->step}, {"rank", a.injected->rank}, {"phase", a.injected->phase}}
                  : json()},
      {"detection_time", a.detection_time},
      {"stalled", a.end == WaitEnd::kStalled},
      {"exit_status", a.exit.status()},
      {"exit_code", a.exit.signaled ? json() : json(a.exit.code)},
      {"signal", a.exit.signaled ? json(a.exit.signal) : json()},
      {"exit", a.exit.describe()},
      {"detect_s", a.detection_time - f.failure_time},
      {"restart_time", optional_number(f.restart != nullptr, f.restart ? f.restart->launch_time : 0)},
      {"restart_s",
       optional_number(f.restart != nullptr, f.restart ? f.restart->launch_time - f.failure_time : 0)},
      {"ledger_attempt", f.resumed ? json(f.resumed->attempt) : json()},
      {"resumed_from_step", f.resumed ? json(f.resumed->resumed_from_step) : json()},
      {"steps_recomputed", f.resumed ? json(f.resumed->recomputed_steps) : json()},
      {"samples_reread", f.resumed ? json(f.resumed->samples_reread) : json()}};
  const bool stepped = f.resumed != nullptr && f.resumed->steps_recorded > 0;
  out["first_step_after_restart_time"] = optional_number(stepped, stepped ? f.resumed->first_step_time : 0);
  out["recovery_s"] = optional_number(stepped, stepped ? f.resumed->first_step_time - f.failure_time : 0);
  return out;
}

// ---- SVG ----

constexpr double kWidth = 960, kLeft = 230, kRight = 30, kTop = 56, kRow = 36, kBar = 20;

std::string svg_color(const AttemptRecord& a) {
  if (a.end == WaitEnd::kStalled) return "#f39c12";
  if (a.end == WaitEnd::kInterrupted) return "#95a5a6";
  return a.exit.success() ? "#27ae60" : "#c0392b";
}

}  // namespace

const ledger::AttemptSummary* ledger_attempt(const RecoveryReport& report, const AttemptRecord& attempt) {
  if (!report.ledger) return nullptr;
  const size_t index = static_cast<size_t>(attempt.ledger_starts_before);
  const auto& attempts = report.ledger->attempts;
  // The start is written while the launch runs; a launch that died before writing one has none (the
  // next start belongs to a later launch). Same clock, so only rounding needs the small allowance.
  if (index >= attempts.size()) return nullptr;
  const double start = attempts[index].start_time;
  if (start < attempt.launch_time - 0.01 || start > attempt.detection_time + 0.01) return nullptr;
  return &attempts[index];
}

json to_json(const RecoveryReport& r) {
  json attempts = json::array();
  for (const AttemptRecord& a : r.attempts) {
    const ledger::AttemptSummary* l = ledger_attempt(r, a);
    attempts.push_back({{"attempt", a.number},
                        {"command", a.command},
                        {"launch_time", a.launch_time},
                        {"detection_time", a.detection_time},
                        {"outcome", end_text(a)},
                        {"exit_status", a.exit.status()},
                        {"ledger_attempt", l ? json(l->attempt) : json()},
                        {"resumed_from_step", l ? json(l->resumed_from_step) : json()}});
  }
  json failure_list = json::array();
  for (const Failure& f : failures(r)) failure_list.push_back(failure_json(f));
  return {{"command", r.command},
          {"restart_command", r.restart_command.empty() ? json() : json(r.restart_command)},
          {"checkpoint_dir", r.checkpoint_dir.empty() ? json() : json(r.checkpoint_dir)},
          {"max_restarts", r.max_restarts},
          {"stall_timeout_s", r.stall_timeout_s},
          {"kill_grace_s", r.kill_grace_s},
          {"start_time", r.start_time},
          {"end_time", r.end_time},
          {"outcome", r.outcome},
          {"exit_status", r.exit_status},
          {"restarts", r.attempts.empty() ? 0 : static_cast<int>(r.attempts.size()) - 1},
          {"attempts", attempts},
          {"failures", failure_list},
          {"ledger", r.ledger ? ledger::to_json(*r.ledger) : json()},
          {"notes", r.notes}};
}

std::string render_timeline_svg(const RecoveryReport& r) {
  const double span = std::max(r.end_time - r.start_time, 1e-3);
  const double plot = kWidth - kLeft - kRight;
  const auto x = [&](double t) { return fixed(kLeft + (t - r.start_time) / span * plot, 2); };
  const double height = kTop + kRow * static_cast<double>(r.attempts.size()) + 70;
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fixed(kWidth, 0) + "\" height=\"" +
                    fixed(height, 0) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  const std::string title = "touchstone supervise: " + r.outcome + ", " +
                            std::to_string(r.attempts.empty() ? 0 : r.attempts.size() - 1) + " restart(s)";
  svg +=
      "<title>" + xml_escape(title) + "</title>\n<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  svg += "<text x=\"10\" y=\"24\" font-size=\"15\" font-weight=\"bold\">" + xml_escape(title) + "</text>\n";
  const double axis_y = kTop + kRow * static_cast<double>(r.attempts.size()) + 6;
  const double spacing = round_tick_step(span, 8);
  for (double t = 0; t <= span + 1e-9; t += spacing) {
    svg += "<line x1=\"" + x(r.start_time + t) + "\" x2=\"" + x(r.start_time + t) + "\" y1=\"" +
           fixed(kTop - 8, 0) + "\" y2=\"" + fixed(axis_y, 0) + "\" stroke=\"#dddddd\"/>\n<text x=\"" +
           x(r.start_time + t) + "\" y=\"" + fixed(axis_y + 14, 0) + "\" text-anchor=\"middle\">" +
           fixed(t, spacing < 1 ? 1 : 0) + "</text>\n";
  }
  svg += "<text x=\"" + fixed(kLeft + plot / 2, 0) + "\" y=\"" + fixed(axis_y + 32, 0) +
         "\" text-anchor=\"middle\">seconds since the supervisor started</text>\n";
  for (size_t i = 0; i < r.attempts.size(); ++i) {
    const AttemptRecord& a = r.attempts[i];
    const double y = kTop + kRow * static_cast<double>(i);
    const ledger::AttemptSummary* l = ledger_attempt(r, a);
    std::string label = "attempt " + std::to_string(a.number);
    if (l != nullptr)
      label += l->resumed_from_step > 0 ? ", from step " + std::to_string(l->resumed_from_step) : ", fresh";
    svg += "<text x=\"10\" y=\"" + fixed(y + kBar - 5, 0) + "\">" + xml_escape(label) + "</text>\n";
    const std::string tooltip = label + ": " + a.command + "; " + end_text(a) + " after " +
                                fixed(a.detection_time - a.launch_time, 2) + " s";
    svg += "<rect x=\"" + x(a.launch_time) + "\" y=\"" + fixed(y, 0) + "\" width=\"" +
           fixed(std::max(1.0, (a.detection_time - a.launch_time) / span * plot), 2) + "\" height=\"" +
           fixed(kBar, 0) + "\" fill=\"" + svg_color(a) + "\"><title>" + xml_escape(tooltip) +
           "</title></rect>\n";
  }
  for (const Failure& f : failures(r)) {
    const size_t row = static_cast<size_t>(f.attempt - r.attempts.data());
    const double y = kTop + kRow * static_cast<double>(row);
    if (f.attempt->injected) {
      const auto& injected = *f.attempt->injected;
      const std::string text = "injected failure: step " + std::to_string(injected.step) + ", rank " +
                               std::to_string(injected.rank) + ", " + injected.phase;
      svg += "<path d=\"M" + x(f.failure_time) + " " + fixed(y - 4, 0) +
             " l-5 -7 h10 z\" fill=\"#000000\"><title>" + xml_escape(text) + "</title></path>\n";
    }
    svg += "<line x1=\"" + x(f.attempt->detection_time) + "\" x2=\"" + x(f.attempt->detection_time) +
           "\" y1=\"" + fixed(y - 3, 0) + "\" y2=\"" + fixed(y + kBar + 3, 0) +
           "\" stroke=\"#000000\" stroke-width=\"2\"><title>detected</title></line>\n";
    if (f.restart != nullptr) {
      svg += "<line x1=\"" + x(f.attempt->detection_time) + "\" y1=\"" + fixed(y + kBar, 0) + "\" x2=\"" +
             x(f.restart->launch_time) + "\" y2=\"" + fixed(y + kRow, 0) +
             "\" stroke=\"#555555\" stroke-dasharray=\"3,2\"><title>restart</title></line>\n";
    }
  }
  const double legend_y = height - 14;
  double legend_x = 10;
  for (const auto& [color, text] :
       std::vector<std::pair<std::string, std::string>>{{"#27ae60", "succeeded"},
                                                        {"#c0392b", "failed"},
                                                        {"#f39c12", "stalled"},
                                                        {"#95a5a6", "interrupted"}}) {
    svg += "<rect x=\"" + fixed(legend_x, 0) + "\" y=\"" + fixed(legend_y - 10, 0) +
           "\" width=\"12\" height=\"12\" fill=\"" + color + "\"/><text x=\"" + fixed(legend_x + 16, 0) +
           "\" y=\"" + fixed(legend_y, 0) + "\">" + text + "</text>\n";
    legend_x += 110;
  }
  svg += "<text x=\"" + fixed(legend_x, 0) + "\" y=\"" + fixed(legend_y, 0) +
         "\">triangle: injected failure; bar: detection; dashed: restart</text>\n</svg>\n";
  return svg;
}

std::string format_summary(const RecoveryReport& r) {
  std::string text = "touchstone supervise: summary\n";
  for (const AttemptRecord& a : r.attempts) {
    text += "  attempt " + std::to_string(a.number) + ": " + end_text(a) + " after " +
            fixed(a.detection_time - a.launch_time, 2) + " s";
    if (a.injected) {
      text += " (injected failure at step " + std::to_string(a.injected->step) + ", rank " +
              std::to_string(a.injected->rank) + ", " + a.injected->phase + ")";
    }
    if (const ledger::AttemptSummary* l = ledger_attempt(r, a)) {
      text += l->resumed_from_step > 0 ? "; resumed from step " + std::to_string(l->resumed_from_step)
                                       : "; fresh start";
      if (!l->recomputed_steps.empty()) {
        text += ", recomputed steps " + ledger::step_ranges(l->recomputed_steps) + " (" +
                std::to_string(l->samples_reread) + " samples re-read)";
      }
    }
    text += "\n";
  }
  for (const Failure& f : failures(r)) {
    if (f.restart == nullptr) continue;
    text += "  failure of attempt " + std::to_string(f.attempt->number) + ": detected after " +
            fixed(f.attempt->detection_time - f.failure_time, 3) + " s, restarted after " +
            fixed(f.restart->launch_time - f.failure_time, 3) + " s";
    if (f.resumed != nullptr && f.resumed->steps_recorded > 0) {
      text += ", first step again after " + fixed(f.resumed->first_step_time - f.failure_time, 3) + " s";
    }
    text += "\n";
  }
  if (r.ledger) {
    text += "  ledger: " + std::string(r.ledger->passed() ? "check passed" : "check FAILED") + ", steps 1.." +
            std::to_string(r.ledger->last_step) + " of " + std::to_string(r.ledger->target_steps) + ", " +
            std::to_string(r.ledger->steps_recomputed) + " step(s) recomputed, " +
            std::to_string(r.ledger->samples_reread) + " sample(s) re-read\n";
    if (!r.ledger->passed()) text += "  first ledger problem: " + r.ledger->problems.front() + "\n";
  }
  for (const std::string& note : r.notes) text += "  note: " + note + "\n";
  const size_t restarts = r.attempts.empty() ? 0 : r.attempts.size() - 1;
  text += "  outcome: " + r.outcome + " after " + std::to_string(restarts) + " restart(s), exit status " +
          std::to_string(r.exit_status) + "\n";
  return text;
}

}  // namespace touchstone::supervise
