// The kernel thread pool behind parallel_for.h, the thread count and the BLAS thread guards.
//
// The pool holds kernel_threads() - 1 workers. run_chunks hands every worker its chunk under one mutex,
// runs chunk 0 itself, and waits on a condition variable until the last chunk is done; between loops
// the workers sleep on another one. One loop runs at a time (a second caller waits for the mutex).
#include "kernels/cpu/parallel_for.h"

#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace touchstone::cpu {

namespace {

thread_local int t_thread_index = 0;       // this thread's kernel thread index
thread_local bool t_inside_chunk = false;  // a nested parallel_for runs serially

using RangeBody = std::function<void(int64_t, int64_t)>;

class ThreadPool {
 public:
  explicit ThreadPool(int threads) : threads_(threads) {
    for (int t = 1; t < threads_; ++t) workers_.emplace_back([this, t] { work(t); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    start_.notify_all();
    for (std::thread& w : workers_) w.join();
  }
  int threads() const { return threads_; }

  void run(int64_t n, const RangeBody& range) {
    const std::lock_guard<std::mutex> one_loop(run_mutex_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      range_ = &range;
      n_ = n;
      pending_ = threads_ - 1;
      error_ = nullptr;
      ++generation_;
    }
    start_.notify_all();
    run_chunk(0);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
    range_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void run_chunk(int t) {
    const int64_t begin = n_ * t / threads_, end = n_ * (t + 1) / threads_;
    t_inside_chunk = true;
    try {
      if (begin < end) (*range_)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    t_inside_chunk = false;
  }

  void work(int t) {
    t_thread_index = t;
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        start_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      run_chunk(t);
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  const int threads_;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one loop at a time
  std::mutex mutex_;      // guards everything below
  std::condition_variable start_, done_;
  const RangeBody* range_ = nullptr;
  int64_t n_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

// OMP_NUM_THREADS as a count >= 1, or 0 when unset or not a count.
int threads_from_environment() {
  const char* text = std::getenv("OMP_NUM_THREADS");
  if (text == nullptr) return 0;
  try {
    size_t used = 0;
    const int n = std::stoi(text, &used);
    return used == std::string(text).size() && n >= 1 ? n : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

int cores() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

std::mutex g_pool_mutex;
std::unique_ptr<ThreadPool> g_pool;  // made on first use, remade by set_kernel_threads

ThreadPool& pool() {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (!g_pool) {
    const int chosen = threads_from_environment();
    g_pool = std::make_unique<ThreadPool>(chosen > 0 ? chosen : cores());
  }
  return *g_pool;
}

}  // namespace

int kernel_threads() { return pool().threads(); }

void set_kernel_threads(int n) {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  g_pool.reset();
  g_pool = std::make_unique<ThreadPool>(std::max(1, n));
}

void share_cores(int processes) {
  if (threads_from_environment() > 0) return;
  set_kernel_threads(std::max(1, cores() / std::max(1, processes)));
}

int kernel_thread_index() { return t_thread_index; }

namespace {
std::atomic<int64_t> g_min_parallel_work{int64_t{1} << 18};
}  // namespace

int64_t min_parallel_work() { return g_min_parallel_work.load(std::memory_order_relaxed); }

void set_min_parallel_work(int64_t work) { g_min_parallel_work.store(work, std::memory_order_relaxed); }

void run_chunks(int64_t n, const std::function<void(int64_t, int64_t)>& range) {
  if (n <= 0) return;
  ThreadPool& p = pool();
  if (t_inside_chunk || p.threads() == 1 || n == 1) {
    range(0, n);
    return;
  }
  p.run(n, range);
}

ThreadScratch::ThreadScratch(int64_t per_thread)
    : per_thread_(per_thread), data_(static_cast<size_t>(per_thread * kernel_threads())) {}

SingleThreadedBlas::SingleThreadedBlas() : saved_threads_(openblas_get_num_threads()) {
  openblas_set_num_threads(1);
}

SingleThreadedBlas::~SingleThreadedBlas() { openblas_set_num_threads(saved_threads_); }

void let_blas_threads_sleep() {
  if (std::getenv("OPENBLAS_THREAD_TIMEOUT") != nullptr) return;
  // openblas_read_env: reads the OPENBLAS_* variables again; blas_thread_shutdown_: joins the workers.
  using Function = void (*)();
  using Shutdown = int (*)();
  const auto read_environment = reinterpret_cast<Function>(dlsym(RTLD_DEFAULT, "openblas_read_env"));
  const auto shutdown = reinterpret_cast<Shutdown>(dlsym(RTLD_DEFAULT, "blas_thread_shutdown_"));
  if (read_environment == nullptr || shutdown == nullptr) return;
  setenv("OPENBLAS_THREAD_TIMEOUT", "4", 0);  // 2^4 cycles: the smallest OpenBLAS takes
  read_environment();
  shutdown();
}

}  // namespace touchstone::cpu
