// Options and output of `touchstone ledger check` (see ledger_cli.h).
#include "tools/ledger/ledger_cli.h"

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>

#include "checkpoint/ledger/ledger_report.h"
#include "common/errors.h"
#include "common/text_output.h"
#include "tools/cli/flag_values.h"

namespace touchstone::ledger {

namespace {

class LedgerCommandImpl final : public LedgerCommand {
 public:
  explicit LedgerCommandImpl(CLI::App& app) {
    ledger_ = app.add_subcommand("ledger", "Sample ledgers of resumable runs");
    ledger_->require_subcommand(1);
    check_ = ledger_->add_subcommand(
        "check",
        "Check that every step read its samples in the sampler order, every sample exactly once across "
        "restarts, and no step is missing; report the recomputed work (see docs/recovery.md)");
    check_->add_option("ledger", path_, "The checkpoint directory holding ledger.jsonl, or the ledger file")
        ->required();
    add_output_option(check_, "--json", json_path_, "Also write the report as JSON");
  }

  bool parsed() const override { return ledger_->parsed(); }

  int run(std::ostream& out) const override {
    if (!json_path_.empty()) check_output_path(json_path_, "--json");
    const std::string file = ledger_path(path_);
    if (!std::filesystem::is_regular_file(file)) throw InputError(file + ": no such ledger file");
    const CheckReport report = check_ledger(read_ledger(file));
    out << format_check_report(report) << std::flush;
    if (!json_path_.empty()) write_text_file_atomically(json_path_, to_json(report).dump(2) + "\n");
    if (report.passed()) return 0;
    std::cerr << "touchstone: ledger check failed: " << report.problems.front() << std::endl;
    return 1;
  }

 private:
  CLI::App* ledger_;
  CLI::App* check_;
  std::string path_;
  std::string json_path_;
};

}  // namespace

std::unique_ptr<LedgerCommand> add_ledger_command(CLI::App& app) {
  return std::make_unique<LedgerCommandImpl>(app);
}

}  // namespace touchstone::ledger
