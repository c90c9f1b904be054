// `touchstone plan calendar`: the acceptance calendar, the refusal to discount a wall-clock throughput
// twice, and input errors. Parsing the flags, and the errors that name them, are the command line's
// (tests/cli/test_plan_cli.py).
#include <gtest/gtest.h>

#include <chrono>
#include <sstream>

#include "common/errors.h"
#include "plan/calendar_plan.h"
#include "plan/format.h"

namespace touchstone::plan {
namespace {

CalendarInput acceptance() {
  CalendarInput in;
  in.tokens = 10e12;
  in.throughput = 1.6e6;
  in.kind = ThroughputKind::kCompute;
  in.calendar_efficiency = 0.9;
  in.start_date = std::chrono::sys_days{std::chrono::year{2025} / 1 / 6};
  return in;
}

TEST(PlanCalendar, AcceptanceNumbers) {
  const CalendarInput in = acceptance();
  const CalendarPlan plan = plan_calendar(in);
  ASSERT_TRUE(plan.compute_days.has_value());
  EXPECT_EQ(fixed(*plan.compute_days, 2), "72.34");
  EXPECT_EQ(fixed(plan.calendar_days, 2), "80.38");
  EXPECT_DOUBLE_EQ(*plan.compute_days, 10e12 / 1.6e6 / 86400);
  EXPECT_EQ(plan.start, "2025-01-06 00:00 UTC");
  EXPECT_EQ(plan.end, "2025-03-27 09:00 UTC");  // + 80.3755 days
  std::ostringstream out;
  print_calendar(in, plan, out);
  for (const char* text : {"72.34 days", "80.38 days", "90%", "Trial runs are billed separately"}) {
    EXPECT_NE(out.str().find(text), std::string::npos) << text;
  }
}

TEST(PlanCalendar, TokensDoneAreNotTrainedAgain) {
  CalendarInput in = acceptance();
  in.tokens_done = 2.5e12;
  const CalendarPlan plan = plan_calendar(in);
  EXPECT_DOUBLE_EQ(plan.remaining_tokens, 7.5e12);
  EXPECT_DOUBLE_EQ(*plan.compute_days, 7.5e12 / 1.6e6 / 86400);
}

TEST(PlanCalendar, WallClockThroughputIsNeverDiscountedTwice) {
  CalendarInput in = acceptance();
  in.kind = ThroughputKind::kWallClock;
  EXPECT_THROW(plan_calendar(in), InputError);
  in.calendar_efficiency.reset();
  const CalendarPlan plan = plan_calendar(in);
  EXPECT_FALSE(plan.compute_days.has_value());
  EXPECT_EQ(plan.efficiency, 1.0);
  EXPECT_EQ(fixed(plan.calendar_days, 2), "72.34");
}

std::string error_of(const CalendarInput& in) {
  try {
    plan_calendar(in);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(PlanCalendar, InvalidInputsAreInputErrors) {
  CalendarInput in = acceptance();
  in.throughput = -1.6e6;
  EXPECT_EQ(error_of(in), "throughput: must be > 0 tokens/s, got -1.6e6");
  in = acceptance();
  in.tokens = 0;
  EXPECT_EQ(error_of(in), "tokens to train: must be > 0, got 0");
  in = acceptance();
  in.tokens_done = 11e12;
  EXPECT_EQ(error_of(in), "tokens done: 11T is more than the 10T tokens to train");
  in = acceptance();
  in.calendar_efficiency = 1.5;
  EXPECT_NE(error_of(in).find("must be in (0, 1]"), std::string::npos);
  in.calendar_efficiency = 0.0;
  EXPECT_EQ(error_of(in), "calendar efficiency: must be in (0, 1], got 0.0000");
}

// 10T tokens at 1.6 tokens/s are 72,337,962.96 days, about 198,054 years: past the last printable date
// the end is refused, never wrapped into some year (std::chrono's years stop at 32767); without a start
// date the days alone are the plan.
TEST(PlanCalendar, EndDatesPastTheYear9999AreRefused) {
  CalendarInput in = acceptance();
  in.throughput = 1.6;
  in.calendar_efficiency.reset();
  EXPECT_EQ(error_of(in),
            "end date: 72337962.96 calendar days from 2025-01-06 00:00 UTC end past 9999-12-31, the last "
            "date a calendar prints (without a start date the plan gives the days alone)");
  in.throughput = 1;
  EXPECT_NE(error_of(in).find("end past 9999-12-31"), std::string::npos);
  in.start_date.reset();
  EXPECT_EQ(fixed(plan_calendar(in).calendar_days, 2), "115740740.74");
  // The last day still prints.
  in = acceptance();
  in.start_date = std::chrono::sys_days{std::chrono::year{9999} / 12 / 31};
  in.calendar_efficiency.reset();
  in.tokens = 1.6e6 * 86400 * 0.5;
  EXPECT_EQ(plan_calendar(in).end, "9999-12-31 12:00 UTC");
  in.tokens = 1.6e6 * 86400;
  EXPECT_NE(error_of(in).find("end past 9999-12-31"), std::string::npos);
}

// Counts are printed digit by digit: past 2^53 a double holds no exact count, and a tiny throughput
// makes the days overflow.
TEST(PlanCalendar, CountsAndDaysBeyondExactDoublesAreRefused) {
  CalendarInput in = acceptance();
  in.start_date.reset();
  in.tokens = 1e308;
  in.throughput = 1;
  EXPECT_EQ(error_of(in), "tokens to train: 1e308 is more than 9.007199254740992e15");
  in = acceptance();
  in.throughput = 1e-310;
  EXPECT_EQ(error_of(in).rfind("calendar time: the remaining tokens over the throughput take inf days", 0),
            0u)
      << error_of(in);
  in = acceptance();
  in.calendar_efficiency = 1e-300;
  EXPECT_NE(error_of(in).find("more than 2^53"), std::string::npos);
}

}  // namespace
}  // namespace touchstone::plan
