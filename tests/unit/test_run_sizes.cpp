// The size arithmetic that refuses a run before it allocates: every integer key within its range
// (common/config.h integer_limits), the closed-form lower bound and the planned bytes of a run
// (plan/run_fit.h), and the check against a memory budget.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "common/config.h"
#include "common/errors.h"
#include "model/param_table.h"
#include "plan/run_fit.h"
#include "test_files.h"

namespace touchstone {
namespace {

using testing::error_of;

std::string invalid(const std::string& assignment) {
  return error_of([&] { validate_config(resolve_config(nullptr, {assignment}, "c"), 1); });
}

TEST(ConfigLimits, EveryIntegerKeyHasAReachableRange) {
  const nlohmann::json defaults = default_config_json();
  for (const IntegerLimit& limit : integer_limits()) {
    SCOPED_TRACE(limit.key);
    std::string pointer = "/" + std::string(limit.key);
    for (char& c : pointer) c = c == '.' ? '/' : c;
    EXPECT_TRUE(defaults.contains(nlohmann::json::json_pointer(pointer)));
    EXPECT_LE(limit.min, limit.max);
  }
  // Counts below 2^31: the product of two fits an int64, and so does tp x pp x dp.
  EXPECT_LT(static_cast<double>(kMaxCount) * static_cast<double>(kMaxCount), 0x1p63);
  EXPECT_LT(std::pow(static_cast<double>(kMaxProcesses), 3.0), 0x1p63);
}

TEST(ConfigLimits, OutOfRangeIsOneLineNamingKeyAndRange) {
  EXPECT_EQ(invalid("parallel.dp=-1"), "config: parallel.dp must be in [1, 1048576] (got -1)");
  EXPECT_EQ(invalid("model.vocab_size=9223372036854775807"),
            "config: model.vocab_size must be in [3, 2147483647] (got 9223372036854775807)");
  EXPECT_EQ(invalid("train.steps=4294967297"),
            "config: train.steps must be in [1, 2147483647] (got 4294967297)");
  EXPECT_EQ(invalid("model.num_kv_heads=0"), "config: model.num_kv_heads must be in [1, 2147483647] (got 0)");
  EXPECT_EQ(invalid("parallel.stage_layers=[0]"),
            "config: parallel.stage_layers must be in [1, 2147483647] (got 0)");
  // Above INT64_MAX: refused as written when loaded, not wrapped to a negative number.
  EXPECT_EQ(invalid("train.seed=9223372036854775808"),
            "override 'train.seed=9223372036854775808': train.seed must be in [0, 9223372036854775807] "
            "(got 9223372036854775808)");
  EXPECT_EQ(invalid("model.num_layers=2147483647"), "");  // in range; the memory check judges the size
}

TEST(ConfigLimits, FloatsMustBeFiniteAndStringsHoldNoNul) {
  Config config;
  config.optim.lr = std::nan("");
  EXPECT_EQ(error_of([&] { validate_config(config, 1); }),
            "config: optim.lr must be a finite number (got nan)");
  config.optim.lr = INFINITY;
  EXPECT_EQ(error_of([&] { validate_config(config, 1); }),
            "config: optim.lr must be a finite number (got inf)");
  EXPECT_EQ(error_of([] {
              resolve_config({{"data", {{"source", std::string("a\0b", 3)}}}}, {}, "c.json");
            }),
            "c.json: data.source must not contain a NUL character");
}

TEST(ConfigLimits, AQuotedValueIsShort) {
  const std::string message = error_of([] {
    resolve_config({{"train", {{"steps", std::string(300, 'x')}}}}, {}, "c.json");
  });
  EXPECT_LT(message.size(), 100u) << message;
}

plan::MemoryBudget budget(double bytes) { return plan::MemoryBudget{bytes, "test"}; }

TEST(RunFit, TheLowerBoundIsBelowThePlanAndGrowsWithEveryCount) {
  const Config base;
  const plan::RunOutputs golden{true, false, false};
  const double lower = plan::lower_bound_bytes(base, golden);
  EXPECT_GT(lower, 0);
  EXPECT_LE(lower, plan::planned_bytes(base, golden));
  const auto grows = [&](const std::function<void(Config&)>& edit) {
    Config c = base;
    edit(c);
    return plan::lower_bound_bytes(c, golden) > lower;
  };
  EXPECT_TRUE(grows([](Config& c) { c.model.num_layers *= 2; }));
  EXPECT_TRUE(grows([](Config& c) { c.model.seq_length *= 2; }));
  EXPECT_TRUE(grows([](Config& c) { c.model.vocab_size *= 2; }));
  EXPECT_TRUE(grows([](Config& c) { c.model.hidden_size *= 2; }));
  EXPECT_TRUE(grows([](Config& c) { c.train.steps *= 2; }));
  EXPECT_TRUE(grows([](Config& c) { c.train.global_batch_size *= 2; }));
  EXPECT_GT(plan::lower_bound_bytes(base, {true, true, true}), lower);  // moments, envelope steps
}

// Context parallelism is planned rank by rank as the trainer holds it (plan/rank_memory.h): a cp rank
// stores the activations of T / cp positions, so the plan of cp = 2 is below that of one rank holding the
// whole window (a plan of the same layout without context parallelism would equal it), and stays above
// the lower bound.
TEST(RunFit, AContextParallelRankIsPlannedWithItsShareOfTheWindow) {
  Config whole;
  whole.model.seq_length = 1024;
  Config split = whole;
  split.parallel.cp = 2;
  const plan::RunOutputs golden{true, false, false};
  const double one = plan::planned_bytes(whole, golden), two = plan::planned_bytes(split, golden);
  EXPECT_LT(two, one);
  EXPECT_GE(two, plan::lower_bound_bytes(split, golden));
}

// What a run holds beside the trainer (oracle/run.cpp): one process writes its trainer's own tensors
// (no gathered copies), the initial weights are released before the first step unless an envelope run
// needs them again, and a one-step run holds AdamW's moments only when it saves them.
TEST(RunFit, OutputsInitialWeightsAndMomentsAreCountedWhereTheRunHoldsThem) {
  Config one_step;
  one_step.train.steps = 1;
  const ParamTable table(one_step.model);
  double full = 0;  // bytes of one full FP64 copy of the parameters
  for (int id = 0; id < table.size(); ++id) full += static_cast<double>(table[id].numel()) * 8.0;
  const plan::RunOutputs golden{true, false, false};
  const double planned = plan::planned_bytes(one_step, golden);
  EXPECT_DOUBLE_EQ(planned, plan::planned_bytes(one_step, {}));  // no copies on one rank
  EXPECT_DOUBLE_EQ(plan::planned_bytes(one_step, {true, true, false}) - planned, 4 * full);  // held + copies
  EXPECT_DOUBLE_EQ(plan::planned_bytes(one_step, {false, false, false, true}) - planned, 2 * full);
  // The envelope keeps the initial weights and each step's low-precision gradients and parameters.
  EXPECT_DOUBLE_EQ(plan::planned_bytes(one_step, {true, false, true}) - planned, 3 * full);
  Config gathered = one_step;  // two ranks: rank 0 gathers the full gradients and parameters
  gathered.parallel.dp = 2;
  gathered.train.global_batch_size = 8;
  EXPECT_DOUBLE_EQ(plan::planned_bytes(gathered, golden) - plan::planned_bytes(gathered, {}), 2 * full);
}

TEST(RunFit, TheLargestCountsStayFiniteAndAreRefusedWithBothNumbers) {
  Config huge;
  huge.model.num_layers = kMaxCount;
  huge.model.seq_length = kMaxCount;
  huge.model.vocab_size = kMaxCount - 1;
  huge.train.steps = kMaxCount;
  const double lower = plan::lower_bound_bytes(huge, {true, true, true});
  EXPECT_TRUE(std::isfinite(lower));
  EXPECT_GT(lower, 1e20);
  const std::string message = error_of([&] { plan::check_run_fits(huge, {}, 1, budget(24e9)); });
  EXPECT_EQ(message.find("config: the run needs at least "), 0u) << message;
  EXPECT_NE(message.find("per process but 24 GB is available (test)"), std::string::npos) << message;
}

TEST(RunFit, TheBudgetDecides) {
  const Config config;
  const double planned = plan::planned_bytes(config, {});
  EXPECT_EQ(error_of([&] { plan::check_run_fits(config, {}, 1, budget(planned * 1.01)); }), "");
  EXPECT_NE(error_of([&] { plan::check_run_fits(config, {}, 1, budget(planned * 0.99)); }), "");
  // Validation comes first: the planner never sees an invalid config.
  Config bad;
  bad.parallel.dp = -1;
  EXPECT_EQ(error_of([&] { plan::check_run_fits(bad, {}, 1, budget(1e12)); }),
            "config: parallel.dp must be in [1, 1048576] (got -1)");
}

TEST(RunFit, TheMachineBudgetIsPhysicalMemorySharedByTheNodesProcesses) {
  const plan::MemoryBudget one = plan::memory_budget(1, 0);
  EXPECT_GT(one.bytes, 1e8);
  EXPECT_NE(one.source.find("physical memory"), std::string::npos);
  EXPECT_EQ(plan::memory_budget(1, 2.5).bytes, 2.5e9);
  EXPECT_NE(error_of([] { plan::memory_budget(1, -1); }), "");
  EXPECT_NE(error_of([] { plan::memory_budget(1, std::nan("")); }), "");
}

}  // namespace
}  // namespace touchstone
