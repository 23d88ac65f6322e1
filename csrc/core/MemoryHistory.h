// Python bindings of the memory tools: private pools (torch.axon.MemPool,
// use_mem_pool, graph_pool_handle), memory history and snapshots in CUDA's
// format (torch.axon.memory._record_memory_history, _snapshot), the
// per-process memory fraction and pinned host memory statistics.  The state
// lives in CachingAllocator.cpp; this file turns it into Python objects.
#pragma once

#include <pybind11/pybind11.h>

namespace at::axon {

void bindMemoryTools(pybind11::module_& m);

}  // namespace at::axon
