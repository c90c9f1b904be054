// run_pipeline (parallel/pipeline/executor.h) on its own, with pp = world size (2 and 4 stages, the
// first stage holding two layers and every other one layer), for 1F1B, AFAB and ZB-H1 and for 1, 3 and 5
// micro-batches of 2 windows (fewer and more micro-batches than stages). It proves, in FP64:
//   - every stage's gradients (of exactly the tensors it holds), the last stage's token losses per
//     micro-batch and its weighted loss equal the same micro-batches run on one rank by the whole model
//     without the pipeline (forward, then backward in micro-batch order), bitwise: every schedule runs
//     the backwards in micro-batch order, and ZB-H1's deferred weight gradients (W) replay the whole
//     backward's calls in micro-batch order too, so every sum is added in the same order;
//   - loss_weights weight the loss and backward_weights start the backward (distinct values for each);
//   - without gradients, the forwards alone give the same losses on any number of stages;
//   - the recorded timeline of each stage, transfers included, is the schedule's action list in order;
//   - with two virtual stages per stage (interleaved 1F1B) the same, chunk by chunk;
//   - without gradients (one stage, as the objective alone is evaluated) only the forward passes run,
//     in micro-batch order; the loss is unchanged and the gradients are left alone.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "model/param_table.h"
#include "model/params.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/shard_plan.h"
#include "tests/mpi/mpi_test.h"
#include "tests/unit/test_support.h"

