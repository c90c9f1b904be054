// Parameter initialisation and loading, both driven by the parameter table.
#include "model/params.h"

#include <cmath>

#include "common/errors.h"
#include "common/h5_file.h"
#include "common/rng.h"

namespace touchstone {

ParamTensors init_parameters(const ParamTable& table, const ModelConfig& model, uint64_t seed) {
  ParamTensors params = ParamTensors::zeros_like(table);
  const double residual_scale = 1.0 / std::sqrt(2.0 * static_cast<double>(model.num_layers));
  for (int id = 0; id < table.size(); ++id) {
    const ParamSpec& spec = table[id];
    std::vector<double>& values = params[id];
    if (spec.init == InitRule::kOnes) {
      std::fill(values.begin(), values.end(), 1.0);
      continue;
    }
    const double std = model.init_std * (spec.init == InitRule::kScaledNormal ? residual_scale : 1.0);
    const PhiloxKey key = stream_key(seed, spec.name);
    for (size_t i = 0; i < values.size(); ++i) values[i] = std * normal_at(key, i);
  }
  return params;
}

namespace {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? "," : "") + std::to_string(shape[i]);
  return text + "]";
}

}  // namespace

ParamTensors load_parameters(const ParamTable& table, const std::string& path, const std::string& group) {
  h5::H5Reader reader(path);
  if (!reader.exists(group)) throw InputError(path + ": no group " + group + " to load parameters from");
  for (const std::string& name : reader.children(group)) {
    if (table.find(name) < 0) {
      throw InputError(path + ": tensor " + group + "/" + name + " is not a parameter of this model");
    }
  }
  ParamTensors params;
  for (const ParamSpec& spec : table.specs()) {
    const std::string object = group + "/" + spec.name;
    if (!reader.exists(object)) throw InputError(path + ": missing tensor " + object);
    if (reader.shape(object) != spec.shape) {
      throw InputError(path + ": tensor " + object + " has shape " + shape_string(reader.shape(object)) +
                       ", the model expects " + shape_string(spec.shape));
    }
    std::vector<double> values = reader.read_f64(object);
    for (double value : values) {
      if (!std::isfinite(value)) throw InputError(path + ": tensor " + object + " holds a non-finite value");
    }
    params.tensors.push_back(std::move(values));
  }
  return params;
}

}  // namespace touchstone
