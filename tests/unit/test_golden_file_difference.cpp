// The FP64 comparison `touchstone check parallel` makes between a layout's golden file and the
// single-rank one (diff::worst_step_difference, over GoldenReader::step_datasets): identical runs
// compare at 0 over every dataset of every step, a run with one rule changed is caught at the dataset
// it changes, and a file that records other steps or is no golden file fails with infinity.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "oracle/diff/metrics.h"
#include "test_diff_signature_fixture.h"

namespace touchstone::diff::testing {
namespace {

class GoldenFileDifference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = std::make_unique<SuiteDirectory>("touchstone_golden_file_difference");
    const fs::path documents = directory_->path() / "documents.jsonl";
    write_documents(documents);
    config_ = signature_config(documents.string());
    reference_ = std::make_unique<GoldenRun>(write_golden(directory_->path() / "reference.h5", config_));
  }
  static void TearDownTestSuite() {
    reference_.reset();
    directory_.reset();
  }
  static fs::path path(const std::string& name) { return directory_->path() / name; }

  static inline std::unique_ptr<SuiteDirectory> directory_;
  static inline std::unique_ptr<GoldenRun> reference_;
  static inline Config config_;
};

TEST_F(GoldenFileDifference, StepDatasetsListEveryRecordedDataset) {
  const GoldenReader golden(reference_->path);
  const std::vector<std::string> paths = golden.step_datasets(2);
  const ParamTable& table = *reference_->table;
  // loss, num_loss_tokens, token_losses, grad_norm, lr, then one gradient and one parameter per tensor
  EXPECT_EQ(paths.size(), 5u + 2u * static_cast<size_t>(table.size()));
  for (const char* name : {"loss", "num_loss_tokens", "token_losses", "grad_norm", "lr"}) {
    EXPECT_NE(std::find(paths.begin(), paths.end(), "steps/2/" + std::string(name)), paths.end()) << name;
  }
  for (const ParamSpec& spec : table.specs()) {
    EXPECT_NE(std::find(paths.begin(), paths.end(), "steps/2/grads/" + spec.name), paths.end()) << spec.name;
    EXPECT_NE(std::find(paths.begin(), paths.end(), "steps/2/params/" + spec.name), paths.end()) << spec.name;
  }
}

TEST_F(GoldenFileDifference, TheSameRunComparesAtZero) {
  const GoldenRun again = write_golden(path("again.h5"), config_);
  const FileDifference worst = worst_step_difference(again.path, reference_->path);
  EXPECT_EQ(worst.relative_l2, 0.0);
  EXPECT_FALSE(worst.path.empty());
}

TEST_F(GoldenFileDifference, AChangedRuleIsCaughtWhereItActs) {
  Config other = config_;
  other.optim.weight_decay = 0.0;  // the step-1 gradients stay equal; the updated parameters do not
  const GoldenRun changed = write_golden(path("no_decay.h5"), other);
  const FileDifference worst = worst_step_difference(changed.path, reference_->path);
  EXPECT_GT(worst.relative_l2, 1e-6);  // far above FP64 reassociation (~1e-14)
  EXPECT_TRUE(std::isfinite(worst.relative_l2));
  EXPECT_EQ(worst.path.rfind("steps/", 0), 0u) << worst.path;
}

TEST_F(GoldenFileDifference, OtherStepsOrNoGoldenFileFail) {
  Config one_step = config_;
  one_step.train.steps = 1;
  const GoldenRun shorter = write_golden(path("one_step.h5"), one_step);
  const FileDifference steps = worst_step_difference(shorter.path, reference_->path);
  EXPECT_TRUE(std::isinf(steps.relative_l2));
  EXPECT_NE(steps.path.find("records other steps"), std::string::npos) << steps.path;

  std::ofstream(path("not_hdf5.h5")) << "not an HDF5 file";
  const FileDifference unreadable = worst_step_difference(path("not_hdf5.h5").string(), reference_->path);
  EXPECT_TRUE(std::isinf(unreadable.relative_l2));
  EXPECT_NE(unreadable.path.find("not_hdf5.h5"), std::string::npos) << unreadable.path;
}

}  // namespace
}  // namespace touchstone::diff::testing
