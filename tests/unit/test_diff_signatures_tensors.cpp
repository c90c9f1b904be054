// The diff's per-tensor signatures (oracle/diff/signatures.cpp): token_count, qkv_layout, tp_shard,
// gradient_scale and one_layer, each on a candidate made from the golden file's own datasets with one
// planted mistake, diffed with run_analysis; and the golden file's own datasets, which pass without a
// verdict. Each case asserts exit status 1 and the exact set of verdicts: its own signature fires and
// every other one stays silent on it (where two coincide by definition, the case says why).
//
// Sizes: a planted mistake moves elements by 1e-3 relative or more (0.5x for the scale), while the FP64
// file's tolerance is 1e-10 relative, so each failing tensor fails by 1e6 x or more and each untouched
// tensor passes exactly (the candidate holds the golden values bit for bit).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "optim/optimizer.h"
#include "parallel/context/load_balanced_split.h"
#include "parallel/tensor/sharding.h"
#include "test_diff_signature_fixture.h"

namespace touchstone::diff::testing {
namespace {

class TensorSignatures : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = std::make_unique<SuiteDirectory>("touchstone_signatures_tensors");
    const fs::path documents = directory_->path() / "documents.jsonl";
    write_documents(documents);
    Config config = signature_config(documents.string());
    golden_ = std::make_unique<GoldenRun>(write_golden(directory_->path() / "golden.h5", config));
    config.data.eos_loss = false;
    no_eos_loss_ = std::make_unique<GoldenRun>(write_golden(directory_->path() / "golden_no_eos.h5", config));
  }
  static void TearDownTestSuite() {
    golden_.reset();
    no_eos_loss_.reset();
    directory_.reset();
  }

  static const ParamTable& table() { return *golden_->table; }
  static std::string grad(int id) { return "steps/1/grads/" + table()[id].name; }

  static std::unique_ptr<SuiteDirectory> directory_;
  static std::unique_ptr<GoldenRun> golden_, no_eos_loss_;
};

std::unique_ptr<SuiteDirectory> TensorSignatures::directory_;
std::unique_ptr<GoldenRun> TensorSignatures::golden_, TensorSignatures::no_eos_loss_;

bool contains(const std::string& text, const std::string& piece) {
  return text.find(piece) != std::string::npos;
}

const Verdict& only_verdict(const DiffResult& result) {
  static const Verdict none;
  if (result.verdicts.size() != 1) {
    ADD_FAILURE() << describe(result);
    return none;
  }
  return result.verdicts.front();
}

TEST_F(TensorSignatures, TheGoldenFilesOwnDatasetsPassWithoutVerdicts) {
  const DiffResult result = analyse(*golden_, golden_datasets(golden_->path), "correct");
  EXPECT_EQ(result.exit_status(), 0) << describe(result);
  EXPECT_TRUE(result.verdicts.empty()) << describe(result);
  EXPECT_EQ(result.count(Status::kFail), 0);
  // The updated parameters were judged by the optimizer check on the candidate's own gradients (and
  // pass: Touchstone's FP64 AdamW is what the check replays), the rest at the golden parameters.
  for (const Entry& e : result.entries) {
    if (e.step == 0 || e.group == "lr") continue;
    EXPECT_EQ(e.basis, e.group == "params" ? Basis::kOptimizer : Basis::kReanchored) << e.path;
    EXPECT_EQ(e.status, Status::kPass) << e.path;
  }
}

// The loss-token count of step 1 off by `difference`, everything else the golden step.
DiffResult count_off_by(const GoldenRun& golden, int64_t difference, const std::string& name) {
  TensorMap candidate = golden.step_datasets(1);
  candidate["steps/1/num_loss_tokens"].values[0] += static_cast<double>(difference);
  return analyse(golden, candidate, name);
}

// The batch's positions each data-rule mistake would add to (or take from) the loss.
struct CountCauses {
  int64_t padding = 0, before_padding = 0, eos_targets = 0, untrained_eos = 0, boundaries = 0;
};

CountCauses count_causes(const GoldenRun& golden) {
  const GlobalBatch& b = golden.batch(1);
  const int32_t eos = static_cast<int32_t>(golden.config.data.eos_token);
  CountCauses c;
  for (int64_t w = 0; w < b.windows; ++w) {
    for (int64_t i = 0; i < b.seq; ++i) {
      const auto at = static_cast<size_t>(w * b.seq + i);
      const bool last = i + 1 == b.seq, ignored = b.targets[at] == -100;
      const int32_t doc = b.document_ids[at], next = last ? doc : b.document_ids[at + 1];
      c.padding += doc == -1;
      c.before_padding += ignored && doc != -1 && next == -1;
      c.eos_targets += b.targets[at] == eos;
      c.untrained_eos += ignored && !last && doc != -1 && next == doc && b.tokens[at + 1] == eos;
      c.boundaries += ignored && !last && doc != -1 && next != -1 && next != doc;
    }
  }
  return c;
}

