// One benchmarked operation at one message size: its buffers, inputs, the call through the
// ProcessGroup, and the exact check of every element of the result.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"

namespace touchstone::commbench {

enum class Op { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kAllToAll, kSendRecv };

struct OpInfo {
  Op op;
  const char* name;
  const char* redop;  // "sum" or "none"
  bool out_of_place;  // whether the interface has this form (see docs/communication.md)
  bool in_place;
  bool reduction;  // where --inject-fault can act
  bool chunked;    // count is per rank: "size" = group size x count x 8 bytes
};

const std::vector<OpInfo>& all_ops();
const OpInfo* find_op(const std::string& name);
// nccl-tests' bus bandwidth factor for a group of n ranks.
double bus_factor(Op op, int n);
// The "count" argument for a message of `bytes` (nccl-tests' "size"); 0 when it is too small.
int64_t count_for_bytes(const OpInfo& info, int64_t bytes, int n);
int64_t bytes_for_count(const OpInfo& info, int64_t count, int n);

class OpRunner {
 public:
  OpRunner(const OpInfo& info, ProcessGroup& group, int64_t count, int root, bool in_place);
  void init();                  // inputs, and a sentinel wherever a result will land
  void run();                   // the timed call
  int64_t count_wrong() const;  // elements of this rank's result that differ from the exact answer

 private:
  const double* result() const;

  OpInfo info_;
  ProcessGroup& group_;
  int64_t count_;
  int root_;
  bool in_place_;
  int rank_;
  int n_;
  std::vector<double> send_;
  std::vector<double> recv_;
};

}  // namespace touchstone::commbench
