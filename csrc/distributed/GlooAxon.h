// ProcessGroupGlooAxon: the backend of gloo groups for device type axon
// (gloo collectives on host views of axon tensors; see GlooAxon.cpp).
#pragma once

namespace pybind11 {
class module_;
}

namespace at::axon {

// Adds torch_axon._C._distributed.ProcessGroupGlooAxon to the submodule.
void initGlooAxonBindings(pybind11::module_& d);

}  // namespace at::axon
