// The CPU backend's one way to use several cores: parallel_for(n, body) runs body(i) for every i in
// [0, n), the range cut into contiguous static chunks, one per kernel thread (OpenMP).
//
// Results stay bitwise independent of the thread count because every caller keeps to one rule: body(i)
// writes only outputs that belong to i and reads only inputs, and any reduction runs inside one body(i)
// in a fixed order. Which thread runs i then changes nothing but the time.
#pragma once

#include <cstdint>
#include <vector>

namespace touchstone::cpu {

// The threads parallel_for uses: OMP_NUM_THREADS, or one per core, until set_kernel_threads.
int kernel_threads();
// Tests set 1 and 2 to check that both give identical bits; n >= 1.
void set_kernel_threads(int n);

// The index of the calling kernel thread, 0 <= index < kernel_threads() (0 outside parallel_for).
int kernel_thread_index();

// Scratch memory for the body of a parallel_for: one slot of `per_thread` doubles per kernel thread,
// allocated once per call of the kernel (docs/planning.md counts it) and freed with it.
class ThreadScratch {
 public:
  explicit ThreadScratch(int64_t per_thread);
  double* slot() { return data_.data() + kernel_thread_index() * per_thread_; }  // this thread's slot

 private:
  int64_t per_thread_;
  std::vector<double> data_;  // [kernel_threads(), per_thread]
};

template <typename Body>
void parallel_for(int64_t n, const Body& body) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) body(i);
}

// Loops whose whole work, n * work_per_index element operations, is below this run on the calling
// thread: starting the team would cost more than the loop saves, and far more when the cores are shared
// (several ranks on one machine), because every parallel region ends by waiting for its slowest thread.
inline constexpr int64_t kMinParallelWork = 16384;

// parallel_for(n, body) for loops worth the threads, the others serial; the same bits either way.
template <typename Body>
void parallel_for(int64_t n, int64_t work_per_index, const Body& body) {
  if (n * work_per_index < kMinParallelWork) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  parallel_for(n, body);
}

// While alive, OpenBLAS runs each call on the calling thread alone, so that GEMMs inside a
// parallel_for do not start threads of their own on top of the kernel threads.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas();
  ~SingleThreadedBlas();
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int saved_threads_;
};

}  // namespace touchstone::cpu
