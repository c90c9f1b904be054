// JSON, SVG and text forms of the recovery report (see recovery_report.h).
#include "checkpoint/supervise/recovery_report.h"

#include <algorithm>

#include "checkpoint/ledger/ledger_report.h"
#include "common/markup.h"

namespace touchstone::supervise {

namespace {

using nlohmann::json;

using markup::fixed;

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

// Rows sit on whole pixels; times map to x with two decimals.
constexpr int kWidth = 960, kLeft = 230, kRight = 30, kTop = 56, kRow = 36, kBar = 20;

struct LegendEntry {
  const char* color;
  const char* text;
};
constexpr LegendEntry kLegend[] = {
    {"#27ae60", "succeeded"}, {"#c0392b", "failed"}, {"#f39c12", "stalled"}, {"#95a5a6", "interrupted"}};

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

std::string render_recovery_timeline_svg(const RecoveryReport& r) {
  const double span = std::max(r.end_time - r.start_time, 1e-3);
  const int plot = kWidth - kLeft - kRight;
  const auto x = [&](double t) { return kLeft + (t - r.start_time) / span * plot; };
  const int rows = static_cast<int>(r.attempts.size());
  const int height = kTop + kRow * rows + 70;
  markup::Svg svg(kWidth, height, {{"font-family", "sans-serif"}, {"font-size", 12}}, 2);
  const std::string title = "touchstone supervise: " + r.outcome + ", " +
                            std::to_string(r.attempts.empty() ? 0 : r.attempts.size() - 1) + " restart(s)";
  svg.title(title);
  svg.rect({{"width", "100%"}, {"height", "100%"}, {"fill", "#ffffff"}});
  svg.text({{"x", 10}, {"y", 24}, {"font-size", 15}, {"font-weight", "bold"}}, title);
  const int axis_y = kTop + kRow * rows + 6;
  const markup::LinearAxis axis = markup::linear_axis(span, 8);
  for (const double t : axis.ticks) {
    svg.line({{"x1", x(r.start_time + t)},
              {"x2", x(r.start_time + t)},
              {"y1", kTop - 8},
              {"y2", axis_y},
              {"stroke", "#dddddd"}});
    svg.text({{"x", x(r.start_time + t)}, {"y", axis_y + 14}, {"text-anchor", "middle"}},
             fixed(t, axis.step < 1 ? 1 : 0));
  }
  svg.text({{"x", kLeft + plot / 2}, {"y", axis_y + 32}, {"text-anchor", "middle"}},
           "seconds since the supervisor started");
  for (int i = 0; i < rows; ++i) {
    const AttemptRecord& a = r.attempts[static_cast<size_t>(i)];
    const int y = kTop + kRow * i;
    const ledger::AttemptSummary* l = ledger_attempt(r, a);
    std::string label = "attempt " + std::to_string(a.number);
    if (l != nullptr)
      label += l->resumed_from_step > 0 ? ", from step " + std::to_string(l->resumed_from_step) : ", fresh";
    svg.text({{"x", 10}, {"y", y + kBar - 5}}, label);
    svg.rect({{"x", x(a.launch_time)},
              {"y", y},
              {"width", std::max(1.0, (a.detection_time - a.launch_time) / span * plot)},
              {"height", kBar},
              {"fill", svg_color(a)}},
             label + ": " + a.command + "; " + end_text(a) + " after " +
                 fixed(a.detection_time - a.launch_time, 2) + " s");
  }
  for (const Failure& f : failures(r)) {
    const int y = kTop + kRow * static_cast<int>(f.attempt - r.attempts.data());
    if (f.attempt->injected) {
      const auto& injected = *f.attempt->injected;
      svg.path({{"d", "M" + svg.number(x(f.failure_time)) + " " + std::to_string(y - 4) + " l-5 -7 h10 z"},
                {"fill", "#000000"}},
               "injected failure: step " + std::to_string(injected.step) + ", rank " +
                   std::to_string(injected.rank) + ", " + injected.phase);
    }
    const double detected = x(f.attempt->detection_time);
    svg.line({{"x1", detected},
              {"x2", detected},
              {"y1", y - 3},
              {"y2", y + kBar + 3},
              {"stroke", "#000000"},
              {"stroke-width", 2}},
             "detected");
    if (f.restart != nullptr) {
      svg.line({{"x1", detected},
                {"y1", y + kBar},
                {"x2", x(f.restart->launch_time)},
                {"y2", y + kRow},
                {"stroke", "#555555"},
                {"stroke-dasharray", "3,2"}},
               "restart");
    }
  }
  const int legend_y = height - 14;
  int legend_x = 10;
  for (const auto& [color, text] : kLegend) {
    svg.rect({{"x", legend_x}, {"y", legend_y - 10}, {"width", 12}, {"height", 12}, {"fill", color}});
    svg.text({{"x", legend_x + 16}, {"y", legend_y}}, text);
    legend_x += 110;
  }
  svg.text({{"x", legend_x}, {"y", legend_y}}, "triangle: injected failure; bar: detection; dashed: restart");
  return svg.str();
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
