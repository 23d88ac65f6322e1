// torch.axon.set_sync_debug_mode: warn or raise on synchronising calls, as
// torch.cuda.set_sync_debug_mode does (c10/cuda/CUDAFunctions.h:
// warn_or_error_on_sync, called by memcpy_and_sync and stream_synchronize).
// The calls that check (CUDA's set): .item() (_local_scalar_dense), blocking
// copies between host and device memory (either direction, pinned or not),
// nonzero and masked_select (result size read from the device), and
// Stream.synchronize().  Not flagged, as on CUDA: torch.axon.synchronize()
// (device), Event.synchronize(), non_blocking copies, and work the host does
// on device memory internally (first launches, and the CPU fallback except
// for the data-dependent ops below).
#pragma once

#include <atomic>

#include <ATen/core/operator_name.h>
#include <c10/macros/Macros.h>

namespace at::axon {

// 0: off ("default"), 1: warn, 2: error.
extern std::atomic<int> g_sync_debug_mode;

void setSyncDebugMode(int mode);
int syncDebugMode();

void warnOrErrorOnSyncSlow();
void warnOrErrorOnFallbackSyncSlow(const c10::OperatorName& op);

// One relaxed load when off: call it at every synchronising call site.
inline void warnOrErrorOnSync() {
  if (C10_UNLIKELY(g_sync_debug_mode.load(std::memory_order_relaxed) != 0)) {
    warnOrErrorOnSyncSlow();
  }
}

// The CPU fallback waits for the stream before every op it runs; flagged
// only for the ops whose result size depends on device data (unique,
// bincount, repeat_interleave with a tensor of repeats), which synchronise
// on CUDA too.
inline void warnOrErrorOnFallbackSync(const c10::OperatorName& op) {
  if (C10_UNLIKELY(g_sync_debug_mode.load(std::memory_order_relaxed) != 0)) {
    warnOrErrorOnFallbackSyncSlow(op);
  }
}

}  // namespace at::axon
