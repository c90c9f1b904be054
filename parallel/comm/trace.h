// The --trace printer: one line per transfer on this rank, and a table of bytes per group and op.
//
// Line format (fields separated by two spaces; "mb -" outside a micro-batch, "-" for no phase):
//   [rank 3 tp1 cp0 dp0 pp1] step 1 mb 2 forward   all_reduce      group=tp  shape=[2,16,32]  bytes=8192
//       site=decoder.layers.1.self_attention.linear_proj RowParallelLinear: all-reduce of partial sums
//   [rank 3 tp1 cp0 dp0 pp1] step 1 mb 2 forward   send            group=pp  shape=[2,16,32]  bytes=8192
//       peer=5  site=...
// (one line each); bytes follows comm.h's convention (nccl-tests' "size"); peer is a global rank; site
// is what the transfer is for (ProcessGroup::set_site), where the caller named it.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <utility>

#include "parallel/comm/grid.h"
#include "parallel/comm/process_group.h"

namespace touchstone {

std::string format_trace_line(int rank, const GridCoordinates& coordinates, const TransferRecord& record);

class TracePrinter {
 public:
  // `out` (a per-rank file or std::cerr) must outlive the printer. Lines are flushed one by one, so
  // the trace of a rank that hangs ends at its last completed transfer.
  TracePrinter(std::ostream& out, const Grid& grid);

  // Install with grid.set_observer(printer.observer()); the printer must outlive that use.
  TransferObserver observer();
  void print(const TransferRecord& record);
  // Calls and bytes per (group, op) seen so far, with a total row.
  void print_summary(std::ostream& out) const;
  const std::map<std::pair<std::string, std::string>, OpCount>& totals() const { return totals_; }

 private:
  std::ostream& out_;
  int rank_;
  GridCoordinates coordinates_;
  std::map<std::pair<std::string, std::string>, OpCount> totals_;  // by (group, op)
};

}  // namespace touchstone
