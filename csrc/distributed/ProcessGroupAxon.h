// ProcessGroupAxon: the c10d backend "axon" (torch.distributed on axon devices).
//
// Collectives are stream work.  A call checks its arguments on the host,
// orders the group's communication stream after the caller's current stream
// (an event), records the tensors' use on that stream with the caching
// allocator, enqueues the transfer (axon::comm, shared memory between the
// processes of the host) and returns a Work at once.  Work::wait() makes the
// caller's current stream wait for the collective, as NCCL's does; the host
// only blocks in barrier() and in an explicit synchronisation.  A collective
// that fails (a peer died or timed out) marks the group broken: the error
// surfaces at the next synchronisation of a stream that waited for it, and
// every later call on the group raises it at once.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace pybind11 {
class module_;
}

namespace at::axon {

void initDistributedBindings(pybind11::module_& m);

}  // namespace at::axon
