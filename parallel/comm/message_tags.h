// Every point-to-point message tag in one place. A tag tells apart the transfers that can be in flight
// at once between the same two ranks of one group (MPI matches a receive by group, peer and tag).
//
// clang-format off
//   group  tag                      transfer                                  sent in
//   pp     2 j                      activation of micro-batch j, s -> s + 1   parallel/pipeline/executor.cpp
//   pp     2 j + 1                  its gradient, stage s + 1 -> s            parallel/pipeline/executor.cpp
//   world  parameter id (< 2^20)    a parameter's shard to world rank 0       oracle/gather.cpp
//   world  2^20                     token losses to world rank 0              oracle/train_step.cpp
//   world  2^20 + 1, 2^20 + 2       a stage's timeline: length, events        oracle/run.cpp
//   world  2^20 + 3                 consumed sample indices to rank 0         oracle/checkpointing.cpp
// clang-format on
#pragma once

#include <cstdint>

namespace touchstone::message_tags {

constexpr int pipeline_activation(int64_t micro_batch) { return static_cast<int>(2 * micro_batch); }
constexpr int pipeline_gradient(int64_t micro_batch) { return static_cast<int>(2 * micro_batch + 1); }

// The world group's gathers to rank 0. Parameter tags are the parameter table's indices, so the fixed
// tags start above any table size.
constexpr int kFirstFixed = 1 << 20;
constexpr int parameter(int param_id) { return param_id; }
constexpr int kTokenLosses = kFirstFixed;
constexpr int kTimelineLength = kFirstFixed + 1;
constexpr int kTimelineEvents = kFirstFixed + 2;
constexpr int kConsumedSamples = kFirstFixed + 3;

}  // namespace touchstone::message_tags
