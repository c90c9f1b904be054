// The layout signatures of touchstone diff: qkv_layout and tp_shard (layout_signatures.h).
#include "oracle/diff/layout_signatures.h"

#include <cmath>
#include <string>
#include <utility>

#include "oracle/hf/hf_names.h"
#include "parallel/tensor/sharding.h"

namespace touchstone::diff {

namespace {

std::string block_text(const ParamSpec& spec, int r, int t) {
  const int64_t rows = spec.shape[0], cols = spec.shape.size() > 1 ? spec.shape[1] : 1;
  auto range = [](int64_t a, int64_t n) {
    return "[" + std::to_string(a) + ", " + std::to_string(a + n) + ")";
  };
  switch (spec.sharding) {
    case Sharding::kRows:
      return "rows " + range(r * rows / t, rows / t);
    case Sharding::kGateUp:
      return "gate rows " + range(r * rows / 2 / t, rows / 2 / t) + " and up rows " +
             range(rows / 2 + r * rows / 2 / t, rows / 2 / t);
    case Sharding::kColumns:
      return "columns " + range(r * cols / t, cols / t);
    case Sharding::kReplicated:
      break;
  }
  return "everything";
}

// The tp shard (largest tp first) holding every failing element of `e`, at least half of its elements
// failing, as {rank, tp}; {-1, 0} if none.
std::pair<int, int> confining_shard(const GoldenReader& golden, Judge& judge, const TensorMap& candidate,
                                    const Entry& e, const std::vector<int>& sizes) {
  const ParamSpec& spec = golden.table()[e.param];
  const ModelConfig& m = golden.config().model;
  if (spec.sharding == Sharding::kReplicated || !e.reason.empty()) return {-1, 0};
  const Recorded g = reference_of(judge, e);
  const Recorded& c = candidate.at(e.path);
  const double threshold =
      e.tolerance.max_abs_normalized * (e.metrics.max_abs_golden > 0 ? e.metrics.max_abs_golden : 1);
  std::vector<double> failing(g.values.size());
  double total = 0;
  for (size_t i = 0; i < failing.size(); ++i) {
    failing[i] = !std::isfinite(c.values[i]) || std::fabs(c.values[i] - g.values[i]) > threshold ? 1.0 : 0.0;
    total += failing[i];
  }
  for (auto t = sizes.rbegin(); t != sizes.rend(); ++t) {
    const bool divides = spec.kind == ParamKind::kQkv          ? m.num_kv_heads % *t == 0
                         : spec.sharding == Sharding::kColumns ? spec.shape[1] % *t == 0
                         : spec.sharding == Sharding::kGateUp  ? (spec.shape[0] / 2) % *t == 0
                                                               : spec.shape[0] % *t == 0;
    if (*t < 2 || !divides || total == 0) continue;
    for (int r = 0; r < *t; ++r) {
      const std::vector<double> in_shard = shard_of(spec.sharding, spec.shape, failing, r, *t);
      double inside = 0;
      for (double f : in_shard) inside += f;
      // A wrong shard is wrong almost everywhere; a few scattered elements always fit in one shard.
      if (inside == total && inside >= 0.5 * static_cast<double>(in_shard.size())) return {r, *t};
    }
  }
  return {-1, 0};
}

}  // namespace

// linear_qkv stored with its rows in [q; k; v] order: a conversion mistake rather than a computation.
std::vector<Verdict> qkv_layout(const GoldenReader& golden, Judge& judge, const TensorMap& candidate,
                                const Group& group) {
  std::vector<Verdict> verdicts;
  for (const Entry* e : group.failing) {
    if (golden.table()[e->param].kind != ParamKind::kQkv || !e->reason.empty()) continue;
    const Recorded reference = reference_of(judge, *e);
    // Stored as [q; k; v], or the [q; k; v] rows of a wrong split regrouped per KV group.
    for (const bool to_separate : {true, false}) {
      Recorded g = reference;
      g.values = to_separate ? hf::qkv_separate_from_grouped(golden.config().model, g.values, g.shape[1])
                             : hf::qkv_grouped_from_separate(golden.config().model, g.values, g.shape[1]);
      if (passes(compare_values(g, candidate.at(e->path), e->tolerance), e->tolerance)) {
        verdicts.push_back(
            {"qkv_layout",
             "QKV rows in the wrong grouping: " + e->path +
                 (to_separate
                      ? " equals the golden tensor with its rows in [q; k; v] order instead of grouped "
                        "per KV group"
                      : " equals the golden tensor read as [all q; all k; all v] and regrouped per KV "
                        "group: linear_qkv was split that way when converting to separate q/k/v")});
        break;
      }
    }
  }
  return verdicts;
}

// Every failing tensor wrong in one tensor-parallel shard only.
std::vector<Verdict> tp_shard(const GoldenReader& golden, Judge& judge, const TensorMap& candidate,
                              const Group& group, const std::vector<int>& tp_sizes) {
  const std::vector<int> sizes = tp_sizes.empty() ? std::vector<int>{2, 4, 8} : tp_sizes;
  std::vector<Verdict> verdicts;
  for (const Entry* e : group.failing) {
    const auto [rank, tp] = confining_shard(golden, judge, candidate, *e, sizes);
    if (rank < 0) return {};
    verdicts.push_back({"tp_shard", "one TP shard off: " + e->path + ": only tp rank " +
                                        std::to_string(rank) + " of " + std::to_string(tp) + " (" +
                                        block_text(golden.table()[e->param], rank, tp) + ") differs"});
  }
  return verdicts;
}

}  // namespace touchstone::diff
