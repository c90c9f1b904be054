// DataParallelOptimizer (parallel/data/data_parallel_optimizer.h) on its own, with dp = world size
// (2 and 4), at every zero stage (0 replicated, 1 distributed optimizer, 2 sharded gradients, 3 sharded
// parameters: the test then hands it the reduce-scattered gradient shards and the parameter shards, as
// the passes would), in FP64 and FP32. Each rank passes its own gradients;
// the test recomputes on every rank what one rank would do with all of them, and proves:
//   - the returned gradients are the sum over dp ranks (in rank order, as the reduction documents)
//     times grad_scale, stored in the main gradients' precision: bitwise;
//   - the global gradient norm counts every element once: bitwise when replicated (one rank sums the
//     squares in table order, as the test does), within a derived bound when sharded (each rank sums
//     its chunk or shards, then the ranks' sums are added);
//   - the clip coefficient is clip_coefficient(norm) (active, and off), the learning rate that of the
//     update;
//   - the updated parameters and the Adam moments are bitwise those of optim/ adamw_step applied on one
//     rank to the reduced gradient with that clip coefficient, over two updates, on every rank;
//   - want_full_grads changes only what the gradients hold on return, never the update;
//   - moments() and restore() continue an optimizer bitwise where another left off.
// The model is chosen so that the flat buffer (135 elements) is padded for dp = 2 and 4 and the dp
// chunks end inside tensors, with and without weight decay; dim-0 shards are padded too (dim 0 of 5, 3
// and 2 rows over 2 and 4 ranks: ranks with padding only).
#include <cmath>
#include <cstring>
#include <iomanip>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "model/param_table.h"
#include "model/params.h"
#include "optim/optimizer.h"
#include "parallel/data/data_parallel_optimizer.h"
#include "parallel/data/dim0_shard.h"
#include "tests/mpi/mpi_test.h"

