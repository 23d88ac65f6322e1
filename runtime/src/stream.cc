#include <algorithm>

#include "axon/runtime.h"
#include "device.h"
#include "graph.h"

namespace axon::rt {

// Stream ids: 0 default, 1..kStreamPoolSize normal pool, then the high pool,
// then the dedicated streams.

void check_stream(Stream s) {
  check_device(s.device);
  if (s.id < 0 || s.id >= kStreamsPerDevice) {
    throw Error("axon: invalid stream id " + std::to_string(s.id) + " on axon:" +
                std::to_string(s.device) + " (valid ids are 0.." +
                std::to_string(kStreamsPerDevice - 1) + ")");
  }
}

StreamState& stream_state(Stream s) {
  check_stream(s);
  return *device(s.device).streams[s.id];
}

Stream stream_from_pool(int d, int priority) {
  Device& dev = device(d);
  const bool high = priority < 0;
  const uint32_t n = dev.next_in_pool[high].fetch_add(1, std::memory_order_relaxed);
  return Stream{d, 1 + static_cast<int64_t>(n % kStreamPoolSize) + (high ? kStreamPoolSize : 0)};
}

Stream stream_dedicated(int d) {
  Device& dev = device(d);
  const uint32_t n = dev.next_dedicated.fetch_add(1, std::memory_order_relaxed);
  return Stream{d, 1 + 2 * kStreamPoolSize + static_cast<int64_t>(n % kDedicatedStreams)};
}

int stream_priority(Stream s) {
  check_stream(s);
  return s.id > kStreamPoolSize && s.id <= 2 * kStreamPoolSize ? -1 : 0;
}

void launch(Stream s, const char* name, std::function<void()> fn) {
  StreamState& st = stream_state(s);
  if (!fn) throw Error("axon: launch of an empty function on axon:" + std::to_string(s.device));
  if (capture_task(s, name, fn)) return;
  const uint64_t seq = st.enqueue(name, std::move(fn));
  if (launch_blocking()) {
    st.wait(seq);
    st.throw_pending_error();
  }
}

void launch(Stream s, const char* name, std::function<void()> fn, FusibleTask* fusible) {
  StreamState& st = stream_state(s);
  if (!fn) throw Error("axon: launch of an empty function on axon:" + std::to_string(s.device));
  if (capture_task(s, name, fn)) return;  // a graph's tasks run one by one
  // Launch-blocking runs op by op: nothing is ever queued behind a task.
  const bool blocking = launch_blocking();
  const uint64_t seq = st.enqueue(name, std::move(fn), blocking ? nullptr : fusible);
  if (blocking) {
    st.wait(seq);
    st.throw_pending_error();
  }
}

bool launch_uncaptured(Stream s, const char* name, std::function<void()>& fn,
                       FusibleTask* fusible) {
  StreamState& st = stream_state(s);
  if (!fn) throw Error("axon: launch of an empty function on axon:" + std::to_string(s.device));
  if (active_capture(s)) return false;
  const bool blocking = launch_blocking();
  const uint64_t seq = st.enqueue(name, std::move(fn), blocking ? nullptr : fusible);
  if (blocking) {
    st.wait(seq);
    st.throw_pending_error();
  }
  return true;
}

void stream_synchronize(Stream s) {
  StreamState& st = stream_state(s);
  if (auto c = active_capture(s)) capture_violation(c, "stream_synchronize");
  st.wait_all();
  st.throw_pending_error();
}

bool stream_query(Stream s) {
  StreamState& st = stream_state(s);
  if (auto c = active_capture(s)) capture_violation(c, "stream_query");
  return st.idle();
}

uint64_t stream_launched(Stream s) { return stream_state(s).launched(); }

void* stream_native_handle(Stream s) { return &stream_state(s); }

std::string stream_pending_failure(Stream s) {
  const FailureList failures = stream_state(s).pending_failures();
  const auto first = std::min_element(failures.begin(), failures.end(),
                                      [](const auto& a, const auto& b) { return a->order < b->order; });
  return first == failures.end() ? std::string() : (*first)->message;
}

}  // namespace axon::rt
