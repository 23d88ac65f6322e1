// Task recording and busy-time accounting behind runtime.h's "profiling"
// section (torch.profiler's device timeline, torch.axon.utilization).
//
// Stream workers call in from StreamState::execute_task and
// StreamState::fuse_timed (profile.cc); enqueue stamps each task with
// launch_stamp().  With recording off a task costs the worker one relaxed
// atomic load for recording and one for the busy accounting, which starts
// with the first device_busy/device_utilization call; from then on a busy run
// of a stream costs two reads of the coarse monotonic clock and two
// compare-and-swaps on its device's busy word.
#pragma once

#include <atomic>
#include <cstdint>

#include "axon/runtime.h"

namespace axon::rt {

// What enqueue records about the launching host thread, for the profiler:
// its correlation id (set_launch_correlation) and when the task was queued.
// Both 0 unless recording is on.
struct LaunchStamp {
  uint64_t correlation = 0;
  int64_t ns = 0;  // device clock
};

namespace profile {

extern std::atomic<bool> g_recording;

inline bool recording() noexcept { return g_recording.load(std::memory_order_relaxed); }

// Event markers (event_record, stream_wait_event) are bookkeeping, not work:
// they are neither recorded nor counted as busy.
bool is_marker(const char* name) noexcept;
TaskKind kind_of(const char* name) noexcept;

extern std::atomic<bool> g_busy_on;

// Busy accounting is on (never turned off again once on).
inline bool busy_on() noexcept { return g_busy_on.load(std::memory_order_relaxed); }

// The device has one more (fewer) stream running a task.  A worker calls
// busy_end only after its own busy_begin.
void busy_begin(int device) noexcept;
void busy_end(int device) noexcept;

// Keeps a record (drops it, counting, beyond kMaxTaskRecords).
void record(TaskRecord&& r) noexcept;

}  // namespace profile

// enqueue's stamp: {0, 0} unless recording (then one thread-local read and a
// clock read).
LaunchStamp launch_stamp_recording() noexcept;
inline LaunchStamp launch_stamp() noexcept {
  return profile::recording() ? launch_stamp_recording() : LaunchStamp{};
}

}  // namespace axon::rt
