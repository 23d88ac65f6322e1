// Python bindings of csrc/distributed: torch_axon._C._distributed
// (torch_axon/distributed/ creates the backends and registers them with c10d).
#include "Bindings.h"

#include <optional>

#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include <axon/comm.h>

#include "GlooAxon.h"
#include "ProcessGroupAxon.h"

namespace at::axon {

void initDistributedBindings(pybind11::module_& m) {
  namespace py = pybind11;
  auto d = m.def_submodule("_distributed", "the axon c10d backend");

  py::class_<ProcessGroupAxon, c10d::Backend, c10::intrusive_ptr<ProcessGroupAxon>>(
      d, "ProcessGroupAxon")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, std::vector<int> host_of,
                       std::optional<c10::intrusive_ptr<c10d::Backend>> leaders,
                       std::optional<c10::intrusive_ptr<c10d::Backend>> global) {
             return c10::make_intrusive<ProcessGroupAxon>(
                 store, rank, size, timeout, std::move(host_of),
                 leaders.value_or(c10::intrusive_ptr<c10d::Backend>()),
                 global.value_or(c10::intrusive_ptr<c10d::Backend>()));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("host_of") = std::vector<int>(), py::arg("leaders") = py::none(),
           py::arg("global_group") = py::none(), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("multi_host", &ProcessGroupAxon::multiHost)
      .def_property_readonly("local_rank", &ProcessGroupAxon::localRank);

  py::class_<ProcessGroupGlooAxon, c10d::Backend, c10::intrusive_ptr<ProcessGroupGlooAxon>>(
      d, "ProcessGroupGlooAxon",
      "The backend of a gloo group for device type axon: gloo on host views of axon tensors.")
      .def(py::init([](const c10::intrusive_ptr<c10d::Backend>& gloo) {
             TORCH_CHECK(gloo, "ProcessGroupGlooAxon needs a gloo backend");
             return c10::make_intrusive<ProcessGroupGlooAxon>(gloo);
           }),
           py::arg("gloo"))
      .def_property_readonly("wrapped", &ProcessGroupGlooAxon::gloo);

  d.def("memcpy_bandwidth", [](size_t bytes, int reps) {
    return ::axon::comm::memcpy_bandwidth(bytes, reps);
  }, py::call_guard<py::gil_scoped_release>());
}

}  // namespace at::axon
