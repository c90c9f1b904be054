// Kernel thread count and the BLAS thread guard of parallel_for.h.
#include "kernels/cpu/parallel_for.h"

#include <cblas.h>
#include <omp.h>

namespace touchstone::cpu {

int kernel_threads() { return omp_get_max_threads(); }

void set_kernel_threads(int n) { omp_set_num_threads(n < 1 ? 1 : n); }

int kernel_thread_index() { return omp_get_thread_num(); }

ThreadScratch::ThreadScratch(int64_t per_thread)
    : per_thread_(per_thread), data_(static_cast<size_t>(per_thread * kernel_threads())) {}

SingleThreadedBlas::SingleThreadedBlas() : saved_threads_(openblas_get_num_threads()) {
  openblas_set_num_threads(1);
}

SingleThreadedBlas::~SingleThreadedBlas() { openblas_set_num_threads(saved_threads_); }

}  // namespace touchstone::cpu