TEST_F(TensorSignatures, TokenCountPaddingCounted) {
  const CountCauses c = count_causes(*golden_);
  // The causes must differ on this batch, or one count would name two mistakes.
  ASSERT_GT(c.padding, 0);
  ASSERT_GT(c.boundaries, 0);
  ASSERT_NE(c.padding, c.boundaries);
  ASSERT_NE(c.padding + c.before_padding, c.boundaries);
  for (const int64_t difference : {c.padding, c.padding + c.before_padding}) {
    const DiffResult result = count_off_by(*golden_, difference, "padding_" + std::to_string(difference));
    expect_verdicts(result, {"token_count"});
    const std::string message = only_verdict(result).message;
    EXPECT_TRUE(contains(message, "padding counted in the loss")) << message;
    EXPECT_FALSE(contains(message, "eos_loss") || contains(message, "document boundaries")) << message;
  }
}

TEST_F(TensorSignatures, TokenCountEosRuleFlipped) {
  // data.eos_loss true in the golden run: the candidate leaves the EOS targets untrained.
  const CountCauses c = count_causes(*golden_);
  ASSERT_GT(c.eos_targets, 0);
  const DiffResult dropped = count_off_by(*golden_, -c.eos_targets, "eos_dropped");
  expect_verdicts(dropped, {"token_count"});
  EXPECT_TRUE(contains(only_verdict(dropped).message, "left untrained (data.eos_loss rule flipped"))
      << describe(dropped);
  EXPECT_FALSE(contains(only_verdict(dropped).message, "padding") ||
               contains(only_verdict(dropped).message, "document boundaries"))
      << describe(dropped);
  // data.eos_loss false: the candidate trains them.
  const CountCauses n = count_causes(*no_eos_loss_);
  ASSERT_GT(n.untrained_eos, 0);
  ASSERT_NE(n.untrained_eos, n.boundaries);
  ASSERT_NE(n.untrained_eos, n.padding);
  const DiffResult trained = count_off_by(*no_eos_loss_, n.untrained_eos, "eos_trained");
  expect_verdicts(trained, {"token_count"});
  const std::string message = only_verdict(trained).message;
  EXPECT_TRUE(contains(message, "whose target is EOS trained (data.eos_loss rule flipped")) << message;
  EXPECT_FALSE(contains(message, "padding") || contains(message, "document boundaries")) << message;
}

TEST_F(TensorSignatures, TokenCountAcrossDocumentBoundaries) {
  const CountCauses c = count_causes(*golden_);
  const DiffResult result = count_off_by(*golden_, c.boundaries, "boundaries");
  expect_verdicts(result, {"token_count"});
  const std::string message = only_verdict(result).message;
  EXPECT_TRUE(contains(message, "loss across document boundaries")) << message;
  EXPECT_FALSE(contains(message, "padding") || contains(message, "eos_loss")) << message;
}

TEST_F(TensorSignatures, TokenCountOfOneContextParallelRank) {
  // CP loss scaling: the count of cp rank 1's rows (chunks 1 and 2 of every window at cp = 2) alone.
  const GlobalBatch& b = golden_->batch(1);
  const LoadBalancedSplit split(b.seq, 2);
  int64_t rank1 = 0, all = 0;
  for (int32_t target : split.take(b.targets.data(), 1, b.windows)) rank1 += target != -100;
  for (int32_t target : b.targets) all += target != -100;
  const DiffResult result = count_off_by(*golden_, rank1 - all, "cp_rank_count");
  expect_verdicts(result, {"token_count"});
  EXPECT_TRUE(contains(only_verdict(result).message,
                       "the loss tokens of cp rank 1 of cp = 2 alone (a count not all-reduced over the "
                       "context-parallel group: CP loss scaling)"))
      << describe(result);
}

TEST_F(TensorSignatures, QkvLayoutOfTheInitialParameters) {
  // Every layer's linear_qkv stored in [q; k; v] order (a conversion that forgot to regroup), and
  // stored regrouped from a wrong [all q; all k; all v] split of the golden tensor.
  const ModelConfig& m = golden_->config.model;
  for (const bool separate : {true, false}) {
    TensorMap candidate;
    for (int id = 0; id < table().size(); ++id) {
      std::vector<double> values = golden_->init[id];
      if (table()[id].kind == ParamKind::kQkv) {
        values = separate ? hf::qkv_separate_from_grouped(m, values, m.hidden_size)
                          : hf::qkv_grouped_from_separate(m, values, m.hidden_size);
      }
      candidate["params/init/" + table()[id].name] = Recorded{table()[id].shape, values, "float64"};
    }
    const DiffResult result = analyse(*golden_, candidate, separate ? "qkv_separate" : "qkv_regrouped");
    // One verdict per layer's tensor.
    expect_verdicts(result, {"qkv_layout"});
    ASSERT_EQ(result.verdicts.size(), static_cast<size_t>(m.num_layers)) << describe(result);
    EXPECT_TRUE(contains(result.verdicts.front().message,
                         separate ? "[q; k; v] order instead of grouped" : "regrouped per KV group"))
        << describe(result);
  }
}

