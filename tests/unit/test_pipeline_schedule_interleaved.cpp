// Tests of the interleaved 1F1B and ZB-H1 schedules (schedule.h): hand-written lists, Megatron-LM's
// warm-up counts and constraints, and properties of every layout up to 8 stages, 4 model chunks and
// 32 micro-batches under the simulator: each piece of work runs once, the virtual stages run in
// pipeline order, nothing deadlocks, the bubble and the activation memory follow the formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/comm/message_tags.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/timeline.h"

namespace touchstone::pipeline {
namespace {

using Lists = std::vector<std::vector<Action>>;

Lists interleaved_lists(int p, int v, int m, int group = 0) {
  Lists lists;
  for (int s = 0; s < p; ++s) lists.push_back(build_interleaved_schedule(p, v, s, m, group));
  return lists;
}

Lists zero_bubble_lists(int p, int m) {
  Lists lists;
  for (int s = 0; s < p; ++s) lists.push_back(build_zero_bubble_h1_schedule(p, s, m));
  return lists;
}

double makespan(const SimulationResult& result) {
  double end = 0.0;
  for (const auto& row : result.timeline) {
    for (const TimelineEvent& event : row) end = std::max(end, event.end_seconds);
  }
  return end;
}

// Forwards of `list` before its first backward (or input-gradient half): the w warm-up forwards and,
// unless the warm-up took them all, the steady state's first.
int forwards_before_backward(const std::vector<Action>& list) {
  int forwards = 0;
  for (const Action& action : list) {
    if (action.kind == ActionKind::kBackward || action.kind == ActionKind::kBackwardInput) break;
    if (action.kind == ActionKind::kForward) ++forwards;
  }
  return forwards;
}

// Everything a correct schedule of p stages, v chunks and m micro-batches must satisfy, checked on
// the lists and on their simulation with `costs`. `split` says whether the backward runs as I + W.
void expect_valid_schedule(const Lists& lists, int v, int m, bool split, const UnitCosts& costs,
                           const std::string& layout) {
  SCOPED_TRACE(layout);
  const int p = static_cast<int>(lists.size());
  const ActionKind backward = split ? ActionKind::kBackwardInput : ActionKind::kBackward;
  for (int s = 0; s < p; ++s) {
    // Position in the list of each (kind, chunk, micro-batch); a second one is a bug.
    std::map<std::tuple<ActionKind, int, int>, std::size_t> position;
    std::map<std::pair<ActionKind, int>, int> last_micro_batch;  // per (kind, chunk), for the order
    for (std::size_t i = 0; i < lists[s].size(); ++i) {
      const Action& a = lists[s][i];
      if (!is_computation(a.kind)) continue;
      ASSERT_GE(a.chunk, 0);
      ASSERT_LT(a.chunk, v);
      ASSERT_TRUE(position.emplace(std::tuple{a.kind, a.chunk, a.micro_batch}, i).second)
          << "stage " << s << " runs " << action_token(a.kind, a.micro_batch, a.chunk) << " twice";
      // Gradients are accumulated in the same micro-batch order on every chunk and in every schedule.
      auto last = last_micro_batch.emplace(std::pair{a.kind, a.chunk}, -1).first;
      EXPECT_EQ(a.micro_batch, last->second + 1)
          << "stage " << s << " runs " << action_token(a.kind, a.micro_batch, a.chunk) << " out of order";
      last->second = a.micro_batch;
    }
    EXPECT_EQ(position.size(), static_cast<std::size_t>((split ? 3 : 2) * v * m)) << "stage " << s;
    for (int c = 0; c < v; ++c) {
      for (int j = 0; j < m; ++j) {
        const auto at = [&](ActionKind kind) { return position[std::tuple{kind, c, j}]; };
        EXPECT_LT(at(ActionKind::kForward), at(backward)) << "stage " << s << " chunk " << c << " mb " << j;
        if (split) {
          EXPECT_LT(at(backward), at(ActionKind::kBackwardWeight))
              << "stage " << s << " chunk " << c << " mb " << j;
        }
      }
    }
  }

  const SimulationResult result = simulate_schedules(lists, costs);
  ASSERT_TRUE(result.completed);
  EXPECT_EQ(result.unreceived_sends, 0u);
  const std::vector<std::string> orders = render_order(flatten_timeline(result.timeline), p, true);
  for (int s = 0; s < p; ++s) EXPECT_EQ(orders[s], format_actions(lists[s], true)) << "stage " << s;

  // In simulated time, micro-batch j's forward passes the virtual stages 0, 1, ..., v p - 1 in turn
  // and its gradient comes back through them in reverse: chunk c of stage s is virtual stage c p + s.
  std::map<std::tuple<ActionKind, int, int>, TimelineEvent> event;  // (kind, virtual stage, micro-batch)
  for (const auto& row : result.timeline) {
    for (const TimelineEvent& e : row) event[{e.kind, e.chunk * p + e.stage, e.micro_batch}] = e;
  }
  for (int j = 0; j < m; ++j) {
    for (int vs = 0; vs + 1 < v * p; ++vs) {
      const auto of = [&](ActionKind kind, int virtual_stage) {
        return event[std::tuple{kind, virtual_stage, j}];
      };
      EXPECT_LE(of(ActionKind::kForward, vs).end_seconds, of(ActionKind::kForward, vs + 1).start_seconds)
          << "mb " << j << " virtual stage " << vs;
      EXPECT_LE(of(backward, vs + 1).end_seconds, of(backward, vs).start_seconds)
          << "mb " << j << " virtual stage " << vs;
    }
  }
}

// ---- Interleaved 1F1B ----

TEST(InterleavedSchedule, TwoStagesTwoChunksFourMicroBatches) {
  // Megatron-LM's table for g = p = 2: (mb, chunk) = (0,0) (1,0) (0,1) (1,1) (2,0) (3,0) (2,1) (3,1);
  // stage 0 warms up with (2 - 0 - 1) * 2 + (2 - 1) * 2 = 4 forwards, stage 1 with 2.
  const Lists lists = interleaved_lists(2, 2, 4);
  EXPECT_EQ(format_actions(lists[0]), "F0 F1 F0:1 F1:1 F2 B0:1 F3 B1:1 F2:1 B0 F3:1 B1 B2:1 B3:1 B2 B3");
  EXPECT_EQ(format_actions(lists[1]), "F0 F1 F0:1 B0:1 F1:1 B1:1 F2 B0 F3 B1 F2:1 B2:1 F3:1 B3:1 B2 B3");
  // Stage 1's chunk 0 is virtual stage 1: it sends to stage 0's chunk 1, virtual stage 2, and stage
  // 0's chunk 1 gets its gradient back from stage 1's chunk 1, the last virtual stage.
  const std::vector<Action>& last = lists[1];
  const auto forward0 = std::find(last.begin(), last.end(), Action{ActionKind::kForward, 0, -1, 0, 0});
  ASSERT_NE(forward0 + 1, last.end());
  EXPECT_EQ(*(forward0 + 1), (Action{ActionKind::kSendActivation, 0, 0, 0, 1}));
  const std::vector<Action>& first = lists[0];
  const auto backward0 = std::find(first.begin(), first.end(), Action{ActionKind::kBackward, 0, -1, 1, 0});
  ASSERT_NE(backward0, first.begin());
  EXPECT_EQ(*(backward0 - 1), (Action{ActionKind::kRecvGradient, 0, 1, 1, 1}));
  // Virtual stage 0 (stage 0, chunk 0) receives nothing before its forwards and sends no gradient.
  EXPECT_EQ(first.front(), (Action{ActionKind::kForward, 0, -1, 0, 0}));
  EXPECT_EQ(first.back(), (Action{ActionKind::kBackward, 3, -1, 0, 0}));
  expect_valid_schedule(lists, 2, 4, false, {}, "p2 v2 m4");
}

TEST(InterleavedSchedule, OneChunkIsPlainOneFOneB) {
  for (int p = 1; p <= 4; ++p) {
    for (int m = 1; m <= 6; ++m) {
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(build_interleaved_schedule(p, 1, s, m),
                  build_schedule(PipelineSchedule::kOneForwardOneBackward, p, s, m));
      }
    }
  }
}

TEST(InterleavedSchedule, MegatronConstraintsOnTheMicroBatches) {
  // Default group g = p: m must be a multiple of p (and at least p).
  EXPECT_THROW(build_interleaved_schedule(4, 2, 0, 6), std::invalid_argument);  // 6 % 4 = 2 < 4
  EXPECT_THROW(build_interleaved_schedule(4, 2, 0, 2), std::invalid_argument);  // g = 4 > m = 2
  EXPECT_NO_THROW(build_interleaved_schedule(4, 2, 0, 8));
  // An explicit g: in [p, m], and the last group empty or of at least p micro-batches.
  EXPECT_NO_THROW(build_interleaved_schedule(2, 2, 0, 5, 3));                      // groups 3 + 2
  EXPECT_THROW(build_interleaved_schedule(2, 2, 0, 4, 3), std::invalid_argument);  // groups 3 + 1
  EXPECT_THROW(build_interleaved_schedule(2, 2, 0, 5, 1), std::invalid_argument);  // g < p
  EXPECT_THROW(build_interleaved_schedule(2, 2, 0, 5, 6), std::invalid_argument);  // g > m
  EXPECT_THROW(build_interleaved_schedule(2, 0, 0, 4), std::invalid_argument);
  EXPECT_THROW(build_interleaved_schedule(2, 2, 2, 4), std::invalid_argument);
  try {
    build_interleaved_schedule(4, 2, 0, 6);
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& error) {
    EXPECT_EQ(std::string(error.what()),
              "pipeline schedule: with virtual stages the last group of micro-batches (6 mod 4 = 2) must "
              "be empty or hold at least stages = 4");
  }
  try {
    build_interleaved_schedule(2, 2, 0, 5, 6);
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& error) {
    EXPECT_EQ(std::string(error.what()),
              "pipeline schedule: with virtual stages the micro-batch group size (6) must lie in [stages = "
              "2, micro-batches = 5]");
  }
}

bool megatron_accepts(int p, int m, int g) { return g >= p && g <= m && (m % g == 0 || m % g >= p); }

TEST(InterleavedSchedule, EveryLayoutIsValidAndWarmsUpAsMegatron) {
  for (int p = 1; p <= 8; ++p) {
    for (int v = 2; v <= 4; ++v) {
      for (int m = 1; m <= 32; ++m) {
        for (int g : {0, p + 1, p + 3}) {
          const int group = g == 0 ? p : g;
          const std::string layout = "p" + std::to_string(p) + " v" + std::to_string(v) + " m" +
                                     std::to_string(m) + " g" + std::to_string(group);
          if (!megatron_accepts(p, m, group)) {
            EXPECT_THROW(interleaved_lists(p, v, m, g), std::invalid_argument) << layout;
            continue;
          }
          const Lists lists = interleaved_lists(p, v, m, g);
          for (int s = 0; s < p; ++s) {
            const int warmup = std::min((p - s - 1) * 2 + (v - 1) * group, v * m);
            EXPECT_EQ(forwards_before_backward(lists[s]), std::min(warmup + 1, v * m))
                << layout << " stage " << s;
          }
          expect_valid_schedule(lists, v, m, false, {}, layout);
        }
      }
    }
  }
}

TEST(InterleavedSchedule, BubbleIsOneChunkOfTheOneFOneBBubble) {
  // One action is one chunk: forward 1/v, backward 2/v, so that a stage's work is 3m as in 1F1B.
  // With the default group the pipeline fills and drains in (p - 1) chunk steps of 3/v each, so the
  // makespan is 3m + 3(p - 1)/v and the idle fraction (p - 1)/(v m) exactly; the only error is the
  // rounding of the 1/v sums, under 1e-12 relative for a few hundred additions.
  for (int p = 1; p <= 8; ++p) {
    for (int v = 1; v <= 4; ++v) {
      for (int m = p; m <= 32; m += p) {
        UnitCosts costs;
        costs.forward = 1.0 / v;
        costs.backward = 2.0 / v;
        const SimulationResult result = simulate_schedules(interleaved_lists(p, v, m), costs);
        ASSERT_TRUE(result.completed);
        const double expected = 3.0 * m + 3.0 * (p - 1) / v;
        EXPECT_NEAR(makespan(result), expected, 1e-12 * expected) << "p" << p << " v" << v << " m" << m;
      }
    }
  }
}

TEST(InterleavedSchedule, ActivationMemoryGrowsWithTheWarmUp) {
  // Stage s holds its warm-up forwards' chunk activations plus the one of the steady state's forward:
  // min(w + 1, v m) with w Megatron-LM's warm-up count. Each is one chunk, 1/v of a stage's layers.
  for (int p = 1; p <= 8; ++p) {
    for (int v = 2; v <= 4; ++v) {
      for (int m = p; m <= 32; m += p) {
        const Lists lists = interleaved_lists(p, v, m);
        for (int s = 0; s < p; ++s) {
          const int warmup = std::min((p - s - 1) * 2 + (v - 1) * p, v * m);
          EXPECT_EQ(peak_in_flight(lists[s]), std::min(warmup + 1, v * m))
              << "p" << p << " v" << v << " m" << m << " stage " << s;
        }
      }
    }
  }
}

// ---- ZB-H1 ----

TEST(ZeroBubbleH1Schedule, FourStagesEightMicroBatches) {
  // The first stage runs each W right after its I; stage s keeps up to s W's pending, the last stage
  // the most, in the time 1F1B would spend waiting for gradients.
  const Lists lists = zero_bubble_lists(4, 8);
  EXPECT_EQ(format_actions(lists[0]),
            "F0 F1 F2 F3 I0 W0 F4 I1 W1 F5 I2 W2 F6 I3 W3 F7 I4 W4 I5 W5 I6 W6 I7 W7");
  EXPECT_EQ(format_actions(lists[1]),
            "F0 F1 F2 I0 F3 I1 W0 F4 I2 W1 F5 I3 W2 F6 I4 W3 F7 I5 W4 I6 W5 I7 W6 W7");
  EXPECT_EQ(format_actions(lists[3]),
            "F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 F5 I5 W2 F6 I6 W3 F7 I7 W4 W5 W6 W7");
  // I carries the transfers of the backward, W none.
  const std::vector<Action>& stage1 = lists[1];
  const auto input0 = std::find(stage1.begin(), stage1.end(), Action{ActionKind::kBackwardInput, 0, -1});
  ASSERT_NE(input0, stage1.begin());
  EXPECT_EQ(*(input0 - 1), (Action{ActionKind::kRecvGradient, 0, 2}));
  EXPECT_EQ(*(input0 + 1), (Action{ActionKind::kSendGradient, 0, 0}));
  const auto weight0 = std::find(stage1.begin(), stage1.end(), Action{ActionKind::kBackwardWeight, 0, -1});
  ASSERT_NE(weight0 + 1, stage1.end());
  EXPECT_EQ(*(weight0 - 1), (Action{ActionKind::kSendGradient, 1, 0}));    // I1's transfer
  EXPECT_EQ(*(weight0 + 1), (Action{ActionKind::kRecvActivation, 4, 0}));  // F4's
}

TEST(ZeroBubbleH1Schedule, EveryLayoutIsValidWithTheBubbleAndMemoryOfTheFormulas) {
  UnitCosts zero_bubble_costs;  // F = I = W = 1
  UnitCosts one_f_one_b_costs;  // F = 1, B = I + W = 2
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      const std::string layout = "p" + std::to_string(p) + " m" + std::to_string(m);
      const Lists lists = zero_bubble_lists(p, m);
      expect_valid_schedule(lists, 1, m, true, zero_bubble_costs, layout);
      const Lists one_f_one_b = build_all_schedules(PipelineSchedule::kOneForwardOneBackward, p, m);
      for (int s = 0; s < p; ++s) {
        // No more activations than 1F1B's first stage holds: min(p, m).
        EXPECT_LE(peak_in_flight(lists[s]), std::min(p, m)) << layout << " stage " << s;
        EXPECT_EQ(peak_in_flight(lists[0]), peak_in_flight(one_f_one_b[0])) << layout;
      }
      const double zero_bubble = makespan(simulate_schedules(lists, zero_bubble_costs));
      const double one_f_one_b_time = makespan(simulate_schedules(one_f_one_b, one_f_one_b_costs));
      // Every term is a whole number of units, so the times are exact. 1F1B: 3m + 3(p - 1). ZB-H1
      // with m >= p: 3m + (p - 1), the (p - 1)(F + I - W) of Qi et al.; with fewer micro-batches
      // than stages the pipeline never fills, and ZB-H1 is still never slower than 1F1B.
      EXPECT_EQ(one_f_one_b_time, 3.0 * m + 3.0 * (p - 1)) << layout;
      if (m >= p) {
        EXPECT_EQ(zero_bubble, 3.0 * m + (p - 1)) << layout;
      }
      EXPECT_LE(zero_bubble, one_f_one_b_time) << layout;
    }
  }
}

