// `touchstone plan calendar`: how long the remaining tokens take. Pure compute time is tokens over a
// throughput measured over training time only; calendar time divides it by the calendar efficiency
// (the share of wall-clock time spent training: restarts, failures, saves, maintenance). A throughput
// measured over whole wall-clock time already contains those losses and is never discounted again.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>

namespace touchstone::plan {

enum class ThroughputKind {
  kCompute,    // measured over steady-state training time only
  kWallClock,  // measured over whole wall-clock time, losses included
};

struct CalendarInput {
  double tokens = 0;       // the main run's total
  double tokens_done = 0;  // already trained
  double throughput = 0;   // non-padding tokens/s
  ThroughputKind kind = ThroughputKind::kCompute;
  std::optional<double> calendar_efficiency;        // (0, 1]; only with a compute throughput
  std::optional<std::chrono::sys_days> start_date;  // 00:00 UTC of that day; none: no end date
};

struct CalendarPlan {
  double remaining_tokens = 0;
  std::optional<double> compute_days;  // unknown for a wall-clock throughput
  double efficiency = 1.0;             // the factor applied (1 for a wall-clock throughput)
  double calendar_days = 0;
  std::string start, end;  // "YYYY-MM-DD HH:MM UTC"; empty without a start date
};

// Throws InputError for a non-positive throughput or token count, more tokens done than planned, an
// efficiency outside (0, 1], or an efficiency given with a wall-clock throughput.
CalendarPlan plan_calendar(const CalendarInput& input);

void print_calendar(const CalendarInput& input, const CalendarPlan& plan, std::ostream& out);

}  // namespace touchstone::plan
