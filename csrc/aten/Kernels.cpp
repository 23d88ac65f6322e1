#include "Kernels.h"

#include <omp.h>

#include <axon/kernels/parallel.h>
#include <axon/runtime.h>

namespace at::axon {
namespace {

namespace k = ::axon::kernels;

// Our kernels split their loops over the device's compute team (runtime.h
// "compute team"), as many threads as the thread policy gave this kernel
// (setKernelThreads sets the calling thread's OpenMP team size; 1: the
// stream worker alone).  Not OpenMP's team: its threads spin for
// milliseconds after each loop, on the core the host dispatches from, until
// the worker ends the team (releaseOpenMpTeam), and starting them again costs
// ~60 us.
void team_parallel_for(int64_t begin, int64_t end, int64_t grain, void* ctx,
                       k::ParallelBody body) {
  ::axon::rt::team_parallel_for(omp_get_max_threads(), begin, end, grain, ctx, body);
}

}  // namespace

void installKernelParallelBackend() { k::set_parallel_backend(&team_parallel_for); }

}  // namespace at::axon
