// The one communication interface: every collective and point-to-point transfer of a run goes through
// a ProcessGroup, so this is where transfers are traced (--trace), counted (bytes per op and group,
// for the benchmarks) and where a fault can be injected.
//
// Reductions are deterministic by construction and give the same bits on every rank:
// reduce_scatter_sum exchanges chunks with an all-to-all and each rank adds the n contributions to
// its chunk in rank order 0..n-1; all_reduce_sum is reduce_scatter_sum followed by all_gather (the
// ring decomposition, without the ring's order dependence), on the buffer padded with zeros to a
// multiple of the group size. A result therefore depends only on the group's size and the inputs,
// never on timing or on which rank computed it. all_reduce_max is exact; it orders +0 above -0 and
// any NaN above everything (returned as one quiet NaN), so those too come out the same on every rank.
// Integer sums are exact.
//
// Every call takes the logical shape of the buffer for the trace; `count` is the element count.
//
// Bytes (TransferRecord::bytes and the counters) follow nccl-tests' "size" column: the larger of
// this rank's send and receive buffers, count * sizeof(element) for
//   all_reduce, broadcast, send, recv   the buffer: count
//   all_gather                          the receive buffer: size() * count
//   reduce_scatter                      the send buffer: size() * count
//   all_to_all                          either buffer: size() * count
//   barrier                             0
// so a record's bytes divided by the op's time is nccl-tests' algbw, and commbench's "size" column
// and a --trace line of the same call show the same number.
//
// In place: all_gather accepts send == recv + rank() * count, reduce_scatter_sum accepts
// recv == send + rank() * count, all_to_all accepts send == recv (nccl-tests' in-place layouts, which
// a sharded optimizer uses to gather parameters into the full buffer it already holds its shard of).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace touchstone {

using Shape = std::vector<int64_t>;

// What a trace line says about the running program when a transfer happens.
struct TraceContext {
  int64_t step = 0;          // optimizer step, 1-based; 0 outside a step
  int64_t micro_batch = -1;  // micro-batch index within the step on this rank; -1 outside one
  std::string phase;         // "forward", "backward", "grads", "optimizer", "output", ...
  int64_t chunk = -1;        // the model chunk running (interleaved 1F1B); -1 without virtual stages
};

// One recorded transfer.
struct TransferRecord {
  std::string op;     // "all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv", ...
  std::string group;  // "world", "tp", "cp", "dp", "dp_cp", "pp", "embedding"
  int peer = -1;      // global rank of the peer for send/recv, -1 for collectives
  Shape shape;        // logical shape of this rank's buffer
  int64_t bytes = 0;  // payload bytes of this rank's buffer (nccl-tests' "size")
  TraceContext context;
  std::string site;  // what the transfer is for (ProcessGroup::set_site); empty where not named
};

// Receives every transfer of every group of this process (the trace printer, the byte counters).
using TransferObserver = std::function<void(const TransferRecord&)>;

// Calls and bytes of one op on one group.
struct OpCount {
  int64_t calls = 0;
  int64_t bytes = 0;
};

// What one group has transferred on this rank since it was made or since reset_counts(), by op name.
struct TransferCounts {
  std::map<std::string, OpCount> by_op;
  int64_t total_bytes() const;
  int64_t total_calls() const;
};

// A fault a test can inject to prove that a check downstream notices a wrong transfer.
enum class FaultKind {
  kNone,
  // The next reduction on the group (all_reduce_sum of doubles or integers, all_reduce_max,
  // reduce_scatter_sum) adds 1 to element 0 of its result on group rank 0 only, then the fault clears.
  // Set it on every rank of the group: on the other ranks it is just cleared by that reduction, so
  // all ranks stay in step. A silent corruption on one rank is what a wrong reduction looks like in
  // practice (a bad link or a race), so the other ranks keep the correct result.
  kCorruptReduction,
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual const std::string& name() const = 0;  // "world", "tp", "cp", "dp", "dp_cp", "pp", "embedding"
  virtual int rank() const = 0;                 // rank within the group
  virtual int size() const = 0;
  virtual int global_rank(int group_rank) const = 0;

