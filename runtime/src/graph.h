// Stream capture (graphs): the state of the captures in progress, shared by
// the calls that record into them (launch, memcpy, events) and those that a
// capture forbids (synchronising calls).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "axon/runtime.h"

namespace axon::rt {

struct GraphTask {
  const char* name;
  std::function<void()> fn;
};

struct Capture {
  Capture(int device, int64_t origin, CaptureMode mode, uint64_t id)
      : device(device), origin(origin), mode(mode), id(id),
        thread(std::this_thread::get_id()) {}
  const int device;
  const int64_t origin;  // the stream the capture began on
  const CaptureMode mode;
  const uint64_t id;
  const std::thread::id thread;  // the thread that began it
  std::mutex mu;         // guards the rest
  std::vector<GraphTask> tasks;
  std::string invalid;   // the first illegal call, if any
  bool ended = false;
  // Joined streams: the task count after each one's last recorded task, and
  // the position up to which the origin waited for it.
  std::map<int64_t, size_t> side_last;
  std::map<int64_t, size_t> joined_upto;
};

// The capture s records into, or null.  Cheap when the device captures
// nothing (one atomic load).
std::shared_ptr<Capture> active_capture(Stream s);

// Records fn into s's capture and returns true; false if s does not capture
// (or its capture just ended).
bool capture_task(Stream s, const char* name, std::function<void()>& fn);

// s waits for an event recorded during `capture` at `pos` on stream `on`:
// joins the capture, or notes the join on its origin.
void capture_wait(Stream s, const std::shared_ptr<Capture>& capture, int64_t on, size_t pos);

// An illegal call during a capture: invalidates `capture` and throws Error
// naming `what`.
[[noreturn]] void capture_violation(const std::shared_ptr<Capture>& capture,
                                    const std::string& what);
// The same for a synchronising call on the whole device, if it captures.
void check_device_not_capturing(int device, const char* what);

}  // namespace axon::rt
