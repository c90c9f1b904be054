// Tests of the pipeline schedules: hand-written action lists, deadlock freedom under the executor's
// model (non-blocking sends, blocking receives matched by tag), the bubble and the activation memory
// of each schedule, the timeline recorder and the text and SVG renderers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/timeline.h"

namespace touchstone::pipeline {

// Failure messages show "RG0<2" rather than bytes.
void PrintTo(const Action& action, std::ostream* os) {
  *os << action_token(action.kind, action.micro_batch);
  const bool send = action.kind == ActionKind::kSendActivation || action.kind == ActionKind::kSendGradient;
  if (action.peer_stage >= 0) *os << (send ? ">" : "<") << action.peer_stage;
}

namespace {

using Actions = std::vector<Action>;

Action F(int j) { return {ActionKind::kForward, j, -1}; }
Action B(int j) { return {ActionKind::kBackward, j, -1}; }
Action RA(int j, int from) { return {ActionKind::kRecvActivation, j, from}; }
Action SA(int j, int to) { return {ActionKind::kSendActivation, j, to}; }
Action RG(int j, int from) { return {ActionKind::kRecvGradient, j, from}; }
Action SG(int j, int to) { return {ActionKind::kSendGradient, j, to}; }

constexpr PipelineSchedule kAfab = PipelineSchedule::kAllForwardAllBackward;
constexpr PipelineSchedule k1f1b = PipelineSchedule::kOneForwardOneBackward;
const PipelineSchedule kSchedules[] = {kAfab, k1f1b};

// ---- Hand-written lists ----

TEST(PipelineSchedule, AfabTwoStagesFourMicroBatches) {
  EXPECT_EQ(build_schedule(kAfab, 2, 0, 4),
            (Actions{F(0), SA(0, 1), F(1), SA(1, 1), F(2), SA(2, 1), F(3), SA(3, 1),  //
                     RG(0, 1), B(0), RG(1, 1), B(1), RG(2, 1), B(2), RG(3, 1), B(3)}));
  EXPECT_EQ(build_schedule(kAfab, 2, 1, 4),
            (Actions{RA(0, 0), F(0), RA(1, 0), F(1), RA(2, 0), F(2), RA(3, 0), F(3),  //
                     B(0), SG(0, 0), B(1), SG(1, 0), B(2), SG(2, 0), B(3), SG(3, 0)}));
}

TEST(PipelineSchedule, OneFOneBTwoStagesFourMicroBatches) {
  // Stage 0 warms up with one forward; the last stage alternates from the start.
  EXPECT_EQ(build_schedule(k1f1b, 2, 0, 4),
            (Actions{F(0), SA(0, 1),                                                  // warm-up
                     F(1), SA(1, 1), RG(0, 1), B(0),                                  // steady state
                     F(2), SA(2, 1), RG(1, 1), B(1), F(3), SA(3, 1), RG(2, 1), B(2),  //
                     RG(3, 1), B(3)}));                                               // cool-down
  EXPECT_EQ(build_schedule(k1f1b, 2, 1, 4),
            (Actions{RA(0, 0), F(0), B(0), SG(0, 0), RA(1, 0), F(1), B(1), SG(1, 0),  //
                     RA(2, 0), F(2), B(2), SG(2, 0), RA(3, 0), F(3), B(3), SG(3, 0)}));
}

TEST(PipelineSchedule, AfabFourStagesThreeMicroBatches) {
  EXPECT_EQ(build_schedule(kAfab, 4, 0, 3), (Actions{F(0), SA(0, 1), F(1), SA(1, 1), F(2), SA(2, 1),  //
                                                     RG(0, 1), B(0), RG(1, 1), B(1), RG(2, 1), B(2)}));
  EXPECT_EQ(build_schedule(kAfab, 4, 1, 3),
            (Actions{RA(0, 0), F(0), SA(0, 2), RA(1, 0), F(1), SA(1, 2), RA(2, 0), F(2), SA(2, 2),  //
                     RG(0, 2), B(0), SG(0, 0), RG(1, 2), B(1), SG(1, 0), RG(2, 2), B(2), SG(2, 0)}));
  EXPECT_EQ(build_schedule(kAfab, 4, 2, 3),
            (Actions{RA(0, 1), F(0), SA(0, 3), RA(1, 1), F(1), SA(1, 3), RA(2, 1), F(2), SA(2, 3),  //
                     RG(0, 3), B(0), SG(0, 1), RG(1, 3), B(1), SG(1, 1), RG(2, 3), B(2), SG(2, 1)}));
  EXPECT_EQ(build_schedule(kAfab, 4, 3, 3), (Actions{RA(0, 2), F(0), RA(1, 2), F(1), RA(2, 2), F(2),  //
                                                     B(0), SG(0, 2), B(1), SG(1, 2), B(2), SG(2, 2)}));
}

TEST(PipelineSchedule, OneFOneBFourStagesThreeMicroBatches) {
  // Warm-up min(p - s - 1, m) = 3, 2, 1, 0: stage 0 has no steady state at all when m <= p - 1.
  EXPECT_EQ(build_schedule(k1f1b, 4, 0, 3), (Actions{F(0), SA(0, 1), F(1), SA(1, 1), F(2), SA(2, 1),  //
                                                     RG(0, 1), B(0), RG(1, 1), B(1), RG(2, 1), B(2)}));
  EXPECT_EQ(build_schedule(k1f1b, 4, 1, 3), (Actions{RA(0, 0), F(0), SA(0, 2), RA(1, 0), F(1), SA(1, 2),  //
                                                     RA(2, 0), F(2), SA(2, 2), RG(0, 2), B(0), SG(0, 0),  //
                                                     RG(1, 2), B(1), SG(1, 0), RG(2, 2), B(2), SG(2, 0)}));
  EXPECT_EQ(build_schedule(k1f1b, 4, 2, 3), (Actions{RA(0, 1), F(0), SA(0, 3),                            //
                                                     RA(1, 1), F(1), SA(1, 3), RG(0, 3), B(0), SG(0, 1),  //
                                                     RA(2, 1), F(2), SA(2, 3), RG(1, 3), B(1), SG(1, 1),  //
                                                     RG(2, 3), B(2), SG(2, 1)}));
  EXPECT_EQ(build_schedule(k1f1b, 4, 3, 3),
            (Actions{RA(0, 2), F(0), B(0), SG(0, 2), RA(1, 2), F(1), B(1), SG(1, 2),  //
                     RA(2, 2), F(2), B(2), SG(2, 2)}));
}

TEST(PipelineSchedule, SingleStageHasNoTransfers) {
  EXPECT_EQ(build_schedule(k1f1b, 1, 0, 2), (Actions{F(0), B(0), F(1), B(1)}));
  EXPECT_EQ(build_schedule(kAfab, 1, 0, 2), (Actions{F(0), F(1), B(0), B(1)}));
}

TEST(PipelineSchedule, RejectsBadArguments) {
  EXPECT_THROW(build_schedule(k1f1b, 0, 0, 4), std::invalid_argument);
  EXPECT_THROW(build_schedule(k1f1b, 2, -1, 4), std::invalid_argument);
  EXPECT_THROW(build_schedule(k1f1b, 2, 2, 4), std::invalid_argument);
  EXPECT_THROW(build_schedule(kAfab, 2, 0, 0), std::invalid_argument);
  EXPECT_THROW(build_all_schedules(kAfab, 0, 1), std::invalid_argument);
}

// ---- Properties over a sweep ----

// Every micro-batch has one forward and one backward, in that order, and each stage sends exactly
// what its neighbour receives.
TEST(PipelineSchedule, EveryMicroBatchRunsOnceForwardBeforeBackward) {
  for (const PipelineSchedule schedule : kSchedules) {
    for (int p = 1; p <= 6; ++p) {
      for (int m = 1; m <= 10; ++m) {
        for (int s = 0; s < p; ++s) {
          SCOPED_TRACE(option_name(schedule) + " p=" + std::to_string(p) + " m=" + std::to_string(m) +
                       " stage=" + std::to_string(s));
          std::vector<int> forwards(static_cast<std::size_t>(m), 0),
              backwards(static_cast<std::size_t>(m), 0);
          int transfers = 0;
          for (const Action& action : build_schedule(schedule, p, s, m)) {
            const auto j = static_cast<std::size_t>(action.micro_batch);
            if (action.kind == ActionKind::kForward) ++forwards[j];
            if (action.kind == ActionKind::kBackward) {
              EXPECT_EQ(forwards[j], 1) << "backward of " << j << " before its forward";
              ++backwards[j];
            }
            if (!is_computation(action.kind)) ++transfers;
          }
          EXPECT_EQ(forwards, std::vector<int>(static_cast<std::size_t>(m), 1));
          EXPECT_EQ(backwards, std::vector<int>(static_cast<std::size_t>(m), 1));
          // Two transfers per micro-batch and neighbour.
          EXPECT_EQ(transfers, 2 * m * ((s > 0 ? 1 : 0) + (s < p - 1 ? 1 : 0)));
        }
      }
    }
  }
}

TEST(PipelineSchedule, NoDeadlockAndEveryMessageReceived) {
  for (const PipelineSchedule schedule : kSchedules) {
    for (int p = 1; p <= 6; ++p) {
      for (int m = 1; m <= 10; ++m) {
        SCOPED_TRACE(option_name(schedule) + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        const auto lists = build_all_schedules(schedule, p, m);
        const SimulationResult result = simulate_schedules(lists);
        EXPECT_TRUE(result.completed);
        for (int s = 0; s < p; ++s) {
          EXPECT_EQ(result.next_action[static_cast<std::size_t>(s)],
                    lists[static_cast<std::size_t>(s)].size())
              << "stage " << s << " stuck";
        }
        EXPECT_EQ(result.unreceived_sends, 0u);
        // The simulated record, rendered, is the expected order: what an executor test compares.
        const auto order = render_order(flatten_timeline(result.timeline), p, true);
        for (int s = 0; s < p; ++s) {
          EXPECT_EQ(order[static_cast<std::size_t>(s)],
                    format_actions(lists[static_cast<std::size_t>(s)], true));
        }
      }
    }
  }
}

// The deadlock check is not vacuous: receiving the gradient before sending the activation it needs
// blocks both stages forever.
TEST(PipelineSchedule, SimulationDetectsDeadlockAndBadMessages) {
  const SimulationResult deadlock = simulate_schedules({{RG(0, 1), F(0), SA(0, 1), B(0)},  //
                                                        {RA(0, 0), F(0), B(0), SG(0, 0)}});
  EXPECT_FALSE(deadlock.completed);
  EXPECT_EQ(deadlock.next_action, (std::vector<std::size_t>{0, 0}));

  const SimulationResult lost = simulate_schedules({{F(0), SA(0, 1), SA(1, 1)}, {RA(0, 0), F(0)}});
  EXPECT_TRUE(lost.completed);
  EXPECT_EQ(lost.unreceived_sends, 1u);

  EXPECT_THROW(simulate_schedules({{F(0), SA(0, 1)}}), std::invalid_argument);  // no stage 1
  EXPECT_THROW(simulate_schedules({{SA(0, 1), SA(0, 1)}, {RA(0, 0)}}), std::invalid_argument);
}

// With forward = 1 and backward = 2 units and free transfers, both schedules take (m + p - 1) * 3
// units, so every stage is idle 3 (p - 1) units of it. The quantity compared: a stage's idle time over
// the step's total time (first forward start to last backward end, over all stages) equals
// (p - 1) / (m + p - 1), which is the standard bubble (p - 1) / m of the ideal time expressed as a
// fraction of the whole step (Narayanan et al. 2021, section 2.2).
TEST(PipelineSchedule, BubbleFractionMatchesTheStandardFormula) {
  for (const PipelineSchedule schedule : kSchedules) {
    for (int p = 1; p <= 6; ++p) {
      for (int m = 1; m <= 10; ++m) {
        SCOPED_TRACE(option_name(schedule) + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        const auto timeline = simulate_timeline(schedule, p, m);
        double total = 0.0;
        for (const auto& stage : timeline) {
          for (const TimelineEvent& event : stage) total = std::max(total, event.end_seconds);
        }
        EXPECT_EQ(total, 3.0 * (m + p - 1));
        for (const auto& stage : timeline) {
          double busy = 0.0;
          for (const TimelineEvent& event : stage) {
            if (is_computation(event.kind)) busy += event.end_seconds - event.start_seconds;
          }
          EXPECT_EQ(busy, 3.0 * m);
          // Integers in doubles: the cross-multiplied comparison is exact.
          EXPECT_EQ((total - busy) * (m + p - 1), (p - 1) * total);
          EXPECT_EQ((total - busy) * m, (p - 1) * busy);  // the (p - 1) / m form
        }
      }
    }
  }
}

TEST(PipelineSchedule, PeakInFlightMicroBatches) {
  for (int p = 1; p <= 6; ++p) {
    for (int m = 1; m <= 10; ++m) {
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(peak_in_flight(build_schedule(k1f1b, p, s, m)), std::min(p - s, m))
            << "p=" << p << " m=" << m << " s=" << s;
        EXPECT_EQ(peak_in_flight(build_schedule(kAfab, p, s, m)), m) << "p=" << p << " m=" << m << " s=" << s;
      }
    }
  }
}

// ---- Recorder and encoding ----

TEST(TimelineRecorder, RecordsEventsRelativeToTheOrigin) {
  double now = 100.0;
  TimelineRecorder recorder(2, [&now] { return now; });
  now = 101.0;
  recorder.begin(ActionKind::kForward, 0);
  now = 101.5;
  recorder.end();
  {
    auto scope = recorder.scope(ActionKind::kBackward, 0);
    now = 103.0;
  }
  EXPECT_THROW(recorder.end(), std::logic_error);
  recorder.begin(ActionKind::kSendGradient, 0);
  EXPECT_THROW(recorder.begin(ActionKind::kForward, 1), std::logic_error);
  recorder.end();
  try {  // an exception inside a scope still closes the event
    auto scope = recorder.scope(ActionKind::kForward, 1);
    throw std::runtime_error("computation failed");
  } catch (const std::runtime_error&) {
  }

  {
    TimelineRecorder::Scope nothing(nullptr, ActionKind::kForward, 7);  // recording switched off
  }
  std::optional<TimelineRecorder::Scope> maybe;
  maybe.emplace(&recorder, ActionKind::kRecvActivation, 2);
  maybe.reset();

  const std::vector<TimelineEvent> events = recorder.take_events();
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[4].kind, ActionKind::kRecvActivation);
  EXPECT_EQ(events[0].stage, 2);
  EXPECT_EQ(events[0].start_seconds, 1.0);
  EXPECT_EQ(events[0].end_seconds, 1.5);
  EXPECT_EQ(events[1].kind, ActionKind::kBackward);
  EXPECT_EQ(events[1].end_seconds, 3.0);
  EXPECT_EQ(events[3].micro_batch, 1);
  EXPECT_TRUE(recorder.events().empty());

  recorder.reset_origin();
  recorder.begin(ActionKind::kForward, 2);
  recorder.end();
  EXPECT_EQ(recorder.events().at(0).start_seconds, 0.0);
}

TEST(TimelineRecorder, SteadyClockIsMonotonic) {
  TimelineRecorder recorder(0);
  for (int j = 0; j < 3; ++j) {
    recorder.begin(ActionKind::kForward, j);
    recorder.end();
  }
  double previous = 0.0;
  for (const TimelineEvent& event : recorder.events()) {
    EXPECT_GE(event.start_seconds, previous);
    EXPECT_GE(event.end_seconds, event.start_seconds);
    previous = event.end_seconds;
  }
}

TEST(TimelineEncoding, RoundTripsAndRejectsGarbage) {
  const std::vector<TimelineEvent> events = {{0, ActionKind::kForward, 3, 0.25, 0.5},
                                             {5, ActionKind::kRecvGradient, 9, 1.0, 1.125},
                                             {1, ActionKind::kBackwardWeight, 2, 2.0, 2.5, 3}};
  const std::vector<TimelineEvent> back = decode_events(encode_events(events));
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[1].stage, 5);
  EXPECT_EQ(back[1].kind, ActionKind::kRecvGradient);
  EXPECT_EQ(back[1].micro_batch, 9);
  EXPECT_EQ(back[1].end_seconds, 1.125);
  EXPECT_EQ(back[2].kind, ActionKind::kBackwardWeight);
  EXPECT_EQ(back[2].chunk, 3);
  EXPECT_THROW(decode_events({1.0, 2.0}), std::invalid_argument);                 // not whole events
  EXPECT_THROW(decode_events({0.0, 0.0, 0.0, 0.0, 1.0}), std::invalid_argument);  // 5 values: old encoding
  EXPECT_THROW(decode_events({0.0, 9.0, 0.0, 0.0, 1.0, 0.0}), std::invalid_argument);    // no such kind
  EXPECT_THROW(decode_events({0.0, 0.0, 0.0, 0.0, 1.0, -1.0}), std::invalid_argument);   // negative chunk
  EXPECT_THROW(decode_events({0.0, 0.0, 0.5, 0.0, 1.0, 0.0}), std::invalid_argument);    // half micro-batch
  EXPECT_THROW(decode_events({1e300, 0.0, 0.0, 0.0, 1.0, 0.0}), std::invalid_argument);  // stage beyond int
}

// ---- Renderers ----

TEST(TimelineRender, TextOfThreeStagesFourMicroBatches) {
  EXPECT_EQ(render_timeline_text(flatten_timeline(simulate_timeline(k1f1b, 3, 4)), 3),
            "stage 0: F0 F1 F2 B0 F3 B1 B2 B3\n"
            "stage 1: F0 F1 B0 F2 B1 F3 B2 B3\n"
            "stage 2: F0 B0 F1 B1 F2 B2 F3 B3\n");
  EXPECT_EQ(render_timeline_text(flatten_timeline(simulate_timeline(kAfab, 2, 1)), 2, true),
            "stage 0: F0 SA0 RG0 B0\n"
            "stage 1: RA0 F0 B0 SG0\n");
}

TEST(TimelineRender, OrdersAMeasuredRecordByStartTime) {
  // Gathered records arrive stage by stage and need not be sorted; a stage with no events is empty.
  const std::vector<TimelineEvent> events = {{1, ActionKind::kBackward, 0, 0.30, 0.40},
                                             {0, ActionKind::kForward, 0, 0.00, 0.10},
                                             {1, ActionKind::kForward, 0, 0.10, 0.20}};
  EXPECT_EQ(render_order(events, 3), (std::vector<std::string>{"F0", "F0 B0", ""}));
  EXPECT_EQ(render_timeline_text(events, 3), "stage 0: F0\nstage 1: F0 B0\nstage 2:\n");
  EXPECT_THROW(render_order(events, 1), std::invalid_argument);  // stage 1 does not exist
  EXPECT_THROW(render_order({{0, ActionKind::kForward, 0, 1.0, 0.5}}, 1), std::invalid_argument);
}

// A small XML checker: balanced tags, quoted attributes without '<', every '&' an entity, one root.
// Returns what is wrong, or "" for a well-formed document.
std::string xml_error(const std::string& xml) {
  auto entity_at = [&](std::size_t i) {
    for (const std::string entity : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"}) {
      if (xml.compare(i, entity.size(), entity) == 0) return true;
    }
    return false;
  };
  std::vector<std::string> open;
  int roots = 0;
  for (std::size_t i = 0; i < xml.size();) {
    if (xml[i] == '&' && !entity_at(i)) return "bare & at " + std::to_string(i);
    if (xml[i] != '<') {
      if (open.empty() && !std::isspace(static_cast<unsigned char>(xml[i]))) return "text outside the root";
      ++i;
      continue;
    }
    const bool closing = xml.compare(i, 2, "</") == 0;
    std::size_t j = i + (closing ? 2 : 1);
    std::string name;
    while (j < xml.size() && (std::isalnum(static_cast<unsigned char>(xml[j])) || xml[j] == '-')) {
      name += xml[j++];
    }
    if (name.empty()) return "tag without a name at " + std::to_string(i);
    bool self_closing = false;
    for (;;) {  // attributes
      while (j < xml.size() && xml[j] == ' ') ++j;
      if (j >= xml.size()) return "unterminated <" + name;
      if (xml[j] == '>') break;
      if (!closing && xml.compare(j, 2, "/>") == 0) {
        self_closing = true;
        ++j;
        break;
      }
      while (j < xml.size() && xml[j] != '=' && xml[j] != '>') ++j;
      if (xml.compare(j, 2, "=\"") != 0) return "unquoted attribute in <" + name;
      for (j += 2; j < xml.size() && xml[j] != '"'; ++j) {
        if (xml[j] == '<' || (xml[j] == '&' && !entity_at(j))) return "bad attribute value in <" + name;
      }
      ++j;
    }
    if (closing) {
      if (open.empty() || open.back() != name) return "mismatched </" + name + ">";
      open.pop_back();
    } else {
      if (open.empty()) ++roots;
      if (!self_closing) open.push_back(name);
    }
    i = j + 1;
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  if (roots != 1) return std::to_string(roots) + " root elements";
  return "";
}

std::size_t count(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(TimelineRender, SvgIsWellFormedEscapedAndHasOneBoxPerComputation) {
  SvgOptions options;
  options.title = "1F1B <p=4> & \"m=8\"";
  options.time_unit = "units";
  const std::string svg = render_timeline_svg(flatten_timeline(simulate_timeline(k1f1b, 4, 8)), 4, options);
  ASSERT_NE(xml_error("<a><b></a></b>"), "");  // the checker itself rejects what it should
  ASSERT_NE(xml_error("<a x=\"1 & 2\"/>"), "");
  EXPECT_EQ(xml_error(svg), "");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(count(svg, "<rect class=\"event"), 4u * 2u * 8u);
  EXPECT_EQ(count(svg, "<rect class=\"event forward\""), 4u * 8u);
  EXPECT_NE(svg.find("1F1B &lt;p=4&gt; &amp; &quot;m=8&quot;"), std::string::npos);
  EXPECT_EQ(svg.find("<p=4>"), std::string::npos);
  EXPECT_NE(svg.find("time (units)"), std::string::npos);
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  EXPECT_EQ(svg.find("@font-face"), std::string::npos);
  EXPECT_EQ(svg.find("href"), std::string::npos);

  // Measured times in seconds: boxes only for computations, transfers on request, a millisecond axis.
  const std::vector<TimelineEvent> measured = {{0, ActionKind::kForward, 0, 0.0, 0.002},
                                               {0, ActionKind::kSendActivation, 0, 0.002, 0.0021},
                                               {1, ActionKind::kRecvActivation, 0, 0.0, 0.0022},
                                               {1, ActionKind::kForward, 0, 0.0022, 0.004}};
  const std::string plain = render_timeline_svg(measured, 2);
  EXPECT_EQ(xml_error(plain), "");
  EXPECT_EQ(count(plain, "<rect class=\"event"), 2u);
  EXPECT_EQ(count(plain, "<rect class=\"transfer"), 0u);
  EXPECT_NE(plain.find("time (ms)"), std::string::npos);
  SvgOptions with_transfers;
  with_transfers.include_communication = true;
  const std::string detailed = render_timeline_svg(measured, 2, with_transfers);
  EXPECT_EQ(xml_error(detailed), "");
  EXPECT_EQ(count(detailed, "<rect class=\"transfer"), 2u);
}

}  // namespace
}  // namespace touchstone::pipeline
