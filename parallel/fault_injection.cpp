// The armed process fault and the abrupt death it causes.
#include "parallel/fault_injection.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "model/errors.h"

namespace touchstone {

namespace {

struct ArmedFault {
  ProcessFault fault;
  std::string record_path;
};

std::optional<ArmedFault>& armed() {
  static std::optional<ArmedFault> fault;
  return fault;
}

bool known_phase(const std::string& phase) {
  return phase == "forward" || phase == "backward" || phase == "optimizer" || phase == "save";
}

void append_record(const ArmedFault& armed_fault) {
  if (armed_fault.record_path.empty()) return;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  char line[256];
  const int length =
      std::snprintf(line, sizeof line,
                    "{\"event\":\"injected_failure\",\"step\":%lld,\"rank\":%d,\"phase\":\"%s\","
                    "\"time\":%.6f}\n",
                    static_cast<long long>(armed_fault.fault.step), armed_fault.fault.rank,
                    armed_fault.fault.phase.c_str(), now);
  const int fd = ::open(armed_fault.record_path.c_str(), O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (fd < 0) return;  // the failure itself is what matters; the record is best effort
  if (::write(fd, line, static_cast<size_t>(length)) == length) ::fsync(fd);
  ::close(fd);
}

}  // namespace

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
  if (fault.step < 1 || fault.rank < 0 || !known_phase(fault.phase)) return fail();
  return fault;
}

namespace {

// Whether `record_path` already holds this fault's record: it has fired in an earlier attempt.
bool already_fired(const ProcessFault& fault, const std::string& record_path) {
  std::ifstream in(record_path);
  std::string line;
  while (std::getline(in, line)) {
    try {
      const nlohmann::json record = nlohmann::json::parse(line);
      if (record.value("step", int64_t{-1}) == fault.step && record.value("rank", -1) == fault.rank &&
          record.value("phase", std::string()) == fault.phase) {
        return true;
      }
    } catch (const nlohmann::json::exception&) {
      // a torn line from a process killed while writing it: not a record
    }
  }
  return false;
}

}  // namespace

void arm_process_fault(const ProcessFault& fault, int world_rank, std::string record_path) {
  if (fault.rank != world_rank) return;
  if (!record_path.empty() && already_fired(fault, record_path)) return;
  armed() = ArmedFault{fault, std::move(record_path)};
}

void process_fault_point(int64_t step, std::string_view phase) {
  const std::optional<ArmedFault>& fault = armed();
  if (!fault || fault->fault.step != step || fault->fault.phase != phase) return;
  append_record(*fault);
  std::fprintf(stderr, "touchstone: injected failure: rank %d dies in %s of step %lld\n", fault->fault.rank,
               fault->fault.phase.c_str(), static_cast<long long>(step));
  std::raise(SIGKILL);
}

}  // namespace touchstone
