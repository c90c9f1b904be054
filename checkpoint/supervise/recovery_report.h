// The supervisor's recovery report: what each attempt did, and for each failure when it happened, when
// it was detected, when the job was restarted and what the restart recomputed (from the sample ledger).
// Rendered as JSON, as an SVG timeline and as a short human summary.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/ledger/ledger.h"
#include "checkpoint/ledger/ledger_check.h"
#include "checkpoint/supervise/child_group.h"

namespace touchstone::supervise {

struct AttemptRecord {
  int number = 0;       // 1-based launch number
  std::string command;  // as launched
  double launch_time = 0.0;
  double detection_time = 0.0;  // when the supervisor saw it exit, declared the stall or got a signal
  WaitEnd end = WaitEnd::kExited;
  ChildExit exit;
  int ledger_starts_before = 0;  // start events in the ledger at launch: its own start is the next one
  std::optional<ledger::InjectedFailure> injected;  // the first injected failure recorded during it
  bool failed() const { return end != WaitEnd::kExited || !exit.success(); }
};

struct RecoveryReport {
  std::vector<std::string> command;
  std::string restart_command;
  std::string checkpoint_dir;
  int max_restarts = 0;
  double stall_timeout_s = 0.0;
  double kill_grace_s = 0.0;
  double start_time = 0.0;
  double end_time = 0.0;
  std::vector<AttemptRecord> attempts;
  std::string outcome;  // "succeeded", "gave up", "interrupted" or "ledger check failed"
  int exit_status = 0;
  std::optional<ledger::CheckReport> ledger;  // the ledger after the job, when there is one
  std::vector<std::string> notes;             // what could not be read
};

// The ledger attempt an attempt's launch started, when the ledger recorded its start.
const ledger::AttemptSummary* ledger_attempt(const RecoveryReport& report, const AttemptRecord& attempt);

nlohmann::json to_json(const RecoveryReport& report);

// One row per attempt on a time axis, with failure, detection and restart marks.
std::string render_recovery_timeline_svg(const RecoveryReport& report);

// A few lines for the end of the supervisor's output.
std::string format_summary(const RecoveryReport& report);

}  // namespace touchstone::supervise
