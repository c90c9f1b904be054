// MPI GPU test of --comm nccl: every ProcessGroup call of NcclProcessGroup against MpiProcessGroup,
// bit for bit, with the same records and byte counts. Run under mpirun (tests/gpu/CMakeLists.txt).
//
//   any GPU count   the rank-order kernels against the host's order on many rows (and the ordered
//                   maximum on NaN, signed zeros and infinities), and each rank's own one-rank NCCL
//                   communicator, started through the bootstrap with the real ncclGetUniqueId and
//                   ncclCommInitRank, running every call through NCCL, against an MPI group of one
//   a GPU per rank  every group of every layout of the world, Grid::create(kNccl) against
//                   Grid::create(kMpi); NCCL refuses two ranks of one communicator on a GPU, so with
//                   fewer GPUs this part is reported as not run (exit 77 with --require-gpu-per-rank)
//
// Exits 77 (CTest: Skipped) on every rank when some rank has no usable CUDA device; 1 when any check
// failed on any rank.
#include <mpi.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/errors.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/device.cuh"
#include "parallel/comm/grid.h"
#include "parallel/comm/mpi_runtime.h"
#include "parallel/comm/nccl/nccl_group.h"
#include "parallel/comm/nccl/rank_order.h"
#include "parallel/comm/ordered_max.h"

