// Starting, watching and terminating a child process group (see process_group.h).
#include "checkpoint/supervise/child_group.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>

namespace touchstone::supervise {

namespace {

std::atomic<int> g_termination_signal{0};
int g_wake_write_fd = -1;
constexpr int kRelayedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};
struct sigaction g_previous[sizeof(kRelayedSignals) / sizeof(int)];

void on_signal(int signal) {
  const int saved_errno = errno;
  if (signal != SIGCHLD) g_termination_signal.store(signal);
  const char byte = 0;
  [[maybe_unused]] const ssize_t ignored = ::write(g_wake_write_fd, &byte, 1);
  errno = saved_errno;
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own output is gone: keep supervising, drop the text
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// Children of `parent` from /proc (the re-parented descendants of a subreaper among them).
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> children;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string text;
    if (!std::getline(stat, text)) continue;  // the process is already gone
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so parse after the last ')'.
    const size_t close = text.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0;
    if (std::sscanf(text.c_str() + close + 1, " %c %ld", &state, &ppid) == 2 && ppid == parent) {
      children.push_back(static_cast<pid_t>(std::stol(name)));
    }
  }
  return children;
}

void poll_wake(const SignalRelay* relay, int timeout_ms) {
  if (relay == nullptr) {
    ::usleep(static_cast<useconds_t>(timeout_ms) * 1000);
    return;
  }
  pollfd wake{relay->wake_fd(), POLLIN, 0};
  ::poll(&wake, 1, timeout_ms);
}

}  // namespace

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void become_subreaper() {
#ifdef PR_SET_CHILD_SUBREAPER
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
#endif
}

std::string ChildExit::describe() const {
  if (!signaled) return "exit status " + std::to_string(code);
  const char* name = ::strsignal(signal);
  return "killed by signal " + std::to_string(signal) +
         (name != nullptr ? std::string(" (") + name + ")" : "");
}

SignalRelay::SignalRelay() {
  if (::pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error("cannot create the signal pipe");
  g_wake_write_fd = pipe_[1];
  g_termination_signal.store(0);
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (size_t i = 0; i < sizeof(kRelayedSignals) / sizeof(int); ++i) {
    ::sigaction(kRelayedSignals[i], &action, &g_previous[i]);
  }
  ::signal(SIGPIPE, SIG_IGN);
}

SignalRelay::~SignalRelay() {
  for (size_t i = 0; i < sizeof(kRelayedSignals) / sizeof(int); ++i) {
    ::sigaction(kRelayedSignals[i], &g_previous[i], nullptr);
  }
  g_wake_write_fd = -1;
  ::close(pipe_[0]);
  ::close(pipe_[1]);
}

int SignalRelay::take_termination_signal() {
  char buffer[64];
  while (::read(pipe_[0], buffer, sizeof(buffer)) > 0) {
  }
  const int signal = g_termination_signal.exchange(0);
  if (signal != 0) received_ = signal;
  return signal;
}

ChildGroup::ChildGroup(const std::vector<std::string>& argv) {
  if (argv.empty()) throw std::runtime_error("no command to run");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("cannot create pipes: ") + std::strerror(errno));
  }
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error(std::string("cannot fork: ") + std::strerror(errno));
  if (pid_ == 0) {
    // Only async-signal-safe calls between fork and exec.
    ::setpgid(0, 0);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    // Handlers are reset by exec, but an ignored signal stays ignored: give the child the defaults.
    for (const int s : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD}) ::signal(s, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execvp(args[0], args.data());
    const char message[] = "touchstone supervise: cannot execute the command\n";
    write_all(STDERR_FILENO, message, sizeof(message) - 1);
    ::_exit(127);
  }
  // Also here, so that the group exists before the parent can signal it, whichever runs first.
  ::setpgid(pid_, pid_);
  ::close(out[1]);
  ::close(err[1]);
  out_fd_ = out[0];
  err_fd_ = err[0];
  ::fcntl(out_fd_, F_SETFL, O_NONBLOCK);
  ::fcntl(err_fd_, F_SETFL, O_NONBLOCK);
}

