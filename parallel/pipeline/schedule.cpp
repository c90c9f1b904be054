// Builds the AFAB and 1F1B action lists and simulates them together (see schedule.h).
#include "parallel/pipeline/schedule.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace touchstone::pipeline {
namespace {

// Appends a forward or backward with the transfers around it, so that both schedules place them the
// same way and differ only in the order of computations.
class StageListBuilder {
 public:
  StageListBuilder(int num_stages, int stage) : num_stages_(num_stages), stage_(stage) {}

  void forward(int micro_batch) {
    if (!is_first()) actions_.push_back({ActionKind::kRecvActivation, micro_batch, stage_ - 1});
    actions_.push_back({ActionKind::kForward, micro_batch, -1});
    if (!is_last()) actions_.push_back({ActionKind::kSendActivation, micro_batch, stage_ + 1});
  }

  void backward(int micro_batch) {
    if (!is_last()) actions_.push_back({ActionKind::kRecvGradient, micro_batch, stage_ + 1});
    actions_.push_back({ActionKind::kBackward, micro_batch, -1});
    if (!is_first()) actions_.push_back({ActionKind::kSendGradient, micro_batch, stage_ - 1});
  }

  std::vector<Action> take() { return std::move(actions_); }

 private:
  bool is_first() const { return stage_ == 0; }
  bool is_last() const { return stage_ == num_stages_ - 1; }

  int num_stages_;
  int stage_;
  std::vector<Action> actions_;
};

bool is_send(ActionKind kind) {
  return kind == ActionKind::kSendActivation || kind == ActionKind::kSendGradient;
}

bool is_recv(ActionKind kind) {
  return kind == ActionKind::kRecvActivation || kind == ActionKind::kRecvGradient;
}

// What identifies a message: its tag (micro-batch and direction) and the pair of stages.
using MessageKey = std::tuple<bool /*gradient*/, int /*micro_batch*/, int /*from*/, int /*to*/>;

MessageKey message_key(const Action& action, int stage) {
  const bool gradient = action.kind == ActionKind::kSendGradient || action.kind == ActionKind::kRecvGradient;
  return is_send(action.kind) ? MessageKey{gradient, action.micro_batch, stage, action.peer_stage}
                              : MessageKey{gradient, action.micro_batch, action.peer_stage, stage};
}

}  // namespace

std::vector<Action> build_schedule(PipelineSchedule schedule, int num_stages, int stage,
                                   int num_micro_batches) {
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

  StageListBuilder list(num_stages, stage);
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

std::string format_actions(const std::vector<Action>& actions, bool include_communication) {
  std::string out;
  for (const Action& action : actions) {
    if (!include_communication && !is_computation(action.kind)) continue;
    if (!out.empty()) out += ' ';
    out += action_token(action.kind, action.micro_batch);
  }
  return out;
}

int peak_in_flight(const std::vector<Action>& actions) {
  int in_flight = 0;
  int peak = 0;
  for (const Action& action : actions) {
    if (action.kind == ActionKind::kForward) peak = std::max(peak, ++in_flight);
    if (action.kind == ActionKind::kBackward) --in_flight;
  }
  return peak;
}

SimulationResult simulate_schedules(const std::vector<std::vector<Action>>& per_stage,
                                    const UnitCosts& costs) {
  const std::size_t num_stages = per_stage.size();
  for (std::size_t stage = 0; stage < num_stages; ++stage) {
    for (const Action& action : per_stage[stage]) {
      if (!is_computation(action.kind) &&
          (action.peer_stage < 0 || static_cast<std::size_t>(action.peer_stage) >= num_stages)) {
        throw std::invalid_argument("pipeline simulation: stage " + std::to_string(stage) + " action " +
                                    action_token(action.kind, action.micro_batch) + " has peer stage " +
                                    std::to_string(action.peer_stage) + ", outside [0, " +
                                    std::to_string(num_stages) + ")");
      }
    }
  }

  SimulationResult result;
  result.next_action.assign(num_stages, 0);
  result.timeline.resize(num_stages);
  std::vector<double> clock(num_stages, 0.0);
  std::map<MessageKey, double> in_transit;  // message -> time it was sent
  std::set<MessageKey> ever_sent;

  // Round-robin until nothing moves; the order does not change the outcome (see schedule.h).
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t s = 0; s < num_stages; ++s) {
      const int stage = static_cast<int>(s);
      const std::vector<Action>& actions = per_stage[s];
      std::size_t& next = result.next_action[s];
      for (; next < actions.size(); ++next) {
        const Action& action = actions[next];
        const double start = clock[s];
        double end = start;
        if (action.kind == ActionKind::kForward) {
          end = start + costs.forward;
        } else if (action.kind == ActionKind::kBackward) {
          end = start + costs.backward;
        } else if (is_send(action.kind)) {
          const MessageKey key = message_key(action, stage);
          if (!ever_sent.insert(key).second) {
            throw std::invalid_argument("pipeline simulation: stage " + std::to_string(stage) + " sends " +
                                        action_token(action.kind, action.micro_batch) + " to stage " +
                                        std::to_string(action.peer_stage) + " twice");
          }
          in_transit[key] = start;
        } else if (is_recv(action.kind)) {
          const auto message = in_transit.find(message_key(action, stage));
          if (message == in_transit.end()) break;  // blocked until the peer sends
          end = std::max(start, message->second);
          in_transit.erase(message);
        }
        clock[s] = end;
        result.timeline[s].push_back({stage, action.kind, action.micro_batch, start, end});
        progress = true;
      }
    }
  }

  result.completed = true;
  for (std::size_t s = 0; s < num_stages; ++s) {
    if (result.next_action[s] != per_stage[s].size()) result.completed = false;
  }
  result.unreceived_sends = in_transit.size();
  return result;
}

std::vector<std::vector<TimelineEvent>> simulate_timeline(PipelineSchedule schedule, int num_stages,
                                                          int num_micro_batches) {
  SimulationResult result = simulate_schedules(build_all_schedules(schedule, num_stages, num_micro_batches));
  if (!result.completed || result.unreceived_sends != 0) {
    throw std::logic_error("pipeline schedule '" + option_name(schedule) +
                           "' deadlocks or leaves messages unreceived for " + std::to_string(num_stages) +
                           " stages and " + std::to_string(num_micro_batches) + " micro-batches");
  }
  return std::move(result.timeline);
}

}  // namespace touchstone::pipeline
