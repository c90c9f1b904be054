// The table of temporaries in flight and the SIGINT/SIGTERM handler that removes them (see signals.h).
#include "common/signals.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace touchstone {

namespace {

// A few at once: one output file, or a checkpoint's partial directory and the file being written in it.
constexpr int kSlots = 16;

// A slot is claimed (kWriting) before its path is copied and published (kActive) after, so that the
// handler never reads a path being written; it reads kActive slots only.
enum SlotState : int { kFree = 0, kWriting = 1, kActive = 2 };

struct Slot {
  std::atomic<int> state{kFree};
  TemporaryKind kind = TemporaryKind::kFile;
  char path[PATH_MAX] = {};
};

Slot g_slots[kSlots];

// The entries of a flat directory, read with the getdents64 system call: opendir and readdir may
// allocate, which a signal handler must not do.
void remove_directory_entries(const char* directory) {
  const int fd = ::open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  alignas(8) char buffer[4096];
  for (;;) {
    const long bytes = ::syscall(SYS_getdents64, fd, buffer, sizeof buffer);
    if (bytes <= 0) break;
    for (long offset = 0; offset < bytes;) {
      const auto* entry = reinterpret_cast<const struct dirent64*>(buffer + offset);
      const char* name = entry->d_name;
      const bool dot = name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'));
      if (!dot) ::unlinkat(fd, name, 0);
      offset += entry->d_reclen;
    }
  }
  ::close(fd);
}

void remove_temporaries_and_exit(int signal) {
  // Files first: a registered file may lie inside a registered directory.
  for (const TemporaryKind kind : {TemporaryKind::kFile, TemporaryKind::kDirectory}) {
    for (Slot& slot : g_slots) {
      if (slot.state.load(std::memory_order_acquire) != kActive || slot.kind != kind) continue;
      if (kind == TemporaryKind::kFile) {
        ::unlink(slot.path);
      } else {
        remove_directory_entries(slot.path);
        ::rmdir(slot.path);
      }
    }
  }
  ::_exit(128 + signal);
}

}  // namespace

void install_signal_cleanup() {
  struct sigaction action {};
  action.sa_handler = remove_temporaries_and_exit;
  sigemptyset(&action.sa_mask);
  // A second signal while the first is handled waits; the process ends in the first handler anyway.
  sigaddset(&action.sa_mask, SIGINT);
  sigaddset(&action.sa_mask, SIGTERM);
  for (const int signal : {SIGINT, SIGTERM}) {
    // A signal ignored when the process started stays ignored (a shell starts a background job with
    // SIGINT ignored; nohup): the handler is only for the signals that would have ended the process.
    struct sigaction previous {};
    if (::sigaction(signal, nullptr, &previous) == 0 && previous.sa_handler == SIG_IGN) continue;
    if (::sigaction(signal, &action, nullptr) != 0) {
      throw std::runtime_error(std::string("cannot install the signal handler: ") + std::strerror(errno));
    }
  }
}

void register_temporary(const std::string& path, TemporaryKind kind) {
  if (path.size() >= PATH_MAX) throw std::runtime_error(path + ": temporary path too long to register");
  for (Slot& slot : g_slots) {
    int expected = kFree;
    if (!slot.state.compare_exchange_strong(expected, kWriting, std::memory_order_acq_rel)) continue;
    slot.kind = kind;
    std::memcpy(slot.path, path.c_str(), path.size() + 1);
    slot.state.store(kActive, std::memory_order_release);
    return;
  }
  throw std::runtime_error(path + ": too many temporary files in flight to register another");
}

void unregister_temporary(const std::string& path) {
  for (Slot& slot : g_slots) {
    if (slot.state.load(std::memory_order_acquire) == kActive && path == slot.path) {
      slot.state.store(kFree, std::memory_order_release);
      return;
    }
  }
}

ScopedTemporary::ScopedTemporary(std::string path, TemporaryKind kind) : path_(std::move(path)) {
  register_temporary(path_, kind);
}

}  // namespace touchstone
