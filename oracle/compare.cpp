// Golden-file comparison through the HDF5 reader.
#include "oracle/compare.h"

#include <cmath>

#include "common/errors.h"
#include "common/h5_file.h"

namespace touchstone {

namespace {

void collect_datasets(const h5::H5Reader& file, const std::string& group, std::vector<std::string>& out) {
  for (const std::string& child : file.children(group)) {
    const std::string path = group + "/" + child;
    if (file.is_group(path)) {
      collect_datasets(file, path, out);
    } else {
      out.push_back(path);
    }
  }
}

}  // namespace

GoldenComparison compare_golden_files(const std::string& candidate, const std::string& reference) {
  const h5::H5Reader ref(reference), cand(candidate);
  std::vector<std::string> datasets;
  collect_datasets(ref, "/steps", datasets);
  GoldenComparison result;
  for (const std::string& path : datasets) {
    if (!cand.exists(path)) throw InputError(candidate + ": missing dataset " + path);
    if (cand.shape(path) != ref.shape(path))
      throw InputError(candidate + ": dataset " + path + " has another shape");
    const std::vector<double> a = cand.read_f64(path), b = ref.read_f64(path);
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
      diff += (a[i] - b[i]) * (a[i] - b[i]);
      norm += b[i] * b[i];
    }
    TensorDifference d{path.substr(1), norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff)};
    if (result.tensors.empty() || d.relative_l2 > result.worst.relative_l2) result.worst = d;
    result.tensors.push_back(d);
  }
  return result;
}

}  // namespace touchstone
