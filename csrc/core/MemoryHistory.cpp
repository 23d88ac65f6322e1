#include "MemoryHistory.h"

#include <c10/core/AllocatorConfig.h>
#include <limits>

#include <ATen/core/CachingHostAllocator.h>
#include <pybind11/stl.h>
#include <torch/csrc/profiler/combined_traceback.h>

#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "AxonRuntime.h"
#include "CachingAllocator.h"

namespace py = pybind11;

// From torch/csrc/profiler/python/combined_traceback.h (exported by
// libtorch_python), whose header needs nlohmann/json, which the wheel lacks.
namespace torch {
TORCH_API std::vector<pybind11::object> py_symbolize(std::vector<CapturedTraceback*>& to_symbolize);
}  // namespace torch

namespace at::axon {
namespace {

using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::TraceEntry;

// Stack capture for the allocator (CUDA's memory_snapshot.cpp gathers the
// same CapturedTraceback).  ATen's Python bindings release the GIL around an
// op, so gathering the Python stack takes it back, as CUDA's does; only a
// thread Python knows (one that holds the GIL or released it around the op)
// does so.  Threads Python never ran on (stream workers, autograd's device
// threads, communication threads) record C++ frames only (stacks="all") or
// nothing: the allocator never waits there for a GIL some Python thread may
// hold while it waits for them.
bool python_thread() {
  return Py_IsInitialized() && PyGILState_GetThisThreadState() != nullptr;
}

std::shared_ptr<c10::GatheredContext> gather_python() {
  if (!python_thread()) return nullptr;
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/false, /*cpp=*/false);
}

std::shared_ptr<c10::GatheredContext> gather_all() {
  return torch::CapturedTraceback::gather(python_thread(), /*script=*/false, /*cpp=*/true);
}

c10::MempoolId_t to_id(const py::tuple& t) {
  TORCH_CHECK(py::len(t) == 2, "a memory pool id is a tuple of two ints, got ",
              py::str(t).cast<std::string>());
  return {t[0].cast<c10::CaptureId_t>(), t[1].cast<c10::CaptureId_t>()};
}

py::tuple from_id(c10::MempoolId_t id) { return py::make_tuple(id.first, id.second); }

void record_history(std::optional<std::string> enabled, std::optional<std::string> context,
                    const std::string& stacks, size_t max_entries, bool clear_history,
                    const std::vector<std::string>& skip_actions) {
  unsigned skip = 0;
  for (const std::string& a : skip_actions) {
    // c10's parser raises "Unknown TraceEntry action: ..." for others.
    skip |= 1u << static_cast<unsigned>(c10::CachingDeviceAllocator::parseTraceEntryAction(a));
  }
  TORCH_CHECK(!enabled || *enabled == "state" || *enabled == "all",
              "expected enabled to be 'state', 'all', or None, but got '", *enabled, "'");
  TORCH_CHECK(!context || *context == "state" || *context == "alloc" || *context == "all",
              "expected context to be 'state', 'alloc', 'all', or None, but got '", *context,
              "'");
  TORCH_CHECK(stacks == "python" || stacks == "all",
              "expected stacks to be 'python', or 'all', but got '", stacks, "'");
  RecordContext rc = RecordContext::NEVER;
  if (enabled && context) {
    rc = *context == "state" ? RecordContext::STATE
         : *context == "alloc" ? RecordContext::ALLOC
                               : RecordContext::ALL;
  }
  const bool trace = enabled && *enabled == "all";
  if (enabled && *enabled == "state" && rc > RecordContext::STATE) rc = RecordContext::STATE;
  auto gather = rc == RecordContext::NEVER ? nullptr
                : stacks == "all"          ? &gather_all
                                           : &gather_python;
  recordHistory(trace, rc, gather, max_entries, clear_history || !enabled, skip);
}

const char* action_name(TraceEntry::Action a) {
  switch (a) {
    case TraceEntry::ALLOC: return "alloc";
    case TraceEntry::FREE_REQUESTED: return "free_requested";
    case TraceEntry::FREE_COMPLETED: return "free_completed";
    case TraceEntry::SEGMENT_ALLOC: return "segment_alloc";
    case TraceEntry::SEGMENT_FREE: return "segment_free";
    case TraceEntry::SEGMENT_MAP: return "segment_map";
    case TraceEntry::SEGMENT_UNMAP: return "segment_unmap";
    case TraceEntry::SNAPSHOT: return "snapshot";
    case TraceEntry::OOM: return "oom";
  }
  return "unknown";
}

int64_t stream_id(void* tag) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(tag)); }

