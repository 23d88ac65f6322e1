#include "HostView.h"

#include <ATen/ScalarOps.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>

#include "../core/AxonRuntime.h"
#include "../core/AxonStream.h"
#include "../core/StreamWork.h"
#include "Launch.h"

namespace at::axon {

at::Tensor hostView(void* data, size_t nbytes, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                    int64_t offset, caffe2::TypeMeta dtype, bool conj, bool neg) {
  c10::Storage cpu_storage(c10::Storage::use_byte_size_t(), nbytes,
                           c10::DataPtr(data, c10::Device(c10::kCPU)), nullptr, false);
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(cpu_storage), c10::DispatchKeySet(c10::DispatchKey::CPU), dtype);
  impl->set_sizes_and_strides(sizes, strides, offset);
  impl->_set_conj(conj);
  impl->_set_neg(neg);
  return at::Tensor(std::move(impl));
}

at::Tensor wrappedNumber(const at::Scalar& value, c10::ScalarType dtype) {
  at::Tensor t = at::detail::scalar_tensor_static(value, dtype, c10::Device(c10::kCPU));
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

at::Scalar wrappedNumberValue(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kDouble: return *t.const_data_ptr<double>();
    case at::kLong: return *t.const_data_ptr<int64_t>();
    case at::kBool: return *t.const_data_ptr<bool>();
    case at::kComplexDouble: return *t.const_data_ptr<c10::complex<double>>();
    default: return t.item();
  }
}

at::Tensor hostView(const at::Tensor& t, bool resizable) {
  const c10::Storage& storage = t.storage();
  c10::Storage cpu_storage(
      c10::Storage::use_byte_size_t(), storage.nbytes(),
      c10::DataPtr(const_cast<void*>(storage.data()), c10::Device(c10::kCPU)),
      resizable ? c10::GetCPUAllocator() : nullptr, resizable);
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(cpu_storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
      t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  impl->_set_conj(t.is_conj());
  impl->_set_neg(t.is_neg());
  return at::Tensor(std::move(impl));
}

void syncCurrentStream(c10::DeviceIndex device) {
  rt::Stream s = current_rt_stream(device);
  rt_call([&] { rt::stream_synchronize(s); });
  releaseFinishedWork();
}

at::Tensor copyToDevice(const at::Tensor& src, c10::DeviceIndex device) {
  c10::DeviceGuard guard(c10::Device(kAxon, device));
  bool dense = src.is_non_overlapping_and_dense();
  at::Tensor dst = dense ? emptyDevice(src.sizes(), src.strides(), src.scalar_type(), device)
                         : emptyDevice(src.sizes(), src.scalar_type(), device);
  if (src.numel() == 0) return dst;
  if (dense) {
    rt::Stream s = current_rt_stream(device);
    rt_call([&] { rt::memcpy(dst.data_ptr(), src.data_ptr(), src.nbytes(), s); });
  } else {
    syncCurrentStream(device);
    hostView(dst).copy_(src);
  }
  return dst;
}

}  // namespace at::axon
