// Asynchronous errors travel along dependencies (runtime.h, AsyncError):
// events carry the failures before them, streams that wait on such an event
// take them, and a synchronising call reports every pending failure.
#include <atomic>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "axon/runtime.h"
#include "test_util.h"

namespace axon::rt {
namespace {

using testing::Gate;

using testing::ScopedEvent;

void fail(Stream s, const char* name, const char* what) {
  launch(s, name, [what] { throw std::runtime_error(what); });
}

// The message of the AsyncError fn throws ("" if none).
template <typename F>
std::string async_error_of(F&& fn) {
  try {
    fn();
  } catch (const AsyncError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(AsyncErrors, TravelThroughEventToWaitingStream) {
  const Stream s = stream_from_pool(2, 0);
  const Stream t{2, 0};
  ScopedEvent ev(2);
  fail(s, "fails_on_s", "index out of range");
  event_record(ev.e, s);
  stream_wait_event(t, ev.e);
  std::atomic<int> later{0};
  launch(t, "after_wait", [&] { ++later; });
  const std::string msg = async_error_of([&] { stream_synchronize(t); });
  EXPECT_TRUE(contains(msg, "asynchronous error in 'fails_on_s' on axon:2 stream " +
                                std::to_string(s.id) + ": index out of range"))
      << msg;
  EXPECT_TRUE(contains(msg, "reported on axon:2 stream 0, which waited for the failed work"))
      << msg;
  EXPECT_EQ(later.load(), 1);  // work after the wait still runs
  EXPECT_NO_THROW(stream_synchronize(t));  // reported once on t
  // The failing stream reports it too: its own results are just as wrong.
  EXPECT_TRUE(contains(async_error_of([&] { stream_synchronize(s); }), "fails_on_s"));
  EXPECT_NO_THROW(stream_synchronize(s));
  EXPECT_NO_THROW(device_synchronize(2));
}

TEST(AsyncErrors, TasksSeeTheFailuresTheyDependOn) {
  // stream_pending_failure, from a task: the earliest failure the work it
  // depends on left pending (its own stream's, or inherited at a wait), until
  // a synchronising call reports it.
  const Stream s = stream_from_pool(3, 0);
  const Stream t = stream_from_pool(3, 0);
  ScopedEvent ev(3);
  std::string seen_before, seen_after, seen_on_s, seen_event;
  launch(t, "before", [&] { seen_before = stream_pending_failure(t); });
  fail(s, "first", "index out of range");
  fail(s, "second", "later failure");
  launch(s, "on_s", [&] { seen_on_s = stream_pending_failure(s); });
  event_record(ev.e, s);
  stream_wait_event(t, ev.e);
  launch(t, "after", [&] {
    seen_after = stream_pending_failure(t);
    seen_event = event_pending_failure(ev.e);  // the event carries the same failure
  });
  EXPECT_NE(async_error_of([&] { stream_synchronize(t); }), "");
  EXPECT_EQ(seen_before, "");
  EXPECT_TRUE(contains(seen_after, "'first'") && contains(seen_after, "index out of range"))
      << seen_after;
  EXPECT_TRUE(contains(seen_on_s, "index out of range")) << seen_on_s;
  EXPECT_TRUE(contains(seen_event, "index out of range")) << seen_event;
  // Reported on t: no longer pending there; s and the event recorded on s
  // still carry it until s reports it.
  EXPECT_EQ(stream_pending_failure(t), "");
  EXPECT_TRUE(contains(event_pending_failure(ev.e), "index out of range"));
  EXPECT_NE(async_error_of([&] { stream_synchronize(s); }), "");
  EXPECT_EQ(stream_pending_failure(s), "");
  EXPECT_EQ(event_pending_failure(ev.e), "");
}

TEST(AsyncErrors, WaitEnqueuedBeforeTheFailureRuns) {
  const Stream s = stream_from_pool(2, 0);
  const Stream t = stream_from_pool(2, -1);
  ScopedEvent ev(2);
  Gate gate;
  launch(s, "gate", [&] { gate.wait(); });
  fail(s, "late_failure", "device-side assert");
  event_record(ev.e, s);
  stream_wait_event(t, ev.e);  // the event is not complete yet
  char src = 1, dst = 0;
  gate.open();
  // A blocking copy on t (pageable memory) is a synchronising call.
  EXPECT_TRUE(contains(async_error_of([&] { memcpy(&dst, &src, 1, t); }), "late_failure"));
  EXPECT_TRUE(contains(async_error_of([&] { device_synchronize(2); }), "late_failure"));
  EXPECT_NO_THROW(device_synchronize(2));
}

TEST(AsyncErrors, AcrossDevicesAndAlongChains) {
  AXON_REQUIRE_DEFAULT_ENV();
  const Stream s = stream_from_pool(1, 0);
  const Stream t{3, 0};
  const Stream u = stream_from_pool(4, 0);
  ScopedEvent e1(1), e2(3);
  fail(s, "fails_on_axon1", "bad index");
  event_record(e1.e, s);
  stream_wait_event(t, e1.e);
  event_record(e2.e, t);
  stream_wait_event(u, e2.e);
  EXPECT_TRUE(contains(async_error_of([&] { stream_synchronize(u); }), "fails_on_axon1"));
  // t passed it on, but its own work after the wait depends on it too.
  EXPECT_TRUE(contains(async_error_of([&] { device_synchronize(3); }), "fails_on_axon1"));
  EXPECT_TRUE(contains(async_error_of([&] { device_synchronize(1); }), "fails_on_axon1"));
  for (int d : {1, 3, 4}) EXPECT_NO_THROW(device_synchronize(d));
}

TEST(AsyncErrors, CompleteEventStillCarriesTheFailure) {
  const Stream s = stream_from_pool(2, 0);
  const Stream t = stream_from_pool(2, 0);
  ScopedEvent ev(2);
  fail(s, "done_already", "x");
  event_record(ev.e, s);
  while (!event_query(ev.e)) {
  }
  stream_wait_event(t, ev.e);  // nothing to wait for, but the failure travels
  EXPECT_TRUE(contains(async_error_of([&] { stream_synchronize(t); }), "done_already"));
  EXPECT_TRUE(contains(async_error_of([&] { device_synchronize(2); }), "done_already"));
}

TEST(AsyncErrors, EventSynchronizeReportsOnceForItsStream) {
  const Stream s = stream_from_pool(2, 0);
  const Stream t = stream_from_pool(2, -1);
  ScopedEvent ev(2);
  fail(s, "before_event", "y");
  event_record(ev.e, s);
  EXPECT_TRUE(contains(async_error_of([&] { event_synchronize(ev.e); }), "before_event"));
  EXPECT_NO_THROW(event_synchronize(ev.e));
  EXPECT_NO_THROW(stream_synchronize(s));  // reported through the event
  // A stream that waits on the event afterwards still depends on the failed
  // work: it reports the failure once.
  stream_wait_event(t, ev.e);
  EXPECT_TRUE(contains(async_error_of([&] { stream_synchronize(t); }), "before_event"));
  EXPECT_NO_THROW(stream_synchronize(t));
  EXPECT_NO_THROW(event_synchronize(ev.e));
}

TEST(AsyncErrors, EveryDependentStreamReportsWhicheverIsSynchronizedFirst) {
  // The failing stream first, then the stream that waited: both report it
  // (the other order is TravelThroughEventToWaitingStream).
  const Stream s = stream_from_pool(2, 0);
  const Stream t = stream_from_pool(2, 0);
  ScopedEvent ev(2);
  fail(s, "origin", "o");
  event_record(ev.e, s);
  stream_wait_event(t, ev.e);
  EXPECT_TRUE(contains(async_error_of([&] { stream_synchronize(s); }), "origin"));
  EXPECT_NO_THROW(stream_synchronize(s));
  const std::string msg = async_error_of([&] { stream_synchronize(t); });
  EXPECT_TRUE(contains(msg, "origin")) << msg;
  EXPECT_TRUE(contains(msg, "which waited for the failed work")) << msg;
  EXPECT_NO_THROW(stream_synchronize(t));
  EXPECT_NO_THROW(device_synchronize(2));
}

TEST(AsyncErrors, ReportedFailureDoesNotResurfaceThroughAnUnsyncedStream) {
  // A stream nobody synchronises (a communication stream) took the failure;
  // once the user saw it, later waits on that stream do not raise it again
  // on the user's stream.  The communication stream itself reports it once,
  // to device_synchronize (its work after the wait depends on it).
  const Stream user{2, 0};
  const Stream comm = stream_from_pool(2, 0);
  ScopedEvent ready(2), done(2);
  fail(user, "user_kernel", "k");
  event_record(ready.e, user);
  stream_wait_event(comm, ready.e);
  EXPECT_TRUE(contains(async_error_of([&] { stream_synchronize(user); }), "user_kernel"));
  for (int i = 0; i < 2; ++i) {
    launch(comm, "collective", [] {});
    event_record(done.e, comm);
    stream_wait_event(user, done.e);
    EXPECT_NO_THROW(stream_synchronize(user));
  }
  EXPECT_TRUE(contains(async_error_of([&] { device_synchronize(2); }), "user_kernel"));
  launch(comm, "collective", [] {});
  event_record(done.e, comm);
  stream_wait_event(user, done.e);
  EXPECT_NO_THROW(stream_synchronize(user));
  EXPECT_NO_THROW(event_synchronize(done.e));
  EXPECT_NO_THROW(device_synchronize(2));
}

TEST(AsyncErrors, EventRecordedAfterReportDoesNotCarryIt) {
  const Stream s = stream_from_pool(2, 0);
  const Stream t = stream_from_pool(2, 0);
  ScopedEvent ev(2);
  fail(s, "reported_first", "z");
  EXPECT_THROW(stream_synchronize(s), AsyncError);
  event_record(ev.e, s);
  stream_wait_event(t, ev.e);
  EXPECT_NO_THROW(stream_synchronize(t));
  EXPECT_NO_THROW(event_synchronize(ev.e));
}

TEST(AsyncErrors, EventWaitReportsNothingAndConsumesNothing) {
  const Stream s = stream_from_pool(2, 0);
  ScopedEvent ev(2);
  fail(s, "for_the_user", "w");
  event_record(ev.e, s);
  EXPECT_NO_THROW(event_wait(ev.e));
  EXPECT_TRUE(event_query(ev.e));
  EXPECT_TRUE(contains(async_error_of([&] { event_synchronize(ev.e); }), "for_the_user"));
}

TEST(AsyncErrors, DeviceWaitReportsNothingAndConsumesNothing) {
  const Stream s = stream_from_pool(2, 0);
  std::atomic<bool> ran{false};
  fail(s, "still_pending", "v");
  launch(s, "after", [&] { ran = true; });
  EXPECT_NO_THROW(device_wait(2));
  EXPECT_TRUE(ran.load());
  EXPECT_TRUE(contains(async_error_of([&] { device_synchronize(2); }), "still_pending"));
  EXPECT_THROW(device_wait(99), InvalidDeviceError);
}

TEST(AsyncErrors, TwoFailuresOnTwoStreamsBothReported) {
  const Stream a = stream_from_pool(2, 0);
  const Stream b = stream_from_pool(2, -1);
  ScopedEvent ev(2);
  fail(a, "first_failure", "one");
  event_record(ev.e, a);
  event_wait(ev.e);  // a's failure happens first
  fail(b, "second_failure", "two");
  stream_wait_event(b, ev.e);  // b now has a's failure too: reported once
  const std::string msg = async_error_of([&] { device_synchronize(2); });
  EXPECT_EQ(msg.find("axon: asynchronous error in 'first_failure'"), 0u) << msg;
  EXPECT_TRUE(contains(msg, "\n1 more asynchronous error since the last synchronization:\n"
                            "  axon: asynchronous error in 'second_failure'"))
      << msg;
  EXPECT_EQ(msg.find("first_failure"), msg.rfind("first_failure")) << msg;
  EXPECT_NO_THROW(device_synchronize(2));
}

TEST(AsyncErrors, InheritedAndOwnFailureOnOneStreamInOrder) {
  const Stream s = stream_from_pool(2, 0);
  const Stream t = stream_from_pool(2, 0);
  ScopedEvent ev(2);
  fail(s, "upstream", "u");
  event_record(ev.e, s);
  stream_wait_event(t, ev.e);
  fail(t, "downstream", "d");
  const std::string msg = async_error_of([&] { stream_synchronize(t); });
  EXPECT_LT(msg.find("upstream"), msg.find("downstream")) << msg;
  EXPECT_TRUE(contains(msg, "1 more asynchronous error")) << msg;
  EXPECT_THROW(stream_synchronize(s), AsyncError);
}

TEST(AsyncErrors, ManyFailuresAreCountedPastTheListLimit) {
  const Stream s = stream_from_pool(2, 0);
  for (int i = 0; i < 20; ++i) fail(s, "many", "again");
  const std::string msg = async_error_of([&] { stream_synchronize(s); });
  EXPECT_TRUE(contains(msg, "19 more asynchronous errors since the last synchronization"))
      << msg;
  EXPECT_TRUE(contains(msg, "... and 4 more (not kept)")) << msg;
  EXPECT_NO_THROW(stream_synchronize(s));
}

}  // namespace
}  // namespace axon::rt
