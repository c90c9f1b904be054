// `touchstone plan calendar`: the acceptance calendar, the refusal to discount a wall-clock throughput
// twice, and input errors.
#include <gtest/gtest.h>

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
  in.start_date = "2025-01-06";
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
  EXPECT_EQ(error_of(in), "--throughput: must be > 0 tokens/s, got -1.6e6");
  in = acceptance();
  in.tokens_done = 11e12;
  EXPECT_EQ(error_of(in), "--tokens-done: 11T is more than --tokens 10T");
  in = acceptance();
  in.calendar_efficiency = 1.5;
  EXPECT_NE(error_of(in).find("must be in (0, 1]"), std::string::npos);
  in = acceptance();
  in.start_date = "2025-02-30";
  EXPECT_EQ(error_of(in), "--start-date: \"2025-02-30\" is not a valid date");
  in.start_date = "06/01/2025";
  EXPECT_NE(error_of(in).find("YYYY-MM-DD"), std::string::npos);
  EXPECT_EQ(parse_efficiency("90%"), 0.9);
  EXPECT_EQ(parse_efficiency("0.9"), 0.9);
  EXPECT_THROW(parse_throughput_kind("measured"), InputError);
}

}  // namespace
}  // namespace touchstone::plan
