// The Axon device contract: everything the layers above know about the device.
//
// The simulated device in runtime/src implements this header on host CPU
// threads.  The contract is small (devices, memory, streams, events, copies,
// launch), and csrc/ reaches the device only through it; a real chip's driver
// would implement it too.  But what the layers above launch, and some of what
// they read, assumes that the device is the host: launch() enqueues a host
// callable, and device memory is host-addressable (host_accessible) and
// shareable with the host's other processes (memory_export/import).  A driver for a
// chip whose cores do not run host code, or whose memory the host cannot
// address, needs besides this header:
//
// - Device-side kernels for everything that now runs as host code on device
//   pointers, and a launch() that takes such a kernel and its arguments
//   instead of a std::function:
//   * tier 2 of csrc/aten: ATen's CPU kernels run on host views of device
//     memory (the structured/native kernels and the generic meta-driven
//     kernel, genericStreamKernel; CpuKernel.h builds the views on the worker);
//   * the kernels/ library (norms, softmax, attention, Adam, linear), called
//     by csrc/aten's fused ops on raw device pointers, with ATen's OpenMP
//     thread pool as its parallel-for (installKernelParallelBackend);
//   * the C++ kernels torch.compile generates, launched as host function
//     pointers (axon_inductor_launch, csrc/python/Inductor.cpp);
//   * comm/'s reductions and copies (below).
// - Another way for the places where the host reads or writes device memory
//   directly, after draining the streams (hostView, csrc/aten/HostView.h):
//   * the first launch of each kernel signature, which runs the CPU kernel on
//     the calling thread so that its errors and warnings reach the caller
//     (csrc/aten/Launch.h);
//   * tier 3, the fallback (axonFallback): every op without an axon kernel
//     runs its CPU kernel on host views;
//   * copies that convert dtype or layout, and copies of non-dense CPU
//     tensors to the device (_copy_from, copyToDevice), which run ATen's copy
//     kernel over host views (same-dtype dense copies already use memcpy
//     below);
//   * .item() (_local_scalar_dense) and the ops whose result size depends on
//     the data (nonzero, masked_select), which read device memory on the host;
//   * gloo collectives on axon tensors (csrc/distributed/GlooAxon.cpp), which
//     hand gloo host views.
//   Each can stay correct by staging through memcpy() into host memory and
//   back (as CUDA backends' CPU fallbacks do), at the cost of the copies.
// - A transport for collectives: comm/ moves and reduces bytes with host code
//   on device pointers, mapping the peers' allocations (memory_export) or
//   staging them through a /dev/shm segment.  A chip needs device-to-device
//   (peer) copies and reductions on the device, or staging through pinned
//   host memory.
// What needs no change: the caching allocator, streams and events, pinned
// host memory, device guards, and the Python package (torch.axon).
//
// Conventions
// - Every function is thread-safe.
// - Errors are C++ exceptions derived from axon::rt::Error.  Out-of-memory is
//   OutOfMemoryError, an invalid device index is InvalidDeviceError.
// - Device resources (worker threads, memory bookkeeping) are created on first
//   use, so idle devices cost nothing.
// - Device memory of the simulated device is host-addressable
//   (DeviceProperties::host_accessible): the layer above may read or write it
//   from the host *after* synchronising the streams that touch it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace axon::rt {

// ---------------------------------------------------------------- errors

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

class InvalidDeviceError : public Error {
 public:
  using Error::Error;
};

class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(const std::string& what, int device, size_t requested,
                   size_t used, size_t capacity, bool host = false)
      : Error(what), device(device), requested(requested), used(used),
        capacity(capacity), host(host) {}
  int device;
  size_t requested;  // bytes asked for
  size_t used;       // bytes of device memory in use when it failed
  size_t capacity;   // the device's capacity in bytes
  // The device had room but the host did not: the host refused the memory
  // (mmap/memfd/aligned_alloc failed), or all devices together would exceed
  // the host memory the runtime may use (host_memory_info).
  bool host;
};

