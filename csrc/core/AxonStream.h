// c10::Stream <-> runtime stream, and the thread's current stream per device
// (the counterpart of c10/cuda/CUDAStream.h).
#pragma once

#include <c10/core/Stream.h>

#include "AxonRuntime.h"

namespace at::axon {

inline rt::Stream to_rt(const c10::Stream& s) {
  return rt::Stream{s.device_index(), s.id()};
}

inline c10::Stream to_c10(rt::Stream s) {
  return c10::Stream(c10::Stream::UNSAFE,
                     c10::Device(kAxon, static_cast<c10::DeviceIndex>(s.device)),
                     s.id);
}

c10::Stream getDefaultAxonStream(c10::DeviceIndex device);
c10::Stream getCurrentAxonStream(c10::DeviceIndex device = -1);
void setCurrentAxonStream(const c10::Stream& stream);
c10::Stream getStreamFromPool(c10::DeviceIndex device, int priority);

// The runtime stream work on `device` is ordered on by default.
inline rt::Stream current_rt_stream(c10::DeviceIndex device) {
  return to_rt(getCurrentAxonStream(device));
}

}  // namespace at::axon
