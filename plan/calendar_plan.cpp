// Calendar arithmetic: compute days, calendar days and the end date.
#include "plan/calendar_plan.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ostream>

#include "common/errors.h"
#include "plan/checked.h"
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

// The end of `days` from `start`, refused past 9999-12-31 23:59 UTC: the last time a four-digit year
// prints (std::chrono's years stop at 32767 and would wrap; a plan that long has no meaningful date).
std::string end_time(std::chrono::sys_days start, double calendar_days) {
  using namespace std::chrono;
  const sys_days last_day{year{9999} / December / 31};
  const auto seconds_left = static_cast<double>(duration_cast<seconds>(last_day + days{1} - start).count());
  const double duration_s = std::round(calendar_days * kSecondsPerDay);
  if (!(duration_s < seconds_left)) {
    throw InputError("end date: " + fixed(calendar_days, 2) + " calendar days from " +
                     format_time(sys_seconds{start}) +
                     " end past 9999-12-31, the last date a calendar prints (without a start date the plan "
                     "gives the days alone)");
  }
  const int64_t whole_s =
      checked_integer(duration_s, 0, static_cast<int64_t>(seconds_left), "calendar time in seconds");
  return format_time(sys_seconds{start} + seconds{whole_s});
}

}  // namespace

CalendarPlan plan_calendar(const CalendarInput& in) {
  if (!(in.throughput > 0))
    throw InputError("throughput: must be > 0 tokens/s, got " + scientific(in.throughput));
  if (!(in.tokens > 0)) throw InputError("tokens to train: must be > 0, got " + scientific(in.tokens));
  if (in.tokens_done < 0) throw InputError("tokens done: must be >= 0, got " + scientific(in.tokens_done));
  // Token counts are printed digit by digit: past 2^53 a double no longer holds them exactly.
  checked_finite(in.tokens, kMaxExactCount, "tokens to train");
  checked_finite(in.throughput, kMaxExactCount, "throughput");
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
  // A tiny throughput or efficiency makes the days overflow, or grow past what prints as a count.
  if (!(plan.calendar_days <= kMaxExactCount)) {
    throw InputError("calendar time: the remaining tokens over the throughput take " +
                     scientific(plan.calendar_days) + " days, more than 2^53");
  }
  if (in.start_date) {
    plan.start = format_time(std::chrono::sys_seconds{*in.start_date});
    plan.end = end_time(*in.start_date, plan.calendar_days);
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
