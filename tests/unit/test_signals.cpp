// The signal policy (common/signals.h): SIGTERM and SIGINT remove the registered temporaries, also a
// checkpoint's partial directory in the middle of a save, and end the process with 128 + signal; an
// unregistered (committed) file is kept. Each case runs in a forked child that signals itself.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>

#include "checkpoint/checkpoint_store.h"
#include "common/h5_file.h"
#include "common/signals.h"
#include "test_files.h"

namespace touchstone {
namespace {

namespace fs = std::filesystem;

// Runs `before_signal` in a child with the handler installed, sends `signal` to the child itself and
// returns its exit status (-1 when it did not exit normally, 99 when `before_signal` threw).
int status_after_signal(int signal, const std::function<void()>& before_signal) {
  const pid_t child = ::fork();
  if (child == 0) {
    try {
      install_signal_cleanup();
      before_signal();
      ::raise(signal);
    } catch (...) {
      ::_exit(99);
    }
    ::_exit(0);  // the signal did not end the process
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::vector<std::string> entries(const fs::path& directory) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(directory))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(Signals, TermRemovesAnHdf5WritersTemporaryFileAndExits143) {
  testing::ScratchDirectory scratch("signals");
  const std::string out = (scratch.path() / "golden.h5").string();
  const int status = status_after_signal(SIGTERM, [&] {
    static h5::H5Writer writer(out);  // never destroyed: the signal ends the process in the middle
    const double value = 1.0;
    writer.write_f64("/x", &value, {1});
  });
  EXPECT_EQ(status, 128 + SIGTERM);
  EXPECT_TRUE(entries(scratch.path()).empty());
}

TEST(Signals, IntRemovesACheckpointsPartialDirectoryButKeepsCommittedCheckpoints) {
  testing::ScratchDirectory scratch("signals");
  const fs::path directory = scratch.path() / "ckpt";
  fs::create_directories(directory / CheckpointStore::step_directory_name(2));
  const int status = status_after_signal(SIGINT, [&] {
    const CheckpointStore store(directory, 0);
    const fs::path state_file = store.begin_save(4);
    std::ofstream(state_file) << "state";                                    // a committed file
    std::ofstream(state_file.parent_path() / "manifest.json.tmp.1") << "{";  // a file in flight
  });
  EXPECT_EQ(status, 128 + SIGINT);
  EXPECT_EQ(entries(directory), std::vector<std::string>{CheckpointStore::step_directory_name(2)});
}

TEST(Signals, AnUnregisteredPathIsKept) {
  testing::ScratchDirectory scratch("signals");
  const fs::path kept = scratch.path() / "kept";
  const int status = status_after_signal(SIGTERM, [&] {
    std::ofstream(kept) << "x";
    register_temporary(kept.string());
    unregister_temporary(kept.string());
  });
  EXPECT_EQ(status, 128 + SIGTERM);
  EXPECT_TRUE(fs::exists(kept));
}

}  // namespace
}  // namespace touchstone
