// Every point-to-point message tag in one place. A tag tells apart the transfers that can be in flight
// at once between the same two ranks of one group (MPI matches a receive by group, peer and tag).
//
// clang-format off
//   group  tag                      transfer                                  sent in
//   pp     2 (j v + c)              activation of micro-batch j into model    parallel/pipeline/executor.cpp
//                                   chunk c of the receiving stage
//   pp     2 (j v + c) + 1          a gradient into chunk c of the receiving  parallel/pipeline/executor.cpp
//                                   stage (v: virtual stages; 1 without)
//   cp     0                        K and V of one ring step (forward, and     parallel/context/context_attention.cpp
//                                   again in the backward)
//   cp     1                        dK and dV of one ring step's block         parallel/context/context_attention.cpp
//   world  parameter id (< 2^20)    a parameter's shard to world rank 0       oracle/gather.cpp
//   world  2^20                     token losses to world rank 0              oracle/train_step.cpp
//   world  2^20 + 1, 2^20 + 2       a stage's timeline: length, events        oracle/run.cpp
//   world  2^20 + 3                 consumed sample indices to rank 0         oracle/checkpointing.cpp
// clang-format on
#pragma once

#include <cstdint>
#include <limits>

namespace touchstone::message_tags {

// `chunk` is the receiving stage's model chunk, which both ends know (pipeline::Action's chunk on the
// receiving side, peer_chunk on the sending side): with virtual stages the last stage sends chunk c's
// output to the first stage's chunk c + 1 while the same pair of ranks also exchanges other chunks'.
// A tag beyond int (over 2^30 micro-batch chunks) becomes -1, which every send and receive refuses
// with the group's valid tag range, instead of wrapping onto another transfer's tag.
constexpr int pipeline_tag(int64_t micro_batch, int chunk, int virtual_stages, int direction) {
  const int64_t tag = 2 * (micro_batch * virtual_stages + chunk) + direction;
  return tag <= std::numeric_limits<int>::max() ? static_cast<int>(tag) : -1;
}
constexpr int pipeline_activation(int64_t micro_batch, int chunk, int virtual_stages) {
  return pipeline_tag(micro_batch, chunk, virtual_stages, 0);
}
constexpr int pipeline_gradient(int64_t micro_batch, int chunk, int virtual_stages) {
  return pipeline_tag(micro_batch, chunk, virtual_stages, 1);
}

// Ring attention (context parallelism): each step passes one block to the next cp rank; with equal tags
// the blocks of successive steps arrive in send order.
constexpr int kContextKeysValues = 0;
constexpr int kContextKeyValueGradients = 1;

// The world group's gathers to rank 0. Parameter tags are the parameter table's indices, so the fixed
// tags start above any table size.
constexpr int kFirstFixed = 1 << 20;
constexpr int parameter(int param_id) { return param_id; }
constexpr int kTokenLosses = kFirstFixed;
constexpr int kTimelineLength = kFirstFixed + 1;
constexpr int kTimelineEvents = kFirstFixed + 2;
constexpr int kConsumedSamples = kFirstFixed + 3;

}  // namespace touchstone::message_tags