// An exception thrown by stream work, reported at the next synchronising call
// on that stream (stream_synchronize, event_synchronize on an event recorded
// there, device_synchronize, a blocking copy).  Carries the op's name.
//
// Errors travel along dependencies: an event recorded after failed work
// carries the failure; a stream that waits on that event (stream_wait_event,
// also across devices) takes it, and its next synchronising call reports it
// too.  Work enqueued after a failure or after such a wait still runs (its
// results may be garbage), but nothing the host reads from it escapes a
// synchronising call, which raises first.  A synchronising call reports every
// failure pending on what it synchronises: the first one's message, then the
// others listed ("N more asynchronous errors ..."), and clears them there.
// Every stream that depends on a failure reports it once, whichever is
// synchronised first: the stream it failed on, and each stream that waited
// for it (their results are wrong too).  A stream never takes back a failure
// it reported, and events recorded on it after the report do not carry it.
// event_synchronize reports what the event carries unless its stream
// reported it already, and counts as that stream's report.
class AsyncError : public Error {
 public:
  using Error::Error;
};

// ---------------------------------------------------------------- devices

struct DeviceProperties {
  std::string name;        // "Axon simulated device"
  size_t total_memory;     // capacity in bytes
  int compute_units;       // compute threads of the device
  int physical_cores;      // physical cores grouped into this logical device
  bool host_accessible;    // device memory can be read/written by the host
  int system_index;        // index among all devices, before AXON_VISIBLE_DEVICES
};

// Number of logical devices.  Never throws; 0 means no device.
// Configured once per process from the environment:
//   AXON_NUM_DEVICES          physical cores (default 8)
//   AXON_DEVICE_MEMORY        memory of one physical core, e.g. "8GiB", "512MiB"
//                             (default min(8GiB, host memory / AXON_NUM_DEVICES))
//   AXON_HOST_MEMORY          host memory all devices may use together
//                             (default: physical memory or cgroup limit)
//   AXON_LOGICAL_CORE_CONFIG  physical cores per logical device (default 1):
//                             device_count = AXON_NUM_DEVICES / N, memory and
//                             compute units x N
//   AXON_VISIBLE_DEVICES      the devices this process sees, as CUDA_VISIBLE_DEVICES:
//                             "2,0" makes device 2 axon:0 and device 0 axon:1;
//                             "" or "-1" hides every device (default: all)
//   AXON_LAUNCH_BLOCKING=1    every launch and copy completes before returning
// At most 127 devices (PyTorch's 8-bit device index); a larger count is
// ignored with a warning, like every other bad value.  The default memory is
// min(8GiB, host memory / AXON_NUM_DEVICES).
int device_count() noexcept;
// Whether the configuration above was read yet (the first call that needs the
// devices reads it, as CUDA initialises lazily: variables set after the
// library loaded, before that call, still apply).
bool devices_initialized() noexcept;

// Throws InvalidDeviceError naming the index and the device count.
void check_device(int device);

DeviceProperties get_device_properties(int device);

// The calling thread's current device (like cudaGetDevice/cudaSetDevice).
int current_device() noexcept;
void set_device(int device);

bool launch_blocking() noexcept;

// True in a child created by fork() after this process had started using a
// device: the device's worker threads do not survive fork, so every device
// call in such a child throws Error (use the "spawn" start method instead).
bool in_bad_fork() noexcept;

// ---------------------------------------------------------------- memory

// Allocates `bytes` (64-byte aligned) of device memory.  Throws
// OutOfMemoryError when the device's capacity would be exceeded, or (with
// host = true) when the host cannot back it: device memory is host memory,
// and the devices of a process together never use more than the host memory
// limit (AXON_HOST_MEMORY, default the host's physical memory or its cgroup
// limit); nor is an allocation made that the host reports it cannot supply.
void* malloc(int device, size_t bytes);

// Frees device memory returned by malloc.  The caller guarantees no pending
// stream work still uses it (the caching allocator above synchronises first).
void free(void* ptr);

struct MemoryInfo {
  size_t free;
  size_t total;
};
MemoryInfo mem_get_info(int device);

// Host memory used by the devices of this process (all devices together) and
// the limit on it; total is 0 when there is no limit.
MemoryInfo host_memory_info() noexcept;

// The device owning `ptr` (anywhere inside an allocation), or -1.
int pointer_device(const void* ptr) noexcept;

