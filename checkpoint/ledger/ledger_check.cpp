// The sample ledger's check and the comparison of effective histories (see ledger_check.h).
#include "checkpoint/ledger/ledger_check.h"

#include <algorithm>
#include <tuple>

#include "data/sampler_order.h"

namespace touchstone::ledger {

namespace {

std::string range_text(int64_t first, int64_t last) {
  return first == last ? std::to_string(first) : std::to_string(first) + ".." + std::to_string(last);
}

std::string step_list(const std::vector<int64_t>& values) {
  std::string text;
  for (const int64_t value : values) text += (text.empty() ? "" : ", ") + std::to_string(value);
  return text;
}

std::string describe_layout_change(const Layout& before, const Layout& after) {
  std::string text;
  const auto compare = [&](const char* name, int64_t a, int64_t b) {
    if (a == b) return;
    if (!text.empty()) text += ", ";
    text += std::string(name) + " " + std::to_string(a) + " -> " + std::to_string(b);
  };
  compare("world_size", before.world_size, after.world_size);
  compare("tp", before.tp, after.tp);
  compare("cp", before.cp, after.cp);
  compare("pp", before.pp, after.pp);
  compare("dp", before.dp, after.dp);
  compare("global_batch_size", before.global_batch_size, after.global_batch_size);
  compare("micro_batch_size", before.micro_batch_size, after.micro_batch_size);
  return text;
}

// The samples dp rank `dp_rank` consumes in `step` under `layout`, in order.
std::vector<int64_t> planned_samples(const Layout& layout, int64_t step, int dp_rank) {
  std::vector<int64_t> samples;
  const int64_t first = (step - 1) * layout.global_batch_size;
  for (const int64_t start :
       micro_batch_starts(layout.global_batch_size, layout.micro_batch_size, layout.dp, dp_rank)) {
    for (int64_t i = 0; i < layout.micro_batch_size; ++i) samples.push_back(first + start + i);
  }
  return samples;
}

class Checker {
 public:
  explicit Checker(const Ledger& ledger) : ledger_(ledger) {
    report_.path = ledger.path;
    report_.notes = ledger.notes;
  }

  CheckReport run() {
    if (ledger_.events.empty()) problem("the ledger records nothing: no attempt started");
    for (const Event& event : ledger_.events) walk(event);
    if (recovered_by_ != 0) {
      problem("the last checkpoint line says attempt " + std::to_string(recovered_by_) +
              " recorded it from the disk, but that attempt never started");
    }
    check_effective_history();
    check_samples();
    finish();
    return std::move(report_);
  }

 private:
  struct Recorded {
    const Event* event;
    size_t attempt_index;
  };

  void problem(const std::string& message) {
    ++report_.problem_count;
    if (report_.problems.size() < CheckReport::kMaxProblems) report_.problems.push_back(message);
  }

  std::string at(const Event& event) const { return "line " + std::to_string(event.line) + ": "; }

  void walk(const Event& event) {
    if (recovered_by_ != 0 && (event.kind != EventKind::kStart || event.attempt != recovered_by_)) {
      problem(at(event) + "expected the start of attempt " + std::to_string(recovered_by_) +
              ", which recorded the checkpoint line before it from the disk");
    }
    recovered_by_ = 0;
    if (event.kind == EventKind::kStart) return start(event);
    if (report_.attempts.empty()) return problem(at(event) + "event before any start event");
    AttemptSummary& attempt = report_.attempts.back();
    if (event.attempt != attempt.attempt) {
      problem(at(event) + "event of attempt " + std::to_string(event.attempt) + " inside attempt " +
              std::to_string(attempt.attempt));
    }
    if (attempt.ended)
      problem(at(event) + "event after attempt " + std::to_string(attempt.attempt) + " ended");
    const int64_t reached = next_step_ - 1;
    switch (event.kind) {
      case EventKind::kStep:
        record_step(event, attempt);
        break;
      case EventKind::kCheckpoint:
        if (event.step != reached) {
          problem(at(event) + "checkpoint of step " + std::to_string(event.step) + ", but attempt " +
                  std::to_string(attempt.attempt) + " is at step " + std::to_string(reached));
        }
        committed_checkpoints_.push_back(event.step);
        attempt.checkpoints.push_back(event.step);
        if (event.recovered_by != 0) {
          attempt.recovered_checkpoints.push_back(event.step);
          recovered_by_ = event.recovered_by;
        }
        break;
      case EventKind::kEnd:
        if (event.step != reached) {
          problem(at(event) + "attempt " + std::to_string(attempt.attempt) + " ended after " +
                  std::to_string(event.step) + " steps, but its last step is " + std::to_string(reached));
        }
        attempt.ended = true;
        attempt.end_time = event.time;
        break;
      case EventKind::kStart:
        break;
    }
  }

