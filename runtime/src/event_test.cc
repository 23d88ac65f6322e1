#include <chrono>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

#include "axon/runtime.h"
#include "test_util.h"

namespace axon::rt {
namespace {

using testing::Gate;

using testing::ScopedEvent;

TEST(Event, NeverRecordedIsComplete) {
  ScopedEvent a(0), b(0);
  EXPECT_EQ(event_device(a.e), 0);
  EXPECT_TRUE(event_query(a.e));
  EXPECT_NO_THROW(event_synchronize(a.e));
  try {
    event_elapsed_ms(a.e, b.e);
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "Both events must be recorded and completed before calculating elapsed time");
  }
  // Waiting on it is a no-op: later work runs at once.
  const Stream s = stream_from_pool(0, 0);
  stream_wait_event(s, a.e);
  bool ran = false;
  launch(s, "after_wait", [&] { ran = true; });
  stream_synchronize(s);
  EXPECT_TRUE(ran);
}

TEST(Event, RecordQuerySynchronize) {
  AXON_REQUIRE_DEFAULT_ENV();
  ScopedEvent ev(1);
  const Stream s = stream_from_pool(1, 0);
  Gate gate;
  launch(s, "gate", [&] { gate.wait(); });
  event_record(ev.e, s);
  EXPECT_FALSE(event_query(ev.e));
  gate.open();
  event_synchronize(ev.e);
  EXPECT_TRUE(event_query(ev.e));
}

TEST(Event, ElapsedTimeCoversWorkBetweenRecords) {
  ScopedEvent start(0), end(0);
  const Stream s = stream_from_pool(0, 0);
  event_record(start.e, s);
  launch(s, "sleep", [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
  event_record(end.e, s);
  event_synchronize(end.e);
  EXPECT_GE(event_elapsed_ms(start.e, end.e), 19.0);  // loose lower bound only
}

TEST(Event, ElapsedTimeNeedsCompletedEvents) {
  AXON_REQUIRE_DEFAULT_ENV();
  ScopedEvent start(0), end(0);
  const Stream s = stream_from_pool(0, 0);
  event_record(start.e, s);
  Gate gate;
  launch(s, "gate", [&] { gate.wait(); });
  event_record(end.e, s);
  EXPECT_THROW(event_elapsed_ms(start.e, end.e), Error);
  gate.open();
  event_synchronize(end.e);
  EXPECT_GE(event_elapsed_ms(start.e, end.e), 0.0);
}

TEST(Event, ReRecordingMovesTheEvent) {
  AXON_REQUIRE_DEFAULT_ENV();
  ScopedEvent ev(2);
  const Stream s = stream_from_pool(2, 0);
  event_record(ev.e, s);
  event_synchronize(ev.e);
  EXPECT_TRUE(event_query(ev.e));
  Gate gate;
  launch(s, "gate", [&] { gate.wait(); });
  event_record(ev.e, s);
  EXPECT_FALSE(event_query(ev.e));  // refers to the latest record now
  gate.open();
  event_synchronize(ev.e);
  EXPECT_TRUE(event_query(ev.e));
}

void check_cross_stream_ordering(Stream a, Stream b) {
  ScopedEvent ev(a.device);
  Gate gate;
  int written = 0;  // written on a, read on b: the event wait orders them
  int observed = -1;
  launch(a, "gate", [&] { gate.wait(); });
  launch(a, "write", [&] { written = 1; });
  event_record(ev.e, a);
  stream_wait_event(b, ev.e);
  launch(b, "read", [&] { observed = written; });
  EXPECT_FALSE(stream_query(b));  // b is held back by a's gate
  gate.open();
  stream_synchronize(b);
  EXPECT_EQ(observed, 1);
  stream_synchronize(a);
}

TEST(Event, StreamWaitEventOrdersStreams) {
  AXON_REQUIRE_DEFAULT_ENV();
  check_cross_stream_ordering(stream_from_pool(3, 0), stream_from_pool(3, -1));
}

TEST(Event, StreamWaitEventAcrossDevices) {
  AXON_REQUIRE_DEFAULT_ENV();
  check_cross_stream_ordering(stream_from_pool(3, 0), stream_from_pool(4, 0));
}

TEST(Event, SynchronizeRethrowsAsyncErrorOfRecordedStream) {
  ScopedEvent ev(5);
  const Stream s = stream_from_pool(5, 0);
  launch(s, "fails_before_event", [] { throw std::runtime_error("oops"); });
  event_record(ev.e, s);
  EXPECT_THROW(event_synchronize(ev.e), AsyncError);
  EXPECT_NO_THROW(event_synchronize(ev.e));
  EXPECT_NO_THROW(stream_synchronize(s));
}

TEST(Event, DestroyWhileMarkerIsPending) {
  AXON_REQUIRE_DEFAULT_ENV();
  const Stream s = stream_from_pool(6, 0);
  Gate gate;
  launch(s, "gate", [&] { gate.wait(); });
  Event* e = event_create(6);
  event_record(e, s);
  event_destroy(e);
  gate.open();
  stream_synchronize(s);
}

TEST(Event, RecordOnAnotherDevicesStreamThrows) {
  AXON_REQUIRE_DEFAULT_ENV();
  ScopedEvent ev(0);
  EXPECT_THROW(event_record(ev.e, Stream{1, 0}), Error);
  EXPECT_THROW(event_query(nullptr), Error);
}

}  // namespace
}  // namespace axon::rt
