// Helpers for deterministic runtime tests.
#pragma once

#include <condition_variable>
#include <cstdlib>
#include <mutex>

#include <gtest/gtest.h>

#include "axon/runtime.h"

namespace axon::rt::testing {

// A one-shot gate: stream work blocks on it until the test opens it.  (A
// mutex + condition variable rather than std::latch keeps TSan fully aware of
// the synchronisation.)
class Gate {
 public:
  void wait() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return open_; });
  }
  void open() {
    {
      std::lock_guard lk(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Owns an event for the test's scope.
struct ScopedEvent {
  explicit ScopedEvent(int d) : e(event_create(d)) {}
  ~ScopedEvent() { event_destroy(e); }
  ScopedEvent(const ScopedEvent&) = delete;
  ScopedEvent& operator=(const ScopedEvent&) = delete;
  Event* e;
};

// Most tests assume the defaults (8 devices, asynchronous launches).
inline bool default_environment() {
  for (const char* var : {"AXON_NUM_DEVICES", "AXON_DEVICE_MEMORY", "AXON_LOGICAL_CORE_CONFIG",
                          "AXON_LAUNCH_BLOCKING"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') return false;
  }
  return true;
}

}  // namespace axon::rt::testing

#define AXON_REQUIRE_DEFAULT_ENV() \
  if (!::axon::rt::testing::default_environment()) GTEST_SKIP() << "needs the default AXON_* environment"