TEST(ZeroBubbleH1Schedule, RejectsBadArguments) {
  EXPECT_THROW(build_zero_bubble_h1_schedule(0, 0, 4), std::invalid_argument);
  EXPECT_THROW(build_zero_bubble_h1_schedule(2, 2, 4), std::invalid_argument);
  EXPECT_THROW(build_zero_bubble_h1_schedule(2, 0, 0), std::invalid_argument);
}

// ---- Simulator, timeline and drawing with chunks and split backwards ----

TEST(ScheduleSimulation, RejectsNegativeChunks) {
  Lists lists = interleaved_lists(2, 2, 2);
  lists[1][0].chunk = -1;
  EXPECT_THROW(simulate_schedules(lists), std::invalid_argument);
  lists = interleaved_lists(2, 2, 2);
  lists[0][1].peer_chunk = -1;
  EXPECT_THROW(simulate_schedules(lists), std::invalid_argument);
}

TEST(ScheduleSimulation, MessagesAreMatchedByChunk) {
  // Stage 1's chunk 0 sends micro-batch 0 to stage 0's chunk 1; a receive that names chunk 0 instead
  // must block, not take the message meant for another chunk.
  Lists lists = interleaved_lists(2, 2, 2);
  for (Action& action : lists[0]) {
    if (action.kind == ActionKind::kRecvActivation && action.micro_batch == 0) action.peer_chunk = 1;
  }
  const SimulationResult result = simulate_schedules(lists);
  EXPECT_FALSE(result.completed);
}