  void start(const Event& event) {
    const StartInfo& s = event.start;
    AttemptSummary attempt;
    attempt.attempt = event.attempt;
    attempt.start_time = event.time;
    attempt.resumed_from_step = s.resumed_from_step;
    attempt.layout = s.layout;
    const std::string name = "attempt " + std::to_string(event.attempt);
    if (event.attempt != static_cast<int>(report_.attempts.size()) + 1) {
      problem(at(event) + "start of " + name + ", expected attempt " +
              std::to_string(report_.attempts.size() + 1));
    }
    if (!report_.attempts.empty()) {
      attempt.layout_change = describe_layout_change(report_.attempts.back().layout, s.layout);
    }
    if (s.layout.global_batch_size % (s.layout.micro_batch_size * s.layout.dp) != 0) {
      problem(at(event) + name + ": global_batch_size " + std::to_string(s.layout.global_batch_size) +
              " is not a multiple of micro_batch_size x dp = " +
              std::to_string(s.layout.micro_batch_size * s.layout.dp));
    }
    if (report_.num_windows != 0 && s.num_windows != report_.num_windows) {
      problem(at(event) + name + " reads " + std::to_string(s.num_windows) + " windows, earlier attempts " +
              std::to_string(report_.num_windows) + " (the data set changed)");
    }
    report_.num_windows = s.num_windows;
    attempt.data_fingerprint = event.data_fingerprint;
    check_data_fingerprint(event, name);
    report_.target_steps = s.steps;
    if (s.resumed_from_step > 0 && std::find(committed_checkpoints_.begin(), committed_checkpoints_.end(),
                                             s.resumed_from_step) == committed_checkpoints_.end()) {
      problem(at(event) + name + " resumed from step " + std::to_string(s.resumed_from_step) +
              ", but no earlier attempt committed a checkpoint of that step");
    }
    next_step_ = s.resumed_from_step + 1;
    report_.attempts.push_back(attempt);
  }

  // Every attempt must read the same content; an attempt of an older ledger without a fingerprint is
  // not compared, and noted.
  void check_data_fingerprint(const Event& event, const std::string& name) {
    const std::string& fingerprint = event.data_fingerprint;
    if (fingerprint.empty()) {
      without_fingerprint_.push_back(event.attempt);
      return;
    }
    if (data_fingerprint_.empty()) {
      data_fingerprint_ = fingerprint;
      data_fingerprint_attempt_ = event.attempt;
    } else if (fingerprint != data_fingerprint_) {
      problem(at(event) + name + " read data with content fingerprint " + fingerprint + ", attempt " +
              std::to_string(data_fingerprint_attempt_) + " " + data_fingerprint_ +
              " (the data set changed between attempts)");
    }
  }

  void record_step(const Event& event, AttemptSummary& attempt) {
    if (event.step != next_step_) {
      const std::string where =
          next_step_ == attempt.resumed_from_step + 1 && attempt.steps_recorded == 0
              ? "as its first step after resuming from step " + std::to_string(attempt.resumed_from_step)
              : "after step " + std::to_string(next_step_ - 1);
      problem(at(event) + "attempt " + std::to_string(attempt.attempt) + " recorded step " +
              std::to_string(event.step) + " " + where + " (expected step " + std::to_string(next_step_) +
              ")");
    }
    next_step_ = event.step + 1;
    const auto earlier = effective_.find(event.step);
    if (earlier != effective_.end()) {
      attempt.recomputed_steps.push_back(event.step);
      for (const auto& samples : event.samples)
        attempt.samples_reread += static_cast<int64_t>(samples.size());
    }
    effective_[event.step] = Recorded{&event, report_.attempts.size() - 1};
    if (attempt.steps_recorded == 0) {
      attempt.first_step = event.step;
      attempt.first_step_time = event.time;
    }
    attempt.last_step = event.step;
    ++attempt.steps_recorded;
  }

