// Context-parallel transfers on the pipeline timeline: recorded within the forward or backward they
// serve (TimelineRecorder::begin_within), carried by the gather encoding, drawn by the SVG renderer as
// strips along the foot of their computation, and left out of the text timelines and the idle measure.
#include <gtest/gtest.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/pipeline/timeline.h"

namespace touchstone::pipeline {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(TimelineContextTransfers, RecordedWithinTheOpenComputation) {
  double now = 0.0;
  TimelineRecorder recorder(1, [&now] { return now; });
  EXPECT_THROW(recorder.begin_within(ActionKind::kContextTransfer), std::logic_error);  // nothing open
  recorder.begin(ActionKind::kBackward, 3, 1);
  EXPECT_TRUE(recorder.open());
  now = 1.0;
  recorder.begin_within(ActionKind::kContextTransfer);
  EXPECT_THROW(recorder.begin_within(ActionKind::kContextTransfer), std::logic_error);  // one at a time
  EXPECT_THROW(recorder.end(), std::logic_error);  // the computation outlives its transfers
  now = 1.5;
  recorder.end_within();
  EXPECT_THROW(recorder.end_within(), std::logic_error);
  now = 2.0;
  recorder.end();
  EXPECT_FALSE(recorder.open());
  const std::vector<TimelineEvent> events = recorder.take_events();
  ASSERT_EQ(events.size(), 2u);
  // The transfer ends first, with the micro-batch and chunk of its backward.
  EXPECT_EQ(events[0].kind, ActionKind::kContextTransfer);
  EXPECT_EQ(events[0].micro_batch, 3);
  EXPECT_EQ(events[0].chunk, 1);
  EXPECT_EQ(events[0].stage, 1);
  EXPECT_EQ(events[0].start_seconds, 1.0);
  EXPECT_EQ(events[0].end_seconds, 1.5);
  EXPECT_EQ(action_token(events[0].kind, 3, 1), "CP3:1");
  const std::vector<TimelineEvent> back = decode_events(encode_events(events));
  EXPECT_EQ(back[0].kind, ActionKind::kContextTransfer);
  // The text timelines and the idle measure see the computations only.
  EXPECT_EQ(render_order(events, 2), (std::vector<std::string>{"", "B3:1"}));
  EXPECT_EQ(measure_idle(events, 2).idle_share.at(1), 0.0);
}

TEST(TimelineContextTransfers, DrawnAlongTheFootOfTheirComputation) {
  const std::vector<TimelineEvent> measured = {{0, ActionKind::kForward, 0, 0.0, 0.002},
                                               {0, ActionKind::kContextTransfer, 0, 0.0005, 0.001},
                                               {0, ActionKind::kBackward, 0, 0.002, 0.006},
                                               {0, ActionKind::kContextTransfer, 0, 0.003, 0.0035},
                                               {0, ActionKind::kContextTransfer, 0, 0.0055, 0.006}};
  for (const bool transfers : {false, true}) {
    SvgOptions options;
    options.include_communication = transfers;
    const std::string svg = render_timeline_svg(measured, 1, options);
    EXPECT_EQ(count(svg, "<rect class=\"event"), 2u);
    EXPECT_EQ(count(svg, "<rect class=\"context-transfer\""), 3u);  // once each, with or without transfers
    EXPECT_EQ(count(svg, "<rect class=\"transfer"), 0u);
    EXPECT_NE(svg.find("context-parallel transfer (within attention)"), std::string::npos);
    EXPECT_NE(svg.find("CP0 on stage 0: context-parallel transfer within attention, 0.5 to 1 ms"),
              std::string::npos);
  }
  const std::string without = render_timeline_svg({measured[0], measured[2]}, 1);
  EXPECT_EQ(without.find("context-parallel"), std::string::npos);  // no legend entry without them
}

}  // namespace
}  // namespace touchstone::pipeline
