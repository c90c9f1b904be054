// The CPU backend's one way to use several cores: parallel_for(n, body) runs body(i) for every i in
// [0, n), the range cut into contiguous static chunks, one per kernel thread of a small pool whose
// threads sleep between loops (a loaded or shared machine then loses nothing to spinning threads).
//
// Results stay bitwise independent of the thread count because every caller keeps to one rule: body(i)
// writes only outputs that belong to i and reads only inputs, and any reduction runs inside one body(i)
// in a fixed order. Which thread runs i then changes nothing but the time.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace touchstone::cpu {

// The threads parallel_for uses: OMP_NUM_THREADS when set (the variable OpenBLAS reads too), else one
// per core shared among the processes on the machine (share_cores), until set_kernel_threads.
int kernel_threads();
// Tests set 1 and 2 to check that both give identical bits; n >= 1.
void set_kernel_threads(int n);
// The default for `processes` ranks of one job on this machine: cores / processes threads (at least
// one), unless OMP_NUM_THREADS chose the count.
void share_cores(int processes);

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

// Runs range(begin, end) for the kernel threads' chunks of [0, n), chunk t = [t n / k, (t + 1) n / k)
// on thread t (the caller is thread 0), and returns when all are done; rethrows the first exception a
// chunk threw. Called from inside a chunk, it runs the whole range on the calling thread.
void run_chunks(int64_t n, const std::function<void(int64_t, int64_t)>& range);

template <typename Body>
void parallel_for(int64_t n, const Body& body) {
  run_chunks(n, [&body](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) body(i);
  });
}

// Loops whose whole work, n * work_per_index element operations, is below min_parallel_work() run on
// the calling thread: waking the pool costs more than such a loop saves, and far more when the cores are
// shared (several ranks or tests on one machine), because every loop waits for its slowest thread. The
// default, 2^18, is a loop of about 0.1 ms.
int64_t min_parallel_work();
// Tests set 1, so that every loop they run is split between the threads.
void set_min_parallel_work(int64_t work);

// parallel_for(n, body) for loops worth the threads, the others serial; the same bits either way.
template <typename Body>
void parallel_for(int64_t n, int64_t work_per_index, const Body& body) {
  if (n * work_per_index < min_parallel_work()) {
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

// OpenBLAS's worker threads, after each threaded call, spin (sched_yield) for 2^28 processor cycles,
// about 0.1 s, before they sleep. A training step's GEMMs come milliseconds apart with the kernel
// threads' loops between them, so a spinning worker holds a core those loops need for the whole step
// (docs/BENCHMARKS.md measures what it costs). This lets them sleep at once, as OPENBLAS_THREAD_TIMEOUT=4
// does: unless that variable is set (OpenBLAS then read the user's choice when it loaded), it sets it and
// stops OpenBLAS's workers, which the next threaded call starts again (as after a fork) with the short
// timeout. OpenBLAS exports the two functions this calls from its pthreads build without declaring them
// in cblas.h; with another BLAS this does nothing. Only the time changes, never a result: which thread
// computes which part of a GEMM is the same. Call it first thing in main, before other threads start
// (setenv is not safe beside a thread reading the environment).
void let_blas_threads_sleep();

}  // namespace touchstone::cpu