// Device memory is shared memory: another process of the host can map an
// allocation (what cudaIpcGetMemHandle / cudaIpcOpenMemHandle do for CUDA).
// The collectives use it to read and write the peers' buffers directly.
// Each allocation is a memfd; another process of the same user maps it
// through /proc/<pid>/fd/<fd>.  AXON_SHAREABLE_MEMORY=0 makes allocations
// private (then memory_export returns false).
struct MemoryExport {
  int fd = -1;          // the allocation's memfd in this process
  uint64_t id = 0;      // unique among this process's allocations
  size_t size = 0;      // bytes of the allocation (the mapping's length)
  size_t offset = 0;    // of ptr within the allocation
  uint64_t inode = 0;   // the memfd's inode: names it across processes
};
// Fills *out for the allocation containing ptr; false if ptr is not in a
// shareable allocation.
bool memory_export(const void* ptr, MemoryExport* out) noexcept;

// The other end of memory_export (cudaIpcOpenMemHandle): maps the allocation
// that process `pid` exported as `ex` into this process, as device memory of
// `device` here, and returns the exported pointer (the mapping + ex.offset).
// Both processes then use the same pages: each sees the other's writes once
// the writer's streams are synchronised.  The mapping is device memory for
// pointer_device, memcpy and memory_export (it can be passed on), but is not
// charged to the device's capacity: the exporter's allocation is.  The
// exporter must keep its allocation until the importer calls memory_close
// (free truncates the memfd: the pages go, mapped or not).  Throws Error if
// the process or the allocation is gone, or the device index is invalid.
void* memory_import(int device, int pid, const MemoryExport& ex);
// Unmaps what memory_import returned (cudaIpcCloseMemHandle); the exporter's
// allocation is untouched.  free() refuses imported memory.
void memory_close(void* ptr);
// Maps `size` bytes of process pid's descriptor `fd` (a memfd it exported),
// read-write, through /proc/<pid>/fd/<fd> (a process of the same user).
// Returns nullptr and sets *why when the process or the descriptor is gone,
// the file is smaller than size, or (inode != 0) it is not that file any
// more.  *local_fd receives this process's descriptor of the file (close it
// after munmap).  memory_import and the collectives' peer mappings use it.
void* map_process_memory(int pid, int fd, size_t size, uint64_t inode, int* local_fd,
                         std::string* why);

// Page-locked ("pinned") host memory.  Copies from/to it may be asynchronous.
// host_free waits for pending copies that use the buffer.
void* host_alloc(size_t bytes);
void host_free(void* ptr);
bool is_host_pinned(const void* ptr) noexcept;
// Whether a copy that uses the pinned buffer at ptr is queued or running (a
// cache of pinned buffers reuses one only when not).  False for other memory.
bool host_in_use(const void* ptr);

// ---------------------------------------------------------------- streams

// A stream is an in-order queue of work on one device.  id 0 is the device's
// default stream; other ids come from stream_from_pool.
struct Stream {
  int device = 0;
  int64_t id = 0;
  bool operator==(const Stream& o) const {
    return device == o.device && id == o.id;
  }
};

constexpr int kStreamPoolSize = 32;  // streams per priority level
constexpr int kDedicatedStreams = 16;  // per device, outside the pools

// A stream from the device's pool, round robin (like CUDA's stream pool).
// priority: 0 normal, < 0 high.  Priorities are accepted and kept apart; the
// simulated device does not preempt.
Stream stream_from_pool(int device, int priority);
// A stream that no pool hands out (ids after the high-priority pool): each
// call returns the next of kDedicatedStreams, so up to that many users (the
// collectives' communication streams, one per process group) each get a queue
// of their own, never shared with a user's pool stream.  Normal priority.
Stream stream_dedicated(int device);
int stream_priority(Stream s);
// Throws Error if id is not a stream of that device.
void check_stream(Stream s);

// Enqueues fn on the stream and returns (unless launch_blocking).  `name`
// must outlive the call (a string literal or an interned name): it names the
// op in an AsyncError when fn throws.
void launch(Stream s, const char* name, std::function<void()> fn);

