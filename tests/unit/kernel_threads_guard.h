// For tests of thread-count independence: while alive, every parallel_for loop is split between the
// kernel threads however small it is (min_parallel_work 1); the thread count and the threshold the test
// found come back afterwards.
#pragma once

#include <cstdint>

#include "kernels/cpu/parallel_for.h"

namespace touchstone::testing {

class KernelThreadsGuard {
 public:
  KernelThreadsGuard() : threads_(cpu::kernel_threads()), min_work_(cpu::min_parallel_work()) {
    cpu::set_min_parallel_work(1);
  }
  ~KernelThreadsGuard() {
    cpu::set_kernel_threads(threads_);
    cpu::set_min_parallel_work(min_work_);
  }
  KernelThreadsGuard(const KernelThreadsGuard&) = delete;
  KernelThreadsGuard& operator=(const KernelThreadsGuard&) = delete;

 private:
  int threads_;
  int64_t min_work_;
};

}  // namespace touchstone::testing
