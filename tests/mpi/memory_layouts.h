// The layouts memory_per_rank measures, and the comparison of every rank's measured peak with its
// predicted peak, with the margin that decides it.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "common/config.h"
#include "plan/rank_memory.h"

namespace touchstone {

struct MemoryLayout {
  std::string name;
  int ranks = 1;
  std::string what;
  std::vector<std::string> overrides;  // config keys of the layout
};

const std::vector<MemoryLayout>& memory_layouts();
// Throws InputError naming the known layouts.
const MemoryLayout& find_memory_layout(const std::string& name);
std::string memory_layout_help();

struct RankComparison {
  plan::RankMemory predicted;
  std::vector<int64_t> measured_steps;  // each step's peak
  double measured = 0;                  // the largest
  double lower = 0, upper = 0;          // the margin: measured must lie in [lower, upper]
  double difference() const { return measured - predicted.total(); }
  bool within() const { return measured >= lower && measured <= upper; }
};

struct LayoutComparison {
  MemoryLayout layout;
  std::vector<RankComparison> ranks;
  int failures() const;
};

// `measured`: every rank's step peaks, steps consecutive per rank, in world-rank order.
LayoutComparison compare_layout(const MemoryLayout& layout, const Config& config,
                                const std::vector<plan::RankMemory>& predicted,
                                const std::vector<int64_t>& measured);
// Each rank's saving of `layout` over `baseline` (same ranks): the measured one against the planned one
// (the difference of the two predictions). Returns the number of ranks whose measured saving is not
// within 1% (the bookkeeping margin) of the larger prediction of the planned one (each measured peak
// lies within [predicted, predicted x 1.01] on layouts without pipeline sends, so its saving lies
// within that much of the planned saving), or that save nothing.
int print_saving(const LayoutComparison& baseline, const LayoutComparison& layout, std::ostream& out);

void print_comparison(const LayoutComparison& comparison, bool markdown, std::ostream& out);

}  // namespace touchstone
