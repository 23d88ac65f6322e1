// torch.profiler's device timeline for axon (Kineto), and the Python entry
// points of csrc/profiler (torch.axon.utilization).
//
// AxonProfiler.cpp registers a libkineto::IActivityProfiler with PyTorch's
// PrivateUse1ProfilerRegistry (REGISTER_PRIVATEUSE1_PROFILER).  While
// torch.profiler records with ProfilerActivity.PrivateUse1, its session turns
// the runtime's task records (axon/runtime.h, "profiling") into Kineto device
// activities: one per kernel, copy, collective or fused run, on a row per
// stream, each linked to the host op that launched it.
#pragma once

namespace pybind11 {
class module_;
}

namespace at::axon::profiler {

// True once the Kineto activity profiler is registered (at load).
bool kinetoProfilerRegistered();

// torch_axon._C._utilization and friends.
void initProfilerBindings(pybind11::module_& m);

}  // namespace at::axon::profiler
