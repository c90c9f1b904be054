// Error types shared by every component.
//
// InputError is anything the user can fix: a bad config key or value, an impossible shape, a bad data
// file, an unreadable golden file, an output path that cannot be written (docs/config.md#outputs). The
// CLI prints its message on one line and exits with status 2, before any compute and without leaving
// an output file behind. A write failure of an output (a full disk, an I/O error) is an InputError
// too: one line naming the file, status 2, no temporary left. Everything else is a bug or an
// environment failure and exits with status 1.
#pragma once

#include <stdexcept>
#include <string>

namespace touchstone {

class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace touchstone
