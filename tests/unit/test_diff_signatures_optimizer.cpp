// The diff's optimizer signatures (optimizer_check.h's mistaken rules, named by signatures.cpp): a
// candidate with the golden gradients of steps 1..s whose parameters after update s come from AdamW with
// one rule changed, written out here by hand from the mistakes' definitions (not with expected_update,
// so that the diff's arithmetic of each mistake is checked against an independent one). Each case
// asserts exit status 1 and exactly its own verdict, at update 1 and at update 2 (moments replayed over
// two updates, the learning rate past warm-up).
//
// Why the cases separate: the optimizer check bounds each element by 3 ulp(p) + lr u (...), ~1e-16
// here. The hand-written update and the diff's replay are the same FP64 operations (bitwise equal for
// the contract's rule), while two different rules move most elements by 1e-5 or more (lr ~1e-3 times
// a relative change of 1e-2 or more): clipping acts at every update (coefficient ~0.12, see
// signature_config), the rates of updates 0..3 are 0, 1e-3, 7.75e-4 and 3.25e-4, bias correction
// changes the step size by 0.45x (update 1) and 1.6x (update 2), and decaying the norm weights (1.0)
// moves them by lr wd = 1e-4.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "optim/optimizer.h"
#include "oracle/diff/optimizer_check.h"
#include "test_diff_signature_fixture.h"

namespace touchstone::diff::testing {
namespace {

// One optimizer mistake as the contract's AdamW with one rule changed (docs/diffing.md).
struct Mistake {
  std::string signature;
  bool bias_correction = true;
  bool decay_every_tensor = false;
  bool clip_the_update = false;
  int64_t lr_offset = 0;
};

const std::vector<Mistake>& mistakes() {
  static const std::vector<Mistake> all = {
      {"optimizer_bias_correction", false, false, false, 0},  // m and v not divided by 1 - beta^t
      {"optimizer_weight_decay", true, true, false, 0},       // the 1-D norm weights decayed too
      {"optimizer_clipping", true, false, true, 0},      // moments of unclipped gradients, update clipped
      {"learning_rate_behind", true, false, false, -1},  // update s at the rate of update s - 1
      {"learning_rate_ahead", true, false, false, 1},    // update s at the rate of update s + 1
  };
  return all;
}

// The parameters after update `step` under `mistake`: AdamW from the golden parameters after step - 1,
// moments built from zero over the golden gradients of updates 1..step, each clipped by the coefficient
// of its recorded norm. Returns the rate used in `lr`.
ParamTensors mistaken_update(const GoldenRun& golden, int64_t step, const Mistake& mistake, double& lr) {
  const OptimConfig& o = golden.config.optim;
  const ParamTable& table = *golden.table;
  ParamTensors params = golden.params_after(step - 1);
  AdamWState state = AdamWState::zeros_like(params);
  double clip = 1.0;
  for (int64_t k = 1; k <= step; ++k) {
    clip = clip_coefficient(golden.record(k).grad_norm, o.clip_grad);
    const double scale = mistake.clip_the_update ? 1.0 : clip;
    for (int id = 0; id < table.size(); ++id) {
      const std::vector<double>& g = golden.record(k).grads[id];
      for (size_t i = 0; i < g.size(); ++i) {
        const double x = g[i] * scale;
        state.exp_avg[id][i] = o.beta1 * state.exp_avg[id][i] + (1 - o.beta1) * x;
        state.exp_avg_sq[id][i] = o.beta2 * state.exp_avg_sq[id][i] + (1 - o.beta2) * x * x;
      }
    }
  }
  lr = learning_rate(o, step + mistake.lr_offset);  // update 0: the warm-up's start (0 by default)
  const auto t = static_cast<double>(step);
  const double bc1 = mistake.bias_correction ? 1 - std::pow(o.beta1, t) : 1.0;
  const double bc2 = mistake.bias_correction ? 1 - std::pow(o.beta2, t) : 1.0;
  for (int id = 0; id < table.size(); ++id) {
    const double wd = table[id].weight_decay || mistake.decay_every_tensor ? o.weight_decay : 0.0;
    for (size_t i = 0; i < params[id].size(); ++i) {
      const double m = state.exp_avg[id][i] * (mistake.clip_the_update ? clip : 1.0);
      params[id][i] = params[id][i] * (1 - lr * wd);
      params[id][i] -= lr * (m / bc1) / (std::sqrt(state.exp_avg_sq[id][i] / bc2) + o.eps);
    }
  }
  return params;
}

class OptimizerSignatures : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = std::make_unique<SuiteDirectory>("touchstone_signatures_optimizer");
    const fs::path documents = directory_->path() / "documents.jsonl";
    write_documents(documents);
    golden_ = std::make_unique<GoldenRun>(
        write_golden(directory_->path() / "golden.h5", signature_config(documents.string())));
  }
  static void TearDownTestSuite() {
    golden_.reset();
    directory_.reset();
  }

