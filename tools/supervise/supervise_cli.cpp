// Options and the restart loop of `touchstone supervise` (see supervise_cli.h).
#include "tools/supervise/supervise_cli.h"

#include <signal.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <sstream>

#include "checkpoint/ledger/ledger.h"
#include "checkpoint/supervise/recovery_report.h"
#include "common/errors.h"
#include "common/text_output.h"
#include "tools/cli/flag_values.h"

namespace touchstone::supervise {

namespace {

std::string join(const std::vector<std::string>& words) {
  std::string text;
  for (const std::string& w : words) text += (text.empty() ? "" : " ") + w;
  return text;
}

void say(const std::string& message) { std::cerr << "touchstone supervise: " << message << std::endl; }

// The longest duration a flag accepts: about 11.6 days. Beyond it a deadline is meaningless, and near
// the double range it overflows the arithmetic of the wait loops.
constexpr double kMaxDurationS = 1e6;

// A duration in seconds: a finite number, positive (or 0 where `zero_means` says what 0 does), at most
// kMaxDurationS. NaN would make every deadline comparison false: a wait that never ends.
CLI::Validator duration_seconds(const char* zero_means) {
  const bool zero_allowed = zero_means != nullptr;
  return CLI::Validator(
      [zero_allowed](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        const bool parsed = !text.empty() && end == text.c_str() + text.size();
        const std::string range =
            std::string(zero_allowed ? "0 or a number of seconds above 0" : "a number of seconds above 0") +
            " and at most 1e6";
        if (!parsed || !std::isfinite(value))
          return "\"" + text + "\" is not a finite number (" + range + ")";
        if (value < 0.0 || (value == 0.0 && !zero_allowed) || value > kMaxDurationS) {
          return text + " is out of range (" + range + ")";
        }
        return std::string();
      },
      zero_allowed ? std::string("SECONDS (0: ") + zero_means + ")" : "SECONDS");
}

class SuperviseCommandImpl final : public SuperviseCommand {
 public:
  explicit SuperviseCommandImpl(CLI::App& app) {
    command_ =
        app.add_subcommand("supervise",
                           "Run a training command; when it fails or stalls, kill its whole process group "
                           "and restart it; report the recovery (see docs/recovery.md)");
    command_->add_option("--max-restarts", max_restarts_, "Restarts before giving up")
        ->check(CLI::Range(0, std::numeric_limits<int>::max()))
        ->capture_default_str();
    command_
        ->add_option("--stall-timeout", stall_timeout_s_,
                     "Seconds without a complete output line after which the job counts as stalled")
        ->check(duration_seconds(nullptr))
        ->capture_default_str();
    command_
        ->add_option("--kill-grace", kill_grace_s_,
                     "Seconds between SIGTERM and SIGKILL when the job's processes are terminated")
        ->check(duration_seconds("SIGKILL right after SIGTERM"))
        ->capture_default_str();
    command_->add_option("--restart-command", restart_command_,
                         "Shell command (run with /bin/sh -c) for the restarts instead of the command: "
                         "another node list, another layout");
    add_output_directory_option(command_, "--checkpoint-dir", checkpoint_dir_,
                                "The job's checkpoint directory, where ledger.jsonl and faults.jsonl are "
                                "(created when missing)");
    add_output_option(command_, "--report", report_path_,
                      "Write the recovery report as JSON, and its timeline as SVG next to it");
    command_->add_option("command", job_, "The command to run, after --")->required();
  }

  bool parsed() const override { return command_->parsed(); }

  int run() const override {
    prepare_outputs();
    become_subreaper();
    SignalRelay relay;
    RecoveryReport report;
    report.command = job_;
    report.restart_command = restart_command_;
    report.checkpoint_dir = checkpoint_dir_;
    report.max_restarts = max_restarts_;
    report.stall_timeout_s = stall_timeout_s_;
    report.kill_grace_s = kill_grace_s_;
    report.start_time = now_seconds();
    for (int number = 1;; ++number) {
      const bool restart = number > 1 && !restart_command_.empty();
      const std::vector<std::string> argv =
          restart ? std::vector<std::string>{"/bin/sh", "-c", restart_command_} : job_;
      AttemptRecord& attempt = report.attempts.emplace_back();
      attempt.number = number;
      attempt.command = restart ? restart_command_ : join(job_);
      attempt.ledger_starts_before = ledger_starts(report.notes);
      const size_t faults_before = faults(report.notes).size();
      if (number > 1) {
        say("restart " + std::to_string(number - 1) + " of " + std::to_string(max_restarts_) + ": " +
            attempt.command);
      }
      run_attempt(argv, relay, attempt);
      const std::vector<ledger::InjectedFailure> recorded = faults(report.notes);
      if (recorded.size() > faults_before) attempt.injected = recorded[faults_before];
      if (attempt.end == WaitEnd::kInterrupted || relay.received() != 0) {
        report.outcome = "interrupted";
        report.exit_status = 128 + relay.received();
        break;
      }
      if (!attempt.failed()) {
        report.outcome = "succeeded";
        report.exit_status = 0;
        break;
      }
      say("attempt " + std::to_string(number) +
          " failed: " + (attempt.end == WaitEnd::kStalled ? "stalled, " : "") + attempt.exit.describe());
      if (number > max_restarts_) {
        report.outcome = "gave up";
        report.exit_status = attempt.exit.status() != 0 ? attempt.exit.status() : 1;
        break;
      }
    }
    report.end_time = now_seconds();
    const bool ledger_good = read_final_ledger(report);
    if (report.outcome == "succeeded" && !ledger_good) {
      // The job exited 0, but the ledger does not show a correct history: not a success.
      report.outcome = "ledger check failed";
      report.exit_status = 1;
    }
    if (!report_path_.empty()) {
      write_text_file_atomically(report_path_, to_json(report).dump(2) + "\n");
      write_text_file_atomically(svg_path(), render_recovery_timeline_svg(report));
    }
    std::cerr << format_summary(report) << std::flush;
    if (report.outcome == "gave up") {
      say("error: the job failed " + std::to_string(report.attempts.size()) +
          " times (last: " + report.attempts.back().exit.describe() + "); gave up after " +
          std::to_string(max_restarts_) + " restart(s)");
    } else if (report.outcome == "ledger check failed") {
      say("error: the job succeeded but its ledger " + ledger_file() +
          " does not check: " + (report.ledger ? report.ledger->problems.front() : report.notes.back()));
    } else if (report.outcome == "interrupted") {
      say("error: interrupted by signal " + std::to_string(relay.received()) + "; the job was terminated");
    }
    return report.exit_status;
  }

