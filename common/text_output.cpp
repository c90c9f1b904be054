// The output-path policy and atomic text files (see text_output.h).
#include "common/text_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include "common/errors.h"
#include "common/signals.h"

namespace touchstone {

namespace {

// What is at `path` when it is not a regular file, for a message: "a FIFO". Empty for a regular
// file; `missing` is set when nothing is there.
std::string what_is_at(const std::string& path, bool& missing) {
  missing = false;
  struct stat status {};
  if (::lstat(path.c_str(), &status) != 0) {
    if (errno == ENOENT) {
      missing = true;
      return "";
    }
    return std::string("cannot be examined (") + std::strerror(errno) + ")";
  }
  switch (status.st_mode & S_IFMT) {
    case S_IFREG:
      return "";
    case S_IFDIR:
      return "a directory";
    case S_IFLNK:
      return "a symbolic link (give the path of the file itself)";
    case S_IFIFO:
      return "a FIFO";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    case S_IFSOCK:
      return "a socket";
    default:
      return "not a regular file";
  }
}

// Why nothing may be replaced at `path`, or "" when a regular file or nothing is there.
std::string refusal(const std::string& path) {
  bool missing = false;
  const std::string what = what_is_at(path, missing);
  if (what.empty()) return "";
  if (what.starts_with("cannot")) return what;
  return "is " + what + "; only a regular file is replaced";
}

std::string parent_directory(const std::string& path) {
  return std::filesystem::absolute(path).parent_path().string();
}

}  // namespace

void check_output_path(const std::string& path, const std::string& option) {
  if (path.empty()) throw InputError(option + " '': empty path");
  const std::string why = refusal(path);
  if (!why.empty()) throw InputError(option + " " + path + ": " + why);
  const std::string parent = parent_directory(path);
  std::error_code error;  // a name too long for the file system is bad input, not an exception
  const bool directory = std::filesystem::is_directory(parent, error);
  if (error && error != std::errc::no_such_file_or_directory) {
    throw InputError(option + " " + path + ": " + error.message());
  }
  if (!directory) {
    throw InputError(option + " " + path + ": directory " + parent + " does not exist");
  }
  // access() also answers EROFS for a read-only file system, which a root process meets too.
  if (::access(parent.c_str(), W_OK | X_OK) != 0) {
    throw InputError(option + " " + path + ": cannot write in directory " + parent + " (" +
                     std::strerror(errno) + ")");
  }
}

void check_output_directory(const std::string& path, const std::string& option) {
  if (path.empty()) throw InputError(option + " '': empty path");
  // A symbolic link to a directory is followed: files are written inside it, nothing replaces it.
  std::filesystem::path existing = std::filesystem::absolute(path);
  while (!std::filesystem::exists(existing) && existing.has_relative_path())
    existing = existing.parent_path();
  if (!std::filesystem::is_directory(existing)) {
    const bool itself = existing == std::filesystem::absolute(path);
    throw InputError(option + " " + path + ": " + (itself ? "" : existing.string() + " ") +
                     "is not a directory");
  }
  if (::access(existing.c_str(), W_OK | X_OK) != 0) {
    throw InputError(option + " " + path + ": cannot write in directory " + existing.string() + " (" +
                     std::strerror(errno) + ")");
  }
}

void check_replaceable(const std::string& path) {
  const std::string why = refusal(path);
  if (!why.empty()) throw InputError(path + ": " + why);
}

std::string temporary_path_for(const std::string& path) {
  return path + ".tmp." + std::to_string(::getpid());
}

void write_text_file_atomically(const std::string& path, const std::string& text) {
  const ScopedTemporary temp(temporary_path_for(path));
  const std::string& temp_path = temp.path();
  const auto fail = [&](const std::string& what) {
    const std::string reason = std::strerror(errno);
    ::unlink(temp_path.c_str());
    throw InputError(path + ": cannot " + what + " (" + reason + ")");
  };
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("create " + temp_path);
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int write_errno = errno;
      ::close(fd);
      errno = write_errno;
      fail("write " + temp_path);
    }
    written += static_cast<size_t>(n);
  }
  // Without the sync a crash just after the rename could leave an empty file under the final name.
  if (::fsync(fd) != 0) {
    const int sync_errno = errno;
    ::close(fd);
    errno = sync_errno;
    fail("sync " + temp_path);
  }
  if (::close(fd) != 0) fail("close " + temp_path);
  try {
    check_replaceable(path);
  } catch (const InputError&) {
    ::unlink(temp_path.c_str());
    throw;
  }
  if (std::rename(temp_path.c_str(), path.c_str()) != 0) fail("rename " + temp_path + " into place");
  sync_directory(parent_directory(path));
}

void sync_directory(const std::string& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const bool synced = fd >= 0 && ::fsync(fd) == 0;
  if (fd >= 0) ::close(fd);
  if (!synced)
    throw std::runtime_error(directory + ": cannot sync the directory (" + std::strerror(errno) + ")");
}

}  // namespace touchstone
