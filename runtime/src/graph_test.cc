#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "axon/runtime.h"
#include "test_util.h"

namespace axon::rt {
namespace {

using testing::ScopedEvent;

struct ScopedGraph {
  explicit ScopedGraph(Graph* g) : g(g) {}
  ~ScopedGraph() { graph_destroy(g); }
  Graph* g;
};

// Each test takes streams of its own (the pool hands them out round robin),
// so a failed test's capture never leaks into another.
Stream fresh_stream() { return stream_dedicated(0); }

std::string thrown(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Graph, CaptureRecordsAndReplayRunsInOrder) {
  const Stream s = fresh_stream();
  std::vector<int> log;
  EXPECT_FALSE(stream_is_capturing(s));
  stream_begin_capture(s);
  EXPECT_TRUE(stream_is_capturing(s));
  EXPECT_TRUE(device_is_capturing(0));
  launch(s, "one", [&log] { log.push_back(1); });
  launch(s, "two", [&log] { log.push_back(2); });
  ScopedGraph g(stream_end_capture(s));
  EXPECT_FALSE(stream_is_capturing(s));
  EXPECT_TRUE(log.empty());  // nothing ran during the capture
  EXPECT_EQ(graph_num_tasks(g.g), 2u);
  EXPECT_EQ(graph_describe(g.g), "one\ntwo\n");
  EXPECT_EQ(graph_device(g.g), 0);
  const uint64_t before = stream_launched(s);
  graph_launch(g.g, s);
  graph_launch(g.g, s);
  EXPECT_EQ(stream_launched(s), before + 2);  // one task per replay
  stream_synchronize(s);
  EXPECT_EQ(log, (std::vector<int>{1, 2, 1, 2}));
  // Replay on another stream of the device, and after destroying the graph.
  const Stream other = fresh_stream();
  graph_launch(g.g, other);
  stream_synchronize(other);
  EXPECT_EQ(log.size(), 6u);
}

TEST(Graph, DeviceCopiesAreCapturedPageableOnesInvalidate) {
  const Stream s = fresh_stream();
  void* a = malloc(0, 64);
  void* b = malloc(0, 64);
  static_cast<char*>(a)[0] = 7;
  static_cast<char*>(b)[0] = 0;
  stream_begin_capture(s);
  rt::memcpy(b, a, 64, s);
  ScopedGraph g(stream_end_capture(s));
  EXPECT_EQ(static_cast<char*>(b)[0], 0);
  graph_launch(g.g, s);
  stream_synchronize(s);
  EXPECT_EQ(static_cast<char*>(b)[0], 7);

  char host[64] = {};
  stream_begin_capture(s);
  const std::string msg = thrown([&] { rt::memcpy(host, a, 64, s); });
  EXPECT_NE(msg.find("operation not permitted when stream is capturing: a copy to pageable host"),
            std::string::npos)
      << msg;
  EXPECT_NE(thrown([&] { graph_destroy(stream_end_capture(s)); })
                .find("operation failed due to a previous error during capture"),
            std::string::npos);
  EXPECT_FALSE(stream_is_capturing(s));
  free(a);
  free(b);
}

TEST(Graph, SynchronisingCallsInvalidateTheCapture) {
  const Stream s = fresh_stream();
  for (int which = 0; which < 3; ++which) {
    stream_begin_capture(s);
    launch(s, "k", [] {});
    std::string msg;
    if (which == 0) msg = thrown([&] { stream_synchronize(s); });
    if (which == 1) msg = thrown([&] { device_synchronize(0); });
    if (which == 2) msg = thrown([&] { stream_query(s); });
    EXPECT_NE(msg.find("operation not permitted when stream is capturing"), std::string::npos)
        << which << ": " << msg;
    const std::string end = thrown([&] { graph_destroy(stream_end_capture(s)); });
    EXPECT_NE(end.find("previous error during capture"), std::string::npos) << end;
  }
  // device_wait (the allocators') is allowed and does not wait for captured work.
  stream_begin_capture(s);
  launch(s, "k", [] {});
  device_wait(0);
  graph_destroy(stream_end_capture(s));
  stream_synchronize(s);  // no longer capturing
}

TEST(Graph, BeginEndMisuse) {
  const Stream s = fresh_stream();
  EXPECT_NE(thrown([&] { stream_end_capture(s); }).find("is not capturing"), std::string::npos);
  stream_begin_capture(s);
  EXPECT_NE(thrown([&] { stream_begin_capture(s); }).find("already capturing"), std::string::npos);
  graph_destroy(stream_end_capture(s));
}

TEST(Graph, ForkJoinThroughEvents) {
  const Stream s = fresh_stream();
  const Stream side = fresh_stream();
  ScopedEvent fork(0), join(0);
  std::vector<int> log;
  stream_begin_capture(s);
  launch(s, "a", [&log] { log.push_back(1); });
  event_record(fork.e, s);
  stream_wait_event(side, fork.e);  // side joins the capture
  EXPECT_TRUE(stream_is_capturing(side));
  launch(side, "b", [&log] { log.push_back(2); });
  event_record(join.e, side);
  stream_wait_event(s, join.e);
  launch(s, "c", [&log] { log.push_back(3); });
  ScopedGraph g(stream_end_capture(s));
  EXPECT_FALSE(stream_is_capturing(side));
  EXPECT_TRUE(log.empty());
  graph_launch(g.g, s);
  stream_synchronize(s);
  EXPECT_EQ(log, (std::vector<int>{1, 2, 3}));
  // After the capture, an event recorded in it marks nothing outside the graph.
  EXPECT_TRUE(event_query(join.e));
  event_synchronize(join.e);
}

TEST(Graph, QueryingACapturedEventDuringTheCaptureInvalidates) {
  const Stream s = fresh_stream();
  ScopedEvent ev(0);
  stream_begin_capture(s);
  event_record(ev.e, s);
  EXPECT_NE(thrown([&] { event_query(ev.e); }).find("not permitted when stream is capturing"),
            std::string::npos);
  EXPECT_NE(thrown([&] { graph_destroy(stream_end_capture(s)); }).find("previous error"),
            std::string::npos);
}

TEST(Graph, CaptureModesDecideWhoMaySynchronizeTheDevice) {
  const Stream s = fresh_stream();
  for (CaptureMode mode : {CaptureMode::kGlobal, CaptureMode::kThreadLocal, CaptureMode::kRelaxed}) {
    stream_begin_capture(s, mode);
    EXPECT_NE(stream_capture_id(s), 0u);
    std::string other;
    std::thread t([&] { other = thrown([&] { device_synchronize(0); }); });
    t.join();
    const bool other_forbidden = mode == CaptureMode::kGlobal;
    EXPECT_EQ(!other.empty(), other_forbidden) << static_cast<int>(mode) << ": " << other;
    const std::string mine = thrown([&] { device_synchronize(0); });
    EXPECT_EQ(!mine.empty(), mode != CaptureMode::kRelaxed) << static_cast<int>(mode);
    // The capturing stream itself is never synchronisable.
    EXPECT_FALSE(thrown([&] { stream_synchronize(s); }).empty());
    EXPECT_FALSE(thrown([&] { graph_destroy(stream_end_capture(s)); }).empty());
    EXPECT_EQ(stream_capture_id(s), 0u);
  }
}

TEST(Graph, JoinedStreamsShareTheCaptureId) {
  const Stream s = fresh_stream();
  const Stream side = fresh_stream();
  ScopedEvent fork(0), join(0);
  stream_begin_capture(s);
  const uint64_t id = stream_capture_id(s);
  event_record(fork.e, s);
  stream_wait_event(side, fork.e);
  EXPECT_EQ(stream_capture_id(side), id);
  event_record(join.e, side);
  stream_wait_event(s, join.e);
  graph_destroy(stream_end_capture(s));
  stream_begin_capture(s);
  EXPECT_NE(stream_capture_id(s), id);  // a new capture, a new id
  graph_destroy(stream_end_capture(s));
}

TEST(Graph, LaunchUncapturedLeavesTheFunctionToTheCaller) {
  const Stream s = fresh_stream();
  int runs = 0;
  std::function<void()> fn = [&runs] { ++runs; };
  EXPECT_TRUE(launch_uncaptured(s, "k", fn));
  stream_synchronize(s);
  EXPECT_EQ(runs, 1);
  std::function<void()> again = [&runs] { ++runs; };
  stream_begin_capture(s);
  EXPECT_FALSE(launch_uncaptured(s, "k", again));
  EXPECT_TRUE(static_cast<bool>(again));  // not consumed
  graph_destroy(stream_end_capture(s));
}

TEST(Graph, UnjoinedStreamFailsTheCapture) {
  const Stream s = fresh_stream();
  const Stream side = fresh_stream();
  ScopedEvent fork(0);
  stream_begin_capture(s);
  event_record(fork.e, s);
  stream_wait_event(side, fork.e);
  launch(side, "b", [] {});
  EXPECT_NE(thrown([&] { stream_end_capture(side); }).find("must end on the stream it began on"),
            std::string::npos);
  const std::string msg = thrown([&] { graph_destroy(stream_end_capture(s)); });
  EXPECT_NE(msg.find("capture was not joined"), std::string::npos) << msg;
  EXPECT_FALSE(stream_is_capturing(side));
  EXPECT_FALSE(stream_is_capturing(s));
}

TEST(Graph, WaitingForOutsideWorkInvalidates) {
  const Stream s = fresh_stream();
  const Stream busy = fresh_stream();
  testing::Gate gate;
  launch(busy, "blocked", [&gate] { gate.wait(); });
  ScopedEvent ev(0);
  event_record(ev.e, busy);
  stream_begin_capture(s);
  const std::string msg = thrown([&] { stream_wait_event(s, ev.e); });
  EXPECT_NE(msg.find("waits for an event recorded outside the capture"), std::string::npos) << msg;
  gate.open();
  EXPECT_NE(thrown([&] { graph_destroy(stream_end_capture(s)); }).find("previous error"),
            std::string::npos);
  stream_synchronize(busy);
}

TEST(Graph, ErrorInReplayNamesTheOp) {
  const Stream s = fresh_stream();
  stream_begin_capture(s);
  launch(s, "fine", [] {});
  launch(s, "boom", [] { throw std::runtime_error("bad index"); });
  ScopedGraph g(stream_end_capture(s));
  graph_launch(g.g, s);
  const std::string msg = thrown([&] { stream_synchronize(s); });
  EXPECT_NE(msg.find("'boom' failed: bad index"), std::string::npos) << msg;
  stream_synchronize(s);  // reported once
}

TEST(Graph, DestroyWhileReplayQueuedIsSafe) {
  const Stream s = fresh_stream();
  auto count = std::make_shared<std::atomic<int>>(0);
  stream_begin_capture(s);
  launch(s, "inc", [count] { count->fetch_add(1); });
  Graph* g = stream_end_capture(s);
  testing::Gate gate;
  launch(s, "blocked", [&gate] { gate.wait(); });
  graph_launch(g, s);
  graph_destroy(g);
  gate.open();
  stream_synchronize(s);
  EXPECT_EQ(count->load(), 1);
}

TEST(Graph, ReplayIntoAnotherCaptureNests) {
  const Stream s = fresh_stream();
  auto count = std::make_shared<std::atomic<int>>(0);
  stream_begin_capture(s);
  launch(s, "inc", [count] { count->fetch_add(1); });
  ScopedGraph inner(stream_end_capture(s));
  stream_begin_capture(s);
  graph_launch(inner.g, s);
  graph_launch(inner.g, s);
  ScopedGraph outer(stream_end_capture(s));
  EXPECT_EQ(graph_num_tasks(outer.g), 2u);
  graph_launch(outer.g, s);
  stream_synchronize(s);
  EXPECT_EQ(count->load(), 2);
}

TEST(Graph, ReplayOnAnotherDeviceIsAnError) {
  AXON_REQUIRE_DEFAULT_ENV();
  const Stream s = fresh_stream();
  stream_begin_capture(s);
  launch(s, "k", [] {});
  ScopedGraph g(stream_end_capture(s));
  EXPECT_NE(thrown([&] { graph_launch(g.g, stream_dedicated(1)); }).find("cannot be replayed"),
            std::string::npos);
}

}  // namespace
}  // namespace axon::rt
