// Work enqueued on axon streams by csrc/ (kernels of native ops).
//
// Kernels capture raw pointers and hold no references to device memory
// (stream-ordered reuse; see aten/CpuKernel.h).  What a kernel does hold (CPU
// snapshots, generators, the generic kernel's arguments) is released by the
// host thread (releaseFinishedWork: by launches in batches, on each
// synchronisation and before an out-of-memory error), never by the stream
// worker: the last reference to a tensor may own its Python object, whose
// release takes the GIL, which the host may hold while it waits for the
// stream.
#pragma once

#include <functional>
#include <memory>

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

namespace axon::rt {
class FusibleTask;
}  // namespace axon::rt

namespace at::axon {

// The thread policy's timing hook (aten/KernelSelect.h): a launch that is a
// trial carries one; the stream worker times the kernel's run and reports
// it with the threads it ran on (1, or 0: the team); a run that threw
// reports infinity, one that ran at the call (Launch.cpp: a new signature)
// reports -1 (not timed).
constexpr double kFailedRun = 1e300;  // "infinity" (-ffast-math safe)
constexpr double kUntimedRun = -1.0;
class TimedRun {
 public:
  virtual void record(int threads, double us) = 0;

 protected:
  ~TimedRun() = default;
};

// The thread policy's deferred decision (aten/KernelSelect.h: a trial's side,
// or the job's choice under agreement between ranks): a launch that carries
// one runs on the threads it returns when the worker gets to it, not on
// those of the launch.
class ThreadsAtRun {
 public:
  virtual int threadsAtRun() = 0;

 protected:
  ~ThreadsAtRun() = default;
};

// One kernel's work: what it captured and how to run it, in one allocation
// (a launch allocates nothing else).  Owned by the launch until it has run,
// then by the finished list until the host releases it.  Launched during a
// graph capture, it is shared by the graph's task instead, runs once per
// replay and goes with the graph (AxonGraph::reset waits for the replays).
class Work {
 public:
  Work() = default;
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  virtual void run() = 0;

  // Warnings the kernel raises on the worker are dropped (the host raised
  // them at the call already; see launchChecked).
  bool quiet = false;
  // Set by the kernel selection for a timed trial (the thread policy's
  // entry, which is never freed, or the work itself).
  TimedRun* timed = nullptr;
  // Set by the thread policy when the threads are decided at the run.
  ThreadsAtRun* threads_at_run = nullptr;
  // Adaptive eager (aten/Fusion.h): set when the kernel may run fused with
  // the kernels queued next to it.  Offered to the stream when it is not a
  // trial; on the team only pointwise kernels, which the engine takes only
  // as its own exactly rounded ops (cpu_kernel::Fusible::team).
  ::axon::rt::FusibleTask* fusible = nullptr;

 private:
  friend struct FinishedList;
  Work* next_finished_ = nullptr;
};

// A std::function as Work (launches that are not CPU kernels).
std::unique_ptr<Work> functionWork(std::function<void()> fn);

// Enqueues `work` on device's current stream.  `name` must outlive the
// process (a string literal or an interned name); it labels asynchronous
// errors.  `threads`: the most threads the kernel's parallel loops may use
// (0: all).
// Starts the runtime's compute team for ATen's thread count (runtime.h
// team_start) on the first launch, so that its helpers are running when the
// first loops and the thread policy's trials of them come.
void startComputeTeam();
void launch(c10::DeviceIndex device, const char* name, std::unique_ptr<Work> work,
            int threads = 0);
void launch(c10::DeviceIndex device, const char* name, std::function<void()> fn,
            int threads = 0);

// On a stream worker: the OpenMP team size for the kernel code that follows
// (threads as launch's; kernel selection's measurements switch it between
// runs), and the team's full size there.
void setKernelThreads(int threads);
int kernelTeamSize();
// Ends this thread's OpenMP team, if a kernel started one.  A stream worker's
// team lives while team kernels follow each other and ends before a kernel on
// the worker alone and when the worker goes idle (the runtime's idle hook).
// A worker's live team makes libgomp count more threads than cores, after
// which every team's threads, the host's too, sleep right after each
// parallel loop instead of spinning: the CPU's own small parallel ops in the
// same process took ~10x longer (50 against 4.5 us for x + 1 on 64K float32
// elements, AMD EPYC, 2 cores); and its threads spin for milliseconds after
// each loop on cores the host and the compute team need.  Starting the team
// again costs ~60 us (the thread policy's trials, alternating sides, see it).
void releaseOpenMpTeam();
// On the calling thread, while alive: the team size a kernel launched with
// `threads` gets on a stream worker, so that a kernel run on the host (a new
// signature's first launch) computes exactly as it will on the device (a
// reduction split over another number of threads rounds differently).
class KernelThreadsScope {
 public:
  explicit KernelThreadsScope(int threads);
  ~KernelThreadsScope();
  KernelThreadsScope(const KernelThreadsScope&) = delete;
  KernelThreadsScope& operator=(const KernelThreadsScope&) = delete;

 private:
  int saved_;          // OpenMP's team size before
  int saved_mkl_ = 0;  // MKL's thread-local setting before (0: none)
  bool changed_ = false;
};
// The threads MKL's GEMMs would use on this thread now (-1: no MKL).
int kernelMklThreads();

// Drops the references held by kernels that have run.
void releaseFinishedWork();
// A warning handler that drops warnings: kernels run asynchronously had theirs
// raised at the call already (see launchChecked).
c10::WarningHandler* dropWarnings();

// Hands work that ran (fused, without its task) to the host for release.
void retireWork(Work* work);

// Adaptive eager on or off: AXON_ADAPTIVE_EAGER (default off), or set in-process.
bool adaptiveEager();
void setAdaptiveEager(int mode);  // 1 on, 0 off, -1 back to the environment

}  // namespace at::axon