  // (a) the sampler order of each step, (c) no missing step.
  void check_effective_history() {
    if (effective_.empty()) return;
    report_.last_step = effective_.rbegin()->first;
    int64_t expected = 1;
    for (const auto& [step, recorded] : effective_) {
      if (step > expected) {
        problem((step - 1 > expected ? "steps " : "step ") + range_text(expected, step - 1) +
                " missing: no attempt recorded it");
      }
      expected = step + 1;
      const AttemptSummary& attempt = report_.attempts[recorded.attempt_index];
      const Layout& layout = attempt.layout;
      const auto& samples = recorded.event->samples;
      const std::string where =
          "step " + std::to_string(step) + " (attempt " + std::to_string(attempt.attempt) + ")";
      if (static_cast<int>(samples.size()) != layout.dp) {
        problem(where + ": " + std::to_string(samples.size()) + " dp ranks recorded, the layout has dp " +
                std::to_string(layout.dp));
        continue;
      }
      for (int r = 0; r < layout.dp; ++r)
        check_order(where, r, samples[r], planned_samples(layout, step, r), layout);
    }
  }

  void check_order(const std::string& where, int dp_rank, const std::vector<int64_t>& got,
                   const std::vector<int64_t>& planned, const Layout& layout) {
    const std::string rank = where + ", dp rank " + std::to_string(dp_rank) + ": ";
    const std::string order = " (sampler order for B " + std::to_string(layout.global_batch_size) + ", M " +
                              std::to_string(layout.micro_batch_size) + ", dp " + std::to_string(layout.dp) +
                              ")";
    for (size_t i = 0; i < std::min(got.size(), planned.size()); ++i) {
      if (got[i] == planned[i]) continue;
      return problem(rank + "sample " + std::to_string(got[i]) + " at position " + std::to_string(i) +
                     ", expected " + std::to_string(planned[i]) + order);
    }
    if (got.size() != planned.size()) {
      problem(rank + std::to_string(got.size()) + " samples, expected " + std::to_string(planned.size()) +
              order);
    }
  }

  // (b) every sample exactly once, 0 .. N-1 where N is the end of the last step's planned samples
  // (last_step x B), and per epoch every window once.
  void check_samples() {
    struct Use {
      int64_t sample, step;
      size_t dp_rank;
    };
    // No correct step reads past its own planned samples, so anything beyond the last step's end is
    // reported on its own rather than counted as a huge gap.
    int64_t planned_end = 0;
    for (const auto& [step, recorded] : effective_) {
      planned_end =
          std::max(planned_end, step * report_.attempts[recorded.attempt_index].layout.global_batch_size);
    }
    std::vector<Use> uses;
    for (const auto& [step, recorded] : effective_) {
      const auto& lists = recorded.event->samples;
      for (size_t r = 0; r < lists.size(); ++r) {
        for (const int64_t sample : lists[r]) {
          ++report_.samples;
          if (sample < planned_end) {
            uses.push_back(Use{sample, step, r});
          } else {
            problem("sample " + std::to_string(sample) + " (step " + std::to_string(step) + " dp rank " +
                    std::to_string(r) + ") is past the last planned sample " +
                    std::to_string(planned_end - 1));
          }
        }
      }
    }
    if (planned_end == 0 || report_.num_windows == 0) return;
    std::stable_sort(uses.begin(), uses.end(),
                     [](const Use& a, const Use& b) { return a.sample < b.sample; });
    const auto use_text = [](const Use& u) {
      return "step " + std::to_string(u.step) + " dp rank " + std::to_string(u.dp_rank);
    };
    const int64_t end = planned_end;
    const int64_t w = report_.num_windows;
    for (int64_t epoch = 0; epoch * w < end; ++epoch) {
      report_.epochs.push_back(EpochCoverage{epoch, 0, std::min(w, end - epoch * w), 0, 0, false});
    }
    int64_t next = 0;  // the smallest sample not seen yet
    for (size_t i = 0; i < uses.size();) {
      const int64_t sample = uses[i].sample;
      size_t j = i;
      while (j < uses.size() && uses[j].sample == sample) ++j;
      if (sample > next) {
        problem((sample - 1 > next ? "samples " : "sample ") + range_text(next, sample - 1) +
                " never read (skipped) although sample " + std::to_string(sample) + " was");
        for (int64_t s = next; s < sample; ++s) ++report_.epochs[static_cast<size_t>(s / w)].windows_missing;
      }
      EpochCoverage& epoch = report_.epochs[static_cast<size_t>(sample / w)];
      if (j - i == 1) {
        ++epoch.windows_read_once;
      } else {
        ++epoch.windows_repeated;
        problem("sample " + std::to_string(sample) + " (window " + std::to_string(sample % w) + " of epoch " +
                std::to_string(sample / w) + ") read " + std::to_string(j - i) +
                " times: " + use_text(uses[i]) + " and " + use_text(uses[i + 1]));
      }
      next = sample + 1;
      i = j;
    }
    if (next < end) {
      problem((end - 1 > next ? "samples " : "sample ") + range_text(next, end - 1) +
              " never read (skipped)");
      for (int64_t s = next; s < end; ++s) ++report_.epochs[static_cast<size_t>(s / w)].windows_missing;
    }
    for (EpochCoverage& epoch : report_.epochs) epoch.complete = epoch.windows_read_once == w;
  }

