// The diff's recomputed signatures (oracle/diff/hypotheses.cpp) and its FP32-in-FP64 check, each on a
// synthetic candidate made to match exactly one rule: the step computed by Touchstone's own trainer
// under the mistaken rule (the other loss normalisation, the document mask dropped or added, position
// ids not reset, linear_qkv read as [q; k; v], FP32 arithmetic) from the golden initial parameters on
// the golden batch, and diffed with run_analysis. Each case asserts exit status 1 and the exact set of
// verdicts: its own rule fires and every other rule stays silent on it.
//
// Why the cases separate: the candidate and the diff's recomputation of the same rule run the same FP64
// operations (two code paths: the trainer's pipeline step and evaluate_objective) and agree to ~1e-15,
// far inside the FP64 file's 1e-10; any other rule moves the loss and the gradients by 1e-3 or more
// relative (the data make the micro-batches' loss-token counts differ and put several documents in each
// window), and FP32 roundoff (~1e-7) is 1e4 x below that, outside fp32_in_fp64's factor-100 band.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <set>

#include "test_diff_signature_fixture.h"

namespace touchstone::diff::testing {
namespace {

struct RecomputedRulesFiles {
  static constexpr const char* kDirectory = "touchstone_signatures_recomputed";
};
class RecomputedRules : public ThreeGoldenFiles<RecomputedRulesFiles> {};

// The properties of the data every case relies on.
TEST_F(RecomputedRules, TheDataSeparateTheRules) {
  const GlobalBatch& batch = masked_->batch(1);
  const int64_t mbs = masked_->config.train.micro_batch_size;
  EXPECT_NE(batch.loss_tokens(0, mbs), batch.loss_tokens(mbs, mbs)) << "the normalisations would coincide";
  for (int64_t w = 0; w < batch.windows; ++w) {
    std::set<int32_t> documents;
    for (int64_t i = 0; i < batch.seq; ++i) {
      const int32_t doc = batch.document_ids[static_cast<size_t>(w * batch.seq + i)];
      if (doc >= 0) documents.insert(doc);
    }
    EXPECT_GE(documents.size(), 2u) << "window " << w << ": the document mask would not matter";
  }
  EXPECT_EQ(batch.document_ids.back(), -1) << "the last window should end in padding";
  std::printf("loss tokens per micro-batch %lld, %lld\n", static_cast<long long>(batch.loss_tokens(0, mbs)),
              static_cast<long long>(batch.loss_tokens(mbs, mbs)));
  for (const GoldenRun* golden : {masked_.get(), unmasked_.get(), per_microbatch_.get()}) {
    for (int64_t s = 1; s <= 2; ++s) {
      std::printf("%s step %lld: grad norm %.4f, clip coefficient %.4f\n",
                  fs::path(golden->path).filename().c_str(), static_cast<long long>(s),
                  golden->record(s).grad_norm, golden->record(s).clip_coefficient);
      EXPECT_GT(golden->record(s).grad_norm, 2 * golden->config.optim.clip_grad) << "clipping should act";
    }
  }
}

TEST_F(RecomputedRules, ACandidateEqualToTheGoldenStepPassesWithoutVerdicts) {
  for (const GoldenRun* golden : {masked_.get(), unmasked_.get(), per_microbatch_.get()}) {
    const DiffResult result = analyse(*golden, golden->step_datasets(1), "correct");
    EXPECT_EQ(result.exit_status(), 0) << describe(result);
    EXPECT_TRUE(result.verdicts.empty()) << describe(result);
  }
}

TEST_F(RecomputedRules, LossNormalization) {
  // global_token_mean golden, the candidate the mean of the micro-batch means; and the other way round.
  Config config = masked_->config;
  config.train.loss_normalization = LossNormalization::kPerMicrobatchMean;
  const DiffResult per_microbatch =
      analyse(*masked_, dump(*masked_, trainer_step(config, masked_->init, 1, masked_->batch(1))), "norm_pm");
  expect_verdicts(per_microbatch, {"loss_normalization"});
  EXPECT_EQ(entry_of(per_microbatch, "steps/1/loss").status, Status::kFail);
  EXPECT_EQ(entry_of(per_microbatch, "steps/1/token_losses").status, Status::kPass);  // not the normalisation

  config.train.loss_normalization = LossNormalization::kGlobalTokenMean;
  const StepRecord global = trainer_step(config, per_microbatch_->init, 1, per_microbatch_->batch(1));
  expect_verdicts(analyse(*per_microbatch_, dump(*per_microbatch_, global), "norm_global"),
                  {"loss_normalization"});
}

TEST_F(RecomputedRules, DocumentMaskMissing) {
  Config config = masked_->config;
  config.data.document_masking = false;  // attention across documents; positions as recorded (reset)
  const StepRecord record = trainer_step(config, masked_->init, 1, masked_->batch(1));
  expect_verdicts(analyse(*masked_, dump(*masked_, record), "mask_missing"), {"document_mask_missing"});
}

TEST_F(RecomputedRules, DocumentMaskMissingPositionsNotReset) {
  Config config = masked_->config;
  config.data.document_masking = false;
  GlobalBatch batch = masked_->batch(1);
  for (size_t i = 0; i < batch.position_ids.size(); ++i) {
    batch.position_ids[i] = static_cast<int32_t>(static_cast<int64_t>(i) % batch.seq);
  }
  const StepRecord record = trainer_step(config, masked_->init, 1, batch);
  expect_verdicts(analyse(*masked_, dump(*masked_, record), "positions_not_reset"),
                  {"document_mask_missing_positions_not_reset"});
}

TEST_F(RecomputedRules, DocumentMaskApplied) {
  Config config = unmasked_->config;
  config.data.document_masking = true;  // per-document attention on the golden (unmasked) batch
  const StepRecord record = trainer_step(config, unmasked_->init, 1, unmasked_->batch(1));
  expect_verdicts(analyse(*unmasked_, dump(*unmasked_, record), "mask_applied"), {"document_mask_applied"});
}

// A model that reads linear_qkv's rows as [all q; all k; all v]: the trainer run on the stored tensor
// regrouped that way. `regroup_gradient` false: the candidate's gradient stays in the model's grouped
// rows (the wrong split happened converting to q/k/v projections, and the diff converts back per group).
StepRecord qkv_read_separate(const GoldenRun& golden, bool regroup_gradient) {
  const ModelConfig& m = golden.config.model;
  const ParamTable& table = *golden.table;
  ParamTensors params = golden.init;
  for (int64_t l = 0; l < m.num_layers; ++l) {
    const int id = table.layer(l).qkv;
    params[id] = hf::qkv_grouped_from_separate(m, params[id], m.hidden_size);
  }
  StepRecord record = trainer_step(golden.config, params, 1, golden.batch(1));
  for (int64_t l = 0; regroup_gradient && l < m.num_layers; ++l) {
    const int id = table.layer(l).qkv;
    record.grads[id] = hf::qkv_separate_from_grouped(m, record.grads[id], m.hidden_size);
  }
  return record;
}

TEST_F(RecomputedRules, QkvGrouping) {
  // qkv_conversion differs from this case in the linear_qkv gradients' row order only, so the
  // candidate's complete gradients tell them apart.
  expect_verdicts(analyse(*masked_, dump(*masked_, qkv_read_separate(*masked_, true)), "qkv_grouping"),
                  {"qkv_grouping"});
}

TEST_F(RecomputedRules, QkvConversion) {
  expect_verdicts(analyse(*masked_, dump(*masked_, qkv_read_separate(*masked_, false)), "qkv_conversion"),
                  {"qkv_conversion"});
}

TEST_F(RecomputedRules, Fp32InsideFp64) {
  // Touchstone's FP32 mode from the golden parameters: every gradient off by FP32 roundoff, the error
  // ratio to Touchstone's FP32 step exactly 1 (the same computation), inside the factor-100 band.
  Config config = masked_->config;
  config.precision = Precision::kFp32;
  const StepRecord record = trainer_step(config, masked_->init, 1, masked_->batch(1));
  const DiffResult result = analyse(*masked_, dump(*masked_, record), "fp32");
  expect_verdicts(result, {"fp32_in_fp64"});
  for (const Entry& e : result.entries) {
    if (e.group != "grads") continue;
    // Every gradient fails, by FP32's error: 1e-10 (the file's tolerance) < relative L2 < 1e-4.
    EXPECT_EQ(e.status, Status::kFail) << e.path;
    EXPECT_LT(e.metrics.relative_l2, 1e-4) << e.path;
  }
}

TEST_F(RecomputedRules, Fp32InsideFp64OnlyWithinAFactor100OfFp32sError) {
  // The FP32 step's deviation from the golden one scaled by k: k = 1/30 and 30 lie inside the band
  // [1/100, 100] of Touchstone's FP32 error, k = 300 outside it (an error 300 x FP32 roundoff, ~3e-5,
  // is no longer FP32 arithmetic; nothing else matches it either). Every gradient still fails at
  // k = 1/30: FP32's relative error here is ~1e-7, 1/30 of it is 30 x the file's 1e-10.
  Config config = masked_->config;
  config.precision = Precision::kFp32;
  const StepRecord fp32 = trainer_step(config, masked_->init, 1, masked_->batch(1));
  for (const double k : {1.0 / 30, 30.0, 300.0}) {
    SCOPED_TRACE("k = " + std::to_string(k));
    StepRecord scaled = fp32;
    const StepRecord& golden = masked_->record(1);
    scaled.loss = golden.loss + k * (fp32.loss - golden.loss);
    for (int id = 0; id < masked_->table->size(); ++id) {
      for (size_t i = 0; i < scaled.grads[id].size(); ++i) {
        scaled.grads[id][i] = golden.grads[id][i] + k * (fp32.grads[id][i] - golden.grads[id][i]);
      }
    }
    const DiffResult result = analyse(*masked_, dump(*masked_, scaled), "fp32_scaled");
    expect_verdicts(result, k < 100 ? std::set<std::string>{"fp32_in_fp64"} : std::set<std::string>{});
  }
}

}  // namespace
}  // namespace touchstone::diff::testing
