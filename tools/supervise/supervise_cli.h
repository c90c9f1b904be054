// `touchstone supervise [options] -- CMD ARGS...`: runs a training job, and when it fails (non-zero
// exit, a signal, or no output line for --stall-timeout seconds) kills its whole process group and
// restarts it, up to --max-restarts times, optionally with another command (a replaced node, another
// layout). Writes a recovery report from its own observations, faults.jsonl and the sample ledger.
// Launches the job's MPI processes, so it never initialises MPI itself (docs/recovery.md).
#pragma once

#include <iosfwd>
#include <memory>

namespace CLI {
class App;
}  // namespace CLI

namespace touchstone::supervise {

class SuperviseCommand {
 public:
  virtual ~SuperviseCommand() = default;
  virtual bool parsed() const = 0;
  // Supervises the job; returns 0 when it finally succeeded, else the last attempt's status.
  // Throws InputError on bad options.
  virtual int run() const = 0;
};

// Adds `supervise` to `app`; the returned object owns the option values and must outlive parsing.
std::unique_ptr<SuperviseCommand> add_supervise_command(CLI::App& app);

}  // namespace touchstone::supervise
