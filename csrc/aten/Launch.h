// Tier 2: native ops run as stream work.  The host thread checks arguments,
// works out the result's shape, allocates it and enqueues a kernel on the
// device's current stream; it does not wait.  Kernels read and write device
// memory through host views (axon memory is host-addressable), so a kernel is
// either one of ours (kernels/) or an ATen CPU kernel.
//
// launch() and the lifetime of what kernels capture: core/StreamWork.h.
#pragma once

#include <functional>

#include <ATen/Tensor.h>

#include "../core/AxonRuntime.h"
#include "../core/AxonStream.h"
#include "../core/StreamWork.h"

namespace at::axon {

// Like launch(), but the first time a kernel `name` sees a combination of
// dtypes (`dtypes`, any hash of them), it runs synchronously on the calling
// thread after the stream has drained, so that a kernel rejecting the dtypes
// raises its own error (NotImplementedError and the like) at the call, as
// CUDA's host-side dtype dispatch does.  Later launches are asynchronous.
void launchChecked(c10::DeviceIndex device, const char* name, uint64_t dtypes, int threads,
                   std::function<void()> fn);

// An uninitialised axon tensor on `device` (allocated on its current stream).
at::Tensor emptyDevice(c10::IntArrayRef sizes, c10::IntArrayRef strides,
                       c10::ScalarType dtype, c10::DeviceIndex device);
at::Tensor emptyDevice(c10::IntArrayRef sizes, c10::ScalarType dtype,
                       c10::DeviceIndex device);  // contiguous
// Laid out like t when t is dense (channels_last stays channels_last), else
// dense in t's dimension order: empty_like's preserve_format.
at::Tensor emptyDeviceLike(const at::Tensor& t, c10::ScalarType dtype);

// The axon device of an op's main tensor; PyTorch's same-device error if it
// is on another device.
c10::DeviceIndex axonDevice(const char* op, const at::Tensor& t);

// A CPU argument an asynchronous kernel reads later: copied now, as CUDA
// copies host arguments at launch, so the caller may change it meanwhile.
at::Tensor snapshotCpuTensor(const at::Tensor& t);

}  // namespace at::axon
