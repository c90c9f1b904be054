// Calendar arithmetic: compute days, calendar days and the end date.
#include "plan/calendar_plan.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ostream>

#include "common/errors.h"
#include "plan/format.h"

namespace touchstone::plan {

namespace {

constexpr double kSecondsPerDay = 86400.0;

std::chrono::sys_days parse_date(const std::string& text) {
  int year = 0;
  unsigned month = 0, day = 0;
  char tail = 0;
  if (text.size() != 10 || std::sscanf(text.c_str(), "%4d-%2u-%2u%c", &year, &month, &day, &tail) != 3) {
    throw InputError("--start-date: \"" + text + "\" is not a date of the form YYYY-MM-DD");
  }
  const std::chrono::year_month_day date{std::chrono::year{year}, std::chrono::month{month},
                                         std::chrono::day{day}};
  if (!date.ok()) throw InputError("--start-date: \"" + text + "\" is not a valid date");
  return std::chrono::sys_days{date};
}

std::string format_time(std::chrono::sys_seconds time) {
  const auto days = std::chrono::floor<std::chrono::days>(time);
  const std::chrono::year_month_day date{days};
  const auto minutes = std::chrono::duration_cast<std::chrono::minutes>(time - days).count();
  char text[64];
  std::snprintf(text, sizeof text, "%04d-%02u-%02u %02lld:%02lld UTC", static_cast<int>(date.year()),
                static_cast<unsigned>(date.month()), static_cast<unsigned>(date.day()),
                static_cast<long long>(minutes / 60), static_cast<long long>(minutes % 60));
  return text;
}

}  // namespace

ThroughputKind parse_throughput_kind(const std::string& name) {
  if (name == "compute") return ThroughputKind::kCompute;
  if (name == "wall-clock") return ThroughputKind::kWallClock;
  throw InputError("--throughput-kind: unknown value \"" + name + "\" (compute or wall-clock)");
}

double parse_efficiency(const std::string& text) {
  const bool percent_sign = !text.empty() && text.back() == '%';
  const double value =
      parse_quantity(percent_sign ? text.substr(0, text.size() - 1) : text, "--calendar-efficiency");
  return percent_sign ? value / 100.0 : value;
}

CalendarPlan plan_calendar(const CalendarInput& in) {
  if (!(in.throughput > 0))
    throw InputError("--throughput: must be > 0 tokens/s, got " + scientific(in.throughput));
  if (!(in.tokens > 0)) throw InputError("--tokens: must be > 0, got " + scientific(in.tokens));
  if (in.tokens_done < 0) throw InputError("--tokens-done: must be >= 0, got " + scientific(in.tokens_done));
  if (in.tokens_done > in.tokens) {
    throw InputError("--tokens-done: " + short_quantity(in.tokens_done) + " is more than --tokens " +
                     short_quantity(in.tokens));
  }
  if (in.kind == ThroughputKind::kWallClock && in.calendar_efficiency) {
    throw InputError(
        "--calendar-efficiency cannot be applied to a --throughput-kind wall-clock throughput: it "
        "already includes the losses, and discounting it again would count them twice");
  }
  if (in.calendar_efficiency && !(*in.calendar_efficiency > 0 && *in.calendar_efficiency <= 1)) {
    throw InputError("--calendar-efficiency: must be in (0, 1] (e.g. 0.9 or 90%), got " +
                     fixed(*in.calendar_efficiency, 4));
  }
  CalendarPlan plan;
  plan.remaining_tokens = in.tokens - in.tokens_done;
  const double days = plan.remaining_tokens / in.throughput / kSecondsPerDay;
  if (in.kind == ThroughputKind::kCompute) {
    plan.compute_days = days;
    plan.efficiency = in.calendar_efficiency.value_or(1.0);
  }
  plan.calendar_days = days / plan.efficiency;
  if (!in.start_date.empty()) {
    const std::chrono::sys_seconds start{parse_date(in.start_date)};
    const auto duration = std::chrono::seconds{std::llround(plan.calendar_days * kSecondsPerDay)};
    plan.start = format_time(start);
    plan.end = format_time(start + duration);
  }
  return plan;
}

void print_calendar(const CalendarInput& in, const CalendarPlan& plan, std::ostream& out) {
  out << "Tokens:              " << short_quantity(in.tokens) << " to train, "
      << short_quantity(in.tokens_done) << " done, " << short_quantity(plan.remaining_tokens)
      << " remaining (" << grouped(plan.remaining_tokens) << ")\n";
  out << "Throughput:          " << short_quantity(in.throughput) << " non-padding tokens/s, measured over "
      << (in.kind == ThroughputKind::kCompute ? "training time only (compute)"
                                              : "whole wall-clock time (losses included)")
      << "\n";
  if (plan.compute_days) {
    out << "Pure compute:        " << fixed(*plan.compute_days, 2) << " days\n";
    if (in.calendar_efficiency) {
      out << "Calendar efficiency: " << percent(plan.efficiency, 0)
          << " of wall-clock time trains (restarts, failures, saves, maintenance take the rest)\n";
    } else {
      out << "Calendar efficiency: not given, 100% assumed: calendar time equals pure compute time\n";
    }
  } else {
    out << "Calendar efficiency: not applied: a wall-clock throughput already includes the losses\n";
  }
  out << "Calendar time:       " << fixed(plan.calendar_days, 2) << " days\n";
  if (!plan.start.empty()) {
    out << "Start:               " << plan.start << "\n";
    out << "End:                 " << plan.end << "\n";
  }
  out << "Trial runs are billed separately: their tokens and days are not part of this run's "
      << short_quantity(in.tokens) << ".\n";
}

}  // namespace touchstone::plan
