// DeviceGuardImpl for axon: how PyTorch switches devices and streams and uses
// events (c10/core/impl/DeviceGuardImplInterface.h).
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "StreamWork.h"
#include "AxonRuntime.h"
#include "AxonStream.h"
#include "CachingAllocator.h"
#include "SyncDebug.h"

namespace at::axon {
namespace {

rt::Event* as_event(void* e) { return static_cast<rt::Event*>(e); }

struct AxonGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType static_type = kAxon;

  c10::DeviceType type() const override { return kAxon; }

  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.is_privateuseone());
    c10::DeviceIndex old = current_device();
    if (d.index() != old) set_device(d.index());
    return c10::Device(kAxon, old);
  }

  c10::Device getDevice() const override {
    return c10::Device(kAxon, current_device());
  }

  void setDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.is_privateuseone());
    set_device(d.index());
  }

  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      rt::set_device(d.index());
    } catch (...) {
    }
  }

  c10::Stream getStream(c10::Device d) const override {
    return getCurrentAxonStream(d.index());
  }

  c10::Stream getDefaultStream(c10::Device d) const override {
    return getDefaultAxonStream(d.index());
  }

  c10::Stream getStreamFromGlobalPool(c10::Device d,
                                      bool isHighPriority) const override {
    return getStreamFromPool(d.index(), isHighPriority ? -1 : 0);
  }

  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return getStreamFromPool(d.index(), priority);
  }

  c10::Stream exchangeStream(c10::Stream s) const override {
    c10::Stream old = getCurrentAxonStream(s.device_index());
    setCurrentAxonStream(s);
    return old;
  }

  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    if (event != nullptr) rt::event_destroy(as_event(event));
  }

  void record(void** event, const c10::Stream& stream,
              const c10::DeviceIndex device_index,
              const c10::EventFlag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
                "Event device index ", static_cast<int>(device_index),
                " does not match recording stream's device index ",
                static_cast<int>(stream.device_index()), ".");
    rt_call([&] {
      if (*event == nullptr) *event = rt::event_create(stream.device_index());
      rt::event_record(as_event(*event), to_rt(stream));
    });
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    rt_call([&] { rt::stream_wait_event(to_rt(stream), as_event(event)); });
  }

  // As CUDA's queries: a complete event (an idle stream) reports the
  // asynchronous errors of the work it covers that nobody has raised yet, as
  // synchronize() would; incomplete work reports nothing yet.
  bool queryEvent(void* event) const override {
    if (event == nullptr) return true;
    return rt_call([&] {
      if (!rt::event_query(as_event(event))) return false;
      rt::event_synchronize(as_event(event));  // complete: raises, does not wait
      return true;
    });
  }

  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }

  // torch.accelerator.get_device_capability(): the dtypes a tensor can be
  // allocated in and converted between on axon (the contract XPU's and MPS's
  // guards report).  Axon memory is host memory and conversions run ATen's CPU
  // copy kernel, so every dtype the CPU converts is supported: the standard
  // ones, complex32, the float8s and the unsigned ints.  Not reported:
  // quantized dtypes (axon has no quantized tensors), the bits* dtypes and
  // the sub-byte int1-7/uint1-7 and float4 placeholders, which the CPU cannot
  // convert either.
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    check_device(d.index());
    c10::DeviceCapability cap;
    cap.capability_data.capability_bits = 0;
    for (int i : {c10::kIndex_Byte, c10::kIndex_Char, c10::kIndex_Short, c10::kIndex_Int,
                  c10::kIndex_Long, c10::kIndex_Half, c10::kIndex_Float, c10::kIndex_Double,
                  c10::kIndex_ComplexHalf, c10::kIndex_ComplexFloat, c10::kIndex_ComplexDouble,
                  c10::kIndex_Bool, c10::kIndex_BFloat16, c10::kIndex_Float8_e5m2,
                  c10::kIndex_Float8_e4m3fn, c10::kIndex_Float8_e5m2fnuz,
                  c10::kIndex_Float8_e4m3fnuz, c10::kIndex_Float8_e8m0fnu, c10::kIndex_UInt16,
                  c10::kIndex_UInt32, c10::kIndex_UInt64}) {
      cap.capability_data.capability_bits |= uint64_t{1} << i;
    }
    return cap;
  }

  bool queryStream(const c10::Stream& stream) const override {
    return rt_call([&] {
      if (!rt::stream_query(to_rt(stream))) return false;
      rt::stream_synchronize(to_rt(stream));  // idle: raises, does not wait
      return true;
    });
  }

  // torch.Stream.is_capturing / native_handle (as CUDA's: cudaStreamIsCapturing,
  // the cudaStream_t).
  bool isStreamCapturing(const c10::Stream& stream) const override {
    return rt_call([&] { return rt::stream_is_capturing(to_rt(stream)); });
  }

  void* getStreamNativeHandle(const c10::Stream stream) const override {
    return rt_call([&] { return rt::stream_native_handle(to_rt(stream)); });
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    warnOrErrorOnSync();
    rt_call([&] { rt::stream_synchronize(to_rt(stream)); });
    releaseFinishedWork();
  }

  void synchronizeEvent(void* event) const override {
    if (event == nullptr) return;
    rt_call([&] { rt::event_synchronize(as_event(event)); });
  }

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    rt_call([&] { rt::device_synchronize(device_index); });
    releaseFinishedWork();
  }

  void recordDataPtrOnStream(const c10::DataPtr& data_ptr,
                             const c10::Stream& stream) const override {
    getCachingAllocator()->recordStream(data_ptr, stream);
  }

  double elapsedTime(void* start, void* end,
                     const c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "Both events must be recorded before calculating elapsed time.");
    // As CUDA (cudaEventElapsedTime refuses events of two devices): the two
    // devices' clocks are not one timeline a user should subtract.
    const int start_device = rt_call([&] { return rt::event_device(as_event(start)); });
    const int end_device = rt_call([&] { return rt::event_device(as_event(end)); });
    TORCH_CHECK(start_device == end_device,
                "Both events must be recorded on the same device to calculate elapsed time, "
                "but they were recorded on axon:", start_device, " and axon:", end_device);
    return rt_call([&] { return rt::event_elapsed_ms(as_event(start), as_event(end)); });
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, AxonGuardImpl);

}  // namespace
}  // namespace at::axon
