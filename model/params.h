// Initial parameters: drawn from the counter-based RNG, or loaded from an HDF5 file (--init-from).
#pragma once

#include <cstdint>
#include <string>

#include "model/param_table.h"

namespace touchstone {

// Element i of parameter `name` is normal_at(stream_key(seed, name), i) * std for the kNormal and
// kScaledNormal rules, and 1 for norm weights (InitRule in model/param_table.h).
ParamTensors init_parameters(const ParamTable& table, const ModelConfig& model, uint64_t seed);

// Reads every tensor of the table from `group` of an HDF5 file (a golden file's "/params/init", or
// "/steps/<s>/params"). Throws InputError naming the file and tensor for a missing tensor, a shape
// mismatch, a non-finite value, or a tensor in the file that the model does not have.
ParamTensors load_parameters(const ParamTable& table, const std::string& path, const std::string& group);

}  // namespace touchstone