  void finish() {
    if (!without_fingerprint_.empty()) {
      std::vector<int64_t> attempts(without_fingerprint_.begin(), without_fingerprint_.end());
      report_.notes.push_back("attempt(s) " + step_list(attempts) +
                              " recorded no data fingerprint (an older ledger): their data is not compared");
    }
    for (const AttemptSummary& attempt : report_.attempts) {
      report_.steps_recomputed += static_cast<int64_t>(attempt.recomputed_steps.size());
      report_.samples_reread += attempt.samples_reread;
    }
    if (!report_.attempts.empty()) {
      const AttemptSummary& last = report_.attempts.back();
      report_.finished =
          last.ended && last.last_step == report_.target_steps && report_.last_step == report_.target_steps;
    }
  }

  const Ledger& ledger_;
  CheckReport report_;
  std::map<int64_t, Recorded> effective_;
  std::vector<int64_t> committed_checkpoints_;
  int64_t next_step_ = 1;
  int recovered_by_ = 0;          // set by a recovered checkpoint line: the start that must follow it
  std::string data_fingerprint_;  // the first fingerprint recorded, and by which attempt
  int data_fingerprint_attempt_ = 0;
  std::vector<int> without_fingerprint_;  // attempts of an older ledger
};

}  // namespace

std::map<int64_t, const Event*> effective_history(const Ledger& ledger) {
  std::map<int64_t, const Event*> history;
  // Attempts follow each other in the file, so the last record of a step is the last attempt's.
  for (const Event& event : ledger.events) {
    if (event.kind == EventKind::kStep) history[event.step] = &event;
  }
  return history;
}

CheckReport check_ledger(const Ledger& ledger) { return Checker(ledger).run(); }

bool same_effective_history(const Ledger& a, const Ledger& b, std::string* difference) {
  const auto history_a = effective_history(a);
  const auto history_b = effective_history(b);
  const auto differ = [&](const std::string& text) {
    if (difference != nullptr) *difference = text;
    return false;
  };
  auto it_a = history_a.begin();
  auto it_b = history_b.begin();
  for (; it_a != history_a.end() && it_b != history_b.end(); ++it_a, ++it_b) {
    if (it_a->first != it_b->first) {
      const int64_t step = std::min(it_a->first, it_b->first);
      return differ("step " + std::to_string(step) + " is recorded in only one of the two ledgers");
    }
    const auto& samples_a = it_a->second->samples;
    const auto& samples_b = it_b->second->samples;
    if (samples_a.size() != samples_b.size()) {
      return differ("step " + std::to_string(it_a->first) + ": " + std::to_string(samples_a.size()) + " vs " +
                    std::to_string(samples_b.size()) + " dp ranks");
    }
    for (size_t r = 0; r < samples_a.size(); ++r) {
      if (samples_a[r] != samples_b[r]) {
        return differ("step " + std::to_string(it_a->first) + ", dp rank " + std::to_string(r) +
                      ": samples differ");
      }
    }
  }
  if (it_a != history_a.end())
    return differ("step " + std::to_string(it_a->first) + " is only in the first ledger");
  if (it_b != history_b.end())
    return differ("step " + std::to_string(it_b->first) + " is only in the second ledger");
  return true;
}

}  // namespace touchstone::ledger
