// Process exit with stream work still around must neither hang nor crash.
// Each case runs in a child process (death test); a failure shows up as an
// exit code other than 0.
#include <chrono>
#include <cstdlib>
#include <thread>

#include <gtest/gtest.h>

#include "axon/runtime.h"

namespace axon::rt {
namespace {

class Exit : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

void slow() { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }

void exit_with_queued_work() {
  const Stream s = stream_from_pool(0, 0);
  launch(s, "slow", slow);
  for (int i = 0; i < 100; ++i) launch(s, "dropped", [] { std::_Exit(3); });
  std::exit(0);
}

void exit_with_cross_stream_wait() {
  const Stream a = stream_from_pool(0, 0);
  const Stream b = stream_from_pool(1, 0);
  Event* e = event_create(0);
  launch(a, "slow", slow);
  launch(a, "dropped", [] { std::_Exit(3); });
  event_record(e, a);
  stream_wait_event(b, e);
  launch(b, "dropped", [] { std::_Exit(4); });
  event_destroy(e);  // while its marker is still queued
  std::exit(0);
}

TEST_F(Exit, PendingWorkIsDropped) {
  EXPECT_EXIT(exit_with_queued_work(), ::testing::ExitedWithCode(0), "");
}

TEST_F(Exit, StreamWaitingOnAnotherStream) {
  EXPECT_EXIT(exit_with_cross_stream_wait(), ::testing::ExitedWithCode(0), "");
}

// Registered before the runtime starts, so it runs after the workers have
// been stopped: the runtime must still work, inline.
void use_runtime_during_teardown() {
  bool ran = false;
  const Stream s{0, 0};
  launch(s, "late", [&] { ran = true; });
  stream_synchronize(s);
  char src = 42, dst = 0;
  memcpy(&dst, &src, 1, s);
  if (!ran || dst != 42) std::_Exit(5);
}

void exit_after_registering_late_user() {
  std::atexit(use_runtime_during_teardown);
  launch(Stream{0, 0}, "early", slow);
  std::exit(0);
}

TEST_F(Exit, RuntimeUsableFromLaterExitHandlers) {
  EXPECT_EXIT(exit_after_registering_late_user(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace axon::rt
