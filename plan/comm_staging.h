// The communication layer's own buffers, replayed into a BufferTally as staging buffers: what
// parallel/comm/mpi_group.cpp allocates beside the caller's data.
//
//   GroupScratch  each group's reduction scratch: `padded_` (all_reduce_sum pads the buffer to a
//                 multiple of the group size) and `exchange_` (the all-to-all of every reduce-scatter).
//                 Both are members reused from call to call, so they grow to the largest reduction the
//                 group has made and then stay allocated for the rest of the run: from a run's second
//                 step on they are live during the whole step.
//   SendCopies    a group's non-blocking sends: each send copies its data, and the copy lives until a
//                 later send of the group finds the transfer complete (MPI_Test) or until wait_sends.
//                 When a transfer completes depends on when the peer receives it, so the replay takes
//                 one of the two extremes, which bound every timing: each send complete by the group's
//                 next send (the fewest copies: the latest send's), or none before wait_sends (the most).
//
// Groups of one rank make no MPI calls and allocate none of these.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include "plan/buffer_tally.h"

namespace touchstone::plan {

// A std::vector<double> member that is assigned or resized and never shrinks its capacity, with the
// growth rules of GCC's libstdc++: assign(n) beyond the capacity allocates exactly n; resize(n) beyond
// it allocates size() + max(size(), n - size()). The new block is allocated before the old one is
// freed.
class ReusedVector {
 public:
  ReusedVector(BufferTally& tally, std::string name) : tally_(tally), name_(std::move(name)) {}
  void assign(double n);
  void resize(double n);

 private:
  void reallocate(double capacity);

  BufferTally& tally_;
  std::string name_;
  double size_ = 0, capacity_ = 0;
  int handle_ = -1;
};

class GroupScratch {
 public:
  GroupScratch(BufferTally& tally, const std::string& group, int64_t size);
  void all_reduce_sum(double count);      // doubles; integer sums and maxima go straight to MPI
  void reduce_scatter_sum(double count);  // count: this rank's chunk

 private:
  double size_;
  ReusedVector padded_, exchange_;
};

enum class SendCompletion {
  kAtNextSend,   // every send has completed when the group's next send checks it
  kAtWaitSends,  // no send completes before wait_sends
};

class SendCopies {
 public:
  SendCopies(BufferTally& tally, std::string group, SendCompletion completion)
      : tally_(tally), group_(std::move(group)), completion_(completion) {}
  // A send of `count` elements; `what` names the data.
  void send(double count, const std::string& what);
  void wait_sends();

 private:
  BufferTally& tally_;
  std::string group_;
  SendCompletion completion_;
  std::deque<int> pending_;
};

}  // namespace touchstone::plan