namespace touchstone {
namespace {

using testing::MpiTest;

class DataParallelOptimizerTest : public MpiTest {};

constexpr double kGradScale = 1.0 / 37.0;  // as 1/num_loss_tokens: not a power of two, so it rounds

// V=5, H=3, one head, F=1, 2 layers: 15 + 2 x 51 + 3 + 15 = 135 elements, an odd count.
Config odd_sized_config(double clip_grad) {
  Config c;
  c.model = ModelConfig{.vocab_size = 5,
                        .hidden_size = 3,
                        .num_layers = 2,
                        .num_heads = 1,
                        .num_kv_heads = 1,
                        .ffn_hidden_size = 1,
                        .seq_length = 4};
  c.parallel.dp = testing::world_size();
  c.optim.lr = 1e-2;
  c.optim.min_lr = 1e-3;
  c.optim.warmup_steps = 1;
  c.optim.decay_steps = 4;  // update 1 at the peak, update 2 on the cosine: two learning rates
  c.optim.weight_decay = 0.1;
  c.optim.clip_grad = clip_grad;
  return c;
}

// Values stored in `precision`'s main-gradient / master-weight format (FP32 unless FP64).
double stored(Precision precision, double value) {
  return precision == Precision::kFp64 ? value : static_cast<double>(static_cast<float>(value));
}

// dp rank `rank`'s accumulated gradient at `update`: values over several binary orders of magnitude,
// so that sums and squares round.
ParamTensors gradients_of(const ParamTable& table, int rank, int64_t update, Precision precision) {
  std::mt19937_64 engine(static_cast<uint64_t>(1000 * update + rank));
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  ParamTensors grads = ParamTensors::zeros_like(table);
  for (auto& tensor : grads.tensors) {
    for (double& g : tensor)
      g = stored(precision, std::ldexp(uniform(engine), static_cast<int>(engine() % 6)));
  }
  return grads;
}

// What one rank holding every dp rank's gradient computes: ((g_0 + g_1) + g_2) + ... in double, stored
// as a main gradient, then times grad_scale as Megatron-LM scales it (the scale and each product stored
// in the same format; see scale_gradient).
ParamTensors reduced_gradient(const ParamTable& table, int64_t update, Precision precision,
                              int* rounded_sums) {
  ParamTensors sum = gradients_of(table, 0, update, precision);
  for (int r = 1; r < testing::world_size(); ++r) {
    const ParamTensors g = gradients_of(table, r, update, precision);
    for (size_t t = 0; t < sum.tensors.size(); ++t) {
      for (size_t i = 0; i < sum.tensors[t].size(); ++i) sum.tensors[t][i] += g.tensors[t][i];
    }
  }
  const double scale = stored(precision, kGradScale);
  for (auto& tensor : sum.tensors) {
    for (double& g : tensor) {
      *rounded_sums += stored(precision, g) != g ? 1 : 0;
      g = stored(precision, stored(precision, g) * scale);
    }
  }
  return sum;
}

// sqrt of the sum of squares in parameter-table order, element by element.
double norm_in_table_order(const ParamTensors& grads) {
  double sum = 0.0;
  for (const auto& tensor : grads.tensors) {
    for (double g : tensor) sum += g * g;
  }
  return std::sqrt(sum);
}

int64_t element_count(const ParamTensors& tensors) {
  int64_t n = 0;
  for (const auto& tensor : tensors.tensors) n += static_cast<int64_t>(tensor.size());
  return n;
}

// "" when every tensor has the same bits, else where the first difference is.
std::string first_difference(const ParamTable& table, const ParamTensors& actual,
                             const ParamTensors& expected) {
  for (int id = 0; id < table.size(); ++id) {
    const std::vector<double>&a = actual[id], &e = expected[id];
    if (a.size() != e.size()) return table[id].name + ": size " + std::to_string(a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::memcmp(&a[i], &e[i], sizeof(double)) != 0) {
        std::ostringstream message;
        message << std::setprecision(17) << table[id].name << "[" << i << "] = " << a[i] << ", expected "
                << e[i];
        return message.str();
      }
    }
  }
  return "";
}

struct Mode {
  Precision precision;
  int64_t zero_stage;
  double clip_grad;  // 1: active for these gradients (norm ~ 10); 0: off
};

std::string describe(const Mode& mode) {
  return option_name(mode.precision) + " zero stage " + std::to_string(mode.zero_stage) +
         (mode.clip_grad > 0 ? " clip on" : " clip off");
}

const Mode kModes[] = {{Precision::kFp64, 0, 1.0}, {Precision::kFp64, 1, 1.0}, {Precision::kFp64, 2, 1.0},
                       {Precision::kFp64, 3, 1.0}, {Precision::kFp64, 0, 0.0}, {Precision::kFp64, 1, 0.0},
                       {Precision::kFp64, 3, 0.0}, {Precision::kFp32, 0, 1.0}, {Precision::kFp32, 1, 1.0},
                       {Precision::kFp32, 2, 1.0}, {Precision::kFp32, 3, 1.0}};

// Zero stage 3: what the passes leave (parallel/data/fully_sharded_parameters.h), each rank's shards of
// the gradients summed over dp, stored as main gradients.
ParamTensors reduce_scattered(const std::vector<Dim0Shard>& shards, ProcessGroup& dp, Backend& backend,
                              const ParamTensors& grads) {
  ParamTensors out;
  out.tensors.resize(grads.tensors.size());
  for (size_t id = 0; id < grads.tensors.size(); ++id) {
    out.tensors[id].assign(static_cast<size_t>(shards[id].shard_numel()), 0.0);
    shards[id].reduce_scatter_add(dp, grads.tensors[id], out.tensors[id]);
    backend.round(TensorRole::kState, out.tensors[id].data(), static_cast<int64_t>(out.tensors[id].size()));
  }
  return out;
}

ParamTensors gathered(const std::vector<Dim0Shard>& shards, ProcessGroup& dp, const ParamTensors& held) {
  ParamTensors full = held;
  for (size_t id = 0; id < held.tensors.size(); ++id)
    shards[id].all_gather(dp, held.tensors[id], full.tensors[id]);
  return full;
}

// The optimizer's copy of the initial weights: master weights stored in the state format.
ParamTensors master_weights(const ParamTable& table, const Config& c, Precision precision) {
  ParamTensors params = init_parameters(table, c.model, 42);
  for (auto& tensor : params.tensors) {
    for (double& p : tensor) p = stored(precision, p);
  }
  return params;
}

// What every test of one mode needs: the odd-sized model, its plan (one stage, one tp rank), the
// dp = world grid and a backend of the mode's precision.
struct ModeSetup {
  explicit ModeSetup(const Mode& mode)
      : config(odd_sized_config(mode.clip_grad)),
        table(config.model),
        plan(table, config, 0, 1, 0),
        grid(Grid::create(GridLayout{1, testing::world_size(), 1})),
        context(context_of(*grid)),
        backend(make_cpu_backend(BackendOptions{mode.precision})),
        shards(dim0_shards(plan, testing::world_size())) {}

