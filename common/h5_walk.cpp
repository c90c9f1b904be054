// The child-process walk of an HDF5 file (see h5_walk.h).
#include "common/h5_walk.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common/errors.h"
#include "common/h5_file.h"

namespace touchstone::h5 {
namespace {

// A group linked into itself, or a web of links, must not make the walk endless.
constexpr int kMaxDepth = 64;
constexpr int64_t kMaxObjects = 4'000'000;

struct Budget {
  uint64_t dataset_bytes =
      0;  // a dataset declaring more values than this is not read (the reader refuses it)
  int64_t objects_left = kMaxObjects;
  std::unordered_set<uint64_t> visited;  // object header addresses: each object is walked once
  // A listing (of an object's attributes or a group's links) that HDF5 failed: what it did not list, the
  // walk did not read, yet a reader can still open it by name (H5Aopen, H5Dopen find what H5Aiterate,
  // H5Literate stop short of), so the walk cannot vouch for the file.
  bool listing_failed = false;
};

template <typename F>
void tolerating_input_errors(F&& call) {
  try {
    call();
  } catch (const InputError&) {
    // An error the reader reports itself; the walk only looks for what would crash.
  }
}

uint64_t declared_bytes(const std::vector<int64_t>& shape) {
  uint64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return UINT64_MAX;
    const auto d = static_cast<uint64_t>(dim);
    if (d != 0 && count > UINT64_MAX / 8 / d) return UINT64_MAX;
    count *= d;
  }
  return count * 8;
}

// The names a listing gives, or none when HDF5 fails it (the walk then cannot vouch for the file).
template <typename F>
std::optional<std::vector<std::string>> listed(Budget& budget, F&& list) {
  try {
    return list();
  } catch (const InputError&) {
    budget.listing_failed = true;
    return std::nullopt;
  }
}

// Everything the reader can be asked about `path`, and everything below it.
void walk(const H5Reader& reader, const std::string& path, int depth, Budget& budget) {
  if (depth > kMaxDepth || --budget.objects_left < 0 || budget.listing_failed) return;
  bool first_visit = true;
  tolerating_input_errors([&] { first_visit = budget.visited.insert(reader.object_address(path)).second; });
  if (!first_visit) return;  // a hard link to an object already walked (a group linked into itself)
  // A link to nothing (dangling, or to a header HDF5 cannot read): no reader can open it by this name.
  if (!reader.opens(path)) return;
  const std::optional<std::vector<std::string>> attributes =
      listed(budget, [&] { return reader.attribute_names(path); });
  if (!attributes) return;
  for (const std::string& name : *attributes) {
    tolerating_input_errors([&] { (void)reader.string_attribute(path, name); });
    tolerating_input_errors([&] { (void)reader.int_attribute(path, name); });
  }
  // has_attribute walks every attribute message of the header, whatever name it looks for.
  tolerating_input_errors([&] { (void)reader.has_attribute(path, "touchstone walk: no such attribute"); });
  if (reader.is_group(path)) {
    const std::optional<std::vector<std::string>> children =
        listed(budget, [&] { return reader.children(path); });
    if (!children) return;
    for (const std::string& child : *children) {
      walk(reader, path == "/" ? "/" + child : path + "/" + child, depth + 1, budget);
    }
    return;
  }
  tolerating_input_errors([&] {
    const std::vector<int64_t> shape = reader.shape(path);
    (void)reader.element_type(path);
    if (declared_bytes(shape) > budget.dataset_bytes) return;
    tolerating_input_errors([&] { (void)reader.read_f64(path); });
    tolerating_input_errors([&] { (void)reader.read_i64(path); });
    tolerating_input_errors([&] { (void)reader.read_i32(path); });
  });
}

// The child's exit status when HDF5 failed to list an object's attributes or a group's links.
constexpr int kListingFailed = 4;

// The child: exit status 0 when the walk finished, whatever the reader reported along the way.
[[noreturn]] void walk_and_exit(const std::string& path, uint64_t file_size) {
  // The child must not outlive a parent that is killed or interrupted while it waits.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The parent's temporaries are the parent's: a Ctrl-C that reaches the child just ends it.
  ::signal(SIGINT, SIG_DFL);
  ::signal(SIGTERM, SIG_DFL);
  // Silent: what went wrong is the parent's to say, in one line (a sanitizer's report included).
  const int null_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (null_fd >= 0) {
    ::dup2(null_fd, STDOUT_FILENO);
    ::dup2(null_fd, STDERR_FILENO);
  }
  int status = 0;
  try {
    // Uncompressed values take at least their size in the file; allow compression up to 8x.
    Budget budget;
    budget.dataset_bytes = 8 * file_size + (64u << 20);
    tolerating_input_errors([&] {
      const H5Reader reader(path, H5Reader::Walk::kNone);
      walk(reader, "/", 0, budget);
    });
    if (budget.listing_failed) status = kListingFailed;
  } catch (...) {
    status = 3;  // anything but an InputError (std::bad_alloc, ...): the reader would not survive it either
  }
  _exit(status);  // no exit handlers: the parent's state (HDF5, MPI, buffered output) is not the child's
}

}  // namespace

void walk_in_child_process(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) return;  // the reader says what is wrong
  const auto file_size = static_cast<uint64_t>(info.st_size);
  const pid_t child = ::fork();
  if (child < 0) {
    throw InputError(path + ": cannot start the process that checks the file (" + std::strerror(errno) + ")");
  }
  if (child == 0) walk_and_exit(path, file_size);

  // Reading proceeds at far more than 10 MB/s; a walk slower than that is stuck in a damaged structure.
  const auto limit = std::chrono::seconds(60 + static_cast<int64_t>(file_size / 10'000'000));
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  auto pause = std::chrono::microseconds(200);
  for (;;) {
    const pid_t done = ::waitpid(child, &status, WNOHANG);
    if (done == child) break;
    if (done < 0 && errno != EINTR) {
      throw InputError(path + ": cannot wait for the process that checks the file (" + std::strerror(errno) +
                       ")");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(child, SIGKILL);
      while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
      }
      throw InputError(path + ": damaged HDF5 file (reading it did not finish within " +
                       std::to_string(limit.count()) + " s)");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20'000));
  }
  if (WIFSIGNALED(status)) {
    throw InputError(path + ": damaged HDF5 file (the HDF5 library crashed reading it: signal " +
                     std::to_string(WTERMSIG(status)) + ")");
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == kListingFailed) {
    throw InputError(path +
                     ": damaged HDF5 file (the HDF5 library cannot list the attributes or links of an "
                     "object, which it could still open by name)");
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
    throw InputError(path + ": damaged HDF5 file (the HDF5 library failed reading it: status " +
                     std::to_string(WEXITSTATUS(status)) + ")");
  }
}

}  // namespace touchstone::h5
