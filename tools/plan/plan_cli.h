// The `touchstone plan` command line: `plan memory`, `plan scaling` and `plan calendar`, registered on
// the main CLI11 app. Parsing only stores options; run() does the work after parsing, so that every
// InputError reaches main()'s handler (one line, exit status 2).
#pragma once

#include <iosfwd>
#include <memory>

namespace CLI {
class App;
}  // namespace CLI

namespace touchstone::plan {

class PlanCommand {
 public:
  virtual ~PlanCommand() = default;
  // True when `plan` (with one of its subcommands) was given on the command line.
  virtual bool parsed() const = 0;
  // Runs the chosen subcommand, printing to `out`; returns the exit status. Throws InputError.
  virtual int run(std::ostream& out) const = 0;
};

// Adds `plan` and its subcommands to `app`; the returned object owns the option values and must
// outlive app.parse().
std::unique_ptr<PlanCommand> add_plan_commands(CLI::App& app);

}  // namespace touchstone::plan