namespace touchstone {
namespace {

using testing::MpiTest;

class PipelineExecutorTest : public MpiTest {};

constexpr int64_t kWindowsPerMicroBatch = 2;
constexpr int kMaxMicroBatches = 5;

// The tiny model of the unit tests on world-size stages: 2 layers on stage 0, 1 on each other stage.
Config pipeline_config() {
  Config c = testing::tiny_config();
  const int stages = testing::world_size();
  c.model.num_layers = stages + 1;
  c.parallel.pp = stages;
  c.parallel.stage_layers.assign(static_cast<size_t>(stages), 1);
  c.parallel.stage_layers[0] = 2;
  c.train.global_batch_size = kWindowsPerMicroBatch * kMaxMicroBatches;
  c.train.micro_batch_size = kWindowsPerMicroBatch;
  return c;
}

// Enough documents of assorted lengths (ids 2..15: neither padding 0 nor EOS 1) for 10 distinct
// windows of T = 8, so that every micro-batch holds other tokens.
std::vector<data::Document> documents() {
  std::vector<data::Document> docs;
  for (int d = 0; d < 16; ++d) {
    data::Document doc;
    for (int i = 0; i < 3 + (d * 5) % 9; ++i) doc.push_back(2 + (d * 7 + i * 3) % 14);
    docs.push_back(doc);
  }
  return docs;
}

// Per micro-batch j, distinct weights that no rounding-free shortcut would reproduce.
std::vector<double> loss_weights(int m) {
  std::vector<double> w;
  for (int j = 0; j < m; ++j) w.push_back(1.0 / (3.0 + j));
  return w;
}
std::vector<double> backward_weights(int m) {
  std::vector<double> w;
  for (int j = 0; j < m; ++j) w.push_back(1.0 / (2.0 + 2.0 * j));
  return w;
}

struct Reference {
  ParamTensors grads;
  std::vector<std::vector<double>> token_losses;
  double weighted_loss = 0.0;
};

// The micro-batches on one rank without the pipeline: forward and backward of each in order, the
// gradients accumulated into one set, the loss weighted as the executor documents.
Reference whole_model_reference(const Config& c, const ParamTable& table, const ParamTensors& params,
                                const std::vector<MicroBatch>& micro_batches) {
  auto backend = make_cpu_backend();
  const Transformer model = testing::whole_model(c, table, *backend);
  const auto m = static_cast<int>(micro_batches.size());
  Reference reference;
  reference.grads = ParamTensors::zeros_like(table);
  for (int j = 0; j < m; ++j) {
    Activations acts;
    model.forward(params, micro_batches[static_cast<size_t>(j)], nullptr, acts);
    double sum = 0.0;
    for (double loss : acts.token_losses) sum += loss;
    reference.weighted_loss += loss_weights(m)[static_cast<size_t>(j)] * sum;
    reference.token_losses.emplace_back(acts.token_losses.begin(), acts.token_losses.end());
    model.backward(params, micro_batches[static_cast<size_t>(j)], acts,
                   backward_weights(m)[static_cast<size_t>(j)], nullptr, reference.grads, nullptr);
  }
  return reference;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// One stage of the pipeline: this rank's shard plan, model chunks and parameters.
struct Stage {
  Stage(const Config& c, const ParamTable& table, const ParamTensors& full_params, Grid& grid)
      : context(context_of(grid)),
        backend(make_cpu_backend()),
        plan(table, c, 0, 1, context.stage()),
        region(context.tp, false, *backend),
        params(plan.shard(full_params)) {
    models.reserve(plan.chunk_ranges().size());
    for (const StageRange& range : plan.chunk_ranges()) {
      models.emplace_back(c.model, c.data.document_masking, c.train.seed, table, *backend, region, range);
      chunks.push_back(&models.back());
    }
  }

  ParallelContext context;
  std::unique_ptr<Backend> backend;
  ShardPlan plan;
  TensorParallelRegion region;
  std::vector<Transformer> models;
  ModelChunks chunks;
  ParamTensors params;
};

// Every held gradient equals the whole model's bitwise, tensors not held stay empty; the last stage's
// losses equal the reference's, other stages report none.
void expect_equals_reference(const Stage& stage, const ParamTable& table, const ParamTensors& grads,
                             const PipelineResult& result, const Reference& reference, int m) {
  for (int id = 0; id < table.size(); ++id) {
    if (stage.plan.holds(id)) {
      EXPECT_TRUE(same_bits(grads[id], reference.grads[id])) << table[id].name;
    } else {
      EXPECT_TRUE(grads[id].empty()) << table[id].name << " is not held by stage " << stage.context.stage();
    }
  }
  if (stage.context.last_stage()) {
    EXPECT_EQ(result.weighted_loss, reference.weighted_loss);
    EXPECT_EQ(result.token_losses.size(), static_cast<size_t>(m));
    for (int j = 0; j < m && j < static_cast<int>(result.token_losses.size()); ++j) {
      EXPECT_TRUE(same_bits(result.token_losses[static_cast<size_t>(j)],
                            reference.token_losses[static_cast<size_t>(j)]))
          << "micro-batch " << j;
    }
  } else {
    EXPECT_EQ(result.weighted_loss, 0.0);
    EXPECT_TRUE(result.token_losses.empty());
  }
}

// The first m micro-batches of the batch.
std::vector<MicroBatch> first_micro_batches(const GlobalBatch& batch, int m) {
  std::vector<MicroBatch> micro_batches;
  for (int j = 0; j < m; ++j)
    micro_batches.push_back(batch.micro_batch(j * kWindowsPerMicroBatch, kWindowsPerMicroBatch));
  return micro_batches;
}

// Without gradients every stage runs its forwards only (and frees what it sent): the same losses as
// `with_gradients`, and no gradient touched.
void expect_forward_only_matches(PipelineSchedule schedule, const Stage& stage,
                                 const std::vector<MicroBatch>& micro_batches,
                                 const PipelineResult& with_gradients) {
  const int m = static_cast<int>(micro_batches.size());
  ParamTensors untouched = stage.plan.zeros();
  const PipelineResult forward_only =
      run_pipeline(schedule, stage.chunks, stage.params, micro_batches, loss_weights(m), backward_weights(m),
                   stage.context, 1, false, untouched, nullptr);
  EXPECT_EQ(untouched.tensors, stage.plan.zeros().tensors);
  EXPECT_EQ(forward_only.weighted_loss, with_gradients.weighted_loss);
  EXPECT_EQ(forward_only.token_losses, with_gradients.token_losses);
}

TEST_F(PipelineExecutorTest, EqualsTheWholeModelOnOneRankAndFollowsTheSchedule) {
  const Config c = pipeline_config();
  const ParamTable table(c.model);
  const ParamTensors full_params = init_parameters(table, c.model, 7);
  const GlobalBatch batch = testing::batch_from_documents(c, documents());
  std::unique_ptr<Grid> grid = Grid::create(GridLayout{1, 1, testing::world_size()});
  Stage stage(c, table, full_params, *grid);
  const int num_stages = stage.context.pp.size(), s = stage.context.stage();

  for (const PipelineSchedule schedule :
       {PipelineSchedule::kOneForwardOneBackward, PipelineSchedule::kAllForwardAllBackward,
        PipelineSchedule::kZeroBubbleH1}) {
    for (int m : {1, 3, kMaxMicroBatches}) {
      SCOPED_TRACE(option_name(schedule) + ", " + std::to_string(m) + " micro-batches");
      const std::vector<MicroBatch> micro_batches = first_micro_batches(batch, m);
      const Reference reference = whole_model_reference(c, table, full_params, micro_batches);

      ParamTensors grads = stage.plan.zeros();
      pipeline::TimelineRecorder recorder(s);
      const PipelineResult result =
          run_pipeline(schedule, stage.chunks, stage.params, micro_batches, loss_weights(m),
                       backward_weights(m), stage.context, 1, true, grads, &recorder);
      expect_forward_only_matches(schedule, stage, micro_batches, result);

      expect_equals_reference(stage, table, grads, result, reference, m);
      const std::string expected_order =
          pipeline::format_actions(pipeline::build_schedule(schedule, num_stages, s, m), true);
      EXPECT_EQ(pipeline::render_order(recorder.events(), num_stages, true)[static_cast<size_t>(s)],
                expected_order);
    }
  }
}

// Interleaved 1F1B: two model chunks per stage (virtual stages 0..2p-1, the first with two layers), for
// p and 2p micro-batches (Megatron-LM's schedule needs a multiple of p). Each layer lives in one chunk,
// whose backwards run in micro-batch order, so every gradient equals the whole model's bitwise too; the
// recorded order, transfers and chunks included, is build_interleaved_schedule's.
TEST_F(PipelineExecutorTest, InterleavedChunksEqualTheWholeModelAndFollowTheSchedule) {
  constexpr int kChunks = 2;
  Config c = pipeline_config();
  const int p = testing::world_size();
  c.parallel.virtual_stages = kChunks;
  c.model.num_layers = p * kChunks + 1;
  c.parallel.stage_layers.assign(static_cast<size_t>(p * kChunks), 1);
  c.parallel.stage_layers[0] = 2;
  const ParamTable table(c.model);
  const ParamTensors full_params = init_parameters(table, c.model, 7);
  const GlobalBatch batch = testing::batch_from_documents(c, documents());
  std::unique_ptr<Grid> grid = Grid::create(GridLayout{1, 1, p});
  Stage stage(c, table, full_params, *grid);
  const int s = stage.context.stage();
  ASSERT_EQ(stage.chunks.size(), static_cast<size_t>(kChunks));
  EXPECT_EQ(stage.chunks[1]->stage().first_layer, s + p + 1);  // virtual stage p + s, after layers 0, 1
  for (int m = p; m <= kMaxMicroBatches; m += p) {
    SCOPED_TRACE(std::to_string(m) + " micro-batches");
    const std::vector<MicroBatch> micro_batches = first_micro_batches(batch, m);
    const Reference reference = whole_model_reference(c, table, full_params, micro_batches);
    ParamTensors grads = stage.plan.zeros();
    pipeline::TimelineRecorder recorder(s);
    const PipelineResult result =
        run_pipeline(PipelineSchedule::kOneForwardOneBackward, stage.chunks, stage.params, micro_batches,
                     loss_weights(m), backward_weights(m), stage.context, 1, true, grads, &recorder);
    expect_equals_reference(stage, table, grads, result, reference, m);
    EXPECT_EQ(pipeline::render_order(recorder.events(), p, true)[static_cast<size_t>(s)],
              pipeline::format_actions(pipeline::build_interleaved_schedule(p, kChunks, s, m), true));
    expect_forward_only_matches(PipelineSchedule::kOneForwardOneBackward, stage, micro_batches, result);
  }
}

// The objective alone (evaluate_objective) runs the executor without gradients on one process.
TEST_F(PipelineExecutorTest, WithoutGradientsRunsTheForwardsOnly) {
  Config c = pipeline_config();
  c.parallel.pp = 1;
  c.parallel.stage_layers.clear();
  const ParamTable table(c.model);
  const ParamTensors params = init_parameters(table, c.model, 7);
  const GlobalBatch batch = testing::batch_from_documents(c, documents());
  const int m = kMaxMicroBatches;
  std::vector<MicroBatch> micro_batches;
  for (int j = 0; j < m; ++j) {
    micro_batches.push_back(batch.micro_batch(j * kWindowsPerMicroBatch, kWindowsPerMicroBatch));
  }
  const Reference reference = whole_model_reference(c, table, params, micro_batches);

  auto backend = make_cpu_backend();
  const Transformer model = testing::whole_model(c, table, *backend);
  SingleProcessContext single;
  ParamTensors grads = ParamTensors::zeros_like(table);
  for (auto& tensor : grads.tensors) std::fill(tensor.begin(), tensor.end(), 0.25);  // must stay
  const ParamTensors untouched = grads;
  pipeline::TimelineRecorder recorder(0);
  const PipelineResult result =
      run_pipeline(PipelineSchedule::kOneForwardOneBackward, {&model}, params, micro_batches, loss_weights(m),
                   backward_weights(m), single.context(), 1, false, grads, &recorder);
  EXPECT_EQ(grads.tensors, untouched.tensors);
  EXPECT_EQ(result.weighted_loss, reference.weighted_loss);
  EXPECT_EQ(result.token_losses, reference.token_losses);
  EXPECT_EQ(pipeline::render_order(recorder.events(), 1, true)[0], "F0 F1 F2 F3 F4");
}

}  // namespace
}  // namespace touchstone
