// TracePrinter: formats transfer records for --trace and sums them per group and op.
#include "parallel/comm/trace.h"

#include <iomanip>
#include <sstream>

namespace touchstone {

std::string format_trace_line(int rank, const GridCoordinates& coordinates, const TransferRecord& record) {
  std::ostringstream line;
  line << "[rank " << rank << " tp" << coordinates.tp_rank << " cp" << coordinates.cp_rank << " dp"
       << coordinates.dp_rank << " pp" << coordinates.pp_rank << "] step " << record.context.step << " mb ";
  if (record.context.micro_batch < 0) {
    line << '-';
  } else {
    line << record.context.micro_batch;
  }
  if (record.context.chunk >= 0) line << " chunk " << record.context.chunk;
  // Padded to the longest phase and op names so the columns of a trace line up.
  line << ' ' << std::left << std::setw(9) << (record.context.phase.empty() ? "-" : record.context.phase)
       << ' ' << std::setw(14) << record.op << "  group=" << record.group << "  shape=[";
  for (size_t i = 0; i < record.shape.size(); ++i) line << (i ? "," : "") << record.shape[i];
  line << "]  bytes=" << record.bytes;
  if (record.peer >= 0) line << "  peer=" << record.peer;
  if (!record.site.empty()) line << "  site=" << record.site;
  return line.str();
}

TracePrinter::TracePrinter(std::ostream& out, const Grid& grid)
    : out_(out), rank_(grid.global_rank()), coordinates_(grid.coordinates()) {}

TransferObserver TracePrinter::observer() {
  return [this](const TransferRecord& record) { print(record); };
}

void TracePrinter::print(const TransferRecord& record) {
  OpCount& total = totals_[{record.group, record.op}];
  total.calls += 1;
  total.bytes += record.bytes;
  out_ << format_trace_line(rank_, coordinates_, record) << std::endl;
}

void TracePrinter::print_summary(std::ostream& out) const {
  OpCount all;
  out << "[rank " << rank_ << "] transfers by group and op\n";
  out << std::left << std::setw(10) << "group" << std::setw(16) << "op" << std::right << std::setw(10)
      << "calls" << std::setw(16) << "bytes" << '\n';
  for (const auto& [key, count] : totals_) {
    out << std::left << std::setw(10) << key.first << std::setw(16) << key.second << std::right
        << std::setw(10) << count.calls << std::setw(16) << count.bytes << '\n';
    all.calls += count.calls;
    all.bytes += count.bytes;
  }
  out << std::left << std::setw(26) << "total" << std::right << std::setw(10) << all.calls << std::setw(16)
      << all.bytes << '\n';
  out.flush();
}

}  // namespace touchstone
