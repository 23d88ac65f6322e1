// DDP's timer for axon (the counterpart of torch's CudaTimer in
// reducer_cuda.cpp): DDP records forward/backward/communication events on the
// current stream and reads their elapsed times for its runtime statistics
// (DDP logging, `_get_ddp_logging_data`).  Without one, DDP warns that time
// stats are only collected for CPU and CUDA devices.
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include "../core/AxonRuntime.h"
#include "../core/AxonStream.h"

namespace at::axon {
namespace {

class AxonTimer : public c10d::Timer {
 public:
  explicit AxonTimer(c10::Device device) : device_(device) {}

  void record(Event event) override {
    c10d::Timer::record(event);  // host time as well
    c10::DeviceGuard guard(device_);
    get(event).record(getCurrentAxonStream(device_.index()));
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    c10::DeviceGuard guard(device_);
    c10::Event& a = get(start);
    c10::Event& b = get(end);
    // Events not recorded in this iteration (e.g. no communication happened).
    if (!a.was_marked_for_recording() || !b.was_marked_for_recording()) return std::nullopt;
    a.synchronize();
    b.synchronize();
    double ms = a.elapsedTime(b);
    if (ms < 0) return std::nullopt;  // not in order, as CudaTimer reports
    return static_cast<int64_t>(ms * 1e6);
  }

 private:
  c10::Event& get(Event event) {
    switch (event) {
      case Event::kForwardStart: return forward_start_;
      case Event::kBackwardComputeStart: return backward_compute_start_;
      case Event::kBackwardComputeEnd: return backward_compute_end_;
      case Event::kBackwardCommStart: return backward_comm_start_;
      case Event::kBackwardCommEnd: return backward_comm_end_;
    }
    TORCH_INTERNAL_ASSERT(false, "unknown DDP timer event");
  }

  c10::Device device_;
  c10::Event forward_start_{kAxon, c10::EventFlag::BACKEND_DEFAULT};
  c10::Event backward_compute_start_{kAxon, c10::EventFlag::BACKEND_DEFAULT};
  c10::Event backward_compute_end_{kAxon, c10::EventFlag::BACKEND_DEFAULT};
  c10::Event backward_comm_start_{kAxon, c10::EventFlag::BACKEND_DEFAULT};
  c10::Event backward_comm_end_{kAxon, c10::EventFlag::BACKEND_DEFAULT};
};

}  // namespace
}  // namespace at::axon

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, at::axon::AxonTimer);
}  // namespace c10d
