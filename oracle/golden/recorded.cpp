// Shape utilities shared by the candidate readers.
#include "oracle/golden/recorded.h"

#include <limits>

#include "common/errors.h"

namespace touchstone {

std::string shape_text(const std::vector<int64_t>& shape) {
  if (shape.empty()) return "scalar";
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& what) {
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) throw InputError(what + ": negative extent in shape " + shape_text(shape));
    if (d > 0 && numel > std::numeric_limits<int64_t>::max() / d) {
      throw InputError(what + ": shape " + shape_text(shape) + " is too large");
    }
    numel *= d;
  }
  return numel;
}

}  // namespace touchstone