// The snapshot dict of torch.cuda.memory._snapshot (torch/cuda/memory.py
// documents it; torch/cuda/_memory_viz.py reads it).
py::dict snapshot_dict(std::optional<c10::MempoolId_t> pool, bool include_traces) {
  Snapshot s = snapshot(pool, include_traces);

  // Symbolize every context once (CUDA does the same).
  std::vector<torch::CapturedTraceback*> to_symbolize;
  std::unordered_map<torch::CapturedTraceback*, size_t> index;
  auto note = [&](const std::shared_ptr<c10::GatheredContext>& ctx) {
    auto* tb = dynamic_cast<torch::CapturedTraceback*>(ctx.get());
    if (tb != nullptr && index.emplace(tb, to_symbolize.size()).second) {
      to_symbolize.push_back(tb);
    }
  };
  for (auto& seg : s.segments) {
    note(seg.context_when_allocated);
    for (auto& b : seg.blocks) note(b.context_when_allocated);
  }
  for (auto& t : s.device_traces) {
    for (auto& e : t) note(e.context_);
  }
  std::vector<py::object> symbolized = torch::py_symbolize(to_symbolize);
  auto frames = [&](const std::shared_ptr<c10::GatheredContext>& ctx) -> py::object {
    auto* tb = dynamic_cast<torch::CapturedTraceback*>(ctx.get());
    if (tb == nullptr) return py::list();
    return symbolized.at(index.at(tb));
  };

  py::list segments;
  for (auto& seg : s.segments) {
    py::dict d;
    d["device"] = static_cast<int>(seg.device);
    d["address"] = seg.address;
    d["total_size"] = seg.total_size;
    d["allocated_size"] = seg.allocated_size;
    d["active_size"] = seg.active_size;
    d["requested_size"] = seg.requested_size;
    d["stream"] = stream_id(seg.stream);
    d["segment_type"] = seg.is_large ? "large" : "small";
    d["segment_pool_id"] = from_id(seg.owner_private_pool_id);
    d["is_expandable"] = false;
    d["frames"] = frames(seg.context_when_allocated);
    py::list blocks;
    size_t address = seg.address;
    for (auto& b : seg.blocks) {
      py::dict bd;
      bd["address"] = address;
      bd["size"] = b.size;
      bd["requested_size"] = b.requested_size;
      bd["state"] = b.allocated ? "active_allocated"
                    : b.active  ? "active_pending_free"
                                : "inactive";
      bd["frames"] = frames(b.context_when_allocated);
      blocks.append(bd);
      address += b.size;
    }
    d["blocks"] = blocks;
    segments.append(d);
  }

  py::list traces;
  for (auto& t : s.device_traces) {
    py::list entries;
    for (auto& e : t) {
      py::dict d;
      d["action"] = action_name(e.action_);
      if (e.action_ == TraceEntry::OOM) {
        d["device_free"] = e.addr_;
      } else {
        d["addr"] = e.addr_;
      }
      d["size"] = e.size_;
      d["stream"] = stream_id(e.stream_);
      d["pool_id"] = from_id(e.mempool_);
      d["time_us"] = static_cast<int64_t>(e.time_.approx_t_);
      d["frames"] = frames(e.context_);
      d["compile_context"] = "";
      d["user_metadata"] = "";
      entries.append(d);
    }
    traces.append(entries);
  }

  py::dict settings;
  using AllocConf = c10::CachingAllocator::AcceleratorAllocatorConfig;
  settings["PYTORCH_AXON_ALLOC_CONF"] = AllocConf::last_allocator_settings();
  settings["max_split_size"] =
      AllocConf::max_split_size() == std::numeric_limits<size_t>::max()
          ? int64_t{-1}
          : static_cast<int64_t>(AllocConf::max_split_size());
  settings["garbage_collection_threshold"] = AllocConf::garbage_collection_threshold();
  settings["expandable_segments"] = false;  // not implemented
  settings["pinned_num_register_threads"] = 1;
  settings["release_lock_on_malloc"] = false;
  settings["pinned_use_host_register"] = false;
  settings["roundup_power2_divisions"] = py::dict();

  py::dict out;
  out["segments"] = segments;
  out["device_traces"] = traces;
  out["allocator_settings"] = settings;
  out["external_annotations"] = py::list();
  return out;
}

