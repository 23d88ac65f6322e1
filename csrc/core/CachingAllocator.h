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
//   request retried; failing that, torch.OutOfMemoryError.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

#include <cstdint>
#include <optional>

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

}  // namespace at::axon
