// The device memory allocator: a caching allocator over runtime memory, in the
// manner of CUDA's (c10/cuda/CUDACachingAllocator.cpp), much reduced.
//
// - Two pools per device: small requests (<= 1 MiB) are carved from 2 MiB
//   segments, large ones from segments of at least the request rounded to
//   2 MiB (20 MiB for requests under 10 MiB).  Free blocks split and merge.
// - Blocks remember the stream they were allocated on.  A freed block is at
//   once reusable on that stream (stream order makes that safe) and never on
//   another, unless record_stream() named other streams: then the free waits
//   for events recorded on those streams.
// - When the runtime refuses memory, cached free segments are released and the
//   request retried; failing that, torch.OutOfMemoryError.  A per-process
//   memory fraction (setMemoryFraction) caps what the device's segments hold.
// - Private pools (MemPool, graphs) own their own segments (below).
// - Memory history (recordHistory) keeps a ring of allocator events and the
//   contexts (stack traces) of allocations, for snapshot() and
//   torch.axon.memory._snapshot (MemoryHistory.cpp makes the Python dicts).
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace at::axon {

c10::DeviceAllocator* getCachingAllocator();

// Test hook: the number of runtime allocations (segments) ever made on device.
int64_t numDeviceAllocs(c10::DeviceIndex device);

// Adaptive eager (aten/Fusion.h) asks whether a kernel's result was freed
// before any later work could read it.  Each device logs the last frees of
// blocks that go straight back to their stream (no record_stream): the block,
// its stream, and that stream's launch count at the free
// (rt::stream_launched).  freeLogMark() is the index the next free will
// take; freedAt() finds the first free of the block at `ptr` on `stream` at
// or after `mark` and returns the launch count then, or nothing if there is
// none yet or the log no longer reaches back to `mark`.  The lookup takes no
// lock (stream workers call it).
uint64_t freeLogMark(c10::DeviceIndex device);
std::optional<uint64_t> freedAt(c10::DeviceIndex device, c10::StreamId stream, const void* ptr,
                                uint64_t mark);

// Private pools (MemPool, graphs), with CUDA's use counts
// (c10/cuda/CUDACachingAllocator.cpp create_or_incref_pool / releasePool).
// Ids as CUDA's: {uid, 0} for pools created by a graph's capture_begin
// (for_graph), {0, uid} from graph_pool_handle() / MemPool.
//
// A graph: beginAllocateToPool at capture_begin (own new id, or a shared
// one), endAllocateToPool at capture_end, releasePool once when it is reset or
// destroyed; nothing else, also when it shares another graph's pool.
// A MemPool: retainPool when created, releasePool when destroyed;
// use_mem_pool: beginAllocateToPool on entry, endAllocateToPool + releasePool
// on exit (as torch.cuda.use_mem_pool).
c10::MempoolId_t newPoolId(bool for_graph);
// From now on, allocations on `device` for which filter(stream of the
// allocation) returns true (evaluated on the allocating thread, under the
// allocator's lock: it must not allocate; it may check the thread) come from
// this private pool's segments (created on demand), never from the device's
// shared pools; blocks of the pool, when freed, go back to this pool only.
// Creates the pool (use count 1) or adds a use to it, as CUDA's.  Raises if
// allocations are already routed to this pool.
void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t pool,
                         std::function<bool(c10::StreamId)> filter);
// Stops routing (the use count is unchanged).
void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t pool);
// Another owner shares the pool: creates it (use count 1) or adds a use.
void retainPool(c10::DeviceIndex device, c10::MempoolId_t pool);
// The pool's owner (graph, MemPool) is done with it: the use count drops by
// one (a pool shared by several graphs/MemPool objects is kept until the last
// releases it); once released, its segments are freed to the runtime when all
// their blocks are free (now or later, when the last tensor in it dies).
void releasePool(c10::DeviceIndex device, c10::MempoolId_t pool);
// The pool's use count (0 once released or unknown).
int poolUseCount(c10::DeviceIndex device, c10::MempoolId_t pool);

// set_per_process_memory_fraction: the device's segments together may hold at
// most fraction * total bytes (fraction in [0, 1]; 1 by default).
// torch.axon.caching_allocator_enable: while off, allocations go straight to
// the runtime (no pool, no statistics) and their frees wait for the device.
void setCachingEnabled(bool enabled);
bool cachingEnabled();
void setMemoryFraction(c10::DeviceIndex device, double fraction);
double getMemoryFraction(c10::DeviceIndex device);

// Memory history (torch.axon.memory._record_memory_history).  `trace` keeps
// the last max_entries allocator events of each device; `context` says which
// events keep the context gather() returns (STATE: live allocations only,
// ALLOC: also alloc events, ALL: also frees).  gather runs on the allocating
// or freeing thread, outside the allocator's lock.  Off (the default), the
// allocation path pays one relaxed atomic load.  skip: a bit (1 << action)
// per TraceEntry::Action left out of the trace.
void recordHistory(bool trace, c10::CachingDeviceAllocator::RecordContext context,
                   c10::CachingDeviceAllocator::CreateContextFn gather, size_t max_entries,
                   bool clear, unsigned skip = 0);

// The allocator's state: every segment of every device (or of one private
// pool), and each device's recorded events.  SegmentInfo::stream and
// TraceEntry::stream_ hold the StreamId (not a pointer); TraceEntry times are
// microseconds since the Unix epoch (time_.approx_t_).
struct Snapshot {
  std::vector<c10::CachingDeviceAllocator::SegmentInfo> segments;
  std::vector<std::vector<c10::CachingDeviceAllocator::TraceEntry>> device_traces;
};
Snapshot snapshot(std::optional<c10::MempoolId_t> pool, bool include_traces);

}  // namespace at::axon
