// One flat buffer over every tensor a rank holds (in parameter-table order), so that data parallelism
// reduces all gradients with one collective per step, and the distributed optimizer can give each
// data-parallel rank one contiguous chunk. The length is padded to a multiple of the dp size.
#pragma once

#include <cstdint>
#include <vector>

#include "common/activation_arena.h"
#include "model/param_table.h"

namespace touchstone {

class FlatBuffer {
 public:
  struct Segment {
    int id;          // parameter id
    int64_t offset;  // first element in the flat buffer
    int64_t numel;
  };

  FlatBuffer(const ParamTensors& shapes, int dp_size);

  int64_t padded_size() const { return padded_size_; }
  int64_t chunk_size() const { return padded_size_ / dp_size_; }  // elements owned per dp rank
  const std::vector<Segment>& segments() const { return segments_; }

  ActivationBuffer flatten(const ParamTensors& tensors) const;
  void unflatten(const ActivationBuffer& flat, ParamTensors& tensors) const;

 private:
  std::vector<Segment> segments_;
  int64_t padded_size_ = 0;
  int dp_size_;
};

}  // namespace touchstone