py::dict stat_dict(const c10::CachingAllocator::Stat& s) {
  py::dict d;
  d["current"] = s.current;
  d["peak"] = s.peak;
  d["allocated"] = s.allocated;
  d["freed"] = s.freed;
  return d;
}

// torch.cuda.host_memory_stats_as_nested_dict's keys where they mean
// something here: buffers owned (allocations, allocated_bytes: in use and
// cached), in use (active_*), runtime host_alloc/host_free calls.  CUDA's
// host_alloc_time/host_free_time are not measured.
py::dict host_stats() {
  at::HostStats s = at::getHostAllocator(kAxon)->get_stats();
  py::dict d;
  d["allocations"] = stat_dict(s.allocations);
  d["allocated_bytes"] = stat_dict(s.allocated_bytes);
  d["active_requests"] = stat_dict(s.active_requests);
  d["active_bytes"] = stat_dict(s.active_bytes);
  d["num_host_alloc"] = s.num_host_alloc;
  d["num_host_free"] = s.num_host_free;
  return d;
}

}  // namespace

void bindMemoryTools(py::module_& m) {
  // Private pools.
  m.def("_mempool_new_id", [](bool for_graph) { return from_id(newPoolId(for_graph)); });
  m.def("_mempool_retain", [](int device, const py::tuple& id) {
    retainPool(static_cast<c10::DeviceIndex>(device), to_id(id));
  });
  m.def("_mempool_release", [](int device, const py::tuple& id) {
    releasePool(static_cast<c10::DeviceIndex>(device), to_id(id));
  });
  m.def("_mempool_use_count", [](int device, const py::tuple& id) {
    return poolUseCount(static_cast<c10::DeviceIndex>(device), to_id(id));
  });
  m.def("_begin_allocate_current_thread_to_pool", [](int device, const py::tuple& id) {
    const auto tid = std::this_thread::get_id();
    beginAllocateToPool(static_cast<c10::DeviceIndex>(device), to_id(id),
                        [tid](c10::StreamId) { return std::this_thread::get_id() == tid; });
  });
  // Test hook: route the allocations made on these streams (any thread).
  m.def("_test_begin_allocate_to_pool_on_streams",
        [](int device, const py::tuple& id, std::vector<int64_t> streams) {
          beginAllocateToPool(static_cast<c10::DeviceIndex>(device), to_id(id),
                              [streams](c10::StreamId s) {
                                for (int64_t x : streams) {
                                  if (x == s) return true;
                                }
                                return false;
                              });
        });
  m.def("_end_allocate_to_pool", [](int device, const py::tuple& id) {
    endAllocateToPool(static_cast<c10::DeviceIndex>(device), to_id(id));
  });

  // History and snapshots.
  m.def("_record_memory_history", &record_history);
  m.def("_memory_snapshot", [](std::optional<py::tuple> pool, bool include_traces) {
    return snapshot_dict(pool ? std::optional<c10::MempoolId_t>(to_id(*pool)) : std::nullopt,
                         include_traces);
  });

  // Memory fraction.
  m.def("_caching_allocator_enable", [](bool enabled) { setCachingEnabled(enabled); });
  m.def("_caching_allocator_is_enabled", [] { return cachingEnabled(); });
  m.def("_set_memory_fraction", [](double fraction, int device) {
    setMemoryFraction(static_cast<c10::DeviceIndex>(device), fraction);
  });
  m.def("_get_memory_fraction",
        [](int device) { return getMemoryFraction(static_cast<c10::DeviceIndex>(device)); });

  // Pinned host memory.
  m.def("_host_memory_stats", &host_stats);
  m.def("_host_reset_accumulated_stats",
        [] { at::getHostAllocator(kAxon)->reset_accumulated_stats(); });
  m.def("_host_reset_peak_stats", [] { at::getHostAllocator(kAxon)->reset_peak_stats(); });
}

}  // namespace at::axon
