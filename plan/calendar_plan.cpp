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

CalendarPlan plan_calendar(const CalendarInput& in) {
  if (!(in.throughput > 0))
    throw InputError("throughput: must be > 0 tokens/s, got " + scientific(in.throughput));
  if (!(in.tokens > 0)) throw InputError("tokens to train: must be > 0, got " + scientific(in.tokens));
  if (in.tokens_done < 0) throw InputError("tokens done: must be >= 0, got " + scientific(in.tokens_done));
  if (in.tokens_done > in.tokens) {
    throw InputError("tokens done: " + short_quantity(in.tokens_done) + " is more than the " +
                     short_quantity(in.tokens) + " tokens to train");
  }
  if (in.kind == ThroughputKind::kWallClock && in.calendar_efficiency) {
    throw InputError(
        "a calendar efficiency cannot be applied to a wall-clock throughput: it already includes the "
        "losses, and discounting it again would count them twice");
  }
  if (in.calendar_efficiency && !(*in.calendar_efficiency > 0 && *in.calendar_efficiency <= 1)) {
    throw InputError("calendar efficiency: must be in (0, 1], got " + fixed(*in.calendar_efficiency, 4));
  }
  CalendarPlan plan;
  plan.remaining_tokens = in.tokens - in.tokens_done;
  const double days = plan.remaining_tokens / in.throughput / kSecondsPerDay;
  if (in.kind == ThroughputKind::kCompute) {
    plan.compute_days = days;
    plan.efficiency = in.calendar_efficiency.value_or(1.0);
  }
  plan.calendar_days = days / plan.efficiency;
  if (in.start_date) {
    const std::chrono::sys_seconds start{*in.start_date};
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