TEST_F(TensorSignatures, QkvLayoutOfTheGradients) {
  const ModelConfig& m = golden_->config.model;
  TensorMap candidate = golden_->step_datasets(1);
  for (int64_t l = 0; l < m.num_layers; ++l) {
    std::vector<double>& g = candidate[grad(table().layer(l).qkv)].values;
    g = hf::qkv_separate_from_grouped(m, g, m.hidden_size);
  }
  expect_verdicts(analyse(*golden_, candidate, "qkv_grads"), {"qkv_layout"});
}

// Tensor-parallel rank `rank` of `tp`'s shard of gradient `id` multiplied by 1.01.
void perturb_shard(const ParamTable& table, TensorMap& candidate, int id, int rank, int tp) {
  std::vector<double>& full = candidate["steps/1/grads/" + table[id].name].values;
  std::vector<double> shard = shard_of(table[id].sharding, table[id].shape, full, rank, tp);
  for (double& x : shard) x *= 1.01;
  place_shard(table[id].sharding, table[id].shape, shard, rank, tp, full);
}

TEST_F(TensorSignatures, TpShard) {
  // linear_fc1 of both layers off in tp rank 1 of 2 (its gate rows and up rows): two layers fail, so
  // one_layer stays silent; a shard of the 2 tp ranks is not confined to one of 4 or 8.
  TensorMap candidate = golden_->step_datasets(1);
  for (int64_t l = 0; l < golden_->config.model.num_layers; ++l)
    perturb_shard(table(), candidate, table().layer(l).fc1, 1, 2);
  const DiffResult fc1 = analyse(*golden_, candidate, "shard_fc1");
  expect_verdicts(fc1, {"tp_shard"});
  ASSERT_EQ(fc1.verdicts.size(), 2u) << describe(fc1);
  EXPECT_TRUE(
      contains(fc1.verdicts.front().message, "only tp rank 1 of 2 (gate rows [12, 24) and up rows [36, 48))"))
      << describe(fc1);

  // The output layer's vocabulary rows of tp rank 3 of 4 (outside the layers: no one_layer).
  candidate = golden_->step_datasets(1);
  perturb_shard(table(), candidate, table().output(), 3, 4);
  const DiffResult output = analyse(*golden_, candidate, "shard_output");
  expect_verdicts(output, {"tp_shard"});
  EXPECT_TRUE(contains(only_verdict(output).message, "only tp rank 3 of 4 (rows [24, 32))"))
      << describe(output);

  // One layer's linear_proj columns of tp rank 0 of 2: the only failing tensor lies in one layer, which is
  // one_layer's definition too, so both name it.
  candidate = golden_->step_datasets(1);
  perturb_shard(table(), candidate, table().layer(1).proj, 0, 2);
  expect_verdicts(analyse(*golden_, candidate, "shard_proj"), {"tp_shard", "one_layer"});
}

TEST_F(TensorSignatures, GradientScale) {
  // Every gradient and the recorded norm halved (a second division by dp = 2), and the candidate's
  // AdamW applied to its own gradients: the updated parameters pass the optimizer check, which judges
  // them on those gradients.
  const GoldenRun& g = *golden_;
  TensorMap candidate = g.step_datasets(1);
  StepRecord halved = g.record(1);
  for (auto& t : halved.grads.tensors) {
    for (double& x : t) x *= 0.5;
  }
  halved.grad_norm *= 0.5;
  ParamTensors params = g.init;
  AdamWState state = AdamWState::zeros_like(params);
  const auto backend = make_cpu_backend();
  adamw_step(*backend, table(), g.config.optim, learning_rate(g.config.optim, 1),
             clip_coefficient(halved.grad_norm, g.config.optim.clip_grad), halved.grads, params, state);
  for (auto& [name, t] : step_datasets(table(), halved, &params, g.windows(), g.seq())) candidate[name] = t;
  const DiffResult result = analyse(g, candidate, "scale");
  expect_verdicts(result, {"gradient_scale"});
  EXPECT_TRUE(contains(only_verdict(result).message, "0.5 x golden = 1/2")) << describe(result);
  for (const Entry& e : result.entries) {
    if (e.group == "grads") {
      EXPECT_EQ(e.status, Status::kFail) << e.path;
    } else if (e.group == "params") {
      EXPECT_EQ(e.basis, Basis::kOptimizer) << e.path;
      EXPECT_EQ(e.status, Status::kPass) << e.path;
    }
  }
}

