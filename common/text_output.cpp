// Output path checks and atomic text files (see text_output.h).
#include "common/text_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "common/errors.h"

namespace touchstone {

void check_output_path(const std::string& path, const std::string& option) {
  const std::filesystem::path parent = std::filesystem::absolute(path).parent_path();
  if (!std::filesystem::is_directory(parent)) {
    throw InputError(option + " " + path + ": directory " + parent.string() + " does not exist");
  }
  if (std::filesystem::is_directory(path)) throw InputError(option + " " + path + ": is a directory");
}

void write_text_file_atomically(const std::string& path, const std::string& text) {
  const std::string temp_path = path + ".tmp." + std::to_string(::getpid());
  const auto fail = [&](const std::string& what) {
    const std::string reason = std::strerror(errno);
    std::remove(temp_path.c_str());
    throw std::runtime_error(path + ": cannot " + what + " (" + reason + ")");
  };
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("create " + temp_path);
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      fail("write " + temp_path);
    }
    written += static_cast<size_t>(n);
  }
  // Without the sync a crash just after the rename could leave an empty file under the final name.
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail("sync " + temp_path);
  }
  if (::close(fd) != 0) fail("close " + temp_path);
  if (std::rename(temp_path.c_str(), path.c_str()) != 0) fail("rename " + temp_path + " into place");
  sync_directory(std::filesystem::absolute(path).parent_path().string());
}

void sync_directory(const std::string& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const bool synced = fd >= 0 && ::fsync(fd) == 0;
  if (fd >= 0) ::close(fd);
  if (!synced)
    throw std::runtime_error(directory + ": cannot sync the directory (" + std::strerror(errno) + ")");
}

}  // namespace touchstone
