// A fresh directory beside the target, exchanged with it in one system call (see published_directory.h).
#include "common/published_directory.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/errors.h"
#include "common/text_output.h"

namespace touchstone {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const std::string& where, const std::string& what, int error) {
  throw InputError(where + ": " + what + " (" + std::strerror(error) + ")");
}

bool target_exists(const fs::path& target) {
  struct stat status {};
  return ::lstat(target.c_str(), &status) == 0;
}

// Removes a directory and what is in it; a failure leaves a stray `.<name>.*` directory, never a
// wrong output, so it is ignored.
void remove_quietly(const std::string& path) {
  std::error_code ignored;
  fs::remove_all(path, ignored);
}

}  // namespace

fs::path directory_path(const std::string& dir) {
  fs::path path = fs::absolute(dir).lexically_normal();
  if (!path.has_filename() && path.has_relative_path()) path = path.parent_path();
  return path;
}

void check_publishable_directory(const std::string& target, const std::string& where) {
  const fs::path directory = directory_path(target);
  if (!target_exists(directory)) return;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory, error)) {
    if (!entry.is_symlink() && entry.is_regular_file()) continue;
    throw InputError(where + ": holds " + entry.path().filename().string() +
                     ", which is not a regular file (the directory is replaced as a whole, and only "
                     "regular files are carried into the new one: export into a directory of its own)");
  }
  if (error) fail(where, "cannot list the directory", error.value());
}

DirectoryPublication::DirectoryPublication(const std::string& target,
                                           const std::vector<std::string>& replaced) {
  const fs::path directory = directory_path(target);
  target_ = directory.string();
  fresh_ =
      (directory.parent_path() / ("." + directory.filename().string() + ".new." + std::to_string(::getpid())))
          .string();
  check_publishable_directory(target_, target_);
  remove_quietly(fresh_);  // left by an earlier process of this pid that was killed with SIGKILL
  registered_.emplace(fresh_, TemporaryKind::kDirectory);
  // A new directory gets the mode mkdir gives under the umask; a replaced one keeps its own.
  struct stat status {};
  const bool replacing = ::lstat(target_.c_str(), &status) == 0;
  if (::mkdir(fresh_.c_str(), 0777) != 0) fail(target_, "cannot create " + fresh_, errno);
  if (replacing && ::chmod(fresh_.c_str(), status.st_mode & 07777) != 0) {
    fail(target_, "cannot set the mode of " + fresh_, errno);
  }
  if (!replacing) return;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    if (std::find(replaced.begin(), replaced.end(), name) != replaced.end()) continue;
    if (::link(entry.path().c_str(), path_of(name).c_str()) != 0) {
      fail(target_, "cannot carry " + name + " into the new directory", errno);
    }
  }
  if (error) fail(target_, "cannot list the directory", error.value());
}

DirectoryPublication::~DirectoryPublication() {
  if (!published_) remove_quietly(fresh_);
}

std::string DirectoryPublication::path_of(const std::string& name) const {
  return (fs::path(fresh_) / name).string();
}

void DirectoryPublication::publish() {
  try {
    sync_directory(fresh_);
  } catch (const std::runtime_error& e) {
    throw InputError(target_ + ": " + e.what());
  }
  if (!target_exists(target_)) {
    if (::rename(fresh_.c_str(), target_.c_str()) != 0)
      fail(target_, "cannot rename " + fresh_ + " to it", errno);
    published_ = true;
  } else if (::renameat2(AT_FDCWD, fresh_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) == 0) {
    // The old directory is at the fresh path now, still registered: a signal from here on removes it.
    published_ = true;
    remove_quietly(fresh_);
  } else if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
    // A file system without the exchange: two renames, the old directory kept aside until the new one
    // is in place, so a kill between them leaves the old files at `.<name>.old.<pid>`, never a mix.
    const std::string old = fs::path(fresh_)
                                .replace_filename("." + fs::path(target_).filename().string() + ".old." +
                                                  std::to_string(::getpid()))
                                .string();
    remove_quietly(old);
    if (::rename(target_.c_str(), old.c_str()) != 0) fail(target_, "cannot move it aside to " + old, errno);
    if (::rename(fresh_.c_str(), target_.c_str()) != 0) {
      const int error = errno;
      ::rename(old.c_str(), target_.c_str());
      fail(target_, "cannot rename " + fresh_ + " to it", error);
    }
    published_ = true;
    remove_quietly(old);
  } else {
    fail(target_, "cannot exchange it with " + fresh_, errno);
  }
  registered_.reset();
  try {
    sync_directory(fs::path(target_).parent_path().string());
  } catch (const std::runtime_error&) {
    // the files are synced and in place; losing the rename needs a crash right now
  }
}

}  // namespace touchstone