TEST(TimelineRender, ChunksAndSplitBackwardsInTextAndSvg) {
  SimulationResult zero_bubble = simulate_schedules(zero_bubble_lists(2, 2));
  const std::string svg = render_timeline_svg(flatten_timeline(zero_bubble.timeline), 2);
  EXPECT_NE(svg.find("class=\"event weight\""), std::string::npos);
  EXPECT_NE(svg.find("backward, weight gradients"), std::string::npos);
  EXPECT_EQ(svg.find("lighter: later model chunks"), std::string::npos);

  SimulationResult interleaved = simulate_schedules(interleaved_lists(2, 2, 2));
  const std::vector<TimelineEvent> events = flatten_timeline(interleaved.timeline);
  EXPECT_EQ(render_timeline_text(events, 2),
            "stage 0: F0 F1 F0:1 F1:1 B0:1 B1:1 B0 B1\nstage 1: F0 F1 F0:1 B0:1 F1:1 B1:1 B0 B1\n");
  const std::string chunked = render_timeline_svg(events, 2);
  EXPECT_NE(chunked.find("lighter: later model chunks"), std::string::npos);
  EXPECT_NE(chunked.find("fill-opacity=\"0.5\""), std::string::npos);  // chunk 1 of 2
  EXPECT_EQ(chunked.find("event weight"), std::string::npos);
}

