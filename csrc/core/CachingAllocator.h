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

namespace at::axon {

c10::DeviceAllocator* getCachingAllocator();

// Test hook: the number of runtime allocations (segments) ever made on device.
int64_t numDeviceAllocs(c10::DeviceIndex device);

}  // namespace at::axon
