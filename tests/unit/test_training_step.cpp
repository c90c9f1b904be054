// Stage-1 properties of the training step: micro-batch equivalence, the per-micro-batch-mean bug,
// cross-document masking, padding and the EOS rule.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/backend.h"
#include "model/params.h"
#include "oracle/run.h"
#include "oracle/train_step.h"
#include "test_support.h"

namespace touchstone {
namespace {

// A small model on the built-in acceptance data (T = 16, B = 8): its micro-batches of 2 windows hold
// different numbers of loss tokens.
Config acceptance_config() {
  Config c = touchstone::testing::small_model_config();
  c.train.global_batch_size = 8;
  c.train.steps = 3;
  return c;
}

struct RunResult {
  std::vector<ParamTensors> grads;   // per step
  std::vector<ParamTensors> params;  // after each step
  std::vector<double> losses;
};

RunResult train(const Config& config) {
  const PreparedRun run = prepare_run(config, RunOptions{});
  auto backend = make_cpu_backend();
  SingleProcessContext single;
  Trainer trainer(config, run.initial_params, *backend, single.context());
  RunResult result;
  for (const GlobalBatch& batch : run.batches) {
    StepRecord record = trainer.step(batch);
    result.losses.push_back(record.loss);
    result.grads.push_back(std::move(record.grads));
    result.params.push_back(trainer.params());
  }
  return result;
}

// Accumulating the same token-weighted sum in another grouping changes only rounding: a few ulps per
// element (u = 1.1e-16) over at most B = 8 partial sums, far below 1e-13 relative L2. AdamW then maps
// gradients to updates with a condition number near 1 (m / sqrt(v)), so params stay within 1e-13.
constexpr double kMicroBatchTolerance = 1e-13;

TEST(MicroBatchEquivalence, GlobalTokenMeanIsIndependentOfTheSplit) {
  Config whole = acceptance_config();
  whole.train.micro_batch_size = 8;  // 1 x B
  const RunResult reference = train(whole);
  for (int64_t mbs : {2, 1}) {  // (B/2) x 2... and B x 1
    Config split = whole;
    split.train.micro_batch_size = mbs;
    const RunResult result = train(split);
    for (size_t s = 0; s < reference.grads.size(); ++s) {
      EXPECT_LE(std::abs(result.losses[s] - reference.losses[s]) / reference.losses[s], kMicroBatchTolerance);
      EXPECT_LE(testing::relative_l2(result.grads[s], reference.grads[s]), kMicroBatchTolerance)
          << "mbs " << mbs << " step " << s + 1;
      EXPECT_LE(testing::relative_l2(result.params[s], reference.params[s]), kMicroBatchTolerance)
          << "mbs " << mbs << " step " << s + 1;
    }
  }
}

TEST(MicroBatchEquivalence, MicroBatchesReallyHoldDifferentTokenCounts) {
  const PreparedRun run = prepare_run(acceptance_config(), RunOptions{});
  const GlobalBatch& batch = run.batches[0];
  std::vector<int64_t> counts;
  for (int64_t j = 0; j < 4; ++j) counts.push_back(batch.loss_tokens(2 * j, 2));
  EXPECT_NE(*std::min_element(counts.begin(), counts.end()), *std::max_element(counts.begin(), counts.end()));
}

TEST(LossNormalization, PerMicrobatchMeanDiffersAndMatchesItsDefinition) {
  const Config config = acceptance_config();
  const PreparedRun run = prepare_run(config, RunOptions{});
  auto backend = make_cpu_backend();
  const ParamTable table(config.model);
  const Transformer model = testing::whole_model(config, table, *backend);
  const GlobalBatch& batch = run.batches[0];
  const int64_t mbs = 2, num_micro = batch.windows / mbs;

  const ObjectiveResult global = evaluate_objective(model, table, run.initial_params, batch, mbs,
                                                    LossNormalization::kGlobalTokenMean, true);
  const ObjectiveResult per_micro = evaluate_objective(model, table, run.initial_params, batch, mbs,
                                                       LossNormalization::kPerMicrobatchMean, true);

  // By hand: each micro-batch alone is a global batch whose token mean is its own mean; average those.
  double hand_loss = 0.0;
  ParamTensors hand_grads = ParamTensors::zeros_like(table);
  for (int64_t j = 0; j < num_micro; ++j) {
    GlobalBatch micro = make_global_batch(run.windows, mbs, 1);
    const MicroBatch view = batch.micro_batch(j * mbs, mbs);
    const size_t n = static_cast<size_t>(mbs * batch.seq);
    micro.tokens.assign(view.tokens, view.tokens + n);
    micro.targets.assign(view.targets, view.targets + n);
    micro.position_ids.assign(view.position_ids, view.position_ids + n);
    micro.document_ids.assign(view.document_ids, view.document_ids + n);
    const ObjectiveResult own = evaluate_objective(model, table, run.initial_params, micro, mbs,
                                                   LossNormalization::kGlobalTokenMean, true);
    hand_loss += own.loss / static_cast<double>(num_micro);
    for (int id = 0; id < table.size(); ++id) {
      for (size_t i = 0; i < hand_grads[id].size(); ++i)
        hand_grads[id][i] += own.grads[id][i] / static_cast<double>(num_micro);
    }
  }
  EXPECT_LE(std::abs(per_micro.loss - hand_loss) / hand_loss, 1e-14);
  EXPECT_LE(testing::relative_l2(per_micro.grads, hand_grads), kMicroBatchTolerance);
  // The silent bug is not subtle in the numbers: 0.2 relative in the gradients (4e-3 in the loss),
  // 12 orders above FP64 rounding.
  EXPECT_GT(testing::relative_l2(per_micro.grads, global.grads), 1e-3);
  EXPECT_GT(std::abs(per_micro.loss - global.loss) / global.loss, 1e-5);
}

// ---- cross-document masking --------------------------------------------------------------------------

struct DocumentOutputs {
  std::vector<double> losses;  // token losses of the second document's positions
  std::vector<double> hidden;  // final hidden states of those positions [n, H]
};

// Window of T = 16: [A (5 tokens) EOS][B (6 tokens) EOS][3 padding]; returns B's outputs.
DocumentOutputs second_document_outputs(bool document_masking, const data::Document& first) {
  Config config = testing::tiny_config();
  config.model.seq_length = 16;
  config.train.global_batch_size = 1;
  config.train.micro_batch_size = 1;
  config.data.document_masking = document_masking;
  auto backend = make_cpu_backend();
  const ParamTable table(config.model);
  const Transformer model = testing::whole_model(config, table, *backend);
  const ParamTensors params = init_parameters(table, config.model, 3);
  const GlobalBatch batch = testing::batch_from_documents(config, {first, {9, 10, 11, 12, 13, 14}});
  Activations acts;
  model.forward(params, batch.micro_batch(0, 1), nullptr, acts);
  DocumentOutputs out;
  const int64_t H = config.model.hidden_size;
  for (int64_t t = 6; t < 13; ++t) {  // B's six tokens and its EOS
    EXPECT_EQ(batch.document_ids[static_cast<size_t>(t)], 1);
    out.losses.push_back(acts.token_losses[static_cast<size_t>(t)]);
    out.hidden.insert(out.hidden.end(), acts.h_final.begin() + t * H, acts.h_final.begin() + (t + 1) * H);
  }
  return out;
}

TEST(DocumentMasking, SecondDocumentIgnoresTheFirstDocumentsContent) {
  const DocumentOutputs before = second_document_outputs(true, {2, 3, 4, 5, 6});
  const DocumentOutputs after = second_document_outputs(true, {15, 7, 7, 2, 8});
  // Masked keys get probability exactly 0, so nothing of A reaches B: equal to the last bit.
  EXPECT_LE(testing::relative_l2(after.losses, before.losses), 1e-15);
  EXPECT_LE(testing::relative_l2(after.hidden, before.hidden), 1e-15);
}

TEST(DocumentMasking, WithoutMaskingTheFirstDocumentLeaksIntoTheSecond) {
  const DocumentOutputs before = second_document_outputs(false, {2, 3, 4, 5, 6});
  const DocumentOutputs after = second_document_outputs(false, {15, 7, 7, 2, 8});
  EXPECT_GT(testing::relative_l2(after.losses, before.losses), 1e-6);
  EXPECT_GT(testing::relative_l2(after.hidden, before.hidden), 1e-6);
}

// ---- padding and EOS ---------------------------------------------------------------------------------

TEST(Padding, ContributesNoLossAndNoGradient) {
  for (bool document_masking : {true, false}) {
    Config config = testing::tiny_config();
    config.data.document_masking = document_masking;
    auto backend = make_cpu_backend();
    const ParamTable table(config.model);
    const Transformer model = testing::whole_model(config, table, *backend);
    const ParamTensors params = init_parameters(table, config.model, 5);
    // 4 windows of T = 8; the stream ends 5 tokens into the last window.
    GlobalBatch batch = testing::batch_from_documents(
        config,
        {{2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {12, 13, 14, 15, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}});
    const ObjectiveResult reference =
        evaluate_objective(model, table, params, batch, 2, LossNormalization::kGlobalTokenMean, true);
    int64_t padding = 0;
    for (size_t i = 0; i < batch.tokens.size(); ++i) {
      if (batch.document_ids[i] != data::kPaddingDocument) continue;
      ++padding;
      EXPECT_EQ(batch.targets[i], data::kIgnoreTarget);
      EXPECT_EQ(reference.token_losses[i], 0.0);
      batch.tokens[i] = 9;  // other content at every padding position
    }
    ASSERT_GT(padding, 0);
    // The pad token's embedding row is never used by a position with a loss: its gradient is 0.
    for (int64_t i = 0; i < config.model.hidden_size; ++i)
      EXPECT_EQ(reference.grads[table.embedding()]
                               [static_cast<size_t>(config.data.pad_token * config.model.hidden_size + i)],
                0.0);
    const ObjectiveResult changed =
        evaluate_objective(model, table, params, batch, 2, LossNormalization::kGlobalTokenMean, true);
    EXPECT_EQ(changed.loss, reference.loss);
    EXPECT_EQ(changed.num_loss_tokens, reference.num_loss_tokens);
    EXPECT_EQ(testing::relative_l2(changed.grads, reference.grads), 0.0) << "masking " << document_masking;
  }
}

TEST(EosRule, EosTargetsAreTrainedOnlyWithEosLoss) {
  Config config = testing::tiny_config();
  config.train.global_batch_size = 2;  // the 15 tokens of these documents fill 2 windows of T = 8
  const std::vector<data::Document> documents{{2, 3, 4}, {5, 6}, {7, 8, 9, 10}, {11, 12}};
  const GlobalBatch with_eos = testing::batch_from_documents(config, documents);
  config.data.eos_loss = false;
  const GlobalBatch without_eos = testing::batch_from_documents(config, documents);
  int64_t eos_targets = 0;
  for (size_t i = 0; i < with_eos.targets.size(); ++i) {
    if (with_eos.targets[i] == config.data.eos_token) {
      ++eos_targets;
      EXPECT_EQ(without_eos.targets[i], data::kIgnoreTarget);
    } else {
      EXPECT_EQ(without_eos.targets[i], with_eos.targets[i]);
    }
  }
  EXPECT_EQ(eos_targets, 4);
  EXPECT_EQ(with_eos.loss_tokens(0, 2) - without_eos.loss_tokens(0, 2), eos_targets);
}

// A run whose optimizer state nobody reads after its last update keeps no moments for that update
// (Trainer::drop_final_moments): a one-step run never holds them and lays out no arena block, with the
// bits of a run that keeps everything; a longer run still holds the moments of its earlier updates.
TEST(FinalMoments, DroppingThemChangesNoBitAndFreesTheirMemory) {
  for (const int64_t steps : {1, 2}) {
    SCOPED_TRACE("steps " + std::to_string(steps));
    Config config = acceptance_config();
    config.train.steps = steps;
    const PreparedRun run = prepare_run(config, RunOptions{});
    auto backend = make_cpu_backend();
    SingleProcessContext single;
    Trainer keeping(config, run.initial_params, *backend, single.context());
    Trainer dropping(config, run.initial_params, *backend, single.context());
    dropping.drop_final_moments();
    for (const GlobalBatch& batch : run.batches) {
      const StepRecord kept = keeping.step(batch), dropped = dropping.step(batch);
      EXPECT_EQ(dropped.loss, kept.loss);
      EXPECT_EQ(dropped.grad_norm, kept.grad_norm);
      EXPECT_EQ(testing::relative_l2(dropped.grads, kept.grads), 0.0);
    }
    for (size_t id = 0; id < keeping.params().tensors.size(); ++id)
      EXPECT_EQ(dropping.params().tensors[id], keeping.params().tensors[id]) << "tensor " << id;
    EXPECT_EQ(keeping.optimizer_moments().step, steps);
    if (steps == 1) {
      EXPECT_THROW(dropping.optimizer_moments(), std::logic_error);
      EXPECT_EQ(dropping.arena().stats().block_bytes, 0) << "a one-step run laid out a block";
    } else {
      const AdamWState moments = dropping.optimizer_moments();  // held since the first update
      EXPECT_EQ(moments.step, 2);
      EXPECT_EQ(testing::relative_l2(moments.exp_avg, keeping.optimizer_moments().exp_avg), 0.0);
      EXPECT_GT(dropping.arena().stats().block_bytes, 0);
    }
  }
}

}  // namespace
}  // namespace touchstone