TEST_F(TensorSignatures, OneLayer) {
  // Every gradient of layer 0 off by up to 1e-3 relative, element by element (not one factor, not one
  // shard).
  TensorMap candidate = golden_->step_datasets(1);
  const LayerParamIds& ids = table().layer(0);
  for (int id : {ids.input_norm, ids.qkv, ids.proj, ids.pre_mlp_norm, ids.fc1, ids.fc2}) {
    std::vector<double>& g = candidate[grad(id)].values;
    for (size_t i = 0; i < g.size(); ++i) g[i] *= 1 + 1e-3 * std::sin(static_cast<double>(i) + 1);
  }
  const DiffResult result = analyse(*golden_, candidate, "one_layer");
  expect_verdicts(result, {"one_layer"});
  EXPECT_TRUE(contains(only_verdict(result).message, "only layer 0 fails")) << describe(result);
}

TEST_F(TensorSignatures, OneLayerFromOneElement) {
  // The largest element of layer 1's linear_fc2 gradient off by 1e-3 of it: a single element fits in
  // one tp shard but covers far less than half of it, so tp_shard stays silent; and the least-squares
  // factor moves off 1 by ~1e-3 g_i^2 / sum g^2, which every other tensor then fails by.
  TensorMap candidate = golden_->step_datasets(1);
  std::vector<double>& g = candidate[grad(table().layer(1).fc2)].values;
  const auto largest =
      std::max_element(g.begin(), g.end(), [](double a, double b) { return std::fabs(a) < std::fabs(b); });
  *largest *= 1.001;
  expect_verdicts(analyse(*golden_, candidate, "one_element"), {"one_layer"});
}

TEST_F(TensorSignatures, OneLayerNeedsAnotherLayerThatPasses) {
  // Only layer 0's gradients in the candidate, all off: no tensor of another layer was compared, so
  // nothing says the mistake is confined to layer 0 (the candidate is also refused as partial).
  TensorMap candidate;
  const LayerParamIds& ids = table().layer(0);
  for (int id : {ids.input_norm, ids.qkv, ids.proj, ids.pre_mlp_norm, ids.fc1, ids.fc2}) {
    Recorded g{table()[id].shape, golden_->record(1).grads[id], "float64"};
    for (size_t i = 0; i < g.values.size(); ++i)
      g.values[i] *= 1 + 1e-3 * std::sin(static_cast<double>(i) + 1);
    candidate[grad(id)] = g;
  }
  const DiffResult result = analyse(*golden_, candidate, "one_layer_alone");
  expect_verdicts(result, {});
  EXPECT_FALSE(result.partial.empty()) << describe(result);
}

// Layer 0's parameters after step 1 off by 1e-6 relative; the gradients are `with_gradients` the golden ones.
TensorMap layer_params_off(const GoldenRun& golden, bool with_gradients) {
  TensorMap candidate = golden.step_datasets(1);
  if (!with_gradients) {
    std::erase_if(candidate, [](const auto& item) { return item.first.rfind("steps/1/params/", 0) != 0; });
  }
  const ParamTable& table = *golden.table;
  const LayerParamIds& ids = table.layer(0);
  for (int id : {ids.input_norm, ids.qkv, ids.proj, ids.pre_mlp_norm, ids.fc1, ids.fc2}) {
    for (double& x : candidate["steps/1/params/" + table[id].name].values) x *= 1 + 1e-6;
  }
  return candidate;
}

TEST_F(TensorSignatures, OneLayerIsNotGivenForUpdatedParametersWhoseGradientsPass) {
  // Layer 0's gradients pass: its updated parameters are off in the optimizer, not in a layer computed
  // wrong. No optimizer rule matches a perturbation either, so the failure has no verdict.
  const DiffResult result = analyse(*golden_, layer_params_off(*golden_, true), "params_grads_pass");
  expect_verdicts(result, {});
  EXPECT_EQ(result.entries[static_cast<size_t>(result.first_failure)].group, "params") << describe(result);
  EXPECT_EQ(result.entries[static_cast<size_t>(result.first_failure)].basis, Basis::kOptimizer);
}

TEST_F(TensorSignatures, OneLayerOfUpdatedParametersWithoutGradients) {
  // The same parameters without gradients (judged against the golden trajectory): one layer is all the
  // diff can say.
  expect_verdicts(analyse(*golden_, layer_params_off(*golden_, false), "params_only"), {"one_layer"});
}

}  // namespace
}  // namespace touchstone::diff::testing
