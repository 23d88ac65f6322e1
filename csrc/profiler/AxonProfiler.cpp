// The Kineto activity profiler of the axon device (see Profiler.h).
//
// How a device activity reaches torch.profiler:
// - configure(): Kineto asks every registered profiler for a session when a
//   trace is prepared; ours answers when the device's activity types
//   (CONCURRENT_KERNEL, GPU_MEMCPY: ProfilerActivity.PrivateUse1) are asked.
// - start()/stop(): switch the runtime's task recording on and off.
// - pushCorrelationId()/popCorrelationId(): Kineto calls them on the thread
//   of every host op the profiler records (RecordFunction enter/exit), with
//   the op's correlation id; we keep the innermost one as the runtime's
//   launch correlation of that thread, so each task it launches carries it.
// - processTrace(): each record becomes a GenericTraceActivity named
//   "<launch name> (axon)" (so that key_averages keeps kernels and the ops
//   of the same name apart; copies are "Memcpy (axon)") on
//   pid = device index, tid = stream id, linked (linkedActivity) to the host
//   op with that correlation id: PyTorch then counts it as the op's device
//   time (key_averages), and the Chrome trace names the op as its "External
//   id".  A PRIVATEUSE1_RUNTIME activity on the host thread at the launch
//   starts a flow ("ac2g") that ends at the device activity, as
//   cudaLaunchKernel does for a CUDA kernel.
#include "Profiler.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <IActivityProfiler.h>
#include <libkineto.h>
#include <output_base.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <axon/runtime.h>

namespace at::axon::profiler {
namespace {

namespace rt = ::axon::rt;
using libkineto::ActivityType;

// Dedicated streams (after the two pools) carry the collectives.
bool isCommunicationStream(int64_t id) { return id > 2 * rt::kStreamPoolSize; }

std::string streamLabel(int64_t id) {
  std::string s = "stream " + std::to_string(id);
  if (id == 0) s += " (default)";
  else if (isCommunicationStream(id)) s += " (communication)";
  return s;
}

// "<launch name> (axon)", unless the launch name says so already.
std::string activityName(const std::string& launch_name) {
  static const std::string kSuffix = " (axon)";
  const bool has = launch_name.size() >= kSuffix.size() &&
                   launch_name.compare(launch_name.size() - kSuffix.size(), kSuffix.size(),
                                       kSuffix) == 0;
  return has ? launch_name : launch_name + kSuffix;
}

// Device clock (steady) to Kineto's (system clock, ns since the epoch): the
// offset between the two, read where the two reads are closest together.
int64_t steadyToSystemOffset() {
  using namespace std::chrono;
  int64_t best_gap = INT64_MAX;
  int64_t offset = 0;
  for (int i = 0; i < 5; ++i) {
    const int64_t a = rt::device_clock_ns();
    const int64_t sys = duration_cast<nanoseconds>(system_clock::now().time_since_epoch()).count();
    const int64_t b = rt::device_clock_ns();
    if (b - a < best_gap) {
      best_gap = b - a;
      offset = sys - (a + (b - a) / 2);
    }
  }
  return offset;
}

// The launch correlation of each host thread: Kineto pushes and pops the
// ids of nested ops; the innermost is the one a launch belongs to.  A stack
// left over from an earlier session (an op that exited after the profiler
// stopped never pops) is dropped when its generation is stale.
std::atomic<uint64_t> g_generation{0};

struct CorrelationStack {
  uint64_t generation = 0;
  std::vector<uint64_t> ids;
};
thread_local CorrelationStack t_correlations;

CorrelationStack& correlations() {
  CorrelationStack& s = t_correlations;
  const uint64_t g = g_generation.load(std::memory_order_relaxed);
  if (s.generation != g) {
    s.generation = g;
    s.ids.clear();
  }
  return s;
}

class AxonProfilerSession final : public libkineto::IActivityProfilerSession {
 public:
  explicit AxonProfilerSession(std::set<ActivityType> types) : types_(std::move(types)) {}