// Adaptive eager (csrc/aten/Fusion.h): a launch may be marked fusible.  When
// a stream's worker takes a fusible task and the task queued right after it
// is fusible too, it hands the run of consecutive fusible tasks queued now
// (at most kMaxFusedTasks) to the fusion hook, which may run a prefix of them
// together.  The runtime only sees the tags; the layer that launched the
// tasks knows what they are.  A fused task's fn is destroyed without being
// called, so the hook owns whatever fn would have released.  Sequence
// numbers, events and failures behave as if the tasks ran one by one: an
// event recorded between two fused tasks (a marker task) ends the run.
class FusibleTask {
 protected:
  ~FusibleTask() = default;
};
struct FusionResult {
  size_t ran = 0;       // 0 (none: the worker runs the first alone) or >= 2
  size_t failed = 0;    // the task that failed (when error is not empty)
  std::string error;    // its exception's message
};
constexpr size_t kMaxFusedTasks = 64;
// seqs[i]: the sequence number of tasks[i] on its stream (see stream_launched).
using FusionHook = FusionResult (*)(FusibleTask* const* tasks, const uint64_t* seqs,
                                    size_t n) noexcept;
void set_fusion_hook(FusionHook hook);  // nullptr: tasks always run one by one
// Called on a stream worker that found its queue empty for its whole spin and
// is about to sleep (outside the stream's lock): what a worker holds only
// while busy goes then.  nullptr: none.
using IdleHook = void (*)() noexcept;
void set_idle_hook(IdleHook hook);
void launch(Stream s, const char* name, std::function<void()> fn, FusibleTask* fusible);
// launch(), unless s captures: then returns false and leaves fn alone, so a
// caller whose fn may run only once can record a re-runnable one instead
// (checking stream_is_capturing first would race with a capture beginning).
bool launch_uncaptured(Stream s, const char* name, std::function<void()>& fn,
                       FusibleTask* fusible = nullptr);

// Copies n bytes on the stream, ordered with its other work.  Any mix of host
// and device pointers.  Returns once the copy is enqueued when both ends are
// device memory or pinned host memory (and !launch_blocking); otherwise it
// waits for the copy (pageable host memory may be reused after return).
void memcpy(void* dst, const void* src, size_t n, Stream s);

void stream_synchronize(Stream s);  // throws the stream's pending AsyncError(s)
// The sequence number of the last task enqueued on s (tasks are numbered 1,
// 2, ... in launch order; 0: none yet).  Lock-free.
uint64_t stream_launched(Stream s);
// The driver's own handle of s (torch.Stream.native_handle): stable for the
// process, distinct per stream, never null.  Throws Error if s is not a stream.
void* stream_native_handle(Stream s);
bool stream_query(Stream s);        // true when all enqueued work has run
// The message of the earliest failure pending on s that no synchronising call
// reported yet (its own tasks' or inherited through stream_wait_event), or ""
// when none is.  Reports nothing.  From a task running on s: whether the work
// it depends on failed (collectives refuse to send results of failed work).
std::string stream_pending_failure(Stream s);
void device_synchronize(int device);
// Waits for all work on the device's streams without reporting failures
// (allocators: freeing memory must not consume errors meant for the user).
void device_wait(int device);

// ---------------------------------------------------------------- events

class Event;  // opaque

Event* event_create(int device);
void event_destroy(Event* e);
// Captures the stream's current position; the event completes when the work
// enqueued before it has run.  Re-recording moves it.
void event_record(Event* e, Stream s);
// Work enqueued on s after this call waits until e completes.  An event never
// recorded is complete.
void stream_wait_event(Stream s, Event* e);
bool event_query(Event* e);
// Waits for e; throws AsyncError if work before it on its stream (or on a
// stream it waited for) failed and no synchronising call raised it yet.
// Those failures then count as reported on the recording stream too.
void event_synchronize(Event* e);
// The message of the earliest failure e's last record carries (work before
// it on its stream, or on streams that stream waited for) that no
// synchronising call reported yet; "" when none does or the record has not
// completed.  Reports nothing.  A task that waited for e: whether the work it
// depends on failed (collectives refuse to send results of failed work).
std::string event_pending_failure(Event* e);
// Waits for e without reporting failures (allocators, teardown: they must
// not consume errors meant for the user).
void event_wait(Event* e);
// Milliseconds between the completions of start and end (both recorded and
// complete, else throws Error).
double event_elapsed_ms(Event* start, Event* end);
int event_device(Event* e);

// ---------------------------------------------------------------- graphs