  const Config config;
  const ParamTable table;
  const ShardPlan plan;
  std::unique_ptr<Grid> grid;
  const ParallelContext context;
  std::unique_ptr<Backend> backend;
  const std::vector<Dim0Shard> shards;
};

TEST_F(DataParallelOptimizerTest, EqualsAdamWOnOneRankAppliedToTheReducedGradient) {
  for (const Mode& mode : kModes) {
    SCOPED_TRACE(describe(mode));
    ModeSetup setup(mode);
    auto& [c, table, plan, grid, context, backend, shards] = setup;
    auto reference_backend = make_cpu_backend(BackendOptions{mode.precision});
    const bool sharded_params = mode.zero_stage == 3;

    const ParamTensors initial = master_weights(table, c, mode.precision);
    ParamTensors expected_params = initial;
    ParamTensors params = sharded_params ? take_shards(shards, initial, context.dp.rank()) : initial;
    AdamWState expected_state = AdamWState::zeros_like(initial);
    DataParallelOptimizer optimizer(plan, c.optim, mode.zero_stage, shards, context, *backend, params);
    EXPECT_EQ(element_count(initial), 135);  // odd: the flat buffer is padded for dp = 2 and 4
    for (int64_t update : {1, 2}) {
      SCOPED_TRACE("update " + std::to_string(update));
      int rounded_sums = 0;
      const ParamTensors expected_grads = reduced_gradient(table, update, mode.precision, &rounded_sums);
      // FP32: the inputs must make the FP32 rounding of the sum visible, or dropping it would pass.
      if (mode.precision != Precision::kFp64) {
        EXPECT_GT(rounded_sums, 0);
      }

      ParamTensors grads = gradients_of(table, context.dp.rank(), update, mode.precision);
      if (sharded_params) grads = reduce_scattered(shards, context.dp, *backend, grads);
      // Update 2 leaves the other ranks' chunks out (a plain step); the update must not change.
      const bool want_full_grads = update == 1;
      const UpdateResult result = optimizer.step(update, grads, params, want_full_grads, kGradScale);
      if (want_full_grads || mode.zero_stage == 0) {
        EXPECT_EQ(first_difference(table, grads, expected_grads), "");
      }

      const double expected_norm = norm_in_table_order(expected_grads);
      if (mode.zero_stage == 0) {
        EXPECT_EQ(result.grad_norm, expected_norm);
      } else {
        // Both sums add the same N rounded squares in different trees: each is within gamma_N S of the
        // exact sum S (gamma_N = N u / (1 - N u), u = 2^-53), and sqrt halves a relative error and adds
        // one rounding: |norm - exact| <= (gamma_N / 2 + u) exact for each. Their difference is at most
        // (N + 2) u; one more u covers the second-order terms (N^2 u^2 ~ 1e-28). N = 135: 1.5e-14.
        const double u = std::ldexp(1.0, -53);
        const auto n = static_cast<double>(element_count(expected_grads));
        EXPECT_LE(std::abs(result.grad_norm - expected_norm), (n + 3.0) * u * expected_norm);
      }
      EXPECT_EQ(result.clip_coefficient, clip_coefficient(result.grad_norm, c.optim.clip_grad));
      if (mode.clip_grad > 0) {
        EXPECT_LT(result.clip_coefficient, 0.5);  // clipping acts, so a wrong norm shows in the update
      } else {
        EXPECT_EQ(result.clip_coefficient, 1.0);
      }
      EXPECT_EQ(result.lr, learning_rate(c.optim, update));

      adamw_step(*reference_backend, table, c.optim, result.lr, result.clip_coefficient, expected_grads,
                 expected_params, expected_state);
      EXPECT_EQ(first_difference(table, sharded_params ? gathered(shards, context.dp, params) : params,
                                 expected_params),
                "");
      const AdamWState moments = optimizer.moments();  // collective when sharded
      EXPECT_EQ(first_difference(table, moments.exp_avg, expected_state.exp_avg), "");
      EXPECT_EQ(first_difference(table, moments.exp_avg_sq, expected_state.exp_avg_sq), "");
      EXPECT_EQ(moments.step, expected_state.step);
    }
  }
}

TEST_F(DataParallelOptimizerTest, RestoredMomentsContinueBitwise) {
  for (const Mode& mode : kModes) {
    SCOPED_TRACE(describe(mode));
    ModeSetup setup(mode);
    auto& [c, table, plan, grid, context, backend, shards] = setup;
    const int rank = context.dp.rank();
    const bool sharded_params = mode.zero_stage == 3;
    const auto gradients = [&](int64_t update) {
      const ParamTensors g = gradients_of(table, rank, update, mode.precision);
      return sharded_params ? reduce_scattered(shards, context.dp, *backend, g) : g;
    };

    const ParamTensors initial = master_weights(table, c, mode.precision);
    ParamTensors params = sharded_params ? take_shards(shards, initial, rank) : initial;
    DataParallelOptimizer original(plan, c.optim, mode.zero_stage, shards, context, *backend, params);
    ParamTensors grads = gradients(1);
    original.step(1, grads, params, false, kGradScale);

    // A second optimizer resumes from the first one's moments (as from a checkpoint), then both run
    // update 2 on the same gradients.
    ParamTensors resumed_params = params;
    DataParallelOptimizer resumed(plan, c.optim, mode.zero_stage, shards, context, *backend, resumed_params);
    resumed.restore(original.moments());
    ParamTensors grads_original = gradients(2), grads_resumed = grads_original;
    const UpdateResult a = original.step(2, grads_original, params, true, kGradScale);
    const UpdateResult b = resumed.step(2, grads_resumed, resumed_params, true, kGradScale);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
    EXPECT_EQ(a.clip_coefficient, b.clip_coefficient);
    EXPECT_EQ(a.lr, b.lr);
    EXPECT_EQ(first_difference(table, resumed_params, params), "");
    const AdamWState moments_original = original.moments(), moments_resumed = resumed.moments();
    EXPECT_EQ(first_difference(table, moments_resumed.exp_avg, moments_original.exp_avg), "");
    EXPECT_EQ(first_difference(table, moments_resumed.exp_avg_sq, moments_original.exp_avg_sq), "");
    EXPECT_EQ(moments_resumed.step, 2);
  }
}

TEST_F(DataParallelOptimizerTest, ScaleGradientRoundsTheScaleAndEachProduct) {
  // FP32: the scale is an FP32 scalar and each product is rounded to FP32; FP64: plain products.
  auto fp32 = make_cpu_backend(BackendOptions{Precision::kFp32});
  auto fp64 = make_cpu_backend(BackendOptions{Precision::kFp64});
  const std::vector<double> g = {1.0, 3.0, static_cast<double>(0.1f), -7.0};
  const double scale32 = static_cast<double>(static_cast<float>(kGradScale));
  std::vector<double> in_fp32 = g, in_fp64 = g;
  scale_gradient(*fp32, kGradScale, in_fp32.data(), 4);
  scale_gradient(*fp64, kGradScale, in_fp64.data(), 4);
  int differ = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(in_fp32[i], static_cast<double>(static_cast<float>(g[i] * scale32))) << i;
    EXPECT_EQ(in_fp64[i], g[i] * kGradScale) << i;
    differ += in_fp32[i] != in_fp64[i] ? 1 : 0;
  }
  EXPECT_GT(differ, 0);  // the FP32 rounding is visible on these values
}

}  // namespace
}  // namespace touchstone
