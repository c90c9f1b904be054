// The in-memory form every candidate format is converted to: datasets of the golden schema, by path.
//
// Paths are golden-file dataset paths without the leading slash ("steps/1/grads/output_layer.weight",
// "params/init/<name>", "steps/1/loss"), tensors are full (unsharded) in the contract's layouts with
// global layer numbers, and values are held as doubles next to the dtype they were stored in, so that
// ULP distances can be measured on the stored type.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace touchstone {

struct Recorded {
  std::vector<int64_t> shape;  // empty for a scalar
  std::vector<double> values;  // row-major, exactly the stored values
  std::string dtype;           // "float64", "float32", "bfloat16", "float16", "int64", "int32", ...

  int64_t numel() const { return static_cast<int64_t>(values.size()); }
};

using TensorMap = std::map<std::string, Recorded>;

// "[256, 32]" for messages; "scalar" for an empty shape.
std::string shape_text(const std::vector<int64_t>& shape);

// The product of the extents (1 for a scalar); throws InputError naming `what` when an extent is
// negative or the product does not fit in int64.
int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& what);

}  // namespace touchstone