 private:
  void run_attempt(const std::vector<std::string>& argv, SignalRelay& relay, AttemptRecord& attempt) const {
    attempt.launch_time = now_seconds();
    ChildGroup child(argv);
    const WaitResult result = child.wait(relay, stall_timeout_s_);
    attempt.detection_time = result.detection_time;
    attempt.end = result.end;
    if (result.end == WaitEnd::kStalled) {
      std::ostringstream seconds;
      seconds << stall_timeout_s_;
      say("no output line for " + seconds.str() + " s: the job counts as stalled");
    }
    // Also after a clean exit: whatever the job left running in its group must not outlive it.
    child.terminate_group(&relay, result.end == WaitEnd::kInterrupted ? result.interrupt_signal : SIGTERM,
                          kill_grace_s_);
    attempt.exit = child.exit();
  }

  int ledger_starts(std::vector<std::string>& notes) const {
    const std::string path = ledger_file();
    if (path.empty() || !std::filesystem::exists(path)) return 0;
    try {
      int starts = 0;
      for (const ledger::Event& e : ledger::read_ledger(path).events)
        starts += e.kind == ledger::EventKind::kStart;
      return starts;
    } catch (const InputError& e) {
      notes.push_back(e.what());
      return 0;
    }
  }

  std::vector<ledger::InjectedFailure> faults(std::vector<std::string>& notes) const {
    if (checkpoint_dir_.empty()) return {};
    const std::string path = (std::filesystem::path(checkpoint_dir_) / ledger::kFaultsFileName).string();
    if (!std::filesystem::exists(path)) return {};
    try {
      return ledger::read_faults(path);
    } catch (const InputError& e) {
      notes.push_back(e.what());
      return {};
    }
  }

  // Checks the ledger the job left; false when it exists and is malformed or fails its check. No
  // ledger at all is only noted: the supervised command need not write one.
  bool read_final_ledger(RecoveryReport& report) const {
    const std::string path = ledger_file();
    if (path.empty()) return true;
    if (!std::filesystem::exists(path)) {
      report.notes.push_back(path + ": no ledger was written");
      return true;
    }
    try {
      report.ledger = ledger::check_ledger(ledger::read_ledger(path));
      return report.ledger->passed();
    } catch (const InputError& e) {
      report.notes.push_back(e.what());
      return false;
    }
  }

  // Creates the checkpoint directory before the report path is checked, so that a report inside it
  // (`--checkpoint-dir ckpt --report ckpt/report.json`) is accepted on a fresh start; a directory
  // created here is removed again when the report path is refused.
  void prepare_outputs() const {
    bool created = false;
    if (!checkpoint_dir_.empty()) {
      check_output_directory(checkpoint_dir_, "--checkpoint-dir");
      std::error_code error;
      created = std::filesystem::create_directories(checkpoint_dir_, error);
      if (error) {
        throw InputError("--checkpoint-dir " + checkpoint_dir_ + ": cannot create the directory (" +
                         error.message() + ")");
      }
    }
    if (report_path_.empty()) return;
    try {
      check_output_path(report_path_, "--report");
      check_output_path(svg_path(), "--report (its timeline)");
    } catch (const InputError&) {
      std::error_code ignored;
      if (created) std::filesystem::remove(checkpoint_dir_, ignored);
      throw;
    }
  }

  std::string ledger_file() const {
    return checkpoint_dir_.empty()
               ? ""
               : (std::filesystem::path(checkpoint_dir_) / ledger::kLedgerFileName).string();
  }

  std::string svg_path() const {
    return (std::filesystem::path(report_path_).replace_extension(".svg")).string();
  }

  CLI::App* command_;
  int max_restarts_ = 3;
  double stall_timeout_s_ = 600;
  double kill_grace_s_ = 10;
  std::string restart_command_;
  std::string checkpoint_dir_;
  std::string report_path_;
  std::vector<std::string> job_;
};

}  // namespace

std::unique_ptr<SuperviseCommand> add_supervise_command(CLI::App& app) {
  return std::make_unique<SuperviseCommandImpl>(app);
}

}  // namespace touchstone::supervise
