// Helpers for tests that write files: a scratch directory per test, and the check that an InputError
// is one line naming the pieces a user needs to find the fault (or its message, to compare whole).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "common/errors.h"

namespace touchstone::testing {

// A fresh directory for the running test, removed afterwards.
class ScratchDirectory {
 public:
  explicit ScratchDirectory(const std::string& prefix) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            (prefix + "_" + std::to_string(getpid()) + "_" + std::string(info->name()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDirectory() { std::filesystem::remove_all(path_); }
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// The message of the InputError `action` throws; empty when it throws none.
inline std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// `fn` must throw an InputError whose message is one line containing every piece.
template <typename Fn>
void expect_input_error(Fn fn, const std::vector<std::string>& pieces) {
  try {
    fn();
    ADD_FAILURE() << "no InputError thrown";
  } catch (const InputError& e) {
    const std::string message = e.what();
    for (const std::string& piece : pieces) EXPECT_NE(message.find(piece), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

}  // namespace touchstone::testing
