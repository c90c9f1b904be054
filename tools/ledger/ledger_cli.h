// `touchstone ledger check DIR_OR_FILE [--json OUT]`: checks a sample ledger
// (checkpoint/ledger/ledger_check.h) and prints the report. Reads files only, so it runs without MPI. Exit
// status: 0 every check passes, 1 a check fails, 2 bad input (missing file, malformed line).
#pragma once

#include <iosfwd>
#include <memory>

namespace CLI {
class App;
}  // namespace CLI

namespace touchstone::ledger {

class LedgerCommand {
 public:
  virtual ~LedgerCommand() = default;
  virtual bool parsed() const = 0;
  // Prints the report to `out`; returns the exit status. Throws InputError on bad input.
  virtual int run(std::ostream& out) const = 0;
};

// Adds `ledger check` to `app`; the returned object owns the option values and must outlive parsing.
std::unique_ptr<LedgerCommand> add_ledger_command(CLI::App& app);

}  // namespace touchstone::ledger
