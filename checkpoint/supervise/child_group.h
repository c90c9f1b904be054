// The supervisor's process handling (POSIX, Linux): a child command in its own process group with its
// output passed through, and a termination that waits until no process of the group remains.
//
// The supervisor makes itself a child subreaper, so descendants that leave the group (MPI launchers
// put each rank in a process group of its own) or lose their parent are re-parented to it; killing
// then also covers those, and the supervisor reaps them, so nothing is left behind, not even a zombie.
#pragma once

#include <sys/types.h>

#include <set>
#include <string>
#include <vector>

namespace touchstone::supervise {

double now_seconds();  // unix time

// SIGINT, SIGTERM and SIGHUP received by the supervisor, and SIGCHLD, turned into a readable pipe so
// that the wait loop wakes up for them. SIGPIPE is ignored (a closed stdout must not kill the
// supervisor while a child runs). One instance per process; restores the previous handlers on exit.
class SignalRelay {
 public:
  SignalRelay();
  ~SignalRelay();
  SignalRelay(const SignalRelay&) = delete;
  SignalRelay& operator=(const SignalRelay&) = delete;

  int wake_fd() const { return pipe_[0]; }
  // Empties the wake-up pipe; returns the termination signal received since the last call, or 0.
  int take_termination_signal();
  // The last termination signal ever taken, so that one consumed while terminating is not forgotten.
  int received() const { return received_; }

 private:
  int pipe_[2] = {-1, -1};
  int received_ = 0;
};

// How a child ended, as waitpid reported it.
struct ChildExit {
  bool signaled = false;
  int code = 0;    // exit code when !signaled
  int signal = 0;  // terminating signal when signaled
  // The shell's convention: the exit code, or 128 + signal.
  int status() const { return signaled ? 128 + signal : code; }
  bool success() const { return !signaled && code == 0; }
  std::string describe() const;
};

// Why an attempt's wait ended.
enum class WaitEnd { kExited, kStalled, kInterrupted };

struct WaitResult {
  WaitEnd end = WaitEnd::kExited;
  ChildExit exit;             // kExited; otherwise ChildGroup::exit() after terminate_group
  int interrupt_signal = 0;   // kInterrupted: the signal the supervisor received (forward it by
                              // passing it to terminate_group)
  double detection_time = 0;  // when the exit, the stall or the signal was seen
};

class ChildGroup {
 public:
  // Starts `argv` (argv[0] searched in PATH) as the leader of a new process group, stdin from
  // /dev/null, stdout and stderr through pipes. Throws std::runtime_error when it cannot be started;
  // a program that cannot be executed exits 127, as in a shell.
  explicit ChildGroup(const std::vector<std::string>& argv);
  ~ChildGroup();  // terminates the group if still running
  ChildGroup(const ChildGroup&) = delete;
  ChildGroup& operator=(const ChildGroup&) = delete;

  pid_t pid() const { return pid_; }

  // Passes output through until the child exits, stays silent (no complete output line) for
  // `stall_timeout_s`, or the supervisor receives a termination signal.
  WaitResult wait(SignalRelay& relay, double stall_timeout_s);

  // Sends `first_signal` to the group (and to every re-parented descendant), SIGKILL after `grace_s`
  // or when the supervisor receives another termination signal, and returns once no process of the
  // group and no child of the supervisor remains. The remaining output is passed through. `relay` may
  // be null (no early escalation).
  void terminate_group(SignalRelay* relay, int first_signal, double grace_s);

  const ChildExit& exit() const { return exit_; }

 private:
  // Reads what the pipes hold and writes it out; returns true when a line was completed.
  bool pass_output();
  // Reaps every exited child of the supervisor; returns true when none is left.
  bool reap();
  // Signals the child's group (when `include_group`) and every child of the supervisor that lives in
  // another group; with `already_signalled`, each such process only once.
  void signal_group_and_orphans(int signal, bool include_group, std::set<pid_t>* already_signalled) const;

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  bool reaped_ = false;
  bool terminated_ = false;
  ChildExit exit_;
};

// Makes the supervisor the reaper of its orphaned descendants (Linux; a no-op elsewhere).
void become_subreaper();

}  // namespace touchstone::supervise
