// `touchstone commbench`: correctness and bandwidth of every ProcessGroup collective over a sweep of
// message sizes, in the style of NVIDIA's nccl-tests (same flags, columns and bus-bandwidth factors),
// so the communication layer is accepted on its own before any model runs on it.
//
// Inputs are small integers, value = (rank + 1) * (i % 7 + 1), so every sum is exact in any order and
// every element of every result is compared exactly (#wrong) after each timed op when --check is 1.
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace touchstone {

class MpiRuntime;

struct CommbenchOptions {
  int64_t min_bytes = 8;        // -b: first "size" (nccl-tests' convention, see comm.h)
  int64_t max_bytes = 1 << 25;  // -e
  int64_t step_factor = 2;      // -f: multiplicative step
  int iters = 20;               // -n
  int warmup_iters = 5;         // -w
  int check = 1;                // -c
  std::string op = "all";  // all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, sendrecv, all
  std::string group = "world";  // world, tp, dp, pp of a tp x dp x pp grid with dp = world / (tp * pp)
  int tp = 1;
  int pp = 1;
  int root = 0;               // broadcast root, a rank of the group
  std::string json_path;      // also write every number here (rank 0)
  bool inject_fault = false;  // corrupt the first checked reduction (tests that #wrong catches it)
  std::string comm = "mpi";   // the groups' backend: mpi, or nccl (one GPU per rank)
};

void add_commbench_options(CLI::App* command, CommbenchOptions& options);

// Collective over MPI_COMM_WORLD; rank 0 prints the tables. Returns the exit status: 0 when every
// element of every result was right, 1 when some were wrong, 2 for bad input (before any transfer;
// every rank agrees, including on whether --comm nccl can run).
int run_commbench(const CommbenchOptions& options, MpiRuntime& mpi);

}  // namespace touchstone
