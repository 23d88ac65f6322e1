#include "graph.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "device.h"
#include "profile.h"

namespace axon::rt {

class Graph {
 public:
  Graph(int device, std::vector<GraphTask> tasks)
      : device(device), tasks(std::make_shared<const std::vector<GraphTask>>(std::move(tasks))) {}
  const int device;
  // Shared with the replays still queued.
  const std::shared_ptr<const std::vector<GraphTask>> tasks;
};

namespace {

std::string stream_name(int device, int64_t id) {
  return "axon:" + std::to_string(device) + " stream " + std::to_string(id);
}

// Ends c on every stream that records into it.  Caller holds dev.capture_mu.
void detach_locked(Device& dev, const Capture* c) {
  for (auto& slot : dev.captures) {
    if (slot.get() == c) {
      slot.reset();
      dev.capturing.fetch_sub(1, std::memory_order_release);
    }
  }
}

}  // namespace

std::shared_ptr<Capture> active_capture(Stream s) {
  Device& dev = device(s.device);
  if (dev.capturing.load(std::memory_order_acquire) == 0) return nullptr;
  check_stream(s);
  std::lock_guard lk(dev.capture_mu);
  return dev.captures[s.id];
}

bool capture_task(Stream s, const char* name, std::function<void()>& fn) {
  auto c = active_capture(s);
  if (!c) return false;
  std::lock_guard lk(c->mu);
  if (c->ended) return false;  // ended meanwhile: the work runs now
  c->tasks.push_back(GraphTask{name, std::move(fn)});
  if (s.id != c->origin) c->side_last[s.id] = c->tasks.size();
  return true;
}

void capture_violation(const std::shared_ptr<Capture>& c, const std::string& what) {
  {
    std::lock_guard lk(c->mu);
    if (c->invalid.empty()) c->invalid = what;
  }
  throw Error("axon error: operation not permitted when stream is capturing: " + what +
              " (the capture begun on " + stream_name(c->device, c->origin) +
              " is invalidated)");
}

void check_device_not_capturing(int d, const char* what) {
  Device* dev = created_device(d);
  if (dev == nullptr || dev->capturing.load(std::memory_order_acquire) == 0) return;
  const auto me = std::this_thread::get_id();
  std::shared_ptr<Capture> first;
  {
    std::lock_guard lk(dev->capture_mu);
    for (auto& c : dev->captures) {
      if (!c) continue;
      const bool forbidden = c->mode == CaptureMode::kGlobal ||
                             (c->mode == CaptureMode::kThreadLocal && c->thread == me);
      if (!forbidden) continue;
      if (!first) first = c;
      std::lock_guard clk(c->mu);
      if (c->invalid.empty()) c->invalid = what;
    }
  }
  if (first) capture_violation(first, what);
}

void capture_wait(Stream s, const std::shared_ptr<Capture>& c, int64_t on, size_t pos) {
  Device& dev = device(s.device);
  check_stream(s);
  std::shared_ptr<Capture> mine;
  {
    std::lock_guard lk(dev.capture_mu);
    mine = dev.captures[s.id];
    if (!mine) {
      std::lock_guard clk(c->mu);
      if (c->ended) return;  // the capture is over: nothing left to wait for
      // Fork: s joins the capture.
      dev.captures[s.id] = c;
      dev.capturing.fetch_add(1, std::memory_order_release);
      return;
    }
  }
  if (mine != c) {
    capture_violation(mine, "a stream waits for an event recorded in another capture");
  }
  if (s.id == c->origin && on != c->origin) {
    std::lock_guard clk(c->mu);
    size_t& upto = c->joined_upto[on];
    upto = std::max(upto, pos);
  }
}

namespace {
std::atomic<uint64_t> g_next_capture_id{1};
}  // namespace

void stream_begin_capture(Stream s, CaptureMode mode) {
  Device& dev = device(s.device);
  check_stream(s);
  std::lock_guard lk(dev.capture_mu);
  if (dev.captures[s.id]) {
    throw Error("axon error: " + stream_name(s.device, s.id) +
                " is already capturing (a capture is in progress on it)");
  }
  dev.captures[s.id] = std::make_shared<Capture>(
      s.device, s.id, mode, g_next_capture_id.fetch_add(1, std::memory_order_relaxed));
  dev.capturing.fetch_add(1, std::memory_order_release);
}

Graph* stream_end_capture(Stream s) {
  Device& dev = device(s.device);
  check_stream(s);
  std::shared_ptr<Capture> c;
  {
    std::lock_guard lk(dev.capture_mu);
    c = dev.captures[s.id];
    if (!c) {
      throw Error("axon error: " + stream_name(s.device, s.id) +
                  " is not capturing (stream_end_capture without stream_begin_capture)");
    }
    if (c->origin != s.id) {
      throw Error("axon error: the capture must end on the stream it began on (" +
                  stream_name(c->device, c->origin) + "), not on " +
                  stream_name(s.device, s.id));
    }
    detach_locked(dev, c.get());
  }
  std::lock_guard clk(c->mu);
  c->ended = true;
  if (!c->invalid.empty()) {
    throw Error("axon error: operation failed due to a previous error during capture: " +
                c->invalid);
  }
  for (const auto& [stream, last] : c->side_last) {
    auto it = c->joined_upto.find(stream);
    if (it == c->joined_upto.end() || it->second < last) {
      throw Error("axon error: capture was not joined: " + stream_name(c->device, stream) +
                  " joined the capture and has work the capturing stream " +
                  stream_name(c->device, c->origin) +
                  " never waited for (record an event on it and wait for it)");
    }
  }
  return new Graph(c->device, std::move(c->tasks));
}

bool stream_is_capturing(Stream s) { return active_capture(s) != nullptr; }

uint64_t stream_capture_id(Stream s) {
  auto c = active_capture(s);
  return c ? c->id : 0;
}

bool device_is_capturing(int d) noexcept {
  if (d < 0 || d >= device_count()) return false;
  Device* dev = created_device(d);
  return dev != nullptr && dev->capturing.load(std::memory_order_acquire) > 0;
}

void graph_launch(Graph* g, Stream s) {
  if (g == nullptr) throw Error("axon: null graph");
  if (s.device != g->device) {
    throw Error("axon: a graph captured on axon:" + std::to_string(g->device) +
                " cannot be replayed on a stream of axon:" + std::to_string(s.device));
  }
  if (g->tasks->empty()) {
    check_stream(s);
    return;
  }
  // While the profiler records, each recorded task shows inside the replay
  // (as a CUDA graph's kernels do), linked to the op that replayed it.
  const uint64_t correlation = profile::recording() ? launch_correlation() : 0;
  launch(s, "graph replay", [tasks = g->tasks, s, correlation] {
    for (const GraphTask& t : *tasks) {
      const bool rec = profile::recording();
      const int64_t start = rec ? device_clock_ns() : 0;
      std::string failed;
      try {
        t.fn();
      } catch (const std::exception& e) {
        failed = e.what();
      }
      if (rec) {
        TaskRecord r;
        r.device = s.device;
        r.stream = s.id;
        r.kind = profile::kind_of(t.name);
        r.name = t.name ? t.name : "?";
        r.correlation = correlation;
        r.start_ns = start;
        r.end_ns = device_clock_ns();
        r.failed = !failed.empty();
        profile::record(std::move(r));
      }
      if (!failed.empty()) {
        throw Error(std::string("'") + (t.name ? t.name : "?") + "' failed: " + failed);
      }
    }
  });
}

void graph_destroy(Graph* g) { delete g; }

size_t graph_num_tasks(const Graph* g) { return g ? g->tasks->size() : 0; }

int graph_device(const Graph* g) { return g ? g->device : -1; }

std::string graph_describe(const Graph* g) {
  std::string out;
  if (g == nullptr) return out;
  for (const GraphTask& t : *g->tasks) {
    out += t.name ? t.name : "?";
    out += '\n';
  }
  return out;
}

}  // namespace axon::rt
