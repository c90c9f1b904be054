// Builds each stage's action list for the AFAB, 1F1B, interleaved 1F1B and ZB-H1 schedules (see
// schedule.h); schedule_simulation.cpp runs the lists together.
#include "parallel/pipeline/schedule.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace touchstone::pipeline {
namespace {

void check_layout(int num_stages, int stage, int num_micro_batches) {
  if (num_stages < 1) {
    throw std::invalid_argument("pipeline schedule: num_stages must be >= 1, got " +
                                std::to_string(num_stages));
  }
  if (stage < 0 || stage >= num_stages) {
    throw std::invalid_argument("pipeline schedule: stage " + std::to_string(stage) + " is outside [0, " +
                                std::to_string(num_stages) + ")");
  }
  if (num_micro_batches < 1) {
    throw std::invalid_argument("pipeline schedule: num_micro_batches must be >= 1, got " +
                                std::to_string(num_micro_batches));
  }
}

// Appends a computation with the transfers around it, so that every schedule places them the same way
// and schedules differ only in the order of computations. Model chunk c of stage s is virtual stage
// vs = c * p + s of a pipeline of v * p virtual stages (schedule.h); its neighbours vs - 1 and vs + 1
// are on stages (vs -+ 1) mod p, as chunks (vs -+ 1) / p.
class StageListBuilder {
 public:
  StageListBuilder(int num_stages, int virtual_stages, int stage)
      : num_stages_(num_stages), num_virtual_(num_stages * virtual_stages), stage_(stage) {}

  void forward(int micro_batch, int chunk = 0) {
    const int vs = virtual_stage(chunk);
    if (vs > 0) transfer(ActionKind::kRecvActivation, micro_batch, chunk, vs - 1);
    actions_.push_back({ActionKind::kForward, micro_batch, -1, chunk});
    if (vs < num_virtual_ - 1) transfer(ActionKind::kSendActivation, micro_batch, chunk, vs + 1);
  }

  // kBackward, or kBackwardInput for the first half of a split backward: both move the gradient of
  // the input to the previous virtual stage.
  void backward(int micro_batch, int chunk = 0, ActionKind kind = ActionKind::kBackward) {
    const int vs = virtual_stage(chunk);
    if (vs < num_virtual_ - 1) transfer(ActionKind::kRecvGradient, micro_batch, chunk, vs + 1);
    actions_.push_back({kind, micro_batch, -1, chunk});
    if (vs > 0) transfer(ActionKind::kSendGradient, micro_batch, chunk, vs - 1);
  }

  // The second half of a split backward: weight gradients stay on this stage, no transfer.
  void backward_weight(int micro_batch, int chunk = 0) {
    actions_.push_back({ActionKind::kBackwardWeight, micro_batch, -1, chunk});
  }

  std::vector<Action> take() { return std::move(actions_); }

 private:
  int virtual_stage(int chunk) const { return chunk * num_stages_ + stage_; }

  void transfer(ActionKind kind, int micro_batch, int chunk, int peer_virtual_stage) {
    actions_.push_back(
        {kind, micro_batch, peer_virtual_stage % num_stages_, chunk, peer_virtual_stage / num_stages_});
  }

  int num_stages_;
  int num_virtual_;
  int stage_;
  std::vector<Action> actions_;
};

}  // namespace

std::vector<Action> build_schedule(PipelineSchedule schedule, int num_stages, int stage,
                                   int num_micro_batches) {
  if (schedule == PipelineSchedule::kZeroBubbleH1) {
    return build_zero_bubble_h1_schedule(num_stages, stage, num_micro_batches);
  }
  check_layout(num_stages, stage, num_micro_batches);
  StageListBuilder list(num_stages, 1, stage);
  const int m = num_micro_batches;
  if (schedule == PipelineSchedule::kAllForwardAllBackward) {
    for (int j = 0; j < m; ++j) list.forward(j);
    for (int j = 0; j < m; ++j) list.backward(j);
  } else {
    // A stage can run as many forwards ahead as there are stages after it before the first gradient
    // can come back; the last stage has none and alternates from the start.
    const int warmup = std::min(num_stages - stage - 1, m);
    for (int j = 0; j < warmup; ++j) list.forward(j);
    for (int i = 0; i < m - warmup; ++i) {
      list.forward(warmup + i);
      list.backward(i);
    }
    for (int j = m - warmup; j < m; ++j) list.backward(j);
  }
  return list.take();
}