namespace touchstone {
namespace {

using Log = std::vector<std::vector<double>>;  // every result of a sequence of calls, in call order

int failures = 0;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

void fail(const std::string& what) {
  ++failures;
  std::cout << "[rank " << world_rank() << "] FAIL: " << what << std::endl;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// Non-integer values over 40 binary orders of magnitude: any other summation order changes bits.
std::vector<double> random_doubles(int64_t seed, int64_t count) {
  std::mt19937_64 engine(static_cast<uint64_t>(seed));
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<double> values(static_cast<size_t>(count));
  for (double& v : values) v = std::ldexp(mantissa(engine), exponent(engine));
  return values;
}

// Random values with NaNs of several payloads and signs, signed zeros and infinities mixed in.
std::vector<double> with_specials(int64_t seed, int64_t count) {
  const double specials[] = {std::bit_cast<double>(uint64_t{0x7ff8000000000abcULL}),
                             std::bit_cast<double>(uint64_t{0xfff8000000000001ULL}),
                             -0.0,
                             0.0,
                             INFINITY,
                             -INFINITY};
  std::vector<double> values = random_doubles(seed, count);
  std::mt19937_64 engine(static_cast<uint64_t>(seed) * 31 + 7);
  for (double& v : values) {
    const uint64_t draw = engine() % 16;
    if (draw < 6) v = specials[draw];
  }
  return values;
}

int64_t seed_of(int global_rank, int call, int64_t count) {
  return (global_rank * 101 + call) * 1000003 + count;
}

std::vector<double> bits_as_doubles(const std::vector<int64_t>& values) {
  std::vector<double> out(values.size());
  std::memcpy(out.data(), values.data(), values.size() * sizeof(double));
  return out;
}

// Every call of the interface, out of place and in place, at counts that hit the chunking edges,
// then point to point both ways with tags received out of order, and the fault hook.
Log exercise(ProcessGroup& g) {
  Log log;
  const int n = g.size();
  const int me = g.global_rank(g.rank());
  const int64_t own = g.rank();
  for (const int64_t count :
       {int64_t{0}, int64_t{1}, int64_t{n + 1}, int64_t{37}, int64_t{1000}, int64_t{100003}}) {
    const Shape shape{count};
    const auto c = static_cast<size_t>(count);
    std::vector<double> sum = random_doubles(seed_of(me, 1, count), count);
    g.all_reduce_sum(sum.data(), count, shape);
    log.push_back(sum);
    std::vector<int64_t> integers(c);
    for (size_t i = 0; i < c; ++i) integers[i] = (int64_t{me} << 40) + static_cast<int64_t>(i) * me - 3;
    g.all_reduce_sum(integers.data(), count);
    log.push_back(bits_as_doubles(integers));
    std::vector<double> max = with_specials(seed_of(me, 2, count), count);
    g.all_reduce_max(max.data(), count, shape);
    log.push_back(max);

    const std::vector<double> mine = random_doubles(seed_of(me, 3, count), count);
    std::vector<double> gathered(c * n, -1.0);
    g.all_gather(mine.data(), gathered.data(), count, shape);
    log.push_back(gathered);
    std::vector<double> gathered_in_place(c * n, -1.0);
    std::copy(mine.begin(), mine.end(), gathered_in_place.begin() + own * count);
    g.all_gather(gathered_in_place.data() + own * count, gathered_in_place.data(), count, shape);
    log.push_back(gathered_in_place);

    std::vector<double> full = random_doubles(seed_of(me, 4, count), count * n);
    std::vector<double> chunk(c, -1.0);
    g.reduce_scatter_sum(full.data(), chunk.data(), count, shape);
    log.push_back(chunk);
    g.reduce_scatter_sum(full.data(), full.data() + own * count, count, shape);
    log.push_back(full);

    for (int root = 0; root < n; ++root) {
      std::vector<double> data = random_doubles(seed_of(me, 5 + root, count), count);
      g.broadcast(data.data(), count, root, shape);
      log.push_back(data);
    }

    std::vector<double> chunks = random_doubles(seed_of(me, 6, count), count * n);
    std::vector<double> exchanged(c * n, -1.0);
    g.all_to_all(chunks.data(), exchanged.data(), count, shape);
    log.push_back(exchanged);
    g.all_to_all(chunks.data(), chunks.data(), count, shape);
    log.push_back(chunks);
  }

  // Both ways before any receive (a pipeline stage does this), tags received out of order.
  const int64_t count = 37;
  const int next = (g.rank() + 1) % n, previous = (g.rank() + n - 1) % n;
  std::vector<double> a = random_doubles(seed_of(me, 7, count), count);
  std::vector<double> b = random_doubles(seed_of(me, 8, count), count);
  std::vector<double> c = random_doubles(seed_of(me, 9, count), count);
  g.send(a.data(), count, next, 1, Shape{count});
  g.send(b.data(), count, next, 2, Shape{count});
  g.send(c.data(), count, previous, 3, Shape{count});
  std::vector<double> second(37), first(37), third(37);
  g.recv(second.data(), count, previous, 2, Shape{count});
  g.recv(first.data(), count, previous, 1, Shape{count});
  g.recv(third.data(), count, next, 3, Shape{count});
  g.wait_sends();
  log.insert(log.end(), {second, first, third});
  g.barrier();

  // The fault fires on the next reduction only, on group rank 0 only.
  for (int call = 0; call < 2; ++call) {
    g.set_fault(FaultKind::kCorruptReduction);
    std::vector<double> sum = random_doubles(seed_of(me, 10 + call, 5), 5);
    if (call == 0) {
      g.all_reduce_sum(sum.data(), 5, Shape{5});
    } else {
      g.all_reduce_max(sum.data(), 5, Shape{5});
    }
    log.push_back(sum);
    std::vector<double> after = random_doubles(seed_of(me, 12 + call, 5), 5);
    g.all_reduce_sum(after.data(), 5, Shape{5});
    log.push_back(after);
  }
  return log;
}

std::string describe(const TransferRecord& r) {
  std::string shape;
  for (int64_t d : r.shape) shape += std::to_string(d) + ",";
  return r.op + " group=" + r.group + " peer=" + std::to_string(r.peer) + " shape=[" + shape +
         "] bytes=" + std::to_string(r.bytes);
}

void compare(const std::string& what, const Log& nccl, const Log& mpi) {
  if (nccl.size() != mpi.size())
    return fail(what + ": " + std::to_string(nccl.size()) + " results, MPI " + std::to_string(mpi.size()));
  for (size_t k = 0; k < nccl.size(); ++k) {
    if (!same_bits(nccl[k], mpi[k]))
      fail(what + ": result " + std::to_string(k) + " differs from the MPI group's");
  }
}

void compare(const std::string& what, const std::vector<TransferRecord>& nccl,
             const std::vector<TransferRecord>& mpi) {
  if (nccl.size() != mpi.size())
    return fail(what + ": " + std::to_string(nccl.size()) + " records, MPI " + std::to_string(mpi.size()));
  for (size_t k = 0; k < nccl.size(); ++k) {
    if (describe(nccl[k]) != describe(mpi[k])) {
      fail(what + ": record " + std::to_string(k) + " is " + describe(nccl[k]) + ", MPI " + describe(mpi[k]));
    }
  }
}

void compare_counts(const std::string& what, const ProcessGroup& nccl, const ProcessGroup& mpi) {
  for (const auto& [op, count] : mpi.counts().by_op) {
    const auto found = nccl.counts().by_op.find(op);
    if (found == nccl.counts().by_op.end() || found->second.calls != count.calls ||
        found->second.bytes != count.bytes) {
      fail(what + ": counts of " + op + " differ from the MPI group's");
    }
  }
  if (nccl.counts().by_op.size() != mpi.counts().by_op.size()) fail(what + ": counts name other ops");
}

// The kernels against the host's rank-order fold, on more elements than one grid covers.
void check_kernels() {
  cuda::DeviceBytes device_rows, device_out;
  for (const int n : {1, 2, 3, 5, 8}) {
    for (const int64_t count : {int64_t{1}, int64_t{1000}, int64_t{1100000}}) {
      const auto c = static_cast<size_t>(count);
      for (const bool max : {false, true}) {
        const std::vector<double> rows =
            max ? with_specials(n * 7 + count, count * n) : random_doubles(n * 7 + count, count * n);
        std::vector<double> expected(rows.begin(), rows.begin() + count);
        for (int r = 1; r < n; ++r) {
          for (size_t i = 0; i < c; ++i) {
            const double v = rows[static_cast<size_t>(r) * c + i];
            expected[i] = max ? ordered_max(expected[i], v) : expected[i] + v;
          }
        }
        auto* in = static_cast<double*>(device_rows.reserve(rows.size() * sizeof(double)));
        auto* out = static_cast<double*>(device_out.reserve(c * sizeof(double)));
        cuda::check(cudaMemcpy(in, rows.data(), rows.size() * sizeof(double), cudaMemcpyHostToDevice),
                    "upload");
        if (max) {
          nccl::max_in_rank_order(in, n, count, out, nullptr);
        } else {
          nccl::sum_in_rank_order(in, n, count, out, nullptr);
        }
        std::vector<double> got(c);
        cuda::check(cudaMemcpy(got.data(), out, c * sizeof(double), cudaMemcpyDeviceToHost), "download");
        if (!same_bits(got, expected)) {
          fail(std::string(max ? "max" : "sum") + "_in_rank_order of " + std::to_string(n) + " rows of " +
               std::to_string(count) + " differs from the host's rank order");
        }
      }
    }
  }
}

// This rank alone on its GPU: a one-rank NCCL communicator runs every call through NCCL.
void check_one_rank_communicator(int device) {
  const int me = world_rank();
  if (nccl_unique_id() == nccl_unique_id()) fail("ncclGetUniqueId returned the same id twice");
  std::vector<TransferRecord> nccl_records, mpi_records;
  GroupMembers members;
  members.name = "self";
  MPI_Comm_dup(MPI_COMM_SELF, &members.comm);
  members.global_ranks = {me};
  members.sink = [&nccl_records](TransferRecord r) { nccl_records.push_back(std::move(r)); };
  NcclProcessGroup nccl_group(std::move(members), device);
  if (!nccl_group.uses_nccl()) fail("a group with a communicator did not start NCCL");
  GroupMembers alone;
  alone.name = "self";
  alone.global_ranks = {me};
  alone.sink = [&mpi_records](TransferRecord r) { mpi_records.push_back(std::move(r)); };
  std::unique_ptr<ProcessGroup> mpi_group = make_mpi_group(std::move(alone));
  // Sequenced: every rank must run the two groups' collectives in the same order.
  const Log nccl_log = exercise(nccl_group);
  const Log mpi_log = exercise(*mpi_group);
  compare("one-rank NCCL communicator", nccl_log, mpi_log);
  compare("one-rank NCCL communicator", nccl_records, mpi_records);
  compare_counts("one-rank NCCL communicator", nccl_group, *mpi_group);
}

// Every group of every layout of the world, NCCL grid against MPI grid.
void check_grids(int world_size) {
  for (int tp = 1; tp <= world_size; ++tp) {
    for (int dp = 1; tp * dp <= world_size; ++dp) {
      if (world_size % (tp * dp) != 0) continue;
      const GridLayout layout{tp, dp, world_size / (tp * dp)};
      const std::string name =
          "tp" + std::to_string(tp) + " dp" + std::to_string(dp) + " pp" + std::to_string(layout.pp);
      std::vector<TransferRecord> nccl_records, mpi_records;
      std::unique_ptr<Grid> mpi_grid = Grid::create(layout, CommBackend::kMpi);
      std::unique_ptr<Grid> nccl_grid = Grid::create(layout, CommBackend::kNccl);
      mpi_grid->set_observer([&mpi_records](const TransferRecord& r) { mpi_records.push_back(r); });
      nccl_grid->set_observer([&nccl_records](const TransferRecord& r) { nccl_records.push_back(r); });
      for (const char* group : {"world", "tp", "dp", "pp", "embedding"}) {
        ProcessGroup& nccl_group = nccl_grid->group(group);
        const auto* as_nccl = dynamic_cast<const NcclProcessGroup*>(&nccl_group);
        if (as_nccl == nullptr || as_nccl->uses_nccl() != (nccl_group.size() > 1)) {
          fail(name + " group " + group + ": not an NCCL group with NCCL exactly when it has several ranks");
        }
        const std::string what = name + " group " + group;
        const Log nccl_log = exercise(nccl_group);  // sequenced: the same order on every rank
        const Log mpi_log = exercise(mpi_grid->group(group));
        compare(what, nccl_log, mpi_log);
        compare_counts(what, nccl_group, mpi_grid->group(group));
      }
      compare(name, nccl_records, mpi_records);
    }
  }
}

int run(int argc, char** argv, const MpiRuntime& mpi) {
  const bool require_gpu_per_rank = argc > 1 && std::string(argv[1]) == "--require-gpu-per-rank";
  int device_count = 0;
  std::string why;
  try {
    device_count = cuda_device_count();
  } catch (const InputError& e) {
    why = e.what();
  }
  const NodeLocalRanks local = node_local_ranks();
  // Every rank must take the same branch, or some would wait in a collective for the others.
  const int usable_everywhere = mpi.sum_over_world(device_count > 0 ? 1 : 0) == mpi.world_size();
  if (!usable_everywhere) {
    if (mpi.world_rank() == 0)
      std::cout << "SKIPPED: the NCCL group test needs a CUDA device on every rank" << std::endl;
    if (!why.empty()) std::cout << "[rank " << mpi.world_rank() << "] " << why << std::endl;
    return 77;
  }
  const int device = cuda::device_for_local_rank(local.rank, device_count);
  cuda::check(cudaSetDevice(device), "cudaSetDevice");
  const bool gpu_per_rank = mpi.sum_over_world(local.size <= device_count ? 1 : 0) == mpi.world_size();
  if (mpi.world_rank() == 0) {
    std::cout << "NCCL group test: " << mpi.world_size() << " ranks, " << device_count << " GPU(s) visible ("
              << cuda_device_name(device) << ")" << std::endl;
  }

  check_kernels();
  check_one_rank_communicator(device);
  if (gpu_per_rank) {
    check_grids(mpi.world_size());
  } else if (mpi.world_rank() == 0) {
    std::cout << "NOT RUN: NCCL against MPI on multi-rank groups needs one GPU per rank (" << local.size
              << " ranks on this node, " << device_count << " GPU(s))" << std::endl;
  }
  const int failed_ranks = mpi.sum_over_world(failures > 0 ? 1 : 0);
  if (mpi.world_rank() == 0) {
    std::cout << (failed_ranks == 0 ? "PASSED" : "FAILED on " + std::to_string(failed_ranks) + " rank(s)")
              << std::endl;
  }
  if (failed_ranks > 0) return 1;
  if (!gpu_per_rank && require_gpu_per_rank) {
    if (mpi.world_rank() == 0) std::cout << "SKIPPED: --require-gpu-per-rank" << std::endl;
    return 77;
  }
  return 0;
}

}  // namespace
}  // namespace touchstone

int main(int argc, char** argv) {
  touchstone::MpiRuntime mpi(&argc, &argv);
  try {
    return touchstone::run(argc, argv, mpi);
  } catch (const std::exception& e) {
    std::cout << "[rank " << mpi.world_rank() << "] FAIL: " << e.what() << std::endl;
    mpi.abort(1);
  }
}
