// Runs every stage's action list together under the execution model of schedule.h: non-blocking
// sends, blocking receives matched by tag, so that deadlocks and idle time show without a model.
#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "parallel/pipeline/schedule.h"

namespace touchstone::pipeline {
namespace {

bool is_send(ActionKind kind) {
  return kind == ActionKind::kSendActivation || kind == ActionKind::kSendGradient;
}

bool is_recv(ActionKind kind) {
  return kind == ActionKind::kRecvActivation || kind == ActionKind::kRecvGradient;
}

// What identifies a message: its tag (micro-batch and direction) and the (stage, chunk) pairs at
// both ends.
using MessageKey = std::tuple<bool /*gradient*/, int /*micro_batch*/, int /*from stage*/, int /*from chunk*/,
                              int /*to stage*/, int /*to chunk*/>;

MessageKey message_key(const Action& action, int stage) {
  const bool gradient = action.kind == ActionKind::kSendGradient || action.kind == ActionKind::kRecvGradient;
  return is_send(action.kind) ? MessageKey{gradient,     action.micro_batch, stage,
                                           action.chunk, action.peer_stage,  action.peer_chunk}
                              : MessageKey{gradient, action.micro_batch, action.peer_stage, action.peer_chunk,
                                           stage,    action.chunk};
}

}  // namespace

SimulationResult simulate_schedules(const std::vector<std::vector<Action>>& per_stage,
                                    const UnitCosts& costs) {
  const std::size_t num_stages = per_stage.size();
  for (std::size_t stage = 0; stage < num_stages; ++stage) {
    for (const Action& action : per_stage[stage]) {
      if (action.chunk < 0 || action.peer_chunk < 0) {
        throw std::invalid_argument("pipeline simulation: stage " + std::to_string(stage) + " action " +
                                    action_token(action.kind, action.micro_batch) + " has chunk " +
                                    std::to_string(action.chunk) + " and peer chunk " +
                                    std::to_string(action.peer_chunk) + "; chunks are >= 0");
      }
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
        } else if (action.kind == ActionKind::kBackwardInput) {
          end = start + costs.backward_input;
        } else if (action.kind == ActionKind::kBackwardWeight) {
          end = start + costs.backward_weight;
        } else if (is_send(action.kind)) {
          const MessageKey key = message_key(action, stage);
          if (!ever_sent.insert(key).second) {
            throw std::invalid_argument("pipeline simulation: stage " + std::to_string(stage) + " sends " +
                                        action_token(action.kind, action.micro_batch, action.chunk) +
                                        " to stage " + std::to_string(action.peer_stage) + " twice");
          }
          in_transit[key] = start;
        } else if (is_recv(action.kind)) {
          const auto message = in_transit.find(message_key(action, stage));
          if (message == in_transit.end()) break;  // blocked until the peer sends
          end = std::max(start, message->second);
          in_transit.erase(message);
        }
        clock[s] = end;
        result.timeline[s].push_back({stage, action.kind, action.micro_batch, start, end, action.chunk});
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
