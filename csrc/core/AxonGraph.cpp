// Graphs (torch.axon.AxonGraph, torch.accelerator.Graph on axon): capture
// and replay, as c10/cuda's CUDAGraph.  The runtime records what is issued
// on the capturing stream (runtime.h, "graphs"); this layer gives the capture
// a private memory pool (CachingAllocator.h), makes random ops draw new
// numbers at each replay (GraphRng, AxonGenerator.h), and registers the
// implementation with ATen's GraphImplRegistry under the device's name.
#include "AxonGraph.h"

#include <fstream>
#include <map>
#include <memory>
#include <thread>

#include <ATen/core/GraphImplInterface.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include "AxonGenerator.h"
#include "AxonRuntime.h"
#include "AxonStream.h"
#include "CachingAllocator.h"

namespace at::axon {
namespace {

class AxonGraphImpl final : public at::GraphImplInterface {
 public:
  explicit AxonGraphImpl(const at::GraphImplArgs& args) : keep_graph_(args.keep_graph) {}
  ~AxonGraphImpl() override {
    try {
      reset();
    } catch (const std::exception& e) {
      TORCH_WARN("axon: releasing a graph failed: ", e.what());
    }
  }

  void capture_begin(c10::MempoolId_t pool, at::GraphCaptureMode mode) override {
    TORCH_CHECK(!has_graph_, "This AxonGraph instance already owns a captured graph. "
                             "To capture a new graph, create a new instance.");
    TORCH_CHECK(!capturing_, "This AxonGraph instance is already capturing");
    TORCH_CHECK(cachingEnabled(), "axon graph capture needs the caching allocator: allocations "
                "would not come from the graph's pool (torch.axon.caching_allocator_enable(True))");
    device_ = current_device();
    const c10::Stream stream = getCurrentAxonStream(device_);
    TORCH_CHECK(stream.id() != getDefaultAxonStream(device_).id(),
                "Axon graphs must be captured on a non-default stream. (However, after "
                "capture, it's ok to replay them on the default stream.)");
    const rt::Stream s = to_rt(stream);
    const rt::CaptureMode rt_mode = mode == at::GraphCaptureMode::ThreadLocal
                                        ? rt::CaptureMode::kThreadLocal
                                    : mode == at::GraphCaptureMode::Relaxed
                                        ? rt::CaptureMode::kRelaxed
                                        : rt::CaptureMode::kGlobal;
    rt_call([&] { rt::stream_begin_capture(s, rt_mode); });
    stream_ = stream;
    capturing_ = true;
    try {
      // Allocations on the capture's streams (the one it began on and those
      // that joined it), from any thread, come from the graph's pool.
      const uint64_t id = rt_call([&] { return rt::stream_capture_id(s); });
      pool_ = pool.first != 0 || pool.second != 0 ? pool : newPoolId(/*for_graph=*/true);
      const c10::DeviceIndex d = device_;
      beginAllocateToPool(d, pool_, [d, id](c10::StreamId sid) {
        return rt::stream_capture_id(rt::Stream{d, sid}) == id;
      });
      pool_owned_ = true;
      routing_ = true;
      rng_ = std::make_shared<GraphRng>();
      capture_id_ = id;
      setCaptureRng(capture_id_, rng_);
    } catch (...) {
      reset();
      throw;
    }
  }

  void capture_end() override {
    TORCH_CHECK(capturing_, "capture_end() called without a preceding capture_begin()");
    TORCH_CHECK(getCurrentAxonStream(device_) == stream_,
                "Capture must end on the same stream it began on.");
    capturing_ = false;
    setCaptureRng(capture_id_, nullptr);
    stopRouting();
    try {
      graph_ = rt_call([&] { return rt::stream_end_capture(to_rt(stream_)); });
    } catch (...) {
      reset();  // the pool and the rng go with the failed capture
      throw;
    }
    has_graph_ = true;
    if (rt::graph_num_tasks(graph_) == 0) {
      TORCH_WARN("The axon graph is empty. This usually means that the graph was attempted "
                 "to be captured on the wrong device or stream.");
    }
  }

  void instantiate() override {
    TORCH_CHECK(has_graph_, "Called AxonGraph::instantiate without a preceding successful capture.");
  }

