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

// The directory of this file's golden runs (removed at exit), and the reference run written once.
const fs::path& directory() {
  static const SuiteDirectory suite("touchstone_golden_file_difference");
  return suite.path();
}
fs::path path(const std::string& name) { return directory() / name; }
Config reference_config() {
  static const fs::path documents = [] {
    write_documents(directory() / "documents.jsonl");
    return directory() / "documents.jsonl";
  }();
  return signature_config(documents.string());
}
const GoldenRun& reference() {
  static const GoldenRun run = write_golden(path("reference.h5"), reference_config());
  return run;
}

TEST(GoldenFileDifference, StepDatasetsListEveryRecordedDataset) {
  const GoldenReader golden(reference().path);
  const std::vector<std::string> paths = golden.step_datasets(2);
  const ParamTable& table = *reference().table;
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

TEST(GoldenFileDifference, TheSameRunComparesAtZero) {
  const GoldenRun again = write_golden(path("again.h5"), reference_config());
  const FileDifference worst = worst_step_difference(again.path, reference().path);
  EXPECT_EQ(worst.relative_l2, 0.0);
  EXPECT_FALSE(worst.path.empty());
}

TEST(GoldenFileDifference, AChangedRuleIsCaughtWhereItActs) {
  Config other = reference_config();
  other.optim.weight_decay = 0.0;  // the step-1 gradients stay equal; the updated parameters do not
  const GoldenRun changed = write_golden(path("no_decay.h5"), other);
  const FileDifference worst = worst_step_difference(changed.path, reference().path);
  EXPECT_GT(worst.relative_l2, 1e-6);  // far above FP64 reassociation (~1e-14)
  EXPECT_TRUE(std::isfinite(worst.relative_l2));
  EXPECT_EQ(worst.path.rfind("steps/", 0), 0u) << worst.path;
}

TEST(GoldenFileDifference, OtherStepsOrNoGoldenFileFail) {
  Config one_step = reference_config();
  one_step.train.steps = 1;
  const GoldenRun shorter = write_golden(path("one_step.h5"), one_step);
  const FileDifference steps = worst_step_difference(shorter.path, reference().path);
  EXPECT_TRUE(std::isinf(steps.relative_l2));
  EXPECT_NE(steps.path.find("records other steps"), std::string::npos) << steps.path;

  std::ofstream(path("not_hdf5.h5")) << "not an HDF5 file";
  const FileDifference unreadable = worst_step_difference(path("not_hdf5.h5").string(), reference().path);
  EXPECT_TRUE(std::isinf(unreadable.relative_l2));
  EXPECT_NE(unreadable.path.find("not_hdf5.h5"), std::string::npos) << unreadable.path;
}

}  // namespace
}  // namespace touchstone::diff::testing
