// The sample ledger: writing and reading it (attempt numbers, torn last lines, malformed lines), and
// its check on good and broken histories across restarts, layout changes and epochs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "checkpoint/ledger/ledger.h"
#include "checkpoint/ledger/ledger_check.h"
#include "checkpoint/ledger/ledger_report.h"
#include "common/errors.h"

namespace touchstone::ledger {
namespace {

namespace fs = std::filesystem;
using SampleLists = std::vector<std::vector<int64_t>>;

Layout layout_with_dp(int dp, int64_t global_batch = 8, int64_t micro_batch = 2) {
  return Layout{
      .world_size = dp, .dp = dp, .global_batch_size = global_batch, .micro_batch_size = micro_batch};
}

// Megatron-LM's order written out independently of micro_batch_starts: micro-batch j of dp rank r
// holds (s-1)*B + j*M*dp + r*M ... + M-1.
SampleLists planned(const Layout& l, int64_t step) {
  SampleLists lists(static_cast<size_t>(l.dp));
  for (int r = 0; r < l.dp; ++r) {
    for (int64_t j = 0; j < l.global_batch_size / (l.micro_batch_size * l.dp); ++j) {
      for (int64_t i = 0; i < l.micro_batch_size; ++i) {
        lists[static_cast<size_t>(r)].push_back((step - 1) * l.global_batch_size +
                                                j * l.micro_batch_size * l.dp + r * l.micro_batch_size + i);
      }
    }
  }
  return lists;
}

bool has_problem(const CheckReport& report, const std::string& text) {
  return std::any_of(report.problems.begin(), report.problems.end(),
                     [&](const std::string& p) { return p.find(text) != std::string::npos; });
}

std::string problems_of(const CheckReport& report) { return format_check_report(report); }

class LedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("touchstone_ledger_" + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name = kLedgerFileName) const { return (dir_ / name).string(); }

  // One attempt: starts (resumed from `resumed_from`), records steps first..last in the planned order
  // (with `override_step` replaced by `override_samples`), commits checkpoints, and ends if asked.
  void attempt(const Layout& l, int64_t resumed_from, int64_t first, int64_t last,
               std::vector<int64_t> checkpoints, bool ends, int64_t num_windows = 64, int64_t target = 10,
               int64_t override_step = 0, const SampleLists& override_samples = {},
               const std::string& file = kLedgerFileName) {
    LedgerWriter writer(path(file));
    writer.start(StartInfo{resumed_from, l, num_windows, target});
    for (int64_t s = first; s <= last; ++s) {
      writer.step(s, s == override_step ? override_samples : planned(l, s));
      if (std::find(checkpoints.begin(), checkpoints.end(), s) != checkpoints.end()) {
        writer.checkpoint(s, "step_0000000" + std::to_string(s));
      }
    }
    if (ends) writer.end(last);
  }

  CheckReport check(const std::string& file = kLedgerFileName) const {
    return check_ledger(read_ledger(path(file)));
  }

