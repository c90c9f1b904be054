// MpiRuntime: initialises and finalises MPI once per process; MPI error checks and node-local ranks.
#include "parallel/comm/mpi_runtime.h"

#include <mpi.h>

#include <cstdlib>
#include <stdexcept>

namespace touchstone {

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // FUNNELED: kernels may use threads, but only the main thread talks to MPI.
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    owns_mpi_ = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
}

MpiRuntime::~MpiRuntime() {
  if (!owns_mpi_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

int MpiRuntime::sum_over_world(int value) const {
  int sum = 0;
  MPI_Allreduce(&value, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return sum;
}

void MpiRuntime::abort(int code) const {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);  // MPI_Abort does not return, but the compiler cannot know that
}

void check_mpi(int code, const std::string& what) {
  if (code == MPI_SUCCESS) return;
  char message[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, message, &length);
  throw std::runtime_error(what + ": " + std::string(message, static_cast<size_t>(length)));
}

NodeLocalRanks node_local_ranks() {
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
            "node-local ranks (MPI_Comm_split_type)");
  NodeLocalRanks ranks;
  MPI_Comm_rank(node, &ranks.rank);
  MPI_Comm_size(node, &ranks.size);
  MPI_Comm_free(&node);
  return ranks;
}

int node_local_rank() { return node_local_ranks().rank; }

}  // namespace touchstone
