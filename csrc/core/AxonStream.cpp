#include "AxonStream.h"

#include <array>

namespace at::axon {
namespace {

// The current stream id per device for this thread; 0 is the default stream.
// Sized for DeviceIndex's range, so no allocation on the hot path.
constexpr int kMaxDevices = 128;
thread_local std::array<c10::StreamId, kMaxDevices> current_streams{};

c10::DeviceIndex resolve(c10::DeviceIndex device) {
  if (device < 0) {
    device = current_device();
  }
  check_device(device);
  TORCH_CHECK(device < kMaxDevices, "axon supports at most ", kMaxDevices,
              " devices");
  return device;
}

}  // namespace

c10::Stream getDefaultAxonStream(c10::DeviceIndex device) {
  return to_c10(rt::Stream{resolve(device), 0});
}

c10::Stream getCurrentAxonStream(c10::DeviceIndex device) {
  device = resolve(device);
  return to_c10(rt::Stream{device, current_streams[device]});
}

void setCurrentAxonStream(const c10::Stream& stream) {
  TORCH_CHECK(stream.device_type() == kAxon, "expected an axon stream, got ",
              stream);
  c10::DeviceIndex device = resolve(stream.device_index());
  rt_call([&] { rt::check_stream(to_rt(stream)); });
  current_streams[device] = stream.id();
}

c10::Stream getStreamFromPool(c10::DeviceIndex device, int priority) {
  device = resolve(device);
  return to_c10(rt_call([&] { return rt::stream_from_pool(device, priority); }));
}

}  // namespace at::axon
