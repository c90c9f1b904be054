// Atomic whole-file writes with POSIX calls (open, write, fsync, rename).
#include "checkpoint/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace touchstone {

namespace {

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what) {
  throw std::runtime_error(path.string() + ": " + what + ": " + std::strerror(errno));
}

}  // namespace

void sync_directory(const std::filesystem::path& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) fail(directory, "cannot open directory to sync it");
  const int status = ::fsync(fd);
  ::close(fd);
  if (status != 0) fail(directory, "cannot sync directory");
}

void write_file_atomically(const std::filesystem::path& path, std::string_view content) {
  std::string temp = path.string() + ".tmpXXXXXX";
  const int fd = ::mkstemp(temp.data());
  if (fd < 0) fail(path, "cannot create a temporary file");
  size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0) {
      ::close(fd);
      ::unlink(temp.c_str());
      fail(path, "write failed");
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(temp.c_str());
    fail(path, "cannot sync");
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    ::unlink(temp.c_str());
    fail(path, "cannot rename the temporary file into place");
  }
  sync_directory(path.has_parent_path() ? path.parent_path() : std::filesystem::path("."));
}

}  // namespace touchstone