  void replay() override {
    TORCH_CHECK(has_graph_, "Called AxonGraph::replay without a preceding successful capture.");
    const c10::Stream stream = getCurrentAxonStream(device_);
    const rt::Stream s = to_rt(stream);
    // Replays of one graph run one after another, as launches of one CUDA
    // graph exec do: they share the graph's memory and its random-number
    // slots, which a replay on another stream would rewrite under this one.
    for (const auto& [sid, done] : replayed_) {
      if (sid != stream.id() && done != nullptr) {
        rt_call([&] { rt::stream_wait_event(s, done); });
      }
    }
    if (std::function<void()> reseed = rng_->prepareReplay()) {
      rt_call([&] { rt::launch(s, "graph replay: rng", std::move(reseed)); });
    }
    rt_call([&] { rt::graph_launch(graph_, s); });
    // Where the replay ends on this stream: reset() waits for it before the
    // graph's work and memory go.
    rt::Event*& done = replayed_[stream.id()];
    if (done == nullptr) done = rt_call([&] { return rt::event_create(device_); });
    rt_call([&] { rt::event_record(done, s); });
  }

  void reset() override {
    if (capturing_) {
      // Abandoned mid-capture (an exception inside `with graph`): end it.
      capturing_ = false;
      setCaptureRng(capture_id_, nullptr);
      try {
        rt::graph_destroy(rt::stream_end_capture(to_rt(stream_)));
      } catch (const rt::Error&) {  // invalidated: it is over either way
      }
    }
    stopRouting();
    // Replays still queued use the graph's work and pool: wait for them (not
    // raising their errors, which stay for the user's next synchronisation),
    // so that the host releases the work and the pool frees nothing in use.
    for (auto& [sid, done] : replayed_) {
      rt::event_wait(done);
      rt::event_destroy(done);
    }
    replayed_.clear();
    if (has_graph_) {
      rt::graph_destroy(graph_);
      graph_ = nullptr;
      has_graph_ = false;
    }
    if (pool_owned_) {
      pool_owned_ = false;
      releasePool(device_, pool_);
    }
    rng_.reset();
  }

  c10::MempoolId_t pool() const override {
    TORCH_CHECK(pool_owned_,
                "Called AxonGraph::pool() without a preceding successful capture.");
    return pool_;
  }

  void enable_debug_mode() override { debug_ = true; }

  void debug_dump(const std::string& path) override {
    TORCH_CHECK(debug_, "AxonGraph::debug_dump: call enable_debug_mode() before capture");
    TORCH_CHECK(has_graph_, "AxonGraph::debug_dump: no captured graph");
    std::ofstream out(path);
    TORCH_CHECK(out.good(), "AxonGraph::debug_dump: cannot write ", path);
    out << "# axon graph on axon:" << static_cast<int>(device_) << ", "
        << rt::graph_num_tasks(graph_) << " tasks in replay order\n"
        << rt::graph_describe(graph_);
  }

 private:
  void stopRouting() {
    if (routing_) {
      routing_ = false;
      endAllocateToPool(device_, pool_);
    }
  }

  bool keep_graph_;
  bool debug_ = false;
  bool capturing_ = false;
  bool has_graph_ = false;
  bool pool_owned_ = false;
  bool routing_ = false;  // the capture's allocations go to the pool
  c10::DeviceIndex device_ = 0;
  c10::Stream stream_{c10::Stream::DEFAULT, c10::Device(kAxon, 0)};
  c10::MempoolId_t pool_{0, 0};
  rt::Graph* graph_ = nullptr;
  std::shared_ptr<GraphRng> rng_;
  uint64_t capture_id_ = 0;  // the runtime's, while capturing
  std::map<c10::StreamId, rt::Event*> replayed_;  // per stream, after its last replay
};

}  // namespace

void registerGraphImpl() {
  const std::string key = c10::DeviceTypeName(kAxon, /*lower_case=*/false);
  auto* registry = at::GraphImplRegistry();
  if (registry->Has(key)) return;
  registry->Register(key, [](const at::GraphImplArgs& args) -> std::unique_ptr<at::GraphImplInterface> {
    return std::make_unique<AxonGraphImpl>(args);
  });
}

bool currentStreamCapturing(c10::DeviceIndex device) {
  if (!rt::device_is_capturing(device)) return false;
  return rt_call([&] { return rt::stream_is_capturing(current_rt_stream(device)); });
}

}  // namespace at::axon
