// torch_axon._C entry points of csrc/profiler (torch.axon.utilization).
#include <torch/csrc/utils/pybind.h>

#include "../core/AxonRuntime.h"
#include "Profiler.h"

namespace py = pybind11;

namespace at::axon::profiler {

void initProfilerBindings(py::module_& m) {
  m.def(
      "_utilization",
      [](int device) { return rt_call([&] { return rt::device_utilization(device); }); },
      "Percent of the last second during which a stream of the device ran work.");
  m.def("_utilization_period_ms", [] { return rt::kUtilizationPeriodMs; });
  m.def("_device_busy", [](int device) {
    auto b = rt_call([&] { return rt::device_busy(device); });
    return py::make_tuple(b.busy_ns, b.clock_ns);
  });
  m.def("_kineto_profiler_registered", &kinetoProfilerRegistered);
  m.def("_task_recording", [] { return rt::task_recording(); });
}

}  // namespace at::axon::profiler
