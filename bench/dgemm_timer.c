// Times the large DGEMMs of a process: preloaded (LD_PRELOAD) into `touchstone train` by
// bench/bench_long_window.py, it wraps cblas_dgemm and writes "M N K seconds" to the file named by
// DGEMM_TIMER_LOG for every call larger than one attention tile product (M N K > 64^3), that is the
// linear layers' and the logits' GEMMs. The bench groups the lines into steps and so splits each step
// into its GEMMs and everything else. The wrapper adds two clock readings per call; the file is
// written through stdio's buffer and flushed at exit.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef void (*DgemmFunction)(int order, int trans_a, int trans_b, int m, int n, int k, double alpha,
                              const double* a, int lda, const double* b, int ldb, double beta, double* c,
                              int ldc);

static const double kLargerThan = 64.0 * 64.0 * 64.0;  // kAttentionTile^2 x head dim 64
static FILE* g_log = NULL;
static DgemmFunction g_real = NULL;  // OpenBLAS's, found before any thread of the process calls it

static double seconds_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void cblas_dgemm(int order, int trans_a, int trans_b, int m, int n, int k, double alpha, const double* a,
                 int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  if (g_real == NULL) {
    fprintf(stderr, "dgemm_timer: no cblas_dgemm after this library\n");
    abort();
  }
  const int timed = (double)m * (double)n * (double)k > kLargerThan;
  const double start = timed ? seconds_now() : 0.0;
  g_real(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (!timed) return;
  const double elapsed = seconds_now() - start;
  if (g_log == NULL) {
    const char* path = getenv("DGEMM_TIMER_LOG");
    if (path == NULL || (g_log = fopen(path, "w")) == NULL) {
      fprintf(stderr, "dgemm_timer: cannot write DGEMM_TIMER_LOG (%s)\n", path ? path : "not set");
      abort();
    }
  }
  fprintf(g_log, "%d %d %d %.9f\n", m, n, k, elapsed);
}

// Processes the trainer starts (Open MPI's helpers) inherit LD_PRELOAD without linking a BLAS: only a
// call without one is an error.
__attribute__((constructor)) static void find_dgemm(void) {
  g_real = (DgemmFunction)dlsym(RTLD_NEXT, "cblas_dgemm");
}

__attribute__((destructor)) static void close_log(void) {
  if (g_log != NULL) fclose(g_log);
}