  fs::path dir_;
};

TEST_F(LedgerTest, WriterAndReaderRoundTrip) {
  const Layout l{.world_size = 4, .tp = 2, .dp = 2, .global_batch_size = 8, .micro_batch_size = 2};
  {
    LedgerWriter writer(path());
    EXPECT_EQ(writer.attempt(), 1);
    writer.start(StartInfo{0, l, 32, 3});
    writer.step(1, planned(l, 1));
    writer.checkpoint(1, "step_00000001");
    writer.end(1);
  }
  const Ledger ledger = read_ledger(path());
  ASSERT_EQ(ledger.events.size(), 4u);
  EXPECT_TRUE(ledger.notes.empty());
  const Event& start = ledger.events[0];
  EXPECT_EQ(start.kind, EventKind::kStart);
  EXPECT_EQ(start.attempt, 1);
  EXPECT_EQ(start.start.layout, l);
  EXPECT_EQ(start.start.num_windows, 32);
  EXPECT_EQ(start.start.steps, 3);
  EXPECT_GT(start.time, 1.5e9);  // unix seconds
  EXPECT_EQ(ledger.events[1].kind, EventKind::kStep);
  EXPECT_EQ(ledger.events[1].samples, planned(l, 1));
  EXPECT_EQ(ledger.events[1].line, 2);
  EXPECT_EQ(ledger.events[2].kind, EventKind::kCheckpoint);
  EXPECT_EQ(ledger.events[2].path, "step_00000001");
  EXPECT_EQ(ledger.events[3].kind, EventKind::kEnd);
  EXPECT_EQ(ledger.events[3].step, 1);
  EXPECT_LE(ledger.events[0].time, ledger.events[3].time);
  EXPECT_EQ(ledger_path(dir_.string()), path());
  EXPECT_EQ(ledger_path(path()), path());
}

TEST_F(LedgerTest, AttemptNumberCountsEarlierStarts) {
  attempt(layout_with_dp(2), 0, 1, 2, {2}, false);
  attempt(layout_with_dp(2), 2, 3, 4, {4}, false);
  LedgerWriter third(path());
  EXPECT_EQ(third.attempt(), 3);
  third.start(StartInfo{4, layout_with_dp(2), 64, 10});
  const Ledger ledger = read_ledger(path());
  std::vector<int> starts;
  for (const Event& e : ledger.events) {
    if (e.kind == EventKind::kStart) starts.push_back(e.attempt);
  }
  EXPECT_EQ(starts, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(ledger.events.back().start.resumed_from_step, 4);
}

TEST_F(LedgerTest, TornLastLineIsIgnoredWithANoteAndCutByTheNextWriter) {
  attempt(layout_with_dp(2), 0, 1, 3, {2}, false);
  std::ofstream(path(), std::ios::app)
      << R"({"event":"step","attempt":1,"step":4,"time":1.0,"samples":[[24,2)";
  const Ledger torn = read_ledger(path());
  ASSERT_EQ(torn.notes.size(), 1u);
  EXPECT_NE(torn.notes[0].find(":6: unterminated last line"), std::string::npos) << torn.notes[0];
  const CheckReport report = check_ledger(torn);
  EXPECT_TRUE(report.passed()) << problems_of(report);
  EXPECT_EQ(report.last_step, 3);
  EXPECT_NE(format_check_report(report).find("note: "), std::string::npos);

  attempt(layout_with_dp(2), 2, 3, 10, {}, true);  // the new lines must not join the torn one
  const Ledger resumed = read_ledger(path());
  EXPECT_TRUE(resumed.notes.empty());
  const CheckReport after = check_ledger(resumed);
  EXPECT_TRUE(after.passed()) << problems_of(after);
  EXPECT_EQ(after.attempts.size(), 2u);
  EXPECT_TRUE(after.finished);
}

TEST_F(LedgerTest, MalformedLinesNameFileAndLine) {
  attempt(layout_with_dp(2), 0, 1, 1, {}, false);
  const auto expect_error = [&](const std::string& line, const std::string& message) {
    std::ofstream(path(), std::ios::app) << line << "\n";
    try {
      read_ledger(path());
      ADD_FAILURE() << "no error for " << line;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(path() + ":3: " + message), std::string::npos) << e.what();
    }
    fs::resize_file(path(), fs::file_size(path()) - line.size() - 1);
  };
  expect_error("{not json", "not valid JSON");
  expect_error("[1,2]", "not a JSON object");
  expect_error(R"({"event":"jump","attempt":1,"time":1})", "unknown event \"jump\"");
  expect_error(R"({"event":"step","attempt":1,"time":1,"samples":[[1]]})", "missing \"step\"");
  expect_error(R"({"event":"step","attempt":1,"step":2,"time":1,"samples":[1]})",
               "\"samples\" is not a list of lists");
  expect_error(R"({"event":"end","attempt":"one","time":1,"steps":1})", "\"attempt\" is not an integer");
  EXPECT_THROW(read_ledger(path("missing.jsonl")), InputError);
  EXPECT_THROW(LedgerWriter((dir_ / "no_such_dir" / "ledger.jsonl").string()), InputError);
}

TEST_F(LedgerTest, RestartRecomputesTheStepsAfterItsCheckpoint) {
  attempt(layout_with_dp(2), 0, 1, 7, {5}, false);  // killed after step 7; last checkpoint at step 5
  attempt(layout_with_dp(2), 5, 6, 10, {10}, true);
  const CheckReport report = check();
  EXPECT_TRUE(report.passed()) << problems_of(report);
  EXPECT_TRUE(report.finished);
  EXPECT_EQ(report.last_step, 10);
  EXPECT_EQ(report.samples, 80);
  ASSERT_EQ(report.attempts.size(), 2u);
  EXPECT_EQ(report.attempts[1].resumed_from_step, 5);
  EXPECT_EQ(report.attempts[1].recomputed_steps, (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(report.attempts[1].samples_reread, 16);
  EXPECT_TRUE(report.attempts[0].recomputed_steps.empty());
  EXPECT_FALSE(report.attempts[0].ended);
  EXPECT_EQ(report.steps_recomputed, 2);
  EXPECT_EQ(report.samples_reread, 16);
  EXPECT_TRUE(report.attempts[1].layout_change.empty());
  const std::string text = format_check_report(report);
  EXPECT_NE(text.find("recomputed 6..7, 16 samples re-read"), std::string::npos) << text;
  EXPECT_NE(text.find("restarts: 1: attempt 2 from step 5"), std::string::npos) << text;
  EXPECT_EQ(to_json(report)["samples_reread"], 16);
}

TEST_F(LedgerTest, SkippedSampleIsReported) {
  // dp rank 1 of step 2 reads sample 16 (step 3's) instead of 15.
  SampleLists step2 = planned(layout_with_dp(2), 2);
  step2[1] = {10, 11, 14, 16};
  attempt(layout_with_dp(2), 0, 1, 3, {}, true, 64, 3, 2, step2);
  const CheckReport report = check();
  EXPECT_FALSE(report.passed());
  EXPECT_TRUE(has_problem(report, "sample 15 never read (skipped)")) << problems_of(report);
  EXPECT_TRUE(has_problem(report, "sample 16 (window 16 of epoch 0) read 2 times")) << problems_of(report);
  EXPECT_TRUE(has_problem(report, "step 2 (attempt 1), dp rank 1: sample 16 at position 3, expected 15"))
      << problems_of(report);
  EXPECT_EQ(report.epochs.at(0).windows_missing, 1);
}

TEST_F(LedgerTest, DataPositionNotRestoredOnResumeDuplicatesSamples) {
  attempt(layout_with_dp(2), 0, 1, 4, {4}, false);
  // The weights resume from step 4, but the data iterator starts again at sample 0.
  attempt(layout_with_dp(2), 4, 5, 5, {}, false, 64, 10, 5, planned(layout_with_dp(2), 1));
  const CheckReport report = check();
  EXPECT_FALSE(report.passed());
  EXPECT_TRUE(has_problem(
      report, "sample 0 (window 0 of epoch 0) read 2 times: step 1 dp rank 0 and step 5 dp rank 0"))
      << problems_of(report);
  EXPECT_TRUE(has_problem(report, "step 5 (attempt 2), dp rank 0: sample 0 at position 0, expected 32"))
      << problems_of(report);
}

TEST_F(LedgerTest, WrongOrderForOneDpRankIsReportedEvenThoughEverySampleIsReadOnce) {
  SampleLists swapped = planned(layout_with_dp(2), 3);
  std::swap(swapped[0], swapped[1]);
  attempt(layout_with_dp(2), 0, 1, 4, {}, true, 64, 4, 3, swapped);
  const CheckReport report = check();
  EXPECT_EQ(report.problem_count, 2) << problems_of(report);
  EXPECT_TRUE(has_problem(report, "step 3 (attempt 1), dp rank 0: sample 18 at position 0, expected 16"))
      << problems_of(report);
  EXPECT_TRUE(has_problem(report, "step 3 (attempt 1), dp rank 1: sample 16 at position 0, expected 18"))
      << problems_of(report);
  EXPECT_TRUE(report.epochs.at(0).windows_repeated == 0 && report.epochs.at(0).windows_missing == 0);
}

TEST_F(LedgerTest, MissingStepIsReported) {
  attempt(layout_with_dp(2), 0, 1, 3, {3}, false);
  attempt(layout_with_dp(2), 3, 5, 6, {}, false);  // resumes after step 3 but starts at step 5
  const CheckReport report = check();
  EXPECT_FALSE(report.passed());
  EXPECT_TRUE(has_problem(report, "step 4 missing")) << problems_of(report);
  EXPECT_TRUE(
      has_problem(report, "recorded step 5 as its first step after resuming from step 3 (expected step 4)"))
      << problems_of(report);
  EXPECT_TRUE(has_problem(report, "samples 24..31 never read (skipped)")) << problems_of(report);
}

TEST_F(LedgerTest, ResumeFromACheckpointThatWasNeverCommittedIsReported) {
  attempt(layout_with_dp(2), 0, 1, 3, {2}, false);
  attempt(layout_with_dp(2), 3, 4, 10, {}, true);
  const CheckReport report = check();
  EXPECT_EQ(report.problem_count, 1) << problems_of(report);
  EXPECT_TRUE(
      has_problem(report, "attempt 2 resumed from step 3, but no earlier attempt committed a checkpoint"))
      << problems_of(report);
}

TEST_F(LedgerTest, LayoutChangeBetweenAttemptsIsValidAndReported) {
  attempt(layout_with_dp(2), 0, 1, 6, {4}, false);
  attempt(layout_with_dp(4), 4, 5, 10, {}, true);  // a replaced node: dp 2 -> 4, same global batch
  const CheckReport report = check();
  EXPECT_TRUE(report.passed()) << problems_of(report);
  ASSERT_EQ(report.attempts.size(), 2u);
  EXPECT_EQ(report.attempts[1].layout_change, "world_size 2 -> 4, dp 2 -> 4");
  EXPECT_EQ(report.attempts[1].recomputed_steps, (std::vector<int64_t>{5, 6}));
  // The effective history holds the second layout's order for the recomputed steps.
  const Ledger ledger = read_ledger(path());
  const auto history = effective_history(ledger);
  EXPECT_EQ(history.at(5)->samples, planned(layout_with_dp(4), 5));
  EXPECT_EQ(history.at(5)->samples.size(), 4u);
  // Recording the old layout's order under the new layout is wrong.
  attempt(layout_with_dp(4), 0, 1, 2, {}, true, 64, 2, 2, planned(layout_with_dp(2), 2), "wrong.jsonl");
  const CheckReport wrong = check("wrong.jsonl");
  EXPECT_TRUE(has_problem(wrong, "step 2 (attempt 1): 2 dp ranks recorded, the layout has dp 4"))
      << problems_of(wrong);
}

TEST_F(LedgerTest, EpochsReadEveryWindowOnce) {
  // W = 12 windows, B = 8: 5 steps read 40 samples = 3 full epochs and 4 windows of the fourth.
  attempt(layout_with_dp(2), 0, 1, 3, {2}, false, 12, 5);
  attempt(layout_with_dp(1), 2, 3, 5, {}, true, 12, 5);
  const CheckReport report = check();
  EXPECT_TRUE(report.passed()) << problems_of(report);
  ASSERT_EQ(report.epochs.size(), 4u);
  for (int e = 0; e < 3; ++e) {
    EXPECT_TRUE(report.epochs[e].complete);
    EXPECT_EQ(report.epochs[e].windows_read_once, 12);
  }
  EXPECT_FALSE(report.epochs[3].complete);
  EXPECT_EQ(report.epochs[3].windows_in_epoch, 4);
  EXPECT_EQ(report.epochs[3].windows_read_once, 4);
  const std::string text = format_check_report(report);
  EXPECT_NE(text.find("epoch 2: windows 0..11 each read once"), std::string::npos) << text;
  EXPECT_NE(text.find("epoch 3: 4 of 12 windows read once (partial epoch"), std::string::npos) << text;
  // A window read twice in one epoch is named with its epoch.
  SampleLists repeat = planned(layout_with_dp(1), 2);
  repeat[0][7] = 3;
  attempt(layout_with_dp(1), 0, 1, 2, {}, true, 12, 2, 2, repeat, "repeat.jsonl");
  EXPECT_TRUE(has_problem(check("repeat.jsonl"), "sample 3 (window 3 of epoch 0) read 2 times"));
}

TEST_F(LedgerTest, EffectiveHistoriesCompare) {
  attempt(layout_with_dp(2), 0, 1, 10, {5}, true, 64, 10, 0, {}, "straight.jsonl");
  attempt(layout_with_dp(2), 0, 1, 7, {5}, false, 64, 10, 0, {}, "resumed.jsonl");
  attempt(layout_with_dp(2), 5, 6, 10, {}, true, 64, 10, 0, {}, "resumed.jsonl");
  std::string difference;
  EXPECT_TRUE(same_effective_history(read_ledger(path("straight.jsonl")), read_ledger(path("resumed.jsonl")),
                                     &difference))
      << difference;
  SampleLists swapped = planned(layout_with_dp(2), 8);
  std::swap(swapped[0], swapped[1]);
  attempt(layout_with_dp(2), 0, 1, 10, {}, true, 64, 10, 8, swapped, "swapped.jsonl");
  EXPECT_FALSE(same_effective_history(read_ledger(path("straight.jsonl")), read_ledger(path("swapped.jsonl")),
                                      &difference));
  EXPECT_EQ(difference, "step 8, dp rank 0: samples differ");
  attempt(layout_with_dp(2), 0, 1, 9, {}, false, 64, 10, 0, {}, "short.jsonl");
  EXPECT_FALSE(same_effective_history(read_ledger(path("straight.jsonl")), read_ledger(path("short.jsonl")),
                                      &difference));
  EXPECT_EQ(difference, "step 10 is only in the first ledger");
}

TEST_F(LedgerTest, InjectedFailuresRoundTrip) {
  append_injected_failure(path(kFaultsFileName), InjectedFailure{7, 1, "backward", 1700000000.5});
  append_injected_failure(path(kFaultsFileName), InjectedFailure{9, 0, "save", 1700000001.0});
  const auto failures = read_faults(path(kFaultsFileName));
  ASSERT_EQ(failures.size(), 2u);
  EXPECT_EQ(failures[0].step, 7);
  EXPECT_EQ(failures[0].rank, 1);
  EXPECT_EQ(failures[0].phase, "backward");
  EXPECT_DOUBLE_EQ(failures[0].time, 1700000000.5);
  EXPECT_EQ(failures[1].phase, "save");
}

// A record whose writer was killed mid-write leaves a torn last line; the next record must start a line
// of its own, or the two glue into one line that is not JSON and every later read refuses the file.
TEST_F(LedgerTest, InjectedFailureAfterATornRecordCutsTheTornTail) {
  append_injected_failure(path(kFaultsFileName), InjectedFailure{3, 0, "forward", 1700000000.0});
  {
    std::ofstream torn(path(kFaultsFileName), std::ios::app | std::ios::binary);
    torn << "{\"event\":\"inj";
  }
  append_injected_failure(path(kFaultsFileName), InjectedFailure{2, 0, "forward", 1700000001.0});
  const auto failures = read_faults(path(kFaultsFileName));
  ASSERT_EQ(failures.size(), 2u);
  EXPECT_EQ(failures[0].step, 3);
  EXPECT_EQ(failures[1].step, 2);
  // A file that is nothing but a torn line (the first record's writer killed) is cut to nothing.
  {
    std::ofstream torn(path("only_torn.jsonl"), std::ios::binary);
    torn << "{\"event\":\"inj";
  }
  append_injected_failure(path("only_torn.jsonl"), InjectedFailure{2, 1, "save", 1700000002.0});
  const auto only = read_faults(path("only_torn.jsonl"));
  ASSERT_EQ(only.size(), 1u);
  EXPECT_EQ(only[0].rank, 1);
}

// The start line records every dimension of the layout: a context-parallel run's world size is
// tp x cp x pp x dp, and cp itself is read back; a line written before cp existed reads as cp 1.
TEST_F(LedgerTest, StartLineRecordsTheContextParallelSize) {
  const Layout l{
      .world_size = 4, .tp = 1, .cp = 2, .pp = 1, .dp = 2, .global_batch_size = 8, .micro_batch_size = 2};
  attempt(l, 0, 1, 2, {}, true);
  const Ledger ledger = read_ledger(path());
  ASSERT_FALSE(ledger.events.empty());
  EXPECT_EQ(ledger.events[0].start.layout, l);
  {
    std::ofstream old(path("before_cp.jsonl"), std::ios::binary);
    old << R"({"event":"start","attempt":1,"time":1.0,"resumed_from_step":0,"world_size":2,"tp":1,"pp":1,)"
        << R"("dp":2,"global_batch_size":8,"micro_batch_size":2,"num_windows":64,"steps":1})"
        << "\n";
  }
  EXPECT_EQ(read_ledger(path("before_cp.jsonl")).events[0].start.layout.cp, 1);
  // A change of cp alone between attempts is named.
  Layout more = l;
  more.cp = 4;
  more.world_size = 8;
  attempt(l, 0, 1, 2, {2}, false, 64, 4, 0, {}, "cp_change.jsonl");
  attempt(more, 2, 3, 4, {}, true, 64, 4, 0, {}, "cp_change.jsonl");
  const CheckReport report = check("cp_change.jsonl");
  ASSERT_EQ(report.attempts.size(), 2u);
  EXPECT_EQ(report.attempts[1].layout_change, "world_size 4 -> 8, cp 2 -> 4");
}

TEST(LedgerReport, StepRanges) {
  EXPECT_EQ(step_ranges({}), "");
  EXPECT_EQ(step_ranges({6, 7, 8, 11, 13, 14}), "6..8, 11, 13..14");
}

}  // namespace
}  // namespace touchstone::ledger
