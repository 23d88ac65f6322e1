// Task recording and busy-time accounting (runtime.h, "profiling").
#include "profile.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include <time.h>

#include "axon/runtime.h"
#include "stream_state.h"

namespace axon::rt {

int64_t device_clock_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace profile {
namespace {

// The busy accounting's clock: the monotonic clock at its last tick (a few
// ms resolution, but a read costs a few ns where steady_clock's costs tens;
// it is read at the ends of each stream's busy runs, which for a host that
// launches slower than the device runs is every task).  A run measured with
// it is up to a tick too long or too short, as likely one as the other:
// sums over many runs are right on average, and a long run is exact to a
// tick.
int64_t coarse_ns() noexcept {
#ifdef CLOCK_MONOTONIC_COARSE
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
#else
  return device_clock_ns();
#endif
}

// ------------------------------------------------------------------ busy

constexpr int kMaxDevices = 128;
constexpr int kHistory = 64;                        // samples kept per device
constexpr int64_t kSampleEveryNs = 20 * 1000000;    // at most one per 20 ms
constexpr uint64_t kRunningMask = 0xff;             // streams running a task
constexpr int64_t kPeriodNs = kUtilizationPeriodMs * 1000000;

struct Sample {
  int64_t at = 0;    // coarse clock
  int64_t busy = 0;  // busy ns up to `at`
};

// One device's busy time.  `state` packs the number of streams running a
// task (low 8 bits; a device has fewer than 256 streams) with the time, in
// microseconds of the coarse clock, the device last went from idle to busy:
// one word, so that the count and the start of the busy period change
// together.  `total_us` has every finished busy period.
struct alignas(64) Busy {
  std::atomic<uint64_t> state{0};
  std::atomic<int64_t> total_us{0};
  std::atomic<int64_t> last_sample{0};
  // Samples of the busy curve, so that utilization() can look one period
  // back; taken at busy transitions (at most every kSampleEveryNs, never
  // waiting for the lock) and when utilization() is asked.
  std::mutex mu;
  std::array<Sample, kHistory> history{};  // guarded by mu
  int next = 0;                            // guarded by mu
  int count = 0;                           // guarded by mu
};

Busy g_busy[kMaxDevices];

// Busy ns of b up to `now` (coarse clock): finished periods plus the
// running one.  A period that ends while this reads may be missed for that
// instant (state says idle, total_us not yet added): utilization is a
// statistic, not a ledger.
int64_t busy_at(const Busy& b, int64_t now) noexcept {
  const uint64_t s = b.state.load(std::memory_order_acquire);
  int64_t us = b.total_us.load(std::memory_order_acquire);
  if ((s & kRunningMask) != 0) {
    us += std::max<int64_t>(0, now / 1000 - static_cast<int64_t>(s >> 8));
  }
  return us * 1000;
}

void push_sample_locked(Busy& b, int64_t now) {
  b.history[b.next] = Sample{now, busy_at(b, now)};
  b.next = (b.next + 1) % kHistory;
  b.count = std::min(b.count + 1, kHistory);
  b.last_sample.store(now, std::memory_order_relaxed);
}

void maybe_sample(Busy& b, int64_t now) noexcept {
  if (now - b.last_sample.load(std::memory_order_relaxed) < kSampleEveryNs) return;
  std::unique_lock lk(b.mu, std::try_to_lock);
  if (!lk.owns_lock()) return;
  if (now - b.last_sample.load(std::memory_order_relaxed) < kSampleEveryNs) return;
  push_sample_locked(b, now);
}

Busy* busy_of(int device) noexcept {
  return device >= 0 && device < kMaxDevices ? &g_busy[device] : nullptr;
}

}  // namespace

std::atomic<bool> g_busy_on{false};

void busy_begin(int device) noexcept {
  Busy* b = busy_of(device);
  if (b == nullptr) return;
  const int64_t now = coarse_ns();
  uint64_t s = b->state.load(std::memory_order_relaxed);
  uint64_t n;
  do {
    n = (s & kRunningMask) != 0 ? s + 1 : (static_cast<uint64_t>(now / 1000) << 8) | 1;
  } while (!b->state.compare_exchange_weak(s, n, std::memory_order_acq_rel,
                                           std::memory_order_relaxed));
  if ((s & kRunningMask) == 0) maybe_sample(*b, now);
}

void busy_end(int device) noexcept {
  Busy* b = busy_of(device);
  if (b == nullptr) return;
  const int64_t now = coarse_ns();
  uint64_t s = b->state.load(std::memory_order_relaxed);
  while (!b->state.compare_exchange_weak(s, s - 1, std::memory_order_acq_rel,
                                         std::memory_order_relaxed)) {
  }
  if ((s & kRunningMask) == 1) {
    const int64_t since = static_cast<int64_t>(s >> 8);
    b->total_us.fetch_add(std::max<int64_t>(0, now / 1000 - since), std::memory_order_acq_rel);
    maybe_sample(*b, now);
  }
}

// The names event.cc and copy.cc enqueue their tasks with (profile_test.cc
// checks both: markers are left out, copies are kCopy).
bool is_marker(const char* name) noexcept {
  return name != nullptr && (name[0] == 'e' || name[0] == 's') &&
         (std::strcmp(name, "event_record") == 0 || std::strcmp(name, "stream_wait_event") == 0);
}

TaskKind kind_of(const char* name) noexcept {
  return name != nullptr && std::strcmp(name, "memcpy") == 0 ? TaskKind::kCopy
                                                             : TaskKind::kKernel;
}

// ------------------------------------------------------------------ records

std::atomic<bool> g_recording{false};

namespace {

struct Records {
  std::mutex mu;
  std::vector<TaskRecord> records;  // guarded by mu
  uint64_t dropped = 0;             // guarded by mu
};

Records& records() {
  static Records* r = new Records();  // outlives the workers at exit
  return *r;
}

thread_local uint64_t t_correlation = 0;

}  // namespace

void record(TaskRecord&& r) noexcept {
  Records& rs = records();
  std::lock_guard lk(rs.mu);
  if (rs.records.size() >= kMaxTaskRecords) {
    ++rs.dropped;
    return;
  }
  try {
    rs.records.push_back(std::move(r));
  } catch (...) {
    ++rs.dropped;
  }
}

}  // namespace profile

using profile::g_recording;

void set_task_recording(bool on) noexcept { g_recording.store(on, std::memory_order_relaxed); }

bool task_recording() noexcept { return profile::recording(); }

TaskRecords take_task_records() {
  TaskRecords out;
  profile::Records& rs = profile::records();
  std::lock_guard lk(rs.mu);
  out.records.swap(rs.records);
  out.dropped = std::exchange(rs.dropped, 0);
  return out;
}

void set_launch_correlation(uint64_t id) noexcept { profile::t_correlation = id; }

uint64_t launch_correlation() noexcept { return profile::t_correlation; }

LaunchStamp launch_stamp_recording() noexcept {
  return LaunchStamp{profile::t_correlation, device_clock_ns()};
}

DeviceBusy device_busy(int device) {
  check_device(device);
  profile::g_busy_on.store(true, std::memory_order_relaxed);
  const int64_t now = profile::coarse_ns();
  return DeviceBusy{profile::busy_at(profile::g_busy[device], now), now};
}

int device_utilization(int device) {
  using namespace profile;
  check_device(device);
  g_busy_on.store(true, std::memory_order_relaxed);
  Busy& b = g_busy[device];
  const int64_t now = coarse_ns();
  const int64_t busy_now = busy_at(b, now);
  std::lock_guard lk(b.mu);
  if (now - b.last_sample.load(std::memory_order_relaxed) >= kSampleEveryNs) {
    push_sample_locked(b, now);
  }
  if (b.count == 0) return 0;
  // The samples in time order, then `now`: the busy curve one period back,
  // interpolated between the samples around it (or, for a device younger
  // than the period, from its first sample).
  const int64_t from = now - kPeriodNs;
  const int oldest = (b.next - b.count + kHistory) % kHistory;
  const auto sample = [&](int i) {
    return i < b.count ? b.history[(oldest + i) % kHistory] : Sample{now, busy_now};
  };
  int64_t start = sample(0).at;
  int64_t busy_start = sample(0).busy;
  if (start < from) {
    int i = 0;
    while (i + 1 <= b.count && sample(i + 1).at <= from) ++i;
    const Sample lo = sample(i);
    const Sample hi = sample(std::min(i + 1, b.count));
    const int64_t span = hi.at - lo.at;
    start = from;
    busy_start = span > 0 ? lo.busy + static_cast<int64_t>(static_cast<double>(hi.busy - lo.busy) *
                                                          static_cast<double>(from - lo.at) /
                                                          static_cast<double>(span))
                          : lo.busy;
  }
  const int64_t elapsed = now - start;
  if (elapsed <= 0) return 0;
  const int64_t pct = (busy_now - busy_start) * 100 / elapsed;
  return static_cast<int>(std::clamp<int64_t>(pct, 0, 100));
}

// ------------------------------------------------------------------ workers

// Busy accounting per stream: a stream is busy from its first task until it
// runs out of queued work (a task finishes with nothing queued after it, or
// a marker is next), so back-to-back tasks touch the device's busy word only
// at the run's ends.

std::string StreamState::execute_task(Task& task) noexcept {
  if (profile::is_marker(task.name)) {
    if (busy_) {
      busy_ = false;
      profile::busy_end(device_);
    }
    return execute(task.name, task.fn);
  }
  if (!busy_ && profile::busy_on()) {
    busy_ = true;
    profile::busy_begin(device_);
  }
  const bool rec = profile::recording();
  const int64_t start = rec ? device_clock_ns() : 0;
  std::string error = execute(task.name, task.fn);
  const int64_t end = rec ? device_clock_ns() : 0;
  if (busy_ && posted_.load(std::memory_order_relaxed) == task.seq) {
    busy_ = false;
    profile::busy_end(device_);
  }
  if (rec) {
    TaskRecord r;
    r.device = device_;
    r.stream = id_;
    r.kind = profile::kind_of(task.name);
    try {
      r.name = task.name ? task.name : "?";
    } catch (...) {
    }
    r.seq = task.seq;
    r.correlation = task.launch.correlation;
    r.launch_ns = task.launch.ns;
    r.start_ns = start;
    r.end_ns = end;
    r.failed = !error.empty();
    profile::record(std::move(r));
  }
  return error;
}

FusionResult StreamState::fuse_timed(FusionHook hook, std::vector<Task>& run,
                                     FusibleTask* const* tags, const uint64_t* seqs) noexcept {
  if (!busy_ && profile::busy_on()) {
    busy_ = true;
    profile::busy_begin(device_);
  }
  const bool rec = profile::recording();
  const int64_t start = rec ? device_clock_ns() : 0;
  FusionResult result = hook(tags, seqs, run.size());
  const int64_t end = rec ? device_clock_ns() : 0;
  const size_t ran = result.ran >= 2 && result.ran <= run.size() ? result.ran : 0;
  // Declined (ran == 0): execute_task runs the first next and ends the run.
  if (busy_ && ran > 0 && posted_.load(std::memory_order_relaxed) == run[ran - 1].seq) {
    busy_ = false;
    profile::busy_end(device_);
  }
  if (rec && ran > 0) {
    TaskRecord r;
    r.device = device_;
    r.stream = id_;
    r.kind = TaskKind::kFused;
    try {
      r.name = "fused: ";
      for (size_t i = 0; i < ran; ++i) {
        if (i > 0) r.name += ", ";
        r.name += run[i].name ? run[i].name : "?";
      }
    } catch (...) {
    }
    r.seq = run[0].seq;
    r.tasks = static_cast<uint32_t>(ran);
    r.correlation = run[0].launch.correlation;
    r.launch_ns = run[0].launch.ns;
    r.start_ns = start;
    r.end_ns = end;
    r.failed = !result.error.empty();
    profile::record(std::move(r));
  }
  return result;
}

}  // namespace axon::rt
