// Comparing two golden files tensor by tensor: relative L2 error of every recorded step dataset
// (loss, loss-token count, grad norm, lr, token losses, every gradient and every updated parameter).
#pragma once

#include <string>
#include <vector>

namespace touchstone {

struct TensorDifference {
  std::string name;           // dataset path, e.g. "steps/2/grads/output_layer.weight"
  double relative_l2 = 0.0;   // ||a - b|| / ||b||; ||a - b|| when b is all zeros
};

struct GoldenComparison {
  std::vector<TensorDifference> tensors;  // in file order
  TensorDifference worst;                 // the largest relative_l2
};

// Compares every dataset under /steps of `reference` with the same dataset of `candidate`. Throws
// InputError naming the file and dataset when one is missing or has another shape.
GoldenComparison compare_golden_files(const std::string& candidate, const std::string& reference);

}  // namespace touchstone