  // data[count] <- sum over the group, same bits on every rank.
  virtual void all_reduce_sum(double* data, int64_t count, const Shape& shape) = 0;
  virtual void all_reduce_sum(int64_t* data, int64_t count) = 0;  // exact integer sums (token counts)
  virtual void all_reduce_max(double* data, int64_t count, const Shape& shape) = 0;
  // recv[size * count] <- concatenation of every rank's send[count] in rank order.
  virtual void all_gather(const double* send, double* recv, int64_t count, const Shape& shape) = 0;
  // recv[count] <- sum over ranks of chunk `rank()` of send[size * count] (chunks in rank order).
  virtual void reduce_scatter_sum(const double* send, double* recv, int64_t count, const Shape& shape) = 0;
  virtual void broadcast(double* data, int64_t count, int root, const Shape& shape) = 0;
  // recv[size * count]: chunk r of every rank's send goes to rank r (chunks in rank order).
  virtual void all_to_all(const double* send, double* recv, int64_t count, const Shape& shape) = 0;
  // Point to point within the group (`peer` is a group rank); `tag` distinguishes transfers between
  // the same pair of ranks, so they may be received in any order; with equal tags they arrive in
  // send order. send does not wait for the receiver (the data is copied); recv blocks until the data
  // arrives and throws if it holds a different number of elements.
  virtual void send(const double* data, int64_t count, int peer, int tag, const Shape& shape) = 0;
  virtual void recv(double* data, int64_t count, int peer, int tag, const Shape& shape) = 0;
  // Waits until every send of this group has been delivered. Not a transfer: it records nothing.
  virtual void wait_sends() = 0;
  virtual void barrier() = 0;

  // What the group's next transfers are for, in the words engineers know from Megatron-LM (the layer,
  // the parameter, the operation: "decoder.layers.0.self_attention.linear_proj RowParallelLinear:
  // all-reduce of partial sums"); every record carries it until it changes. TransferSite sets it for a
  // scope.
  void set_site(std::string site) { site_ = std::move(site); }
  const std::string& site() const { return site_; }

  // Counted by every implementation through report(), whether or not an observer is set.
  const TransferCounts& counts() const { return counts_; }
  void reset_counts() { counts_ = TransferCounts(); }
  void set_fault(FaultKind fault) { fault_ = fault; }
  FaultKind fault() const { return fault_; }

 protected:
  // Implementations call this once per completed call (for send: once the data is copied and the
  // send posted). It counts the transfer and passes it to the sink, which the grid that made the
  // group sets to its observer (with the trace context filled in).
  void report(TransferRecord record);
  // report() of a transfer of `elements` doubles (or 8-byte integers): bytes = elements * 8.
  void report_transfer(const char* op, const Shape& shape, int64_t elements, int peer = -1);
  void set_record_sink(std::function<void(TransferRecord)> sink) { sink_ = std::move(sink); }
  // Implementations call this on the result of every reduction, after it is complete.
  void apply_reduction_fault(double* result, int64_t count);
  void apply_reduction_fault(int64_t* result, int64_t count);

 private:
  bool take_reduction_fault();

  TransferCounts counts_;
  std::string site_;
  FaultKind fault_ = FaultKind::kNone;
  std::function<void(TransferRecord)> sink_;
};

// Names the transfers of `group` inside a scope (ProcessGroup::set_site), restoring the site before it.
class TransferSite {
 public:
  TransferSite(ProcessGroup& group, std::string site) : group_(group), previous_(group.site()) {
    group_.set_site(std::move(site));
  }
  ~TransferSite() { group_.set_site(std::move(previous_)); }
  TransferSite(const TransferSite&) = delete;
  TransferSite& operator=(const TransferSite&) = delete;

 private:
  ProcessGroup& group_;
  std::string previous_;
};

}  // namespace touchstone
