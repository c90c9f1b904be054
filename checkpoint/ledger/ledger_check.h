// What a sample ledger proves about a run that was killed and resumed, possibly with another layout.
//
// The effective history is, for every step, the record of the last attempt that recorded it. The
// check verifies on it that
//   (a) every step's dp ranks consumed exactly Megatron-LM's sampler order for the layout of the
//       attempt that recorded it (data/sampler_order.h),
//   (b) every global sample index appears exactly once and together they are 0 .. N-1, so each epoch
//       reads every window exactly once,
//   (c) no step between 1 and the last recorded one is missing,
// and, across attempts, that each resumed attempt's first step follows its checkpoint, that the
// checkpoint was committed by an earlier attempt (its checkpoint line, or the line the resuming attempt
// recorded for it from the disk, LedgerWriter::record_recovered_checkpoint), and that every attempt read
// the same data (number of windows and content fingerprint). A ledger with no event fails: it proves
// nothing. It also accounts for the recomputed work: which
// attempt redid which steps, and how many samples were read again.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/ledger/ledger.h"

namespace touchstone::ledger {

// One attempt as the ledger saw it.
struct AttemptSummary {
  int attempt = 0;
  double start_time = 0.0;
  int64_t resumed_from_step = 0;
  Layout layout;
  std::string layout_change;  // "dp 2 -> 4, world_size 2 -> 4" against the previous attempt; empty if none
  int64_t first_step = 0;     // first and last step it recorded (0 when none)
  int64_t last_step = 0;
  int64_t steps_recorded = 0;
  double first_step_time = 0.0;  // when it recorded its first step (0 when none): the end of a recovery
  std::vector<int64_t> recomputed_steps;  // steps it recorded that an earlier attempt had already recorded
  int64_t samples_reread = 0;             // the samples of those steps, read again by this attempt
  std::vector<int64_t> checkpoints;       // steps of the checkpoints it committed
  std::vector<int64_t> recovered_checkpoints;  // those of them the next attempt recorded from the disk
  std::string data_fingerprint;                // of the data it read; empty when not recorded
  bool ended = false;                          // wrote an end event
  double end_time = 0.0;
};

// How one epoch (W consecutive global samples) was read in the effective history.
struct EpochCoverage {
  int64_t epoch = 0;
  int64_t windows_read_once = 0;  // windows of the epoch read exactly once
  int64_t windows_in_epoch = 0;   // W, or fewer for the last, partial epoch
  int64_t windows_missing = 0;    // never read, up to the end of the last step
  int64_t windows_repeated = 0;   // read more than once
  bool complete = false;          // every window 0..W-1 read exactly once
};

struct CheckReport {
  std::string path;
  int64_t last_step = 0;     // the effective history covers steps 1..last_step
  int64_t target_steps = 0;  // the last attempt's target
  bool finished = false;     // the last attempt ended cleanly after its target steps
  int64_t num_windows = 0;
  int64_t samples = 0;  // sample records in the effective history
  std::vector<AttemptSummary> attempts;
  std::vector<EpochCoverage> epochs;
  int64_t steps_recomputed = 0;  // sum over attempts
  int64_t samples_reread = 0;
  std::vector<std::string> problems;  // failed checks, each naming the step / sample; at most kMaxProblems
  int64_t problem_count = 0;          // all failed checks, including those not listed
  std::vector<std::string> notes;     // the reader's notes (a torn last line)

  static constexpr size_t kMaxProblems = 50;
  bool passed() const { return problem_count == 0; }
};

// For every step, the step event of the last attempt that recorded it (keyed by step); the pointers
// point into `ledger`, which must outlive the map.
std::map<int64_t, const Event*> effective_history(const Ledger& ledger);

CheckReport check_ledger(const Ledger& ledger);

// True when both effective histories hold the same steps with the same sample list for every dp rank;
// otherwise `difference` (when given) names the first differing step.
bool same_effective_history(const Ledger& a, const Ledger& b, std::string* difference = nullptr);

}  // namespace touchstone::ledger
