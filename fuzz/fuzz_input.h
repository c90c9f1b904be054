// What every fuzz target shares: the input bytes as a file that a reader opens by its path, and the
// rule that decides what counts as a finding.
//
// The readers take paths (HDF5 opens the file itself, and h5_vlen_check.h reads its raw bytes), so the
// input is written to one file per process, rewritten for every input, in /dev/shm (memory, no disk
// I/O) where there is one, else in $TMPDIR or /tmp. HDF5 resolves the real path of what it opens, so
// an anonymous memfd (/proc/self/fd/N) does not do. A killed process leaves its file behind.
//
// A finding is a crash, a sanitizer report, a leak, a timeout or out-of-memory (libFuzzer's limits), or
// an exception other than touchstone::InputError, the one error type of bad input (common/errors.h):
// that one is printed and the process aborts, so libFuzzer records the input.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
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
  explicit InputFile(const char* name) {
    struct stat info {};
    const char* tmpdir = std::getenv("TMPDIR");
    const std::string folder = ::stat("/dev/shm", &info) == 0 && S_ISDIR(info.st_mode) ? "/dev/shm"
                               : tmpdir                                                ? tmpdir
                                                                                       : "/tmp";
    path_ = folder + "/touchstone-" + name + "-" + std::to_string(::getpid());
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd_ < 0) fail(path_.c_str());
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }

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

  int fd_ = -1;
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

// HDF5 (not instrumented) sizes some metadata buffers from the file before reading them, and handles a
// malloc that fails. ASan would report a size no allocator can satisfy as an error of its own; with
// this it returns NULL, as malloc does without ASan, so HDF5 reports the error it would report in a
// Touchstone run. A size that does succeed still counts against libFuzzer's -malloc_limit_mb. (Each
// target includes this header from its one source file, so the definition is made once.)
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
// HDF5 1.10 leaks metadata-cache entries when it fails to load a damaged object header (H5Fopen and
// H5Oopen through H5C_protect): its bug, not the reader's, and unreachable from it. LeakSanitizer still
// checks every allocation of Touchstone's own code; HDF5 is built without frame pointers, so its leaks
// are told apart by the library they come from.
extern "C" const char* __lsan_default_suppressions() { return "leak:libhdf5_serial.so\nleak:libhdf5.so\n"; }
