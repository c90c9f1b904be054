// Command-line values parsed into the libraries' types. The libraries never see a flag's text and
// never name a flag; errors here name the flag the user typed (exit status 2).
#pragma once

#include <CLI/CLI.hpp>
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

// Declares a flag naming an output file (`directory`: an output directory). CLI11 leaves `path` empty
// both when the flag is absent and when it is given as '', and a command reads an empty path as "no
// output": a given empty path is refused here, as an InputError thrown by the parse. The command
// checks the paths given with common/text_output.h before it starts working.
CLI::Option* add_output_option(CLI::App* command, const std::string& name, std::string& path,
                               const std::string& description);
CLI::Option* add_output_directory_option(CLI::App* command, const std::string& name, std::string& path,
                                         const std::string& description);

// Makes every integer flag of `app` and its subcommands (CLI11's type names INT and UINT) accept
// exactly a decimal integer that fits its type's int64_t or uint64_t range, as "--tp 4" means. CLI11
// alone reads the text with strtoll/strtoull in base 0 and never checks the range: "99999999999999999999"
// became 2^63 - 1, "-1" for an unsigned flag 2^64 - 1, "010" 8 and "0x10" 16. Here the first three are
// refused with a parse error naming the flag and the value, and leading zeros are read as decimal.
// Call once, after every option is declared and before parsing.
void check_integer_flags(CLI::App& app);

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
