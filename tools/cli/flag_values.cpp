// Parsing of the flags whose values name a choice, a fault or an output (tools/cli/flag_values.h).
#include "tools/cli/flag_values.h"

#include <charconv>
#include <cstdint>
#include <limits>
#include <stdexcept>

#include "common/text_output.h"

namespace touchstone {

namespace {

// "" when `text` is a decimal integer of the flag's range, rewritten without leading zeros (CLI11 reads
// "010" in base 8); else why not, which CLI11 reports as "<flag>: <why>".
template <typename Integer>
std::string decimal_integer(std::string& text) {
  const bool negative = !text.empty() && text[0] == '-';
  const size_t sign = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
  if (text.size() == sign || text.find_first_not_of("0123456789", sign) != std::string::npos) {
    return "\"" + text + "\" is not a decimal integer";
  }
  if (negative && !std::numeric_limits<Integer>::is_signed) return "\"" + text + "\" is not >= 0";
  Integer value{};
  const char* first = text.data() + (negative ? 0 : sign);
  const auto [end, error] = std::from_chars(first, text.data() + text.size(), value);
  if (error == std::errc::result_out_of_range || end != text.data() + text.size()) {
    return "\"" + text + "\" is out of range (" + std::to_string(std::numeric_limits<Integer>::min()) +
           " to " + std::to_string(std::numeric_limits<Integer>::max()) + ")";
  }
  text = std::to_string(value);
  return "";
}

}  // namespace

void check_integer_flags(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    if (type == "INT") {
      option->transform(CLI::Validator(decimal_integer<int64_t>, ""));
    } else if (type == "UINT") {
      option->transform(CLI::Validator(decimal_integer<uint64_t>, ""));
    }
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) check_integer_flags(*sub);
}

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
