// Finite-difference check of the hand-written FP64 backward, every element of every parameter kind.
//
// Stencil: the fourth-order central difference
//   g_fd = [8 (f(x+h) - f(x-h)) - (f(x+2h) - f(x-2h))] / (12 h),
// whose truncation error is h^4 |f^(5)| / 30 and whose rounding error is about 18 u |f| / (12 h)
// (u = 2^-53, one rounding error of f per evaluation, 18 = sum of the stencil's |weights|).
// With |f| ~ 3 (the loss) and h = 3e-4 the rounding term is ~1.5e-12; the truncation term, measured
// (it dominates at h = 1e-3, where the worst error is 2e-10), is ~2e-12 at h = 3e-4. So the
// finite difference is good to ~3e-12 absolute, and a relative bound of 1e-7 is meaningful for
// elements with |g| >= 3e-5; smaller elements are held to that absolute budget instead:
//   |g_fd - g| <= 1e-7 * max(|g|, 3e-5).
// A wrong backward (a missing term, a transposed layout) gives relative errors of 1e-2 and more.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "kernels/backend.h"
#include "model/params.h"
#include "model/transformer.h"
#include "oracle/train_step.h"
#include "test_support.h"

namespace touchstone {
namespace {

constexpr double kStep = 3e-4;
constexpr double kRelativeBound = 1e-7;
constexpr double kGradientFloor = 3e-5;

// Two windows of T=8 with a document continued across the edge, two packed short documents, padding.
std::vector<data::Document> fd_documents() {
  return {{5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, {3, 4}, {15, 2, 9}, {7, 7, 8, 2, 3, 4, 5, 6, 11, 12, 13}};
}

void check_every_gradient(const Config& config, LossNormalization normalization) {
  auto backend = make_cpu_backend();
  const ParamTable table(config.model);
  const Transformer model = testing::whole_model(config, table, *backend);
  ParamTensors params = init_parameters(table, config.model, 7);
  const GlobalBatch batch = testing::batch_from_documents(config, fd_documents());
  const int64_t mbs = config.train.micro_batch_size;
  const ObjectiveResult analytic = evaluate_objective(model, table, params, batch, mbs, normalization, true);
  ASSERT_GT(analytic.num_loss_tokens, 0);

  auto objective_at = [&](int id, size_t i, double x) {
    params[id][i] = x;
    return evaluate_objective(model, table, params, batch, mbs, normalization, false).loss;
  };
  for (int id = 0; id < table.size(); ++id) {
    double worst = 0.0;
    for (size_t i = 0; i < params[id].size(); ++i) {
      const double x = params[id][i];
      const double near = objective_at(id, i, x + kStep) - objective_at(id, i, x - kStep);
      const double far = objective_at(id, i, x + 2 * kStep) - objective_at(id, i, x - 2 * kStep);
      params[id][i] = x;
      const double fd = (8.0 * near - far) / (12.0 * kStep);
      const double g = analytic.grads[id][i];
      const double error = std::abs(fd - g) / std::max(std::abs(g), kGradientFloor);
      worst = std::max(worst, error);
      ASSERT_LE(error, kRelativeBound) << table[id].name << "[" << i << "]: analytic " << g << ", fd " << fd;
    }
    EXPECT_GT(std::sqrt(std::inner_product(analytic.grads[id].begin(), analytic.grads[id].end(),
                                           analytic.grads[id].begin(), 0.0)),
              1e-4)
        << table[id].name << " has a vanishing gradient: the check would be vacuous";
    ::testing::Test::RecordProperty(table[id].name, std::to_string(worst));
  }
}

TEST(GradientCheck, UntiedGqaDocumentMasking) {
  check_every_gradient(testing::tiny_config(), LossNormalization::kGlobalTokenMean);
}

TEST(GradientCheck, TiedEmbeddings) {
  Config config = testing::tiny_config();
  config.model.tie_embeddings = true;
  check_every_gradient(config, LossNormalization::kGlobalTokenMean);
}

// The masks depend only on (seed, site, sample, coordinates), never on the parameters, so with both
// dropouts on the objective is a smooth function of the parameters and the same bounds apply.
TEST(GradientCheck, AttentionAndHiddenDropout) {
  Config config = testing::tiny_config();
  config.model.attention_dropout = 0.3;
  config.model.hidden_dropout = 0.2;
  check_every_gradient(config, LossNormalization::kGlobalTokenMean);
}

TEST(GradientCheck, MhaWithoutDocumentMaskingPerMicrobatchMean) {
  Config config = testing::tiny_config();
  config.model.num_kv_heads = 2;
  config.data.document_masking = false;
  check_every_gradient(config, LossNormalization::kPerMicrobatchMean);
}

}  // namespace
}  // namespace touchstone
