// MPI's lifetime as an object: MPI_Init on construction, MPI_Finalize on destruction.
//
// A binary started without mpirun runs as an MPI singleton (world size 1), so every command works
// the same on one process. Every Grid and ProcessGroup must be destroyed before the runtime.
#pragma once

#include <string>

namespace touchstone {

class MpiRuntime {
 public:
  // argc/argv may be null. If MPI is already initialised (a test harness did it), this object
  // neither initialises nor finalises it.
  MpiRuntime(int* argc, char*** argv);
  MpiRuntime() : MpiRuntime(nullptr, nullptr) {}
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }

  // Sum of `value` over every rank of the world (before any process grid exists: the ranks use it to
  // agree that their inputs were valid).
  int sum_over_world(int value) const;

  // Ends every process of the job: a rank that fails alone must not leave its peers blocked in a
  // collective waiting for it (they would hold their devices until the scheduler's time limit).
  [[noreturn]] void abort(int code) const;

 private:
  bool owns_mpi_ = false;
  int world_rank_ = 0;
  int world_size_ = 1;
};

// Throws std::runtime_error("<what>: <MPI's error string>") unless `code` is MPI_SUCCESS.
void check_mpi(int code, const std::string& what);

// This process's rank among the processes of the job on its node (MPI_COMM_TYPE_SHARED), and how
// many there are: which GPU a rank drives. Collective over MPI_COMM_WORLD.
struct NodeLocalRanks {
  int rank = 0;
  int size = 1;
};
NodeLocalRanks node_local_ranks();
int node_local_rank();

}  // namespace touchstone
