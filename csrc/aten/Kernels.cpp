#include "Kernels.h"

#include <ATen/Parallel.h>

#include <axon/kernels/parallel.h>

namespace at::axon {
namespace {

namespace k = ::axon::kernels;

// Kernels split work with ATen's thread pool (OpenMP), from the stream worker.
void aten_parallel_for(int64_t begin, int64_t end, int64_t grain, void* ctx,
                       k::ParallelBody body) {
  at::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) { body(ctx, b, e); });
}

}  // namespace

void installKernelParallelBackend() { k::set_parallel_backend(&aten_parallel_for); }

}  // namespace at::axon
