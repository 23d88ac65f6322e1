#include "stream_state.h"
#include "spin.h"

#include <algorithm>
#include <exception>
#include <system_error>
#include <utility>

#include "axon/runtime.h"

#ifdef __linux__
#include <pthread.h>
#endif

namespace axon::rt {
namespace {

constexpr auto kSpin = std::chrono::microseconds(50);
std::atomic<IdleHook> g_idle_hook{nullptr};  // set_idle_hook

// The queue's lock is held for a few instructions, by the host (enqueue) and
// the worker (take a task, finish one).  A thread that finds it held spins
// for it a little rather than sleeping at once in the kernel: sleeping costs
// it a futex wait and the holder a futex wake, several microseconds on both
// sides, against tens of nanoseconds of waiting.
constexpr int kLockSpins = 256;

void lock_spinning(std::unique_lock<std::mutex>& lk) {
  for (int i = 0; i < kLockSpins; ++i) {
    if (lk.try_lock()) return;
    spin_pause();
  }
  lk.lock();
}

std::atomic<uint64_t> g_failure_order{0};

void add_failure(const StreamState* self, std::vector<PendingFailure>& list, uint64_t& dropped,
                 std::shared_ptr<const AsyncFailure> f, bool inherited) {
  if (inherited && f->reported_on(self)) return;
  for (const auto& p : list)
    if (p.failure == f) return;
  if (list.size() >= kMaxPendingFailures) {
    ++dropped;
    return;
  }
  list.push_back(PendingFailure{std::move(f), inherited});
}

}  // namespace

bool AsyncFailure::reported_on(const StreamState* s) const {
  std::lock_guard lk(mu_);
  return std::find(reported_on_.begin(), reported_on_.end(), s) != reported_on_.end();
}

void AsyncFailure::mark_reported(const StreamState* s) const {
  std::lock_guard lk(mu_);
  if (std::find(reported_on_.begin(), reported_on_.end(), s) == reported_on_.end())
    reported_on_.push_back(s);
}

void throw_failures(std::vector<PendingFailure> failures, const std::string& where,
                    uint64_t dropped) {
  std::stable_sort(failures.begin(), failures.end(), [](const auto& a, const auto& b) {
    return a.failure->order < b.failure->order;
  });
  // Deduplicate (device_synchronize gathers one failure from several streams);
  // a failure counts as the stream's own if any stream had it as its own.
  std::vector<PendingFailure> unique;
  for (auto& p : failures) {
    if (!unique.empty() && unique.back().failure == p.failure) {
      unique.back().inherited = unique.back().inherited && p.inherited;
      continue;
    }
    unique.push_back(std::move(p));
  }
  if (unique.empty()) throw AsyncError("axon: asynchronous error (no details kept)");
  std::string msg = unique.front().failure->message;
  if (unique.front().inherited && !where.empty()) {
    msg += " (reported on " + where + ", which waited for the failed work through an event)";
  }
  const uint64_t more = unique.size() - 1 + dropped;
  if (more > 0) {
    msg += "\n" + std::to_string(more) + " more asynchronous error" + (more == 1 ? "" : "s") +
           " since the last synchronization:";
    for (size_t i = 1; i < unique.size(); ++i) msg += "\n  " + unique[i].failure->message;
    if (dropped > 0) msg += "\n  ... and " + std::to_string(dropped) + " more (not kept)";
  }
  throw AsyncError(msg);
}

StreamState::~StreamState() {
  // Devices live for the whole process, so this only runs for a StreamState
  // owned elsewhere; never leave a joinable std::thread behind.
  request_stop();
  finish_stop(std::chrono::steady_clock::time_point::max());
}

uint64_t StreamState::enqueue(const char* name, std::function<void()> fn,
                             FusibleTask* fusible) {
  std::unique_lock lk(mu_, std::defer_lock);
  lock_spinning(lk);
  if (stopping_) {
    // Teardown (static destructors) still gets its work done, inline.
    const uint64_t seq = ++enqueued_;
    lk.unlock();
    std::string error = execute(name, fn);
    fn = nullptr;
    lk.lock();
    finish_locked(seq, std::move(error));
    return seq;
  }
  if (!worker_.joinable()) {
    try {
      worker_ = std::thread(&StreamState::run, this);
    } catch (const std::system_error& e) {
      throw Error("axon: cannot start the worker of axon:" + std::to_string(device_) +
                  " stream " + std::to_string(id_) + ": " + e.what());
    }
  }
  const uint64_t seq = ++enqueued_;
  queue_.push_back(Task{seq, name, std::move(fn), fusible, launch_stamp()});
  posted_.store(seq, std::memory_order_release);
  const bool wake = sleeping_;
  lk.unlock();
  if (wake) work_cv_.notify_one();
  return seq;
}

void StreamState::run() {
#ifdef __linux__
  // Names show up in gdb and top; 15 characters max.
  const std::string name = "axon" + std::to_string(device_) + ":s" + std::to_string(id_);
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
#endif
  std::unique_lock lk(mu_);
  for (;;) {
    if (queue_.empty() && !stopping_) {
      const uint64_t seen = enqueued_;
      lk.unlock();
      const auto until = std::chrono::steady_clock::now() + kSpin;
      while (posted_.load(std::memory_order_acquire) == seen &&
             std::chrono::steady_clock::now() < until) {
        spin_pause();
      }
      if (posted_.load(std::memory_order_acquire) == seen) {
        if (const IdleHook hook = g_idle_hook.load(std::memory_order_acquire)) hook();
      }
      lock_spinning(lk);
      sleeping_ = true;
      work_cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      sleeping_ = false;
    }
    if (stopping_) break;
    Task task = std::move(queue_.front());
    queue_.pop_front();
    if (task.fusible != nullptr && !queue_.empty() && queue_.front().fusible != nullptr &&
        run_fused(task, lk)) {
      continue;
    }
    lk.unlock();
    std::string error = execute_task(task);
    // Captures may own runtime resources (buffers, events); release them
    // before relocking so their destructors can call back into the runtime.
    task.fn = nullptr;
    lock_spinning(lk);
    finish_locked(task.seq, std::move(error));
  }
  // Dropped work counts as done so that no waiter (nor exit) hangs on it.
  std::deque<Task> dropped = std::move(queue_);
  queue_.clear();
  completed_ = enqueued_;
  exited_ = true;
  done_cv_.notify_all();
  lk.unlock();
  dropped.clear();
}

namespace {
std::atomic<FusionHook> g_fusion_hook{nullptr};
}  // namespace

void set_fusion_hook(FusionHook hook) { g_fusion_hook.store(hook, std::memory_order_release); }
void set_idle_hook(IdleHook hook) { g_idle_hook.store(hook, std::memory_order_release); }

bool StreamState::run_fused(Task& first, std::unique_lock<std::mutex>& lk) {
  const FusionHook hook = g_fusion_hook.load(std::memory_order_acquire);
  if (hook == nullptr) return false;
  // The run as queued now: work the host enqueues meanwhile waits its turn.
  std::vector<Task> run;
  run.reserve(8);
  run.push_back(std::move(first));
  while (!queue_.empty() && queue_.front().fusible != nullptr && run.size() < kMaxFusedTasks) {
    run.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  lk.unlock();
  FusibleTask* tags[kMaxFusedTasks];
  uint64_t seqs[kMaxFusedTasks];
  for (size_t i = 0; i < run.size(); ++i) {
    tags[i] = run[i].fusible;
    seqs[i] = run[i].seq;
  }
  FusionResult result = fuse_timed(hook, run, tags, seqs);
  size_t ran = result.ran >= 2 && result.ran <= run.size() ? result.ran : 0;
  std::string error;
  size_t failed = 0;
  if (ran == 0) {
    // The first alone, as usual; the rest go back to the queue's head.
    error = execute_task(run[0]);
    ran = 1;
  } else if (!result.error.empty()) {
    failed = std::min(result.failed, ran - 1);
    error = std::string("axon: asynchronous error in '") +
            (run[failed].name ? run[failed].name : "?") + "' on axon:" +
            std::to_string(device_) + " stream " + std::to_string(id_) + ": " + result.error;
  }
  for (size_t i = 0; i < ran; ++i) run[i].fn = nullptr;
  lock_spinning(lk);
  for (size_t i = run.size(); i-- > ran;) queue_.push_front(std::move(run[i]));
  if (!error.empty()) finish_locked(run[failed].seq, std::move(error));
  finish_locked(run[ran - 1].seq, {});
  return true;
}

std::string StreamState::execute(const char* name, std::function<void()>& fn) noexcept {
  std::string what;
  try {
    fn();
    return {};
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "unknown exception";
  }
  return std::string("axon: asynchronous error in '") + (name ? name : "?") + "' on axon:" +
         std::to_string(device_) + " stream " + std::to_string(id_) + ": " + what;
}

void StreamState::finish_locked(uint64_t seq, std::string error) {
  if (!error.empty()) {
    auto f = std::make_shared<const AsyncFailure>(
        g_failure_order.fetch_add(1, std::memory_order_relaxed), std::move(error));
    add_failure(this, failures_, dropped_failures_, std::move(f), false);
  }
  // max: during teardown inline tasks may finish out of order.
  completed_ = std::max(completed_, seq);
  done_cv_.notify_all();
}

void StreamState::wait(uint64_t seq) {
  std::unique_lock lk(mu_);
  if (completed_ >= seq) return;
  if (std::this_thread::get_id() == worker_.get_id()) {
    throw Error("axon: work on axon:" + std::to_string(device_) + " stream " +
                std::to_string(id_) + " waits for its own stream (deadlock)");
  }
  done_cv_.wait(lk, [&] { return completed_ >= seq; });
}

void StreamState::wait_all() {
  uint64_t seq;
  {
    std::lock_guard lk(mu_);
    seq = enqueued_;
  }
  wait(seq);
}

uint64_t StreamState::completed() const {
  std::lock_guard lk(mu_);
  return completed_;
}

bool StreamState::idle() const {
  std::lock_guard lk(mu_);
  return completed_ == enqueued_;
}

void StreamState::throw_pending_error() {
  std::vector<PendingFailure> failures;
  uint64_t dropped = 0;
  {
    std::lock_guard lk(mu_);
    if (failures_.empty() && dropped_failures_ == 0) return;
    failures.swap(failures_);
    std::swap(dropped, dropped_failures_);
    // Under the lock: a wait task inheriting on the worker meanwhile must see them
    // reported here, or it would add them back.
    for (const auto& p : failures) p.failure->mark_reported(this);
  }
  throw_failures(std::move(failures), describe(), dropped);
}

FailureList StreamState::pending_failures() const {
  FailureList out;
  std::lock_guard lk(mu_);
  out.reserve(failures_.size());
  for (const auto& p : failures_) out.push_back(p.failure);
  return out;
}

void StreamState::inherit(const FailureList& failures) {
  if (failures.empty()) return;
  std::lock_guard lk(mu_);
  for (const auto& f : failures) add_failure(this, failures_, dropped_failures_, f, true);
}

void StreamState::forget(const FailureList& failures) {
  if (failures.empty()) return;
  std::lock_guard lk(mu_);
  for (const auto& f : failures) f->mark_reported(this);
  std::erase_if(failures_, [&](const PendingFailure& p) {
    return std::find(failures.begin(), failures.end(), p.failure) != failures.end();
  });
}

std::vector<PendingFailure> StreamState::take_failures(uint64_t* dropped) {
  std::lock_guard lk(mu_);
  *dropped += std::exchange(dropped_failures_, 0);
  for (const auto& p : failures_) p.failure->mark_reported(this);
  return std::exchange(failures_, {});
}

std::string StreamState::describe() const {
  return "axon:" + std::to_string(device_) + " stream " + std::to_string(id_);
}

void StreamState::request_stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();  // unconditionally: the worker may be about to sleep
}

void StreamState::finish_stop(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lk(mu_);
  if (!worker_.joinable()) return;
  const auto has_exited = [&] { return exited_; };
  bool exited = true;
  if (deadline == std::chrono::steady_clock::time_point::max()) done_cv_.wait(lk, has_exited);
  else exited = done_cv_.wait_until(lk, deadline, has_exited);
  std::thread worker = std::move(worker_);
  if (!exited) {
    // A task blocked forever must not hang process exit: give up on it and
    // release everyone who waits on this stream.
    completed_ = enqueued_;
    done_cv_.notify_all();
  }
  lk.unlock();
  if (exited) worker.join();
  else worker.detach();
}

}  // namespace axon::rt
