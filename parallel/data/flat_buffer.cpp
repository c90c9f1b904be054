// Flattening held tensors into one buffer and back.
#include "parallel/data/flat_buffer.h"

#include <algorithm>

namespace touchstone {

FlatBuffer::FlatBuffer(const ParamTensors& shapes, int dp_size) : dp_size_(dp_size) {
  int64_t offset = 0;
  for (size_t id = 0; id < shapes.tensors.size(); ++id) {
    const auto numel = static_cast<int64_t>(shapes.tensors[id].size());
    if (numel == 0) continue;
    segments_.push_back(Segment{static_cast<int>(id), offset, numel});
    offset += numel;
  }
  padded_size_ = (offset + dp_size - 1) / dp_size * dp_size;
}

ActivationBuffer FlatBuffer::flatten(const ParamTensors& tensors) const {
  ActivationBuffer flat(static_cast<size_t>(padded_size_));  // not zero-filled: the segments cover it
  int64_t end = 0;
  for (const Segment& s : segments_) {
    std::copy(tensors[s.id].begin(), tensors[s.id].end(), flat.begin() + s.offset);
    end = s.offset + s.numel;
  }
  std::fill(flat.begin() + end, flat.end(), 0.0);  // the padding up to a multiple of dp
  return flat;
}

void FlatBuffer::unflatten(const ActivationBuffer& flat, ParamTensors& tensors) const {
  for (const Segment& s : segments_) {
    std::copy_n(flat.begin() + s.offset, s.numel, tensors[s.id].begin());
  }
}

}  // namespace touchstone
