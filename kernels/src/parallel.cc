// The installed parallel backend: one atomic function pointer, serial by default.
#include "axon/kernels/parallel.h"

#include <atomic>

namespace axon::kernels {
namespace {

std::atomic<ParallelBackend> g_backend{nullptr};

}  // namespace

void set_parallel_backend(ParallelBackend fn) { g_backend.store(fn, std::memory_order_release); }

void parallel_for(int64_t begin, int64_t end, int64_t grain, void* ctx, ParallelBody body) {
  if (begin >= end) return;
  const ParallelBackend backend = g_backend.load(std::memory_order_acquire);
  if (backend == nullptr || end - begin <= grain) {
    body(ctx, begin, end);
  } else {
    backend(begin, end, grain < 1 ? 1 : grain, ctx, body);
  }
}

}  // namespace axon::kernels
