#include "StreamWork.h"

#include <stdexcept>

#include <algorithm>
#include <chrono>
#include <atomic>
#include <omp.h>
#include <cstdlib>
#include <string>

#include <ATen/Parallel.h>

#include <c10/util/Exception.h>

#include "AxonStream.h"

namespace at::axon {

// Finished work is released by the host, not by the stream worker: the last
// reference to a tensor may own its Python object, whose release takes the
// GIL, which the host may be holding while it waits for the stream.
// Workers push what has run onto a lock-free list (one atomic exchange or
// compare-exchange, no lock the host could hold: a worker never sleeps on
// it and the host never wakes one); launches take the whole list in batches,
// synchronisations and the allocator's out-of-memory path take it all.
struct FinishedList {
  std::atomic<Work*> head{nullptr};
  // Approximate (pushes count after they land, takes subtract what they
  // took); only decides when a launch releases a batch.
  std::atomic<int64_t> count{0};

  void push(Work* w) {
    Work* h = head.load(std::memory_order_relaxed);
    do {
      w->next_finished_ = h;
    } while (!head.compare_exchange_weak(h, w, std::memory_order_release,
                                         std::memory_order_relaxed));
    count.fetch_add(1, std::memory_order_relaxed);
  }

  void release_if_at_least(int64_t n) {
    if (count.load(std::memory_order_relaxed) < n) return;
    Work* w = head.exchange(nullptr, std::memory_order_acquire);
    int64_t taken = 0;
    while (w != nullptr) {
      Work* next = w->next_finished_;
      delete w;
      w = next;
      ++taken;
    }
    count.fetch_sub(taken, std::memory_order_relaxed);
  }
};

namespace {
constexpr int64_t kReleaseBatch = 32;
FinishedList finished;  // never destroyed before the workers stop: see below

// Stream workers: a kernel launched asynchronously had its warnings raised
// at the call already (see launchChecked); nothing goes to stderr.
class DropWarnings final : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

class FunctionWork final : public Work {
 public:
  explicit FunctionWork(std::function<void()> fn) : fn_(std::move(fn)) {}
  void run() override { fn_(); }