TEST(TimelineIdle, MeasuredOnSimulatedTimelinesIsTheBubbleFormula) {
  // Every stage works 3m units; the span is the makespan. Whole numbers of units throughout, so the
  // only rounding is that of 1 - busy / span against the formula's quotient: a few ulps.
  for (int p = 1; p <= 6; ++p) {
    for (int m = 1; m <= 12; ++m) {
      const std::string layout = "p" + std::to_string(p) + " m" + std::to_string(m);
      for (const PipelineSchedule schedule :
           {PipelineSchedule::kOneForwardOneBackward, PipelineSchedule::kAllForwardAllBackward}) {
        const PipelineIdle idle = measure_idle(flatten_timeline(simulate_timeline(schedule, p, m)), p);
        EXPECT_EQ(idle.span_seconds, 3.0 * (m + p - 1)) << layout;
        for (const double share : idle.idle_share)
          EXPECT_NEAR(share, (p - 1.0) / (m + p - 1.0), 1e-15) << layout;
      }
      if (m < p) continue;
      const SimulationResult zero_bubble = simulate_schedules(zero_bubble_lists(p, m));
      const PipelineIdle idle = measure_idle(flatten_timeline(zero_bubble.timeline), p);
      ASSERT_EQ(idle.idle_share.size(), static_cast<std::size_t>(p));
      for (const double share : idle.idle_share)
        EXPECT_NEAR(share, (p - 1.0) / (3.0 * m + p - 1.0), 1e-15) << layout;
    }
  }
  EXPECT_EQ(
      format_idle(measure_idle(
          flatten_timeline(simulate_timeline(PipelineSchedule::kOneForwardOneBackward, 4, 8)), 4)),
      "pipeline idle: stage 0 27.3%, stage 1 27.3%, stage 2 27.3%, stage 3 27.3% of 33.000 s\n");  // 3/11
  const PipelineIdle empty = measure_idle({}, 2);
  EXPECT_EQ(empty.span_seconds, 0.0);
  EXPECT_EQ(empty.idle_share, (std::vector<double>{0.0, 0.0}));
}

