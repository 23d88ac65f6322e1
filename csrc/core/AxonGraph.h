// Graph capture and replay (AxonGraph.cpp).
#pragma once

#include <c10/core/Device.h>

namespace at::axon {

// Registers the axon graph with ATen's GraphImplRegistry (torch.accelerator.Graph),
// under the device's current name: call after the backend is renamed.
void registerGraphImpl();

// The current stream of `device` captures a graph (cheap when nothing captures).
bool currentStreamCapturing(c10::DeviceIndex device);

}  // namespace at::axon
