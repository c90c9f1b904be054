// What every fuzz target shares: the input bytes as a file that a reader opens by its path, and the
// rule that decides what counts as a finding.
//
// The readers take paths (HDF5 opens the file itself, and h5_vlen_check.h reads its raw bytes), so the
// input is written to an anonymous in-memory file (memfd) and the reader is given /proc/self/fd/N:
// no disk I/O, and nothing left behind when a run is killed.
//
// A finding is a crash, a sanitizer report, a leak, a timeout or out-of-memory (libFuzzer's limits), or
// an exception other than touchstone::InputError, the one error type of bad input (common/errors.h):
// that one is printed and the process aborts, so libFuzzer records the input.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <typeinfo>

#include "common/errors.h"

namespace touchstone::fuzz {

class InputFile {
 public:
  explicit InputFile(const char* name) : fd_(::memfd_create(name, 0)) {
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile() { ::close(fd_); }

  // Replaces the file's content with `size` bytes and returns its path.
  const std::string& write(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0) fail("ftruncate");
    size_t written = 0;
    while (written < size) {
      const ssize_t n = ::pwrite(fd_, data + written, size - written, static_cast<off_t>(written));
      if (n <= 0) fail("pwrite");
      written += static_cast<size_t>(n);
    }
    return path_;
  }

 private:
  [[noreturn]] static void fail(const char* what) {
    std::perror(what);
    std::abort();
  }

  int fd_;
  std::string path_;
};

// Runs `read`; an InputError is the reader refusing bad input as documented, anything else a finding.
template <typename Read>
void expect_input_errors_only(Read&& read) {
  try {
    read();
  } catch (const InputError&) {
  } catch (const std::exception& error) {
    std::fprintf(stderr, "finding: %s escaped the reader: %s\n", typeid(error).name(), error.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "finding: a non-standard exception escaped the reader\n");
    std::abort();
  }
}

}  // namespace touchstone::fuzz