  ~AxonProfilerSession() override {
    if (recording_) rt::set_task_recording(false);
  }

  void start() override {
    g_generation.fetch_add(1, std::memory_order_relaxed);
    rt::take_task_records();  // what an earlier session left behind
    offset_ns_ = steadyToSystemOffset();
    recording_ = true;
    rt::set_task_recording(true);
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    rt::set_task_recording(false);
    recording_ = false;
    g_generation.fetch_add(1, std::memory_order_relaxed);
    rt::set_launch_correlation(0);
    rt::TaskRecords taken = rt::take_task_records();
    records_ = std::move(taken.records);
    if (taken.dropped > 0) {
      errors_.push_back("axon: " + std::to_string(taken.dropped) +
                        " device activities were not recorded (more than " +
                        std::to_string(rt::kMaxTaskRecords) + " in one trace)");
    }
    for (const auto& r : records_) {
      devices_.insert(r.device);
      streams_.insert({r.device, r.stream});
    }
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return errors_; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, nullptr, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger,
                    libkineto::getLinkedActivityCallback getLinkedActivity,
                    int64_t captureWindowStartTime, int64_t /*captureWindowEndTime*/) override {
    trace_ = std::make_unique<libkineto::CpuTraceBuffer>();
    trace_->span = libkineto::TraceSpan(captureWindowStartTime, 0, "axon");
    trace_->gpuOpCount = -1;
    // A row name for each device after the first (getDeviceInfo names the
    // first: Kineto takes one DeviceInfo per session).
    for (int d : devices_) {
      if (d != firstDevice()) logger.handleDeviceInfo(deviceInfo(d), captureWindowStartTime);
    }
    const bool kernels = types_.count(ActivityType::CONCURRENT_KERNEL) > 0;
    const bool copies = types_.count(ActivityType::GPU_MEMCPY) > 0;
    const bool runtime = types_.count(ActivityType::PRIVATEUSE1_RUNTIME) > 0;
    uint32_t flow = 0;
    int64_t span_end = captureWindowStartTime;
    for (const rt::TaskRecord& r : records_) {
      const bool copy = r.kind == rt::TaskKind::kCopy;
      if (copy ? !copies : !kernels) continue;
      ++flow;
      const libkineto::ITraceActivity* op = nullptr;
      if (r.correlation != 0 && getLinkedActivity) {
        op = getLinkedActivity(static_cast<int32_t>(r.correlation));
      }
      trace_->emplace_activity(trace_->span,
                               copy ? ActivityType::GPU_MEMCPY : ActivityType::CONCURRENT_KERNEL,
                               copy ? std::string("Memcpy (axon)") : activityName(r.name));
      auto& act = libkineto::CpuTraceBuffer::toRef(trace_->activities.back());
      act.device = r.device;
      act.resource = static_cast<int32_t>(r.stream);
      act.startTime = r.start_ns + offset_ns_;
      act.endTime = r.end_ns + offset_ns_;
      act.id = static_cast<int32_t>(flow);
      act.linked = op;
      act.addMetadata("device", r.device);
      act.addMetadata("stream", r.stream);
      act.addMetadata("correlation", flow);
      if (r.launch_ns != 0) {
        act.addMetadata("queued us", (r.start_ns - r.launch_ns) / 1000);
      }
      if (r.kind == rt::TaskKind::kFused) act.addMetadata("fused tasks", r.tasks);
      if (isCommunicationStream(r.stream)) act.addMetadataQuoted("stream kind", "communication");
      if (r.failed) act.addMetadataQuoted("failed", "true");
      span_end = std::max(span_end, act.endTime);
      if (op != nullptr && runtime) {
        // The launch on the host: a point in the op that launched it (the
        // clocks of op and device differ by the offset's error, so the point
        // is kept inside the op), where the flow to the device activity
        // starts.
        act.flow.id = flow;
        act.flow.type = libkineto::kLinkAsyncCpuGpu;
        act.flow.start = false;
        const int64_t op_start = op->timestamp();
        const int64_t op_end = op_start + std::max<int64_t>(0, op->duration());
        const int64_t at =
            std::clamp(r.launch_ns != 0 ? r.launch_ns + offset_ns_ : op_end, op_start, op_end);
        trace_->emplace_activity(trace_->span, ActivityType::PRIVATEUSE1_RUNTIME,
                                 copy ? "axonMemcpyAsync" : "axonLaunchKernel");
        auto& launch = libkineto::CpuTraceBuffer::toRef(trace_->activities.back());
        launch.device = static_cast<int32_t>(op->deviceId());
        launch.resource = static_cast<int32_t>(op->resourceId());
        launch.threadId = op->getThreadId();
        launch.startTime = at;
        launch.endTime = at;
        launch.id = static_cast<int32_t>(flow);
        launch.linked = op;
        launch.flow.id = flow;
        launch.flow.type = libkineto::kLinkAsyncCpuGpu;
        launch.flow.start = true;
        launch.addMetadata("correlation", flow);
        launch.log(logger);
      }
      act.log(logger);
    }
    trace_->span.endTime = span_end;
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    if (devices_.empty()) return nullptr;
    return std::make_unique<libkineto::DeviceInfo>(deviceInfo(firstDevice()));
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (const auto& [device, stream] : streams_) {
      out.push_back(libkineto::ResourceInfo{stream, stream, device, streamLabel(stream)});
    }
    return out;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return std::move(trace_);
  }

