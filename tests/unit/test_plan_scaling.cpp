// `touchstone plan scaling`: the stage-4 acceptance numbers, the bubbles of 1F1B, interleaved 1F1B and
// ZB-H1 against the schedule simulator, the comparability warnings, CSV errors naming the line, and the
// number formatting the acceptance digits depend on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "common/errors.h"
#include "parallel/pipeline/schedule.h"
#include "plan/format.h"
#include "plan/scaling_plan.h"

namespace touchstone::plan {
namespace {

const std::string kHeader = std::string(kScalingCsvHeader) + "\n";

// The rows of docs/examples/scaling_acceptance.csv.
const std::string kAcceptance = kHeader +
                                "512,8,8,8,1920,1,1800.0,3512.0,20,308160000,0,1\n"
                                "1024,8,8,16,1920,1,1500.0,2463.0,20,308160000,0,1\n"
                                "2560,8,8,40,1920,1,1200.0,1616.0,20,308160000,0,1\n"
                                "5120,8,8,80,1920,1,1200.0,1430.0,20,308160000,0,1\n";

TEST(PlanScaling, Stage4AcceptanceNumbers) {
  const ScalingTable table = scaling_table(parse_scaling_csv(kAcceptance, "runs.csv"));
  ASSERT_EQ(table.rows.size(), 4u);
  std::vector<int64_t> dp, micro_batches;
  for (const ScalingRow& row : table.rows) {
    dp.push_back(row.run.dp);
    micro_batches.push_back(row.micro_batches);
  }
  EXPECT_EQ(dp, (std::vector<int64_t>{8, 16, 40, 80}));
  EXPECT_EQ(micro_batches, (std::vector<int64_t>{240, 120, 48, 24}));
  EXPECT_EQ(grouped(table.rows[0].tokens_per_s), "180,000");
  EXPECT_EQ(grouped(table.rows[1].tokens_per_s), "320,000");
  EXPECT_EQ(fixed(table.rows[1].speedup, 2) + "x", "1.78x");
  EXPECT_EQ(percent(table.rows[1].efficiency, 0), "89%");
  EXPECT_DOUBLE_EQ(table.rows[0].bubble, 7.0 / 247.0);  // (p - 1) / (m + p - 1)
  EXPECT_DOUBLE_EQ(table.rows[3].bubble, 7.0 / 31.0);
  ASSERT_TRUE(table.rows[0].interleaved_bubble && table.rows[0].zero_bubble_h1_bubble);
  EXPECT_DOUBLE_EQ(*table.rows[0].interleaved_bubble, 7.0 / 487.0);     // (p - 1) / (v m + p - 1), v = 2
  EXPECT_DOUBLE_EQ(*table.rows[0].zero_bubble_h1_bubble, 7.0 / 727.0);  // (p - 1) / (3m + p - 1)
  EXPECT_TRUE(table.warnings.empty());
  std::ostringstream out;
  print_scaling_table(table, out);
  for (const char* text :
       {"180,000", "320,000", "1.78x", "89%", " 240 ", " 120 ", " 48 ", " 24 ", " 2.8%    1.4%    1.0% "}) {
    EXPECT_NE(out.str().find(text), std::string::npos) << text;
  }
  const std::string svg = scaling_chart_svg(table);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("89%"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

// The idle share of the step in the schedule simulator (pipeline/schedule.h), with the costs the
// table's formulas assume: a whole stage's forward 1 and backward 2, each chunk 1/v of that, and the
// split backward's halves 1 each.
double simulated_bubble(const std::vector<std::vector<pipeline::Action>>& lists,
                        const pipeline::UnitCosts& costs, double work) {
  const pipeline::SimulationResult result = pipeline::simulate_schedules(lists, costs);
  EXPECT_TRUE(result.completed);
  double end = 0.0;
  for (const auto& row : result.timeline) {
    for (const pipeline::TimelineEvent& event : row) end = std::max(end, event.end_seconds);
  }
  return (end - work) / end;
}

TEST(PlanScaling, BubblesAreTheSimulatedIdleShareOfEverySchedule) {
  for (int pp = 1; pp <= 8; ++pp) {
    for (int m = 1; m <= 24; ++m) {
      for (int v = 2; v <= 3; ++v) {
        const std::string csv = kHeader + std::to_string(pp) + ",1," + std::to_string(pp) + ",1," +
                                std::to_string(m) + ",1,0,10,1,1000,0,1\n";
        const ScalingRow row = scaling_table(parse_scaling_csv(csv, "runs.csv"), v).rows.at(0);
        const std::string layout =
            "pp" + std::to_string(pp) + " m" + std::to_string(m) + " v" + std::to_string(v);
        ASSERT_EQ(row.micro_batches, m) << layout;
        // Rounding: a few hundred additions of 1/v in the simulation, well under 1e-12 relative.
        const double work = 3.0 * m;
        EXPECT_NEAR(
            row.bubble,
            simulated_bubble(pipeline::build_all_schedules(PipelineSchedule::kOneForwardOneBackward, pp, m),
                             {}, work),
            1e-12)
            << layout;
        std::vector<std::vector<pipeline::Action>> interleaved, zero_bubble;
        for (int s = 0; s < pp; ++s) zero_bubble.push_back(pipeline::build_zero_bubble_h1_schedule(pp, s, m));
        try {
          for (int s = 0; s < pp; ++s)
            interleaved.push_back(pipeline::build_interleaved_schedule(pp, v, s, m));
        } catch (const std::invalid_argument&) {
          interleaved.clear();  // Megatron-LM refuses this m; so does the table
        }
        ASSERT_EQ(row.interleaved_bubble.has_value(), !interleaved.empty()) << layout;
        if (row.interleaved_bubble) {
          pipeline::UnitCosts chunk;
          chunk.forward = 1.0 / v;
          chunk.backward = 2.0 / v;
          EXPECT_NEAR(*row.interleaved_bubble, simulated_bubble(interleaved, chunk, work), 1e-12) << layout;
        }
        const double zero_bubble_simulated = simulated_bubble(zero_bubble, {}, work);
        ASSERT_EQ(row.zero_bubble_h1_bubble.has_value(), m >= pp) << layout;
        if (row.zero_bubble_h1_bubble) {
          EXPECT_NEAR(*row.zero_bubble_h1_bubble, zero_bubble_simulated, 1e-12) << layout;
        } else {
          EXPECT_LE(zero_bubble_simulated, row.bubble)
              << layout;  // short of the formula, never worse than 1F1B
        }
      }
    }
  }
  EXPECT_THROW(scaling_table(parse_scaling_csv(kAcceptance, "runs.csv"), 1), InputError);
  EXPECT_THROW(scaling_table(parse_scaling_csv(kAcceptance, "runs.csv"), kMaxVirtualStages + 1), InputError);
}

TEST(PlanScaling, ReferenceIsTheSmallestRunWhateverTheOrder) {
  const std::string reversed = kHeader +
                               "1024,8,8,16,1920,1,1500.0,2463.0,20,308160000,0,1\n"
                               "512,8,8,8,1920,1,1800.0,3512.0,20,308160000,0,1\n";
  const ScalingTable table = scaling_table(parse_scaling_csv(reversed, "runs.csv"));
  EXPECT_EQ(table.rows[0].run.gpus, 512);
  EXPECT_EQ(table.rows[0].run.line, 3);
  EXPECT_EQ(percent(table.rows[1].efficiency, 0), "89%");
}

std::vector<std::string> warnings_of(const std::string& rows) {
  return scaling_table(parse_scaling_csv(kHeader + rows, "runs.csv")).warnings;
}

bool has(const std::vector<std::string>& warnings, const std::string& text) {
  for (const std::string& w : warnings) {
    if (w.find(text) != std::string::npos) return true;
  }
  return false;
}

TEST(PlanScaling, WarnsWhenWindowsAreNotComparable) {
  const std::string base = "512,8,8,8,1920,1,1800,3512,20,308160000,0,1\n";
  EXPECT_TRUE(has(warnings_of(base + "1024,8,8,16,1920,1,0,1130,20,308160000,0,0\n"),
                  "cold start mixed with steady state: the windows of 1024 GPUs"));
  EXPECT_TRUE(has(
      warnings_of("512,8,8,8,1920,1,0,1800,20,308160000,0,0\n1024,8,8,16,1920,1,0,900,20,308160000,0,0\n"),
      "no window excludes start-up"));
  EXPECT_TRUE(has(warnings_of(base + "1024,8,8,16,1920,1,1500,2500,20,308160000,1,1\n"),
                  "checkpoint saves fall inside the window of 1024 GPUs only"));
  EXPECT_TRUE(
      has(warnings_of(base + "1024,8,8,16,960,1,1500,2463,40,308160000,0,1\n"), "different global batch"));
  EXPECT_TRUE(
      has(warnings_of(base + "1024,8,8,16,1920,1,1500,3426,40,616320000,0,1\n"), "different windows"));
  EXPECT_TRUE(
      has(warnings_of(base + "1024,8,8,16,1920,1,1500,2463,20,300000000,0,1\n"), "tokens per update differ"));
  EXPECT_TRUE(has(warnings_of(base), "only one run"));
}

std::string error_of(const std::string& text) {
  try {
    parse_scaling_csv(text, "runs.csv");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(PlanScaling, MalformedRowsNameTheLine) {
  const std::string ok = "512,8,8,8,1920,1,1800,3512,20,308160000,0,1\n";
  EXPECT_EQ(error_of(kHeader + ok + "1024,8,8,x,1920,1,1500,2463,20,308160000,0,1\n"),
            "runs.csv:3: column dp: \"x\" is not an integer");
  EXPECT_EQ(error_of(kHeader + "# comment\n\n" + ok + "1024,8,8,16,1920\n"),
            "runs.csv:5: expected 12 comma-separated fields, found 5");
  EXPECT_EQ(error_of(kHeader + "1000,8,8,16,1920,1,1500,2463,20,308160000,0,1\n"),
            "runs.csv:2: gpus 1000 is not tp x pp x dp = 8 x 8 x 16 = 1024");
  EXPECT_EQ(error_of(kHeader + "448,8,8,7,1920,1,1500,2463,20,308160000,0,1\n"),
            "runs.csv:2: global_batch 1920 is not divisible by dp x micro_batch = 7 x 1 = 7");
  EXPECT_EQ(error_of(kHeader + "512,8,8,8,1920,1,1800,1800,20,308160000,0,1\n"),
            "runs.csv:2: window_end_s 1800 is not after window_start_s 1800");
  EXPECT_EQ(error_of(kHeader + "512,8,8,8,1920,1,1800,3512,20,308160000,maybe,1\n"),
            "runs.csv:2: column checkpoint_in_window: \"maybe\" is not 0/1, true/false or yes/no");
  EXPECT_EQ(error_of(kHeader + "512,8,8,8,1920,1,-5,3512,20,308160000,0,1\n"),
            "runs.csv:2: column window_start_s: -5 must be >= 0");
  EXPECT_NE(error_of("gpus,tp\n" + ok).find("runs.csv:1: the header must be exactly gpus,tp,pp,dp"),
            std::string::npos);
  EXPECT_EQ(error_of(kHeader), "runs.csv: no runs after the header");
}

// Sizes past any cluster are refused before tp x pp x dp or dp x micro_batch is formed, so the
// products the checks print cannot overflow int64.
TEST(PlanScaling, RefusesSizesWhoseProductsWouldOverflow) {
  EXPECT_EQ(error_of(kHeader + "1,4194304,4194304,4194304,1920,1,1800,3512,20,308160000,0,1\n"),
            "runs.csv:2: column tp: 4194304 must be <= 1048576");
  EXPECT_EQ(error_of(kHeader + "512,8,8,8,1920,2199023255553,1800,3512,20,308160000,0,1\n"),
            "runs.csv:2: column micro_batch: 2199023255553 must be <= 1099511627776");
  EXPECT_EQ(error_of(kHeader + "512,8,8,8,1920,1,1800,3512,9223372036854775807,308160000,0,1\n"),
            "runs.csv:2: column updates: 9223372036854775807 must be <= 1099511627776");
}

// Counts and rates past 2^53, where a double holds no exact count, are refused: they would print as
// digits no one measured (a wrapped integer, before).
TEST(PlanScaling, RefusesCountsAndRatesPastExactDoubles) {
  EXPECT_EQ(error_of(kHeader + "512,8,8,8,1920,1,1800,3512,20,1e30,0,1\n"),
            "runs.csv:2: column tokens: 1e30 must be <= 2^53 (9007199254740992)");
  EXPECT_EQ(error_of(kHeader + "512,8,8,8,1920,1,0,1e-300,20,308160000,0,1\n"),
            "runs.csv:2: tokens / (window_end_s - window_start_s) = inf tokens/s, more than 2^53: the "
            "window is too short for its tokens");
  EXPECT_EQ(error_of(kHeader + "512,8,8,8,1920,1,0,1e300,20,308160000,0,1\n"),
            "runs.csv:2: column window_end_s: 1e300 must be <= 2^53 (9007199254740992)");
  EXPECT_EQ(error_of(kHeader + "512,8,8,8,1920,1,1800,3512,20,0.5,0,1\n"),
            "runs.csv:2: column tokens: must be >= 1");
  // At the bounds every printed number is a finite count.
  std::ostringstream out;
  print_scaling_table(
      scaling_table(parse_scaling_csv(kHeader + "512,8,8,8,1920,1,0,9007199254740992,20,1,0,1\n"
                                                "1024,8,8,16,1920,1,0,1,20,9007199254740992,0,1\n",
                                      "runs.csv")),
      out);
  EXPECT_EQ(out.str().find('-' + std::string("9,")), std::string::npos) << out.str();
  EXPECT_EQ(out.str().find("inf"), std::string::npos) << out.str();
  EXPECT_EQ(out.str().find("nan"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("9,007,199,254,740,992"), std::string::npos) << out.str();
}

// The cp column (after tp): the layout's GPUs include the context-parallel ranks, which split every
// sequence and so leave m (micro-batches per replica) and the bubbles as they are; the table gains a CP
// column.
TEST(PlanScaling, ContextParallelColumn) {
  const std::string header = std::string(kScalingCsvHeaderWithCp) + "\n";
  const ScalingTable table =
      scaling_table(parse_scaling_csv(header + "1024,8,2,8,8,1920,1,1800.0,3512.0,20,308160000,0,1\n"
                                               "2048,8,2,8,16,1920,1,1500.0,2463.0,20,308160000,0,1\n",
                                      "runs.csv"));
  ASSERT_EQ(table.rows.size(), 2u);
  EXPECT_EQ(table.rows[0].run.cp, 2);
  EXPECT_EQ(table.rows[1].micro_batches, 120);
  EXPECT_DOUBLE_EQ(table.rows[1].bubble, 7.0 / 127.0);
  EXPECT_EQ(percent(table.rows[1].efficiency, 0), "89%");
  std::ostringstream out;
  print_scaling_table(table, out);
  EXPECT_NE(out.str().find("  GPUs  TP  CP  PP   DP"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("  2048   8   2   8   16"), std::string::npos) << out.str();
  // Without the column every run has cp 1 and the table no CP column.
  std::ostringstream plain;
  print_scaling_table(scaling_table(parse_scaling_csv(kAcceptance, "runs.csv")), plain);
  EXPECT_EQ(plain.str().find(" CP "), std::string::npos) << plain.str();
  EXPECT_EQ(error_of(header + "1000,8,2,8,8,1920,1,1800,3512,20,308160000,0,1\n"),
            "runs.csv:2: gpus 1000 is not tp x cp x pp x dp = 8 x 2 x 8 x 8 = 1024");
  // Four factors of 2^20 would pass int64: the product stops once past 2^20.
  EXPECT_EQ(error_of(header + "1,1048576,1048576,1048576,1048576,1920,1,1800,3512,20,308160000,0,1\n"),
            "runs.csv:2: gpus 1 is not tp x cp x pp x dp = 1048576 x 1048576 x 1048576 x 1048576 = more than "
            "1048576");
  EXPECT_EQ(error_of(header + "1024,8,0,8,8,1920,1,1800,3512,20,308160000,0,1\n"),
            "runs.csv:2: column cp: 0 must be >= 1");
}

TEST(PlanFormat, RoundsHalfAwayFromZeroAndPrintsCompactly) {
  EXPECT_EQ(fixed(140.625, 2), "140.63");  // printf's round-half-even would print 140.62
  EXPECT_EQ(fixed(58.59375, 2), "58.59");
  EXPECT_EQ(fixed(48.046875, 2), "48.05");
  EXPECT_EQ(fixed(-0.001, 2), "0.00");
  EXPECT_EQ(gigabytes(140.625e9), "140.63");
  EXPECT_EQ(scientific(7.8125e9), "7.8125e9");
  EXPECT_EQ(scientific(500e9), "5e11");
  EXPECT_EQ(scientific(512), "512");
  EXPECT_EQ(grouped(1339826.09), "1,339,826");
  EXPECT_EQ(grouped(999), "999");
  EXPECT_EQ(percent(0.8888, 0), "89%");
  EXPECT_EQ(short_quantity(1.6e6), "1.6M");
  EXPECT_EQ(short_quantity(1e13), "10T");
  EXPECT_EQ(parse_quantity("10T", "--tokens"), 1e13);
  EXPECT_EQ(parse_quantity("1.6M", "--throughput"), 1.6e6);
  EXPECT_EQ(parse_quantity("500e9", "--params"), 500e9);
  EXPECT_EQ(parse_quantity("500B", "--params"), 500e9);
  EXPECT_THROW(parse_quantity("10X", "--tokens"), InputError);
  EXPECT_THROW(parse_quantity("many", "--tokens"), InputError);
  EXPECT_THROW(parse_quantity("1e308T", "--tokens"), InputError);  // finite, until scaled
  EXPECT_FALSE(std::signbit(parse_quantity("-0", "--tokens-done")));
}

// No number is printed through an integer it does not fit: counts past 2^63 keep their digits, and a
// long fixed-point number is printed whole, never cut at a buffer's end.
TEST(PlanFormat, PrintsEveryFiniteValueWhole) {
  EXPECT_EQ(grouped(1e30), "1,000,000,000,000,000,019,884,624,838,656");
  EXPECT_EQ(grouped(-9.3e18), "-9,300,000,000,000,000,000");
  EXPECT_EQ(grouped(-0.3), "0");
  EXPECT_EQ(fixed(1e300, 2).size(), 304u);
  EXPECT_EQ(fixed(1e300, 2).substr(0, 4), "1000");
  EXPECT_EQ(scientific(std::nan("")), "nan");
  EXPECT_EQ(scientific(-std::numeric_limits<double>::infinity()), "-inf");
}

}  // namespace
}  // namespace touchstone::plan
