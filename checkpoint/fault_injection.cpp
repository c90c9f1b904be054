// The armed process fault and the abrupt death it causes.
#include "checkpoint/fault_injection.h"

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <stdexcept>

#include "checkpoint/ledger/ledger.h"
#include "parallel/comm/context.h"

namespace touchstone {

bool is_fault_phase(std::string_view phase) {
  return phase == "forward" || phase == "backward" || phase == "optimizer" || phase == "save";
}

namespace {

struct ArmedFault {
  ProcessFault fault;
  std::string record_path;
};

std::optional<ArmedFault>& armed() {
  static std::optional<ArmedFault> fault;
  return fault;
}

// Whether `record_path` already holds this fault's record: it has fired in an earlier attempt.
bool already_fired(const ProcessFault& fault, const std::string& record_path) {
  if (!std::filesystem::exists(record_path)) return false;
  for (const ledger::InjectedFailure& failure : ledger::read_faults(record_path)) {
    if (failure.step == fault.step && failure.rank == fault.rank && failure.phase == fault.phase) return true;
  }
  return false;
}

}  // namespace

void arm_process_fault(const ProcessFault& fault, int world_rank, std::string record_path) {
  if (fault.rank != world_rank) return;
  if (!record_path.empty() && already_fired(fault, record_path)) return;
  armed() = ArmedFault{fault, std::move(record_path)};
  install_phase_hook(process_fault_point);
}

void process_fault_point(int64_t step, std::string_view phase) {
  const std::optional<ArmedFault>& fault = armed();
  if (!fault || fault->fault.step != step || fault->fault.phase != phase) return;
  if (!fault->record_path.empty()) {
    try {
      ledger::append_injected_failure(fault->record_path,
                                      ledger::InjectedFailure{fault->fault.step, fault->fault.rank,
                                                              fault->fault.phase, ledger::unix_time_now()});
    } catch (const std::runtime_error&) {
      // the failure itself is what matters; its record is best effort
    }
  }
  std::fprintf(stderr, "touchstone: injected failure: rank %d dies in %s of step %lld\n", fault->fault.rank,
               fault->fault.phase.c_str(), static_cast<long long>(step));
  std::raise(SIGKILL);
}

}  // namespace touchstone
