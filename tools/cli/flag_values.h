// Command-line values parsed into the libraries' types. The libraries never see a flag's text and
// never name a flag; errors here name the flag the user typed (exit status 2).
#pragma once

#include <string>
#include <utility>

#include "checkpoint/fault_injection.h"
#include "common/errors.h"
#include "kernels/backend.h"
#include "parallel/comm/comm_backend.h"

namespace touchstone {

// --comm: "mpi" or "nccl".
CommBackend parse_comm_backend(const std::string& value);
// --backend: "cpu" or "cuda".
BackendKind parse_backend_kind(const std::string& value);
// --fail-at: "step:rank[:phase]" with step >= 1, rank >= 0 and phase forward (the default), backward,
// optimizer or save.
ProcessFault parse_process_fault(const std::string& spec);

// Runs `action` and returns what it returns; an InputError it throws comes back as
// "<flag>: <its message>". A library says why it refuses (no CUDA device is visible, two ranks share a
// GPU) without knowing which flag asked for it; the command line does know.
template <class Action>
auto naming_flag(const std::string& flag, Action&& action) -> decltype(action()) {
  try {
    return std::forward<Action>(action)();
  } catch (const InputError& e) {
    throw InputError(flag + ": " + e.what());
  }
}

}  // namespace touchstone
