// torch_axon._C: the few entry points Python needs beyond what PyTorch's
// generic APIs (torch.accelerator, torch.Stream, torch.Event) already reach
// through the guard, hooks and allocator.
#include <c10/core/InferenceMode.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/utils/device_lazy_init.h>
#include <torch/csrc/utils/pybind.h>

#include "../core/StreamWork.h"
#include "Inductor.h"
#include "../distributed/Bindings.h"
#include "../profiler/Profiler.h"
#include "../aten/CustomKernel.h"
#include "../aten/Fallback.h"
#include "../aten/Fusion.h"
#include "../aten/GenericKernel.h"
#include "../aten/KernelSelect.h"
#include "../aten/Kernels.h"
#include "../aten/Registry.h"
#include "../core/AxonGenerator.h"
#include "../core/AxonGraph.h"
#include "../core/AxonIpc.h"
#include "../core/SyncDebug.h"
#include "../core/AxonRuntime.h"
#include "../core/AxonStream.h"
#include "../core/CachingAllocator.h"
#include "../core/MemoryHistory.h"

#include <axon/env.h>

namespace py = pybind11;
using namespace at::axon;

namespace {

py::dict device_properties(int device) {
  auto p = rt_call([&] { return rt::get_device_properties(device); });
  py::dict d;
  d["name"] = p.name;
  d["total_memory"] = p.total_memory;
  d["multi_processor_count"] = p.compute_units;
  d["physical_cores"] = p.physical_cores;
  d["host_accessible"] = p.host_accessible;
  d["system_index"] = p.system_index;
  return d;
}

py::tuple default_generators() {
  int n = device_count();
  py::tuple t(n);
  for (int i = 0; i < n; ++i) {
    t[i] = py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(
        getDefaultAxonGenerator(static_cast<c10::DeviceIndex>(i))));
  }
  return t;
}

// Enqueues work that throws on the device's current stream: how tests check
// that an asynchronous error surfaces at the next synchronisation.
void inject_async_error(int device, const std::string& message) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<std::string>> names;  // launch keeps the name
  const char* name;
  {
    std::lock_guard<std::mutex> lock(mu);
    names.push_back(std::make_unique<std::string>("axon_test_error"));
    name = names.back()->c_str();
  }
  rt::Stream s = current_rt_stream(static_cast<c10::DeviceIndex>(device));
  rt_call([&] {
    rt::launch(s, name, [message] { throw std::runtime_error(message); });
  });
}