  static std::unique_ptr<SuiteDirectory> directory_;
  static std::unique_ptr<GoldenRun> golden_;
};

std::unique_ptr<SuiteDirectory> OptimizerSignatures::directory_;
std::unique_ptr<GoldenRun> OptimizerSignatures::golden_;

TEST_F(OptimizerSignatures, EveryMistakenRuleOfTheDiffHasACase) {
  std::set<std::string> diff_rules, cases;
  for (const OptimizerRule& rule : mistaken_optimizer_rules()) diff_rules.insert(rule.signature);
  for (const Mistake& mistake : mistakes()) cases.insert(mistake.signature);
  EXPECT_EQ(diff_rules, cases);
}

TEST_F(OptimizerSignatures, TheHandWrittenContractRuleIsTheGoldenRun) {
  // The reference of the cases below: without a mistake, the hand-written update is the golden file's,
  // bit for bit (the same FP64 operations in the same order as the trainer's AdamW).
  for (int64_t step = 1; step <= 2; ++step) {
    double lr = 0.0;
    const ParamTensors params = mistaken_update(*golden_, step, Mistake{}, lr);
    EXPECT_EQ(lr, golden_->record(step).lr);
    for (int id = 0; id < golden_->table->size(); ++id) {
      const std::vector<double>& want = golden_->params_after(step)[id];
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(params[id][i], want[i])
            << "update " << step << ", " << (*golden_->table)[id].name << "[" << i << "]";
      }
    }
  }
}

TEST_F(OptimizerSignatures, EachMistakenRuleIsNamedAndNoOther) {
  for (int64_t step = 1; step <= 2; ++step) {
    for (const Mistake& mistake : mistakes()) {
      SCOPED_TRACE(mistake.signature + " at update " + std::to_string(step));
      TensorMap candidate;
      for (int64_t s = 1; s <= step; ++s) {
        for (auto& [name, t] : golden_->step_datasets(s)) candidate[name] = t;
      }
      double lr = 0.0;
      const ParamTensors params = mistaken_update(*golden_, step, mistake, lr);
      const std::string prefix = "steps/" + std::to_string(step) + "/";
      candidate[prefix + "lr"].values = {lr};  // the rate the candidate used
      for (int id = 0; id < golden_->table->size(); ++id) {
        candidate[prefix + "params/" + (*golden_->table)[id].name].values = params[id];
      }
      const DiffResult result = analyse(*golden_, candidate, mistake.signature + "_" + std::to_string(step));
      expect_verdicts(result, {mistake.signature});
      for (const Entry& e : result.entries) {
        if (e.group == "params") {
          EXPECT_EQ(e.basis, Basis::kOptimizer) << e.path;
        } else if (e.group == "grads") {
          EXPECT_EQ(e.status, Status::kPass) << e.path;
        }
      }
    }
  }
}

}  // namespace
}  // namespace touchstone::diff::testing