// Stream capture and replay, as cudaStreamBeginCapture / cudaGraphLaunch.
// While a stream captures, what is issued on it (launch, memcpy between device
// or pinned memory, event_record) is recorded into a graph instead of being
// enqueued; nothing runs.  Replay enqueues the recorded work on a stream as
// one task that runs it in recorded order, as often as asked.  A task's fn is
// called once per replay, so what it captured must stay valid (device memory:
// the graph's private pool, csrc/core/CachingAllocator.h) and it must not
// release anything when called.
//
// Fork and join: a stream that waits (stream_wait_event) for an event recorded
// during a capture joins that capture; its work is recorded into the same
// graph in issue order (a valid order: it respects every dependency the
// host expressed).  Before stream_end_capture, the capture's origin stream
// must wait for an event recorded on each joined stream after its last work.
//
// Illegal calls during a capture throw Error("axon error: operation not
// permitted when stream is capturing ...") and invalidate the capture
// (stream_end_capture then throws, as CUDA's cudaErrorStreamCaptureInvalidated):
// stream_synchronize/stream_query of a capturing stream, device_synchronize of
// its device, event_query/event_synchronize/event_elapsed_ms of an event
// recorded in a capture, a capturing stream waiting for an event recorded
// outside the capture, memcpy from or to pageable host memory on a
// capturing stream.  device_wait and event_wait (the allocators' waits) do
// not wait for captured work (there is none queued) and are allowed.
class Graph;  // opaque

// Who a capture forbids synchronising calls to (cudaStreamCaptureMode).
// Calls on the capturing streams themselves (stream_synchronize, stream_query,
// pageable copies, queries of captured events) are illegal in every mode;
// device_synchronize of the capture's device is illegal from any thread in
// kGlobal, from the capturing thread in kThreadLocal, never in kRelaxed.
enum class CaptureMode { kGlobal, kThreadLocal, kRelaxed };

// Throws Error if s already captures (or joined a capture).
void stream_begin_capture(Stream s, CaptureMode mode = CaptureMode::kGlobal);
// A process-unique id of the capture s records into (also for a stream that
// joined it), 0 if none.  Lets a layer above recognise its capture's streams
// (the allocator routes their allocations to the graph's pool).
uint64_t stream_capture_id(Stream s);
// Ends the capture begun on s and returns its graph (owned by the caller:
// graph_destroy).  Throws Error, and ends the capture, if s is not the
// stream the capture began on, if the capture was invalidated, or if a
// joined stream was not joined back.
Graph* stream_end_capture(Stream s);
bool stream_is_capturing(Stream s);
// Some stream of the device captures (a synchronising call would be illegal).
bool device_is_capturing(int device) noexcept;
// Enqueues the graph's work on s (which may itself be capturing: the replay
// is then recorded as one task).  s must be on the graph's device.
void graph_launch(Graph* g, Stream s);
// Replays still queued keep the recorded work alive (a worker then releases
// it); what the work points to (device memory) must outlive them.
void graph_destroy(Graph* g);
size_t graph_num_tasks(const Graph* g);
int graph_device(const Graph* g);
// The names of the recorded tasks, in order, one per line.
std::string graph_describe(const Graph* g);

// ---------------------------------------------------------------- profiling
// (torch.profiler's device timeline and torch.axon.utilization; issue 19)
//
// Every task a stream's worker runs can be recorded: its stream, its name,
// when it started and ended on the device clock, and which host op launched
// it.  csrc/profiler turns the records into torch.profiler's device
// activities (Kineto).  Recording is off by default; off, a task costs the
// worker one relaxed atomic load for it.  Event markers (event_record,
// stream_wait_event) are not recorded.

enum class TaskKind : uint8_t {
  kKernel,  // launch()
  kCopy,    // memcpy()
  kFused,   // consecutive fusible launches that adaptive eager ran together
};

struct TaskRecord {
  int device = 0;
  int64_t stream = 0;
  TaskKind kind = TaskKind::kKernel;
  // The launch's name; a fused run: "fused: <first>, <second>, ..." (the
  // names of the tasks it ran, in order).
  std::string name;
  uint64_t seq = 0;          // sequence number on its stream (a fused run's first)
  uint32_t tasks = 1;        // tasks a fused run ran (>= 2), else 1
  // set_launch_correlation() of the thread that launched it, when it
  // launched (0: none; a fused run: its first task's).
  uint64_t correlation = 0;
  int64_t launch_ns = 0;     // device clock: enqueued by the host (0: unknown)
  int64_t start_ns = 0;      // device clock: the worker started it
  int64_t end_ns = 0;        // device clock: the worker finished it
  bool failed = false;       // it threw (an AsyncError is pending)
};