// Every (micro-batch, chunk, direction) of a pipeline gets its own tag, so no two transfers a pair of
// stages may have in flight match each other; a tag beyond int is -1 (refused by every group).
TEST(PipelineTags, DistinctPerMicroBatchChunkAndDirectionAndNeverWrap) {
  for (int v : {1, 2, 4}) {
    std::map<int, std::tuple<int, int, int>> owner;
    for (int j = 0; j < 32; ++j) {
      for (int c = 0; c < v; ++c) {
        for (int gradient = 0; gradient < 2; ++gradient) {
          const int tag = gradient ? message_tags::pipeline_gradient(j, c, v)
                                   : message_tags::pipeline_activation(j, c, v);
          EXPECT_GE(tag, 0);
          EXPECT_TRUE(owner.emplace(tag, std::make_tuple(j, c, gradient)).second)
              << "tag " << tag << ", v " << v;
        }
      }
    }
  }
  // The largest: 2 (j v + c) + 1 with j v + c = 2^30 - 1.
  EXPECT_EQ(message_tags::pipeline_gradient((int64_t{1} << 29) - 1, 1, 2), std::numeric_limits<int>::max());
  EXPECT_EQ(message_tags::pipeline_activation(int64_t{1} << 30, 0, 1), -1);
  EXPECT_EQ(message_tags::pipeline_gradient(int64_t{1} << 40, 3, 4), -1);
}

}  // namespace
}  // namespace touchstone::pipeline
