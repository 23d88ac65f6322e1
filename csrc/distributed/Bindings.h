// Python bindings of csrc/distributed: torch_axon._C._distributed.
#pragma once

namespace pybind11 {
class module_;
}

namespace at::axon {

// Adds the submodule _distributed (ProcessGroupAxon, ProcessGroupGlooAxon,
// memcpy_bandwidth) to m.
void initDistributedBindings(pybind11::module_& m);

}  // namespace at::axon