// The device clock of TaskRecord and DeviceBusy: nanoseconds of the host's
// monotonic clock (std::chrono::steady_clock).
int64_t device_clock_ns() noexcept;

// While on, each task a worker starts is recorded (when it ends).  At most
// kMaxTaskRecords are kept until taken; later ones are only counted.
constexpr size_t kMaxTaskRecords = size_t{1} << 22;
void set_task_recording(bool on) noexcept;
bool task_recording() noexcept;
struct TaskRecords {
  std::vector<TaskRecord> records;  // per stream in completion order
  uint64_t dropped = 0;             // not kept since the last take
};
// Takes what was recorded so far (a task still running when recording
// stops is recorded when it ends, and taken by the next call).
TaskRecords take_task_records();

// The id of the host op now running on the calling thread (torch.profiler's
// correlation id; 0: none).  Work this thread launches or copies while
// recording carries it (TaskRecord::correlation).
void set_launch_correlation(uint64_t id) noexcept;
uint64_t launch_correlation() noexcept;

// Busy time, counted from the first device_busy or device_utilization call
// of the process (before it, workers skip the accounting): the time at least
// one stream of the device was
// running work (kernels, copies, collectives, fused runs), from the start of
// a task until the stream runs out of queued work (the worker's few hundred
// ns between back-to-back tasks count; a stream waiting for an event does
// not).  Measured with the coarse monotonic clock at the ends of each
// stream's busy runs: a few ms resolution, right on average over many runs;
// back-to-back work costs nothing more.
struct DeviceBusy {
  int64_t busy_ns = 0;   // since the process started using the device
  int64_t clock_ns = 0;  // device clock when read
};
DeviceBusy device_busy(int device);
// Percent (0..100) of the last kUtilizationPeriodMs that the device was busy
// (torch.cuda.utilization's "percent of time over the past sample period
// during which one or more kernels was executing").  The busy curve between
// samples kept every >= 20 ms of activity is interpolated linearly; less than
// a period after counting started, it reports over the time since.
constexpr int64_t kUtilizationPeriodMs = 1000;
int device_utilization(int device);

// ---------------------------------------------------------------- compute team
// The host threads a kernel spreads its loop over (issue 17): the calling
// thread (a stream's worker) and up to `threads - 1` helper threads the
// runtime starts on first use.  Helpers spin for a few tens of microseconds
// after a loop (back-to-back loops start at once), then sleep in the kernel,
// so between kernels they leave the cores to the host's threads (an OpenMP
// team spins there for milliseconds).  One loop runs on the team at a time: a
// second caller, and a loop nested in a team loop, run serially on the
// calling thread.

using TeamBody = void (*)(void* ctx, int64_t begin, int64_t end);
// Splits [begin, end) into chunks of at least `grain` iterations (but for the
// last), runs body(ctx, b, e) once for each chunk, on the calling thread and
// up to threads - 1 helpers, and returns when every chunk has run.  A chunk
// a helper has not started when the caller runs out of work is run by the
// caller.  An exception thrown by the body is rethrown here (the first one;
// the other chunks still run).
void team_parallel_for(int threads, int64_t begin, int64_t end, int64_t grain, void* ctx,
                       TeamBody body);
// Starts the helpers a team of `threads` needs, if not started yet (they
// sleep until a loop comes).  A new thread may wait milliseconds for the
// scheduler to move it off its creator's busy core: started when the device
// is first used, the helpers are running by the time its first loops (and the
// thread policy's trials of them) come.
void team_start(int threads);
struct TeamStats {
  int helpers = 0;            // helper threads started
  int sleeping = 0;           // of them, asleep now
  uint64_t loops = 0;         // loops run on the team
  uint64_t serial_loops = 0;  // loops run serially (team busy, nested, one chunk)
  uint64_t helper_chunks = 0; // chunks helpers ran
  uint64_t helper_moves = 0;  // helpers that moved off a core another member held
};
TeamStats team_stats() noexcept;

}  // namespace axon::rt
