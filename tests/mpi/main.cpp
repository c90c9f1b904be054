// GoogleTest main for the MPI tests: starts MPI, prints the usual report on rank 0 and only the
// failures on every other rank (prefixed with the rank), and exits non-zero on every rank when any
// rank failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <iostream>

#include "parallel/comm/mpi_runtime.h"

namespace {

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::cout << "[rank " << rank_ << "] " << (result.file_name() ? result.file_name() : "?") << ":"
              << result.line_number() << ": Failure\n"
              << result.summary() << std::endl;
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::cout << "[rank " << rank_ << "] FAILED " << info.test_suite_name() << "." << info.name()
                << std::endl;
    }
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  touchstone::MpiRuntime mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (mpi.world_rank() != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(mpi.world_rank()));
  }
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any_failed;
}