// Enqueues a sleep: makes pending stream work observable in tests.
void sleep_on_stream(int device, double ms) {
  rt::Stream s = current_rt_stream(static_cast<c10::DeviceIndex>(device));
  rt_call([&] {
    rt::launch(s, "axon_test_sleep", [ms] {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
    });
  });
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "Axon device runtime bindings";
  // Before any kernel can run (kernels launch only once Python calls ops).
  installKernelParallelBackend();
  fusion::install();
  m.def("_device_count", [] { return static_cast<int>(device_count()); });
  m.def("_devices_initialized", [] { return ::axon::rt::devices_initialized(); });
  // torch's own "device initialised" flag (what device_lazy_init sets after
  // torch.axon._lazy_init), for set-ups that did not come through it
  // (torch.axon.init()); torch.accelerator.empty_host_cache() checks it.
  m.def("_mark_torch_device_initialized", [] {
    torch::utils::set_requires_device_init(c10::DeviceType::PrivateUse1, false);
  });
  m.def("_current_device", [] { return static_cast<int>(current_device()); });
  m.def("_set_device", [](int d) { set_device(static_cast<c10::DeviceIndex>(d)); });
  m.def("_synchronize", [](int d) {
    py::gil_scoped_release no_gil;
    rt_call([&] { rt::device_synchronize(d); });
    releaseFinishedWork();
  });
  // Graphs (core/AxonGraph.h): torch.accelerator.Graph / torch.axon.AxonGraph.
  m.def("_register_graph_impl", [] { registerGraphImpl(); });
  m.def("_is_current_stream_capturing", [](int d) {
    return currentStreamCapturing(static_cast<c10::DeviceIndex>(d));
  });
  m.def("_get_device_properties", &device_properties);
  m.def("_meta_for_axon", [] { return metaForAxon(); });
  // torch_axon.kernel's native ops (aten/CustomKernel.h).
  m.def("_register_native_op", &registerNativeOp, py::arg("qualname"), py::arg("fn"),
        py::arg("shape_fn"), py::arg("launch_name"));
  // The memory format of the CPU's convolution result for these arguments
  // (aten/GenericKernel.h): torch.compile's fake convolutions on axon ask it
  // (integrations/torch_compile.py), so that compiled and eager layouts agree.
  m.def("_conv_memory_format",
        [](std::vector<int64_t> input_sizes, std::vector<int64_t> input_strides,
           std::vector<int64_t> weight_sizes, std::vector<int64_t> weight_strides,
           at::ScalarType dtype, std::optional<std::vector<int64_t>> bias_sizes,
           std::vector<int64_t> stride, std::vector<int64_t> padding,
           std::vector<int64_t> dilation, bool transposed, std::vector<int64_t> output_padding,
           int64_t groups) {
          return convMemoryFormat(
              input_sizes, input_strides, weight_sizes, weight_strides, dtype,
              bias_sizes.has_value() ? std::optional<at::IntArrayRef>(*bias_sizes) : std::nullopt,
              stride, padding, dilation, transposed, output_padding, groups);
        });
  // reduce-overhead's graphs (integrations/torch_compile.py): every tensor on
  // `t`'s storage raises `msg` when its data is used from now on (torch.cuda's
  // _set_storage_data_ptr_access_error_msg, for a graph output a later replay
  // overwrote).  For storages that do not own their memory.
  m.def("_invalidate_storage", [](const at::Tensor& t, std::string msg) {
    c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
    TORCH_CHECK(s != nullptr, "_invalidate_storage: a tensor without storage");
    s->release_data_and_set_meta_custom_data_ptr_error_msg_(std::move(msg));
  });
  m.def("_launch_blocking", [] { return rt::launch_blocking(); });
  m.def("_in_bad_fork", [] { return rt::in_bad_fork(); });
  m.def("_check_device", [](int d) { check_device(static_cast<c10::DeviceIndex>(d)); });
  m.def("_stream_priority", [](int d, int64_t id) {
    return rt_call([&] { return rt::stream_priority(rt::Stream{d, id}); });
  });
  m.def("_default_generators", &default_generators);
  m.def("_fallback_stats", [] { return fallbackStats(); });
  m.def("_reset_fallback_stats", [] { resetFallbackStats(); });
  // Adaptive eager (aten/Fusion.h): torch.axon.fusion_stats().
  m.def("_fusion_stats", [] {
    const fusion::Stats s = fusion::stats();
    py::dict d;
    d["chains_seen"] = s.chains_seen;
    d["fused_kernels"] = s.fused_kernels;
    d["ops_fused"] = s.ops_fused;
    d["tiles"] = s.tiles;
    d["intermediate_bytes_not_written"] = s.intermediate_bytes_not_written;
    d["kernels_compiled"] = s.kernels_compiled;
    return d;
  });
  m.def("_reset_fusion_stats", [] { fusion::resetStats(); });
  m.def("_set_adaptive_eager", [](int mode) { setAdaptiveEager(mode); });
  m.def("_adaptive_eager", [] { return adaptiveEager(); });
  m.def("_test_fusion_fail", [](const std::string& op) { fusion::failForTest(op); });
  m.def("_test_fusion_tile_bytes", [](int64_t bytes) { fusion::setTileBytesForTest(bytes); });
  m.def("_test_fusion_own_threads", [](int mode) { fusion::setOwnThreadsForTest(mode); });
  // The runtime's compute team (runtime.h): helpers started, loops run on it.
  m.def("_team_stats", [] {
    const ::axon::rt::TeamStats s = ::axon::rt::team_stats();
    py::dict d;
    d["helpers"] = s.helpers;
    d["sleeping"] = s.sleeping;
    d["loops"] = s.loops;
    d["serial_loops"] = s.serial_loops;
    d["helper_chunks"] = s.helper_chunks;
    d["helper_moves"] = s.helper_moves;
    return d;
  });
  // The axon kernel registrations (aten/Registry.h): (op, dispatch key, path,
  // family, source file) per registration; torch_axon/ops.py makes the table.
  m.def("_op_table", [] {
    py::list rows;
    for (const OpRecord& r : opTable()) {
      rows.append(py::make_tuple(r.op, r.key, pathName(r.path), r.family, r.file));
    }
    return rows;
  });
  // Kernel selection (aten/KernelSelect.h): (op, dtype, shape class, layout, choice,
  // threads, source, own/worker us, own/team us, library/worker us, library/team us,
  // own runs, library runs) per key; python -m torch_axon.tune.
  m.def("_kernel_select_table", [] {
    py::list rows;
    for (const kselect::Row& r : kselect::table()) {
      rows.append(py::make_tuple(r.op, r.dtype, r.shape, r.layout, r.choice, r.threads, r.source,
                                 r.us[0], r.us[1], r.us[2], r.us[3], r.own_runs,
                                 r.library_runs, r.samples));
    }
    return rows;
  });
  // The thread policy: (kernel, bytes class, threads, source, worker us, team us,
  // worker runs, team runs, measurements) per key.
  m.def("_thread_policy_table", [] {
    py::list rows;
    for (const kselect::ThreadRow& r : kselect::threadTable()) {
      rows.append(py::make_tuple(r.kernel, r.bytes, r.choice, r.source, r.worker_us,
                                 r.team_us, r.worker_runs, r.team_runs, r.samples));
    }
    return rows;
  });
  m.def("_num_device_allocs", [](int d) {
    return numDeviceAllocs(static_cast<c10::DeviceIndex>(d));
  });
  // One backward pass through a node on device d's autograd thread, made of
  // tensors without Python objects (see torch_axon/axon/_exit.py): when it
  // returns, that thread has released every earlier pass; its own pass holds
  // nothing whose release needs the GIL.  The GIL is released meanwhile, so
  // the thread can drop an earlier pass's Python objects.
  m.def("_autograd_turnover", [](int d) {
    const c10::Device device(kAxon, static_cast<c10::DeviceIndex>(d));
    c10::InferenceMode no_inference(false);
    torch::autograd::AutoGradMode grad(true);
    at::Tensor x = at::zeros({}, at::TensorOptions().device(device)).requires_grad_(true);
    torch::autograd::backward({x.mul(2)}, {at::ones({}, at::TensorOptions().device(device))});
  }, py::call_guard<py::gil_scoped_release>());
  // The runtime's environment parsers (axon/env.h), so Python reads AXON_*
  // variables with the same rules and the same "ignoring ..." warning.
  m.def("_env_bool", [](const std::string& name, bool fallback) {
    return rt::env_bool(name.c_str(), fallback);
  });
  m.def("_env_bytes", [](const std::string& name, size_t fallback) {
    return rt::env_bytes(name.c_str(), fallback);
  });
  // (free, limit) bytes of host memory for the devices of this process
  // (AXON_HOST_MEMORY); limit 0 means none.
  m.def("_host_memory_info", [] {
    const rt::MemoryInfo i = rt::host_memory_info();
    return std::make_pair(i.free, i.total);
  });
  m.def("_test_inject_async_error", &inject_async_error);
  m.def("_test_sleep_on_stream", &sleep_on_stream);
  // Waits for an event without reporting its work's errors (the allocators'
  // wait; tests that must order failures without raising them).
  m.def("_test_event_wait", [](uintptr_t event) {
    if (event != 0) rt_call([&] { rt::event_wait(reinterpret_cast<rt::Event*>(event)); });
  }, py::call_guard<py::gil_scoped_release>());
  // Sharing storages between processes (core/AxonIpc.h; torch.multiprocessing
  // through torch_axon/integrations/torch_multiprocessing.py).  A handle is
  // (device, pid, fd, id, inode, alloc_size, offset, nbytes, counter_fd,
  // counter_inode, counter_slot).
  m.def("_ipc_share", [](const at::Tensor& t) {
    const ipc::Handle h = [&] {
      py::gil_scoped_release no_gil;
      return ipc::share(*t.storage().unsafeGetStorageImpl());
    }();
    return py::make_tuple(h.device, h.pid, h.fd, h.id, h.inode, h.alloc_size, h.offset, h.nbytes,
                          h.counter_fd, h.counter_inode, h.counter_slot);
  });
  m.def("_ipc_open", [](const py::tuple& t) {
    TORCH_CHECK(t.size() == 11, "axon IPC: a handle has 11 fields, got ", t.size());
    ipc::Handle h;
    h.device = t[0].cast<int>();
    h.pid = t[1].cast<int>();
    h.fd = t[2].cast<int>();
    h.id = t[3].cast<uint64_t>();
    h.inode = t[4].cast<uint64_t>();
    h.alloc_size = t[5].cast<size_t>();
    h.offset = t[6].cast<size_t>();
    h.nbytes = t[7].cast<size_t>();
    h.counter_fd = t[8].cast<int>();
    h.counter_inode = t[9].cast<uint64_t>();
    h.counter_slot = t[10].cast<size_t>();
    // A uint8 tensor over the storage; Python takes its untyped_storage().
    c10::Storage storage = ipc::open(h);
    const auto n = static_cast<int64_t>(h.nbytes);
    return at::empty({0}, at::TensorOptions().dtype(at::kByte).device(storage.device()))
        .set_(storage, 0, {n}, {1});
  });
  m.def("_ipc_release_counter", [](int pid, int fd, uint64_t inode, size_t slot) {
    ipc::releaseCounter(pid, fd, inode, slot);
  });
  m.def("_ipc_collect", [] { return ipc::collect(); }, py::call_guard<py::gil_scoped_release>());
  m.def("_ipc_sent_stats", [] {
    const ipc::SentStats s = ipc::sentStats();
    return std::make_pair(s.live, s.limbo);
  });
  // torch.axon.set_sync_debug_mode / get_sync_debug_mode (core/SyncDebug.h).
  m.def("_set_sync_debug_mode", [](int mode) { setSyncDebugMode(mode); });
  m.def("_get_sync_debug_mode", [] { return syncDebugMode(); });
  // Memory tools (core/MemoryHistory.h): MemPool, use_mem_pool, history and
  // snapshots, set_per_process_memory_fraction, host_memory_stats.
  bindMemoryTools(m);
  initInductorBindings(m);
  initDistributedBindings(m);
  at::axon::profiler::initProfilerBindings(m);
}
