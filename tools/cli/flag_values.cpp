// Parsing of the flags whose values name a choice, a fault or an output (tools/cli/flag_values.h).
#include "tools/cli/flag_values.h"

#include <stdexcept>

#include "common/text_output.h"

namespace touchstone {

CLI::Option* add_output_option(CLI::App* command, const std::string& name, std::string& path,
                               const std::string& description) {
  return command->add_option(name, path, description)->each([name](const std::string& value) {
    if (value.empty()) check_output_path(value, name);
  });
}

CLI::Option* add_output_directory_option(CLI::App* command, const std::string& name, std::string& path,
                                         const std::string& description) {
  return command->add_option(name, path, description)->each([name](const std::string& value) {
    if (value.empty()) check_output_directory(value, name);
  });
}

CommBackend parse_comm_backend(const std::string& value) {
  if (value == comm_backend_name(CommBackend::kMpi)) return CommBackend::kMpi;
  if (value == comm_backend_name(CommBackend::kNccl)) return CommBackend::kNccl;
  throw InputError("--comm: unknown value \"" + value + "\" (mpi, nccl)");
}

BackendKind parse_backend_kind(const std::string& value) {
  if (value == backend_kind_name(BackendKind::kCpu)) return BackendKind::kCpu;
  if (value == backend_kind_name(BackendKind::kCuda)) return BackendKind::kCuda;
  throw InputError("--backend: unknown value \"" + value + "\" (cpu, cuda)");
}

ProcessFault parse_process_fault(const std::string& spec) {
  const auto fail = [&]() -> ProcessFault {
    throw InputError("--fail-at " + spec +
                     ": expected step:rank[:phase] with phase forward, backward, optimizer or save");
  };
  ProcessFault fault;
  const size_t first = spec.find(':');
  if (first == std::string::npos) return fail();
  const size_t second = spec.find(':', first + 1);
  try {
    size_t used = 0;
    fault.step = std::stoll(spec.substr(0, first), &used);
    if (used != first) return fail();
    const std::string rank =
        spec.substr(first + 1, second == std::string::npos ? std::string::npos : second - first - 1);
    fault.rank = std::stoi(rank, &used);
    if (used != rank.size()) return fail();
  } catch (const std::logic_error&) {
    return fail();
  }
  if (second != std::string::npos) fault.phase = spec.substr(second + 1);
  if (fault.step < 1 || fault.rank < 0 || !is_fault_phase(fault.phase)) return fail();
  return fault;
}

}  // namespace touchstone