ChildGroup::~ChildGroup() {
  if (!terminated_) terminate_group(nullptr, SIGKILL, 0.0);
}

bool ChildGroup::pass_output() {
  bool completed_line = false;
  char buffer[65536];
  for (int* fd : {&out_fd_, &err_fd_}) {
    while (*fd >= 0) {
      const ssize_t n = ::read(*fd, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;  // EAGAIN: nothing more for now
      if (n == 0) {
        ::close(*fd);
        *fd = -1;
        break;
      }
      write_all(fd == &out_fd_ ? STDOUT_FILENO : STDERR_FILENO, buffer, static_cast<size_t>(n));
      completed_line = completed_line || std::memchr(buffer, '\n', static_cast<size_t>(n)) != nullptr;
    }
  }
  return completed_line;
}

bool ChildGroup::reap() {
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      if (pid == pid_) {
        reaped_ = true;
        exit_.signaled = WIFSIGNALED(status);
        exit_.code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
        exit_.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      }
      continue;
    }
    if (pid < 0 && errno == EINTR) continue;
    return pid < 0 && errno == ECHILD;
  }
}

WaitResult ChildGroup::wait(SignalRelay& relay, double stall_timeout_s) {
  WaitResult result;
  double last_line = steady_seconds();
  for (;;) {
    pollfd fds[3] = {{relay.wake_fd(), POLLIN, 0}, {out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
    const double left = last_line + stall_timeout_s - steady_seconds();
    ::poll(fds, 3, static_cast<int>(std::clamp(left * 1000.0, 0.0, 250.0)));  // negative fds are skipped
    if (pass_output()) last_line = steady_seconds();
    result.detection_time = now_seconds();
    if (const int signal = relay.take_termination_signal(); signal != 0) {
      result.end = WaitEnd::kInterrupted;
      result.interrupt_signal = signal;
      return result;
    }
    reap();
    if (reaped_) {
      result.end = WaitEnd::kExited;
      result.exit = exit_;
      return result;
    }
    if (steady_seconds() - last_line >= stall_timeout_s) {
      result.end = WaitEnd::kStalled;
      return result;
    }
  }
}

void ChildGroup::signal_group_and_orphans(int signal, bool include_group,
                                          std::set<pid_t>* already_signalled) const {
  if (include_group) ::kill(-pid_, signal);  // ESRCH once the group is empty
  for (const pid_t child : children_of(::getpid())) {
    const pid_t group = ::getpgid(child);
    if (group == pid_ || group < 0) continue;  // in the child's group: signalled above
    if (already_signalled != nullptr && !already_signalled->insert(child).second) continue;
    // A descendant in a group of its own (an MPI rank, a daemon): its whole group, never ours.
    ::kill(group == ::getpgrp() ? child : -group, signal);
  }
}

void ChildGroup::terminate_group(SignalRelay* relay, int first_signal, double grace_s) {
  if (terminated_) return;
  std::set<pid_t> signalled;
  signal_group_and_orphans(first_signal, true, &signalled);
  const double deadline = steady_seconds() + grace_s;
  bool killing = first_signal == SIGKILL;
  for (;;) {
    pass_output();
    const bool no_children = reap();
    const bool group_empty = ::kill(-pid_, 0) != 0 && errno == ESRCH;
    if (no_children && group_empty) break;
    if (!killing &&
        (steady_seconds() >= deadline || (relay != nullptr && relay->take_termination_signal() != 0))) {
      killing = true;
    }
    // Repeated, because a parent's death re-parents its descendants to the supervisor; until the
    // grace period ends, each process gets the first signal once.
    if (killing) {
      signal_group_and_orphans(SIGKILL, true, nullptr);
    } else {
      signal_group_and_orphans(first_signal, false, &signalled);
    }
    poll_wake(relay, 20);
  }
  pass_output();
  for (int* fd : {&out_fd_, &err_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  terminated_ = true;
}

}  // namespace touchstone::supervise
