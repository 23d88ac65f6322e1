// Axon memory is host-addressable (rt::DeviceProperties::host_accessible), so
// an axon tensor can be handed to a CPU kernel as a CPU tensor over the same
// bytes, once the streams that write it have drained.  The fallback and the
// slow copy paths are built on that.
#pragma once

#include <ATen/Tensor.h>

namespace at::axon {

// A CPU tensor over t's memory, same storage span, offset, sizes, strides.
// With `resizable`, a kernel may resize it; it then gets fresh CPU memory and
// the caller notices the storage changed.
at::Tensor hostView(const at::Tensor& t, bool resizable = false);

// The same from device memory (a storage's data and size) and a geometry.
at::Tensor hostView(void* data, size_t nbytes, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                    int64_t offset, caffe2::TypeMeta dtype, bool conj, bool neg);

// A Python number as PyTorch wraps it (a 0-dim CPU tensor marked as a
// wrapped number, which type promotion treats as a scalar), and back.
at::Tensor wrappedNumber(const at::Scalar& value, c10::ScalarType dtype);
at::Scalar wrappedNumberValue(const at::Tensor& t);

// An axon tensor on `device` holding a copy of the CPU tensor `src`
// (same strides when src is dense).
at::Tensor copyToDevice(const at::Tensor& src, c10::DeviceIndex device);

// Waits for the work on device's current stream.
void syncCurrentStream(c10::DeviceIndex device);

}  // namespace at::axon
