// The host side of an NCCL group's start, in plain C++ so that it builds and is tested without CUDA:
// sharing the unique id over the group's MPI communicator, and the check that no two ranks of a
// group drive the same GPU (NCCL refuses that with "Duplicate GPU detected").
//
// The id generator is a parameter: NcclProcessGroup passes one that calls ncclGetUniqueId, the MPI
// tests one that writes who generated the id, so they can check that every rank of every group got
// the id of its own group's rank 0.
#pragma once

#include <mpi.h>

#include <array>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace touchstone {

// ncclUniqueId's size (NCCL_UNIQUE_ID_BYTES; checked against nccl.h where NCCL is built).
constexpr std::size_t kNcclUniqueIdBytes = 128;
using NcclUniqueIdBytes = std::array<char, kNcclUniqueIdBytes>;
using UniqueIdGenerator = std::function<NcclUniqueIdBytes()>;

// What this rank passes to ncclCommInitRank(comm, ranks, unique_id, rank) for one group.
struct NcclBootstrap {
  NcclUniqueIdBytes unique_id{};
  int ranks = 1;  // the group's size
  int rank = 0;   // this rank's group rank
};

// Collective over `comm` (a group's communicator, ranks in group order): group rank 0 calls
// `generate` (no other rank does) and broadcasts the id with MPI_Bcast. `group` names the group in
// errors.
NcclBootstrap share_unique_id(MPI_Comm comm, const std::string& group, const UniqueIdGenerator& generate);

// Collective over `comm`: throws InputError on every rank of the group when two of its ranks name the
// same `gpu` (this rank's GPU, unique across the job: the host name and the PCI bus id), naming both
// world ranks (`global_ranks`: the world rank of each group rank).
void check_one_gpu_per_rank(MPI_Comm comm, const std::string& group, const std::vector<int>& global_ranks,
                            const std::string& gpu);

}  // namespace touchstone
