// Layouts, margin and the printed comparison of memory_per_rank.
#include "tests/mpi/memory_layouts.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>

#include "common/errors.h"
#include "plan/format.h"

namespace touchstone {

const std::vector<MemoryLayout>& memory_layouts() {
  // The uneven stages assume the 6 layers of tests/parallel/layout_matrix.json.
  static const std::vector<MemoryLayout> kLayouts = {
      {"dp2", 2, "data parallel", {"parallel.dp=2"}},
      {"dp2_zero",
       2,
       "data parallel, distributed optimizer",
       {"parallel.dp=2", "parallel.distributed_optimizer=true"}},
      {"dp4_zero1", 4, "data parallel, ZeRO-1", {"parallel.dp=4", "parallel.zero_stage=1"}},
      {"dp4_zero2", 4, "data parallel, ZeRO-2", {"parallel.dp=4", "parallel.zero_stage=2"}},
      {"dp4_zero3", 4, "data parallel, ZeRO-3", {"parallel.dp=4", "parallel.zero_stage=3"}},
      {"tp2_dp2_sp_zero3",
       4,
       "tensor + sequence parallel, ZeRO-3",
       {"parallel.tp=2", "parallel.dp=2", "parallel.sequence_parallel=true", "parallel.zero_stage=3"}},
      {"pp2_dp2_tied_zero3",
       4,
       "pipeline, tied embeddings, ZeRO-3",
       {"parallel.pp=2", "parallel.dp=2", "model.tie_embeddings=true", "parallel.zero_stage=3"}},
      {"tp2", 2, "tensor parallel", {"parallel.tp=2"}},
      {"tp2_sp", 2, "tensor + sequence parallel", {"parallel.tp=2", "parallel.sequence_parallel=true"}},
      {"pp2_1f1b", 2, "pipeline, 1F1B", {"parallel.pp=2", "parallel.schedule=1f1b"}},
      {"pp2_afab", 2, "pipeline, AFAB", {"parallel.pp=2", "parallel.schedule=afab"}},
      {"pp2_zb_h1", 2, "pipeline, ZB-H1 (split backward)", {"parallel.pp=2", "parallel.schedule=zb_h1"}},
      {"pp4_uneven_zb_h1",
       4,
       "pipeline, stages of 1, 3, 1, 1 layers, ZB-H1",
       {"parallel.pp=4", "parallel.stage_layers=[1,3,1,1]", "parallel.schedule=zb_h1"}},
      {"pp2_dp2_tied_zero3_zb_h1",
       4,
       "pipeline, tied embeddings, ZeRO-3, ZB-H1 (gradients held until the last W)",
       {"parallel.pp=2", "parallel.dp=2", "model.tie_embeddings=true", "parallel.zero_stage=3",
        "parallel.schedule=zb_h1"}},
      {"pp4_uneven_1f1b",
       4,
       "pipeline, stages of 1, 3, 1, 1 layers, 1F1B",
       {"parallel.pp=4", "parallel.stage_layers=[1,3,1,1]", "parallel.schedule=1f1b"}},
      {"pp4_uneven_afab",
       4,
       "pipeline, stages of 1, 3, 1, 1 layers, AFAB",
       {"parallel.pp=4", "parallel.stage_layers=[1,3,1,1]", "parallel.schedule=afab"}},
      {"pp2_v2_uneven",
       2,
       "pipeline, interleaved 1F1B, virtual stages of 1, 2, 2, 1 layers",
       {"parallel.pp=2", "parallel.virtual_stages=2", "parallel.stage_layers=[1,2,2,1]"}},
      {"pp2_v2_dp2_zero3",
       4,
       "pipeline, interleaved 1F1B, ZeRO-3",
       {"parallel.pp=2", "parallel.virtual_stages=2", "parallel.stage_layers=[1,2,2,1]", "parallel.dp=2",
        "parallel.zero_stage=3"}},
      {"tp2_sp_pp2_v2_tied",
       4,
       "tensor + sequence parallel, interleaved 1F1B, tied embeddings",
       {"parallel.tp=2", "parallel.pp=2", "parallel.virtual_stages=2", "parallel.stage_layers=[2,1,1,2]",
        "parallel.sequence_parallel=true", "model.tie_embeddings=true"}},
      {"tp2_pp2_dp2", 8, "all three", {"parallel.tp=2", "parallel.pp=2", "parallel.dp=2"}},
      {"tp2_pp2_dp2_sp_zero",
       8,
       "all three, sequence parallel, distributed optimizer",
       {"parallel.tp=2", "parallel.pp=2", "parallel.dp=2", "parallel.sequence_parallel=true",
        "parallel.distributed_optimizer=true"}},
      {"cp2", 2, "context parallel, ring attention", {"parallel.cp=2"}},
      {"cp2_allgather",
       2,
       "context parallel, all-gather attention",
       {"parallel.cp=2", "parallel.cp_comm=allgather"}},
      {"cp4", 4, "context parallel, ring of four", {"parallel.cp=4"}},
      {"tp2_sp_cp2",
       4,
       "tensor + sequence + context parallel",
       {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.cp=2"}},
      {"cp2_dp2_zero3",
       4,
       "context + data parallel, ZeRO-3 over dp x cp, all-gather attention",
       {"parallel.cp=2", "parallel.dp=2", "parallel.zero_stage=3", "parallel.cp_comm=allgather"}},
      {"cp2_pp2_zero1",
       4,
       "context parallel, pipeline (1F1B), ZeRO-1 over dp x cp",
       {"parallel.cp=2", "parallel.pp=2", "parallel.zero_stage=1"}},
      {"tp2_sp_pp2_dropout",
       4,
       "tensor + sequence + pipeline parallel, attention and hidden dropout",
       {"parallel.tp=2", "parallel.pp=2", "parallel.sequence_parallel=true", "model.attention_dropout=0.1",
        "model.hidden_dropout=0.1"}},
  };
  return kLayouts;
}

std::string memory_layout_help() {
  std::string help = "Layout to run:";
  for (const MemoryLayout& l : memory_layouts()) help += " " + l.name;
  return help;
}

const MemoryLayout& find_memory_layout(const std::string& name) {
  const auto& layouts = memory_layouts();
  const auto it =
      std::find_if(layouts.begin(), layouts.end(), [&](const MemoryLayout& l) { return l.name == name; });
  if (it == layouts.end())
    throw InputError("--layout: unknown layout '" + name + "' (" + memory_layout_help() + ")");
  return *it;
}

int LayoutComparison::failures() const {
  return static_cast<int>(
      std::count_if(ranks.begin(), ranks.end(), [](const RankComparison& r) { return !r.within(); }));
}

// The margin, per rank: predicted <= measured <= total_sends_held x (1 + kBookkeeping).
//
// Below: the prediction counts every buffer of the step at its exact size, the communication scratch
// included, and frees each pipeline send's copy at the earliest moment the code can (the stage's next
// send), so a rank measures less only if the trainer stopped allocating a buffer the replay still counts.
// Above, two things the prediction leaves out:
//   - send copies whose peer has not received them yet: how many depends on timing; at most every copy
//     lives until the group's wait_sends, and the replay computes that bound (total_sends_held). On
//     these layouts it is 0 to 5 more copies of Nl h (65,536 bytes each) of the pipeline, up to 5.7% of a
//     rank's peak, and up to 3 more K/V blocks of the context-parallel ring (32,768 bytes each).
//   - bookkeeping: std::vector headers of the per-tensor and per-micro-batch lists, the parameter names
//     of the Trainer's table, the schedule's action list, the timeline recorder's events (which grow by
//     one per action each step), the transfer counters and site names, context parallelism's index
//     lists: measured 33-78 kB on these layouts, 0.17-0.80% of a rank's bound (the most on tp2, whose
//     peak is among the smallest; docs/BENCHMARKS.md).
// kBookkeeping is test_plan_memory's 1%.
constexpr double kBookkeeping = 0.01;

LayoutComparison compare_layout(const MemoryLayout& layout, const Config& config,
                                const std::vector<plan::RankMemory>& predicted,
                                const std::vector<int64_t>& measured) {
  LayoutComparison comparison;
  comparison.layout = layout;
  const auto steps = static_cast<size_t>(config.train.steps);
  for (size_t rank = 0; rank < predicted.size(); ++rank) {
    RankComparison r;
    r.predicted = predicted[rank];
    r.measured_steps.assign(measured.begin() + static_cast<std::ptrdiff_t>(rank * steps),
                            measured.begin() + static_cast<std::ptrdiff_t>((rank + 1) * steps));
    r.measured = static_cast<double>(*std::max_element(r.measured_steps.begin(), r.measured_steps.end()));
    r.lower = r.predicted.total();
    r.upper = r.predicted.total_sends_held * (1 + kBookkeeping);
    comparison.ranks.push_back(r);
  }
  return comparison;
}

namespace {

std::string signed_bytes(double bytes, double of) {
  char text[64];
  std::snprintf(text, sizeof text, "%s%s (%+.2f%%)", bytes < 0 ? "-" : "+",
                plan::grouped(std::abs(bytes)).c_str(), 100 * bytes / of);
  return text;
}

std::string steps_of(const RankComparison& r) {
  std::string text;
  for (int64_t s : r.measured_steps)
    text += (text.empty() ? "" : " / ") + plan::grouped(static_cast<double>(s));
  return text;
}

}  // namespace

int print_saving(const LayoutComparison& baseline, const LayoutComparison& layout, std::ostream& out) {
  using plan::grouped;
  out << "\nSaving of " << layout.layout.name << " over " << baseline.layout.name << ", bytes per rank:\n";
  int failures = 0;
  for (size_t rank = 0; rank < layout.ranks.size() && rank < baseline.ranks.size(); ++rank) {
    const RankComparison &b = baseline.ranks[rank], &l = layout.ranks[rank];
    const double planned = b.predicted.total() - l.predicted.total(), measured = b.measured - l.measured;
    const double margin = kBookkeeping * std::max(b.predicted.total(), l.predicted.total());
    const bool within = measured > 0 && std::abs(measured - planned) <= margin;
    failures += within ? 0 : 1;
    char line[256];
    std::snprintf(line, sizeof line,
                  "  rank %zu: planned %s, measured %s (%.1f%% of the baseline's peak)%s\n", rank,
                  grouped(planned).c_str(), grouped(measured).c_str(), 100 * measured / b.measured,
                  within ? "" : "  OUTSIDE THE MARGIN");
    out << line;
  }
  return failures + (layout.ranks.size() == baseline.ranks.size() ? 0 : 1);
}

void print_comparison(const LayoutComparison& c, bool markdown, std::ostream& out) {
  using plan::grouped;
  out << "Layout " << c.layout.name << " (" << c.layout.what << "), " << c.ranks.size()
      << " ranks; bytes; measured: the largest step peak above the live bytes before the Trainer\n";
  char line[768];
  if (markdown) {
    out << "\n| rank | tp | cp | dp | stage | predicted | measured | difference | bound with every send copy "
           "held | staging at the peak | peak at "
           "|\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
  } else {
    std::snprintf(line, sizeof line, "%4s %3s %3s %3s %5s %12s %12s %20s %12s %12s  %s\n", "rank", "tp", "cp",
                  "dp", "stage", "predicted", "measured", "difference", "sends held", "staging",
                  "measured per step");
    out << line;
  }
  for (const RankComparison& r : c.ranks) {
    const plan::RankMemory& p = r.predicted;
    const std::string difference = signed_bytes(r.difference(), p.total());
    if (markdown) {
      out << "| " << p.world_rank << " | " << p.tp_rank << " | " << p.cp_rank << " | " << p.dp_rank << " | "
          << p.stage << " | " << grouped(p.total()) << " | " << grouped(r.measured) << " | " << difference
          << " | " << grouped(p.total_sends_held) << " | " << grouped(p.peak.staging) << " | "
          << p.peak.at.name << " |\n";
      continue;
    }
    std::snprintf(line, sizeof line, "%4d %3lld %3lld %3lld %5lld %12s %12s %20s %12s %12s  %s%s\n",
                  p.world_rank, static_cast<long long>(p.tp_rank), static_cast<long long>(p.cp_rank),
                  static_cast<long long>(p.dp_rank), static_cast<long long>(p.stage),
                  grouped(p.total()).c_str(), grouped(r.measured).c_str(), difference.c_str(),
                  grouped(p.total_sends_held).c_str(), grouped(p.peak.staging).c_str(), steps_of(r).c_str(),
                  r.within() ? "" : "  OUTSIDE THE MARGIN");
    out << line;
  }
  if (!markdown) {
    std::vector<plan::RankMemory> predicted;
    for (const RankComparison& r : c.ranks) predicted.push_back(r.predicted);
    plan::print_rank_memory(predicted, out);
  }
  out << "\nMargin: predicted <= measured <= sends held x " << 1 + kBookkeeping << ": "
      << (c.failures() == 0 ? "every rank within it" : std::to_string(c.failures()) + " rank(s) outside it")
      << "\n";
}

}  // namespace touchstone
