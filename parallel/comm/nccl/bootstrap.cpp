// Sharing an NCCL unique id over MPI, and the one-GPU-per-rank check (parallel/comm/nccl/bootstrap.h).
#include "parallel/comm/nccl/bootstrap.h"

#include <algorithm>
#include <map>

#include "common/errors.h"
#include "parallel/comm/mpi_runtime.h"

namespace touchstone {

NcclBootstrap share_unique_id(MPI_Comm comm, const std::string& group, const UniqueIdGenerator& generate) {
  NcclBootstrap bootstrap;
  check_mpi(MPI_Comm_rank(comm, &bootstrap.rank), "NCCL bootstrap of group " + group);
  check_mpi(MPI_Comm_size(comm, &bootstrap.ranks), "NCCL bootstrap of group " + group);
  if (bootstrap.rank == 0) bootstrap.unique_id = generate();
  check_mpi(MPI_Bcast(bootstrap.unique_id.data(), static_cast<int>(kNcclUniqueIdBytes), MPI_BYTE, 0, comm),
            "NCCL bootstrap of group " + group + ": broadcast of the unique id");
  return bootstrap;
}

void check_one_gpu_per_rank(MPI_Comm comm, const std::string& group, const std::vector<int>& global_ranks,
                            const std::string& gpu) {
  // Fixed-size records, so one MPI_Allgather carries them; a host name longer than this is cut,
  // which can only merge two identities that were already alike in their first 255 bytes.
  constexpr int kRecordBytes = 256;
  std::array<char, kRecordBytes> mine{};
  std::copy_n(gpu.begin(), std::min(gpu.size(), mine.size() - 1), mine.begin());
  std::vector<char> all(global_ranks.size() * kRecordBytes);
  check_mpi(MPI_Allgather(mine.data(), kRecordBytes, MPI_CHAR, all.data(), kRecordBytes, MPI_CHAR, comm),
            "NCCL bootstrap of group " + group + ": gathering the GPUs");
  std::map<std::string, size_t> first_rank_of;  // GPU -> the first group rank that drives it
  for (size_t r = 0; r < global_ranks.size(); ++r) {
    const std::string identity(all.data() + r * kRecordBytes);
    const auto [seen, inserted] = first_rank_of.emplace(identity, r);
    if (inserted) continue;
    throw InputError("NCCL needs one GPU per rank, but world ranks " +
                     std::to_string(global_ranks[seen->second]) + " and " + std::to_string(global_ranks[r]) +
                     " of group " + group + " both drive GPU " + identity +
                     " (start at most as many ranks per node as there are GPUs)");
  }
}

}  // namespace touchstone