  void pushCorrelationId(uint64_t id) override {
    CorrelationStack& s = correlations();
    s.ids.push_back(id);
    rt::set_launch_correlation(id);
  }

  void popCorrelationId() override {
    CorrelationStack& s = correlations();
    if (!s.ids.empty()) s.ids.pop_back();
    rt::set_launch_correlation(s.ids.empty() ? 0 : s.ids.back());
  }

 private:
  int firstDevice() const { return devices_.empty() ? 0 : *devices_.begin(); }

  static libkineto::DeviceInfo deviceInfo(int device) {
    // Below the host's rows in the viewer, in device order.
    return libkineto::DeviceInfo{device, 0x1000000 + device, "axon:" + std::to_string(device),
                                 "axon " + std::to_string(device)};
  }

  std::set<ActivityType> types_;
  bool recording_ = false;
  int64_t offset_ns_ = 0;
  std::vector<rt::TaskRecord> records_;
  std::set<int> devices_;
  std::set<std::pair<int, int64_t>> streams_;
  std::vector<std::string> errors_;
  std::unique_ptr<libkineto::CpuTraceBuffer> trace_;
};

class AxonActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override {
    static const std::string kName = "axon";
    return kName;
  }

  const std::set<ActivityType>& availableActivities() const override {
    static const std::set<ActivityType> kTypes = {
        ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
        ActivityType::PRIVATEUSE1_RUNTIME};
    return kTypes;
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<ActivityType>& types, const libkineto::Config& /*config*/) override {
    // Only when the device's activities are asked (ProfilerActivity.PrivateUse1).
    if (!types.count(ActivityType::CONCURRENT_KERNEL) && !types.count(ActivityType::GPU_MEMCPY)) {
      return nullptr;
    }
    return std::make_unique<AxonProfilerSession>(types);
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t /*ts_ms*/, int64_t /*duration_ms*/, const std::set<ActivityType>& types,
      const libkineto::Config& config) override {
    return configure(types, config);
  }
};

REGISTER_PRIVATEUSE1_PROFILER(AxonActivityProfiler);

}  // namespace

bool kinetoProfilerRegistered() {
  return torch::profiler::impl::PrivateUse1ProfilerRegistry::instance().hasFactory();
}

}  // namespace at::axon::profiler