std::vector<std::vector<Action>> build_all_schedules(PipelineSchedule schedule, int num_stages,
                                                     int num_micro_batches) {
  if (num_stages < 1) {
    throw std::invalid_argument("pipeline schedule: num_stages must be >= 1, got " +
                                std::to_string(num_stages));
  }
  std::vector<std::vector<Action>> lists;
  for (int stage = 0; stage < num_stages; ++stage) {
    lists.push_back(build_schedule(schedule, num_stages, stage, num_micro_batches));
  }
  return lists;
}

std::vector<Action> build_interleaved_schedule(int num_stages, int virtual_stages, int stage,
                                               int num_micro_batches, int micro_batch_group_size) {
  check_layout(num_stages, stage, num_micro_batches);
  if (virtual_stages < 1) {
    throw std::invalid_argument("pipeline schedule: virtual_stages must be >= 1, got " +
                                std::to_string(virtual_stages));
  }
  if (virtual_stages == 1)
    return build_schedule(PipelineSchedule::kOneForwardOneBackward, num_stages, stage, num_micro_batches);
  const int p = num_stages;
  const int v = virtual_stages;
  const int m = num_micro_batches;
  const int g = micro_batch_group_size == 0 ? p : micro_batch_group_size;
  if (g < p || g > m) {
    throw std::invalid_argument("pipeline schedule: with virtual stages the micro-batch group size (" +
                                std::to_string(g) + ") must lie in [stages = " + std::to_string(p) +
                                ", micro-batches = " + std::to_string(m) + "]");
  }
  if (m % g != 0 && m % g < p) {
    throw std::invalid_argument("pipeline schedule: with virtual stages the last group of micro-batches (" +
                                std::to_string(m) + " mod " + std::to_string(g) + " = " +
                                std::to_string(m % g) +
                                ") must be empty or hold at least stages = " + std::to_string(p));
  }

  // Forward number k runs table[k]; backward number k runs the same micro-batch on chunk v - 1 - c.
  std::vector<std::pair<int, int>> table;  // (micro-batch, chunk), v * m entries
  for (int first = 0; first < m; first += g) {
    const int end = first + g >= m ? m : first + g;  // the last group takes what is left
    for (int chunk = 0; chunk < v; ++chunk) {
      for (int j = first; j < end; ++j) table.emplace_back(j, chunk);
    }
  }
  const int total = v * m;
  const int warmup = std::min((p - stage - 1) * 2 + (v - 1) * g, total);
  StageListBuilder list(p, v, stage);
  const auto forward = [&](int k) { list.forward(table[k].first, table[k].second); };
  const auto backward = [&](int k) { list.backward(table[k].first, v - 1 - table[k].second); };
  for (int k = 0; k < warmup; ++k) forward(k);
  for (int k = 0; k < total - warmup; ++k) {
    forward(k + warmup);
    backward(k);
  }
  for (int k = total - warmup; k < total; ++k) backward(k);
  return list.take();
}

std::vector<Action> build_zero_bubble_h1_schedule(int num_stages, int stage, int num_micro_batches) {
  check_layout(num_stages, stage, num_micro_batches);
  const int m = num_micro_batches;
  const int warmup = std::min(num_stages - stage - 1, m);
  StageListBuilder list(num_stages, 1, stage);
  int next_weight = 0;  // the oldest micro-batch whose I has run and whose W has not
  const auto input_then_weights = [&](int j) {
    list.backward(j, 0, ActionKind::kBackwardInput);
    for (; j + 1 - next_weight > stage; ++next_weight) list.backward_weight(next_weight);
  };
  for (int j = 0; j < warmup; ++j) list.forward(j);
  for (int i = 0; i < m - warmup; ++i) {
    list.forward(warmup + i);
    input_then_weights(i);
  }
  for (int j = m - warmup; j < m; ++j) input_then_weights(j);
  for (; next_weight < m; ++next_weight) list.backward_weight(next_weight);
  return list.take();
}

std::string format_actions(const std::vector<Action>& actions, bool include_communication) {
  std::string out;
  for (const Action& action : actions) {
    if (!include_communication && !is_computation(action.kind)) continue;
    if (!out.empty()) out += ' ';
    out += action_token(action.kind, action.micro_batch, action.chunk);
  }
  return out;
}

int peak_in_flight(const std::vector<Action>& actions) {
  int in_flight = 0;
  int peak = 0;
  for (const Action& action : actions) {
    if (action.kind == ActionKind::kForward) peak = std::max(peak, ++in_flight);
    if (action.kind == ActionKind::kBackward || action.kind == ActionKind::kBackwardWeight) --in_flight;
  }
  return peak;
}

}  // namespace touchstone::pipeline
