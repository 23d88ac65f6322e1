// One stream's in-order queue and the worker thread that drains it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "axon/runtime.h"
#include "profile.h"

namespace axon::rt {

class StreamState;

// One failed task: `order` is process-wide (earlier failures have smaller
// numbers), so failures gathered from several streams sort into the order
// they happened.  Shared, never copied: the same failure may be pending on
// several streams (it travels along events, see StreamState::inherit).
struct AsyncFailure {
  AsyncFailure(uint64_t order, std::string message)
      : order(order), message(std::move(message)) {}
  const uint64_t order;
  const std::string message;
  // Every stream that depends on the failure reports it once: a stream it
  // was reported on (a synchronising call on it raised it, or
  // event_synchronize on an event recorded there) drops it and never takes
  // it again, so it cannot come back through a stream nobody synchronises.
  bool reported_on(const StreamState* s) const;
  void mark_reported(const StreamState* s) const;

 private:
  mutable std::mutex mu_;
  mutable std::vector<const StreamState*> reported_on_;  // streams live as long as the process
};
using FailureList = std::vector<std::shared_ptr<const AsyncFailure>>;

// A failure pending on a stream; `inherited` when it reached the stream
// through stream_wait_event rather than failing there.
struct PendingFailure {
  std::shared_ptr<const AsyncFailure> failure;
  bool inherited = false;
};

// Throws AsyncError for `failures` (sorted by order, deduplicated): the first
// one's message, then a list of the others.  `where` names the stream a
// synchronising call reported them on (for inherited failures).  The caller
// marks them reported on the streams it took them from.
// `dropped`: further failures that were not kept (see kMaxPendingFailures).
[[noreturn]] void throw_failures(std::vector<PendingFailure> failures, const std::string& where,
                                 uint64_t dropped = 0);

// Failures a stream keeps until it reports them; later ones are only counted.
constexpr size_t kMaxPendingFailures = 16;

// Tasks get sequence numbers 1, 2, ... in enqueue order; `completed` is the
// sequence number of the last finished task, so "has task n run" is
// completed() >= n, which is all events and pinned-buffer tracking need.
class StreamState {
 public:
  StreamState(int device, int64_t id) : device_(device), id_(id) {}
  ~StreamState();
  StreamState(const StreamState&) = delete;
  StreamState& operator=(const StreamState&) = delete;

  // Starts the worker on first use.  Returns the task's sequence number.
  uint64_t enqueue(const char* name, std::function<void()> fn,
                   FusibleTask* fusible = nullptr);

  // Blocks until task `seq` has run.  Throws Error when called from this
  // stream's own worker, which would otherwise deadlock.
  void wait(uint64_t seq);
  void wait_all();
  uint64_t completed() const;
  uint64_t launched() const { return posted_.load(std::memory_order_acquire); }
  bool idle() const;

  // Throws AsyncError for every failure pending on this stream (its own
  // tasks' and inherited ones, the first raised and the others listed) and
  // clears them.  No-op when none is pending.
  void throw_pending_error();

  // The failures pending now, none reported on this stream yet (an event
  // marker captures them: the event then carries them to every stream that
  // waits on it).
  FailureList pending_failures() const;
  // Makes failures of another stream pending here too (stream_wait_event:
  // everything enqueued after the wait depends on the failed work), except
  // those this stream reported already.
  void inherit(const FailureList& failures);
  // Removes these failures (reported by event_synchronize) from this stream
  // and marks them reported on it.
  void forget(const FailureList& failures);
  // Takes every pending failure, marked reported on this stream
  // (device_synchronize reports them together); adds the count of those not
  // kept to *dropped.
  std::vector<PendingFailure> take_failures(uint64_t* dropped);
  std::string describe() const;  // "axon:0 stream 3"

  // Process exit: the worker finishes its current task and drops the rest.
  // request_stop on every stream first, then finish_stop joins each worker,
  // or detaches it if it is still stuck in a task at `deadline`.
  void request_stop();
  void finish_stop(std::chrono::steady_clock::time_point deadline);

 private:
  struct Task {
    uint64_t seq;
    const char* name;
    std::function<void()> fn;
    FusibleTask* fusible = nullptr;
    LaunchStamp launch;  // profiler: the launching host op (profile.h)
  };

  void run();
  // With the lock held on entry and exit: runs `first` and the fusible tasks
  // queued after it through the fusion hook, if it takes them.
  bool run_fused(Task& first, std::unique_lock<std::mutex>& lk);
  std::string execute(const char* name, std::function<void()>& fn) noexcept;
  // Profiling (profile.cc): execute() timed, counted as busy and, while
  // recording, recorded; and the fusion hook's call, likewise.
  std::string execute_task(Task& task) noexcept;
  FusionResult fuse_timed(FusionHook hook, std::vector<Task>& run, FusibleTask* const* tags,
                          const uint64_t* seqs) noexcept;
  void finish_locked(uint64_t seq, std::string error);

  const int device_;
  const int64_t id_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // worker: queue not empty or stopping
  std::condition_variable done_cv_;  // waiters: completed_ moved, worker exited
  std::deque<Task> queue_;
  uint64_t enqueued_ = 0;
  uint64_t completed_ = 0;
  // Failures not yet reported on this stream, in the order they arrived
  // (at most kMaxPendingFailures; dropped_failures_ counts the rest).
  std::vector<PendingFailure> failures_;
  uint64_t dropped_failures_ = 0;
  std::thread worker_;
  bool stopping_ = false;
  bool exited_ = false;
  // The worker spins briefly for new work before it sleeps; enqueue wakes it
  // (a futex call) only when it sleeps.  Back-to-back small kernels then cost
  // neither side a context switch.
  bool sleeping_ = false;
  std::atomic<uint64_t> posted_{0};  // enqueued_, readable without the lock
  // Worker only (profile.cc): the stream counts as busy for its device's
  // utilization from its first task until it runs out of queued work.
  bool busy_ = false;
};

}  // namespace axon::rt
