// Text and JSON forms of the ledger check report (see ledger_report.h).
#include "checkpoint/ledger/ledger_report.h"

namespace touchstone::ledger {

namespace {

std::string layout_text(const Layout& l) {
  return "world_size " + std::to_string(l.world_size) + " (tp " + std::to_string(l.tp) + ", cp " +
         std::to_string(l.cp) + ", pp " + std::to_string(l.pp) + ", dp " + std::to_string(l.dp) +
         "), global batch " + std::to_string(l.global_batch_size) + ", micro-batch " +
         std::to_string(l.micro_batch_size);
}

std::string attempt_line(const AttemptSummary& a) {
  std::string line = "attempt " + std::to_string(a.attempt) + ": ";
  line +=
      a.resumed_from_step == 0 ? "fresh start" : "resumed from step " + std::to_string(a.resumed_from_step);
  line += ", " + (a.layout_change.empty() ? layout_text(a.layout) : "layout changed: " + a.layout_change);
  line += a.steps_recorded == 0
              ? "; no step recorded"
              : "; steps " + std::to_string(a.first_step) + ".." + std::to_string(a.last_step);
  if (!a.recomputed_steps.empty()) {
    line += " (recomputed " + step_ranges(a.recomputed_steps) + ", " + std::to_string(a.samples_reread) +
            " samples re-read)";
  }
  if (!a.checkpoints.empty()) line += "; checkpoints at " + step_ranges(a.checkpoints);
  if (!a.recovered_checkpoints.empty()) {
    line += " (" + step_ranges(a.recovered_checkpoints) +
            " killed before its ledger line, recorded by the next attempt from the disk)";
  }
  line += a.ended ? "; ended cleanly" : "; no end record (killed or still running)";
  return line;
}

std::string epoch_line(const EpochCoverage& e, int64_t num_windows) {
  std::string line = "epoch " + std::to_string(e.epoch) + ": ";
  if (e.complete) return line + "windows 0.." + std::to_string(num_windows - 1) + " each read once";
  line += std::to_string(e.windows_read_once) + " of " + std::to_string(num_windows) + " windows read once";
  if (e.windows_missing > 0) line += ", " + std::to_string(e.windows_missing) + " skipped";
  if (e.windows_repeated > 0) line += ", " + std::to_string(e.windows_repeated) + " read more than once";
  if (e.windows_in_epoch < num_windows) line += " (partial epoch: the run ends in it)";
  return line;
}

}  // namespace

std::string step_ranges(const std::vector<int64_t>& steps) {
  std::string text;
  for (size_t i = 0; i < steps.size();) {
    size_t j = i;
    while (j + 1 < steps.size() && steps[j + 1] == steps[j] + 1) ++j;
    if (!text.empty()) text += ", ";
    text += std::to_string(steps[i]);
    if (j > i) text += ".." + std::to_string(steps[j]);
    i = j + 1;
  }
  return text;
}

std::string format_check_report(const CheckReport& r) {
  std::string text = "ledger " + r.path + ": " + std::to_string(r.attempts.size()) +
                     " attempt(s), steps 1.." + std::to_string(r.last_step) + " of " +
                     std::to_string(r.target_steps) + (r.finished ? ", finished" : ", not finished") + "; " +
                     std::to_string(r.samples) + " samples over " + std::to_string(r.num_windows) +
                     " windows\n";
  for (const AttemptSummary& a : r.attempts) text += attempt_line(a) + "\n";
  for (const EpochCoverage& e : r.epochs) text += epoch_line(e, r.num_windows) + "\n";
  text += "recomputed: " + std::to_string(r.steps_recomputed) + " step(s), " +
          std::to_string(r.samples_reread) + " sample(s) re-read\n";
  std::string restarts;
  for (const AttemptSummary& a : r.attempts) {
    if (a.attempt == r.attempts.front().attempt) continue;
    restarts += std::string(restarts.empty() ? "" : "; ") + "attempt " + std::to_string(a.attempt) +
                " from step " + std::to_string(a.resumed_from_step) +
                (a.layout_change.empty() ? "" : " (" + a.layout_change + ")");
  }
  text += "restarts: " + std::to_string(r.attempts.empty() ? 0 : r.attempts.size() - 1) +
          (restarts.empty() ? "" : ": " + restarts) + "\n";
  for (const std::string& note : r.notes) text += "note: " + note + "\n";
  if (r.passed()) {
    text += "check passed: every step in sampler order, every sample read exactly once, no step missing\n";
  } else {
    text += "check FAILED: " + std::to_string(r.problem_count) + " problem(s)\n";
    for (const std::string& p : r.problems) text += "  " + p + "\n";
    if (r.problem_count > static_cast<int64_t>(r.problems.size())) {
      text += "  ... and " + std::to_string(r.problem_count - static_cast<int64_t>(r.problems.size())) +
              " more\n";
    }
  }
  return text;
}

nlohmann::json to_json(const CheckReport& r) {
  nlohmann::json attempts = nlohmann::json::array();
  for (const AttemptSummary& a : r.attempts) {
    attempts.push_back(
        {{"attempt", a.attempt},
         {"start_time", a.start_time},
         {"resumed_from_step", a.resumed_from_step},
         {"layout",
          {{"world_size", a.layout.world_size},
           {"tp", a.layout.tp},
           {"cp", a.layout.cp},
           {"pp", a.layout.pp},
           {"dp", a.layout.dp},
           {"global_batch_size", a.layout.global_batch_size},
           {"micro_batch_size", a.layout.micro_batch_size}}},
         {"layout_change", a.layout_change},
         {"first_step", a.first_step},
         {"last_step", a.last_step},
         {"steps_recorded", a.steps_recorded},
         {"first_step_time", a.steps_recorded > 0 ? nlohmann::json(a.first_step_time) : nlohmann::json()},
         {"recomputed_steps", a.recomputed_steps},
         {"samples_reread", a.samples_reread},
         {"checkpoints", a.checkpoints},
         {"recovered_checkpoints", a.recovered_checkpoints},
         {"data_fingerprint",
          a.data_fingerprint.empty() ? nlohmann::json() : nlohmann::json(a.data_fingerprint)},
         {"ended", a.ended},
         {"end_time", a.ended ? nlohmann::json(a.end_time) : nlohmann::json()}});
  }
  nlohmann::json epochs = nlohmann::json::array();
  for (const EpochCoverage& e : r.epochs) {
    epochs.push_back({{"epoch", e.epoch},
                      {"windows_in_epoch", e.windows_in_epoch},
                      {"windows_read_once", e.windows_read_once},
                      {"windows_missing", e.windows_missing},
                      {"windows_repeated", e.windows_repeated},
                      {"complete", e.complete}});
  }
  return {{"path", r.path},
          {"passed", r.passed()},
          {"problem_count", r.problem_count},
          {"problems", r.problems},
          {"notes", r.notes},
          {"last_step", r.last_step},
          {"target_steps", r.target_steps},
          {"finished", r.finished},
          {"num_windows", r.num_windows},
          {"samples", r.samples},
          {"steps_recomputed", r.steps_recomputed},
          {"samples_reread", r.samples_reread},
          {"restarts", r.attempts.empty() ? 0 : r.attempts.size() - 1},
          {"attempts", attempts},
          {"epochs", epochs}};
}

}  // namespace touchstone::ledger