 private:
  std::function<void()> fn_;
};

}  // namespace

// The OpenMP team size of the calling thread for its next kernel: `threads`,
// or (0) the thread's default.
namespace {
thread_local int team_size = 0;  // the thread's default, read once
}  // namespace

// MKL's per-thread count, which its GEMMs obey before OpenMP's: libtorch's
// lazy init sets it on a thread's first parallel loop once
// torch.set_num_threads was called (at::set_num_threads ->
// mkl_set_num_threads_local).  MKL's C entry points (mkl_service.h maps the
// lower-case names to them; the lower-case symbols are the Fortran ones,
// which take pointers).  Weak: a libtorch built without MKL has neither.
extern "C" int MKL_Set_Num_Threads_Local(int) __attribute__((weak));
extern "C" int MKL_Get_Max_Threads() __attribute__((weak));

int kernelMklThreads() { return MKL_Get_Max_Threads != nullptr ? MKL_Get_Max_Threads() : -1; }

int kernelTeamSize() {
  if (team_size == 0) {
    // ATen sets a thread's team size at its first parallel loop (libtorch's
    // lazy_init_num_threads, whose per-thread flag is libtorch's own):
    // at::get_num_threads() runs that first, so it cannot undo ours later.
    team_size = std::max(1, at::get_num_threads());
  }
  return team_size;
}

void setKernelThreads(int threads) {
  const int all = kernelTeamSize();
  const int want = threads > 0 ? std::min(threads, all) : all;
  // The live value (a thread-local read), not a cached one: anything the
  // kernels call may have set it.
  if (omp_get_max_threads() != want) {
    omp_set_num_threads(want);
    // Whatever set OpenMP's count (ATen's lazy init) may have set MKL's too.
    if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(want);
  }
}

namespace {
// This worker may hold an OpenMP team (a kernel ran with more than one
// thread since the last release).
thread_local bool omp_team_live = false;

// The runtime's idle hook: a worker about to sleep ends its OpenMP team.
void releaseIdleOpenMpTeam() noexcept {
  if (omp_team_live) releaseOpenMpTeam();
}
}  // namespace

void releaseOpenMpTeam() {
  // Cheap without a pool (libgomp checks the thread's pool and returns).
  // Unconditional: a kernel may have started threads with a num_threads
  // clause whatever omp_get_max_threads() says.
  omp_pause_resource_all(omp_pause_soft);
  omp_team_live = false;
}

KernelThreadsScope::KernelThreadsScope(int threads) : saved_(0) {
  // kernelTeamSize() first: on a thread's first use it runs ATen's lazy
  // per-thread OpenMP setup, whose result is the one to restore.
  const int all = kernelTeamSize();
  (void)at::get_num_threads();
  saved_ = omp_get_max_threads();
  const int want = threads > 0 ? std::min(threads, all) : all;
  if (want == saved_) return;
  changed_ = true;
  omp_set_num_threads(want);
  if (MKL_Set_Num_Threads_Local != nullptr) saved_mkl_ = MKL_Set_Num_Threads_Local(want);
}

KernelThreadsScope::~KernelThreadsScope() {
  if (!changed_) return;
  omp_set_num_threads(saved_);
  if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(saved_mkl_);
}

std::unique_ptr<Work> functionWork(std::function<void()> fn) {
  return std::make_unique<FunctionWork>(std::move(fn));
}

void releaseFinishedWork() { finished.release_if_at_least(1); }

void retireWork(Work* work) { finished.push(work); }

c10::WarningHandler* dropWarnings() {
  static DropWarnings drop;
  return &drop;
}

namespace {
int adaptive_eager_from_env() {
  const char* v = std::getenv("AXON_ADAPTIVE_EAGER");
  if (v == nullptr || *v == '\0') return 0;
  const std::string s(v);
  if (s == "0" || s == "false" || s == "off") return 0;
  if (s == "1" || s == "true" || s == "on") return 1;
  TORCH_WARN_ONCE("AXON_ADAPTIVE_EAGER: expected 0 or 1, got '", s, "'; using 0");
  return 0;
}
std::atomic<int> adaptive_eager_override{-1};
}  // namespace

bool adaptiveEager() {
  static const int from_env = adaptive_eager_from_env();
  const int o = adaptive_eager_override.load(std::memory_order_relaxed);
  return (o >= 0 ? o : from_env) != 0;
}

void setAdaptiveEager(int mode) { adaptive_eager_override.store(mode < 0 ? -1 : mode != 0); }

namespace {
// Runs a kernel's work on a stream worker: its thread count, its warnings
// dropped if quiet, a c10::Error's message without the worker's backtrace,
// and the timing a trial asked for.
void runWork(Work& w, int threads) {
  if (w.threads_at_run != nullptr) threads = w.threads_at_run->threadsAtRun();
  // A worker's OpenMP team lives while team kernels follow each other: it
  // ends before a kernel on the worker alone (not timed with it) and when the
  // worker goes idle (releaseOpenMpTeam).
  if (threads == 1 && omp_team_live) releaseOpenMpTeam();
  setKernelThreads(threads);
  const auto t0 = w.timed != nullptr ? std::chrono::steady_clock::now()
                                     : std::chrono::steady_clock::time_point();
  struct MarkLive {
    int threads;
    ~MarkLive() {
      if (threads != 1 || omp_get_max_threads() > 1) omp_team_live = true;
    }
  };
  try {
    MarkLive mark{threads};
    if (w.quiet) {
      c10::WarningUtils::WarningHandlerGuard guard(dropWarnings());
      w.run();
    } else {
      w.run();
    }
  } catch (const c10::Error& e) {
    if (w.timed != nullptr) w.timed->record(threads, kFailedRun);
    // The runtime keeps the message for a later synchronising call; the
    // C++ backtrace of a worker thread would only bury it.
    throw std::runtime_error(e.what_without_backtrace());
  } catch (...) {
    if (w.timed != nullptr) w.timed->record(threads, kFailedRun);
    throw;
  }
  if (w.timed != nullptr) {
    w.timed->record(threads, std::chrono::duration<double, std::micro>(
                                 std::chrono::steady_clock::now() - t0).count());
  }
}
}  // namespace

void startComputeTeam() {
  static const bool started = (rt::team_start(at::get_num_threads()),
                               rt::set_idle_hook(&releaseIdleOpenMpTeam), true);
  (void)started;
}

void launch(c10::DeviceIndex device, const char* name, std::unique_ptr<Work> work, int threads) {
  startComputeTeam();
  finished.release_if_at_least(kReleaseBatch);
  rt::Stream s = current_rt_stream(device);
  // The stream's task holds a plain pointer and an int, which std::function
  // stores without another allocation; the work object itself moves to
  // `finished` once it has run.  (Work a stream drops at process exit, or a
  // launch the runtime refuses, is not freed.)
  Work* w = work.release();
  rt::FusibleTask* fusible =
      w->fusible != nullptr && w->timed == nullptr &&
              w->threads_at_run == nullptr && adaptiveEager()
          ? w->fusible
          : nullptr;
  std::function<void()> fn = [w, threads] {
    struct Retire {
      Work* w;
      ~Retire() { finished.push(w); }
    } retire{w};
    runWork(*w, threads);
  };
  if (rt_call([&] { return rt::launch_uncaptured(s, name, fn, fusible); })) return;
  // A graph capture (AxonGraph.cpp): its task runs once per replay, so it
  // shares the work and never retires it.  The graph releases it on the host
  // (AxonGraph::reset waits for the replays first).
  // A thread trial picks its side now, as a kernel captured into a graph
  // runs the same threads at every replay (each replay is timed).
  if (w->threads_at_run != nullptr && w->timed != nullptr) {
    threads = w->threads_at_run->threadsAtRun();
    w->threads_at_run = nullptr;
  }
  std::shared_ptr<Work> shared(w);
  rt_call([&] {
    rt::launch(s, name, [shared, threads] { runWork(*shared, threads); });
  });
}

void launch(c10::DeviceIndex device, const char* name, std::function<void()> fn, int threads) {
  launch(device, name, functionWork(std::move(fn)), threads);
}

}  // namespace at::axon
