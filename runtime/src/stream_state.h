// One stream's in-order queue and the worker thread that drains it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace axon::rt {

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
  uint64_t enqueue(const char* name, std::function<void()> fn);

  // Blocks until task `seq` has run.  Throws Error when called from this
  // stream's own worker, which would otherwise deadlock.
  void wait(uint64_t seq);
  void wait_all();
  uint64_t completed() const;
  bool idle() const;

  // Throws the first error of a task since the last call (and clears it).
  void throw_pending_error();

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
  };

  void run();
  std::string execute(const char* name, std::function<void()>& fn) noexcept;
  void finish_locked(uint64_t seq, std::string error);

  const int device_;
  const int64_t id_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // worker: queue not empty or stopping
  std::condition_variable done_cv_;  // waiters: completed_ moved, worker exited
  std::deque<Task> queue_;
  uint64_t enqueued_ = 0;
  uint64_t completed_ = 0;
  std::string error_;  // first pending async error; empty means none
  std::thread worker_;
  bool stopping_ = false;
  bool exited_ = false;
  // The worker spins briefly for new work before it sleeps; enqueue wakes it
  // (a futex call) only when it sleeps.  Back-to-back small kernels then cost
  // neither side a context switch.
  bool sleeping_ = false;
  std::atomic<uint64_t> posted_{0};  // enqueued_, readable without the lock
};

}  // namespace axon::rt
