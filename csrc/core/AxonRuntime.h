// The one place csrc/ calls into the runtime: rt exceptions become PyTorch
// errors here, so every caller raises what a CUDA user would see.
#pragma once

#include <axon/runtime.h>

#include <string>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>

namespace at::axon {

namespace rt = ::axon::rt;

constexpr c10::DeviceType kAxon = c10::DeviceType::PrivateUse1;

// Runs fn(), turning runtime errors into c10 errors (Python RuntimeError).
template <typename F>
auto rt_call(F&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const rt::OutOfMemoryError& e) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
  } catch (const rt::AsyncError& e) {
    // A collective that failed as stream work (ProcessGroupAxon's messages
    // start "axon process group"): DistBackendError, as when it fails inline.
    TORCH_CHECK_WITH(DistBackendError, std::string(e.what()).find(": axon process group") ==
                                           std::string::npos, e.what());
    // A kernel's failure: torch.AcceleratorError (a RuntimeError), as CUDA's
    // asynchronous errors.  The code is CUDA's cudaErrorLaunchFailure.
    throw c10::AcceleratorError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, 719,
                                e.what());
  } catch (const rt::InvalidDeviceError& e) {
    // An index past the device count: torch.AcceleratorError, as CUDA's
    // "invalid device ordinal" (cudaErrorInvalidDevice, 101).
    throw c10::AcceleratorError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, 101,
                                e.what());
  } catch (const rt::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

inline c10::DeviceIndex device_count() noexcept {
  return static_cast<c10::DeviceIndex>(rt::device_count());
}

inline void check_device(c10::DeviceIndex index) {
  rt_call([&] { rt::check_device(index); });
}

inline c10::DeviceIndex current_device() {
  return static_cast<c10::DeviceIndex>(rt::current_device());
}

inline void set_device(c10::DeviceIndex index) {
  rt_call([&] { rt::set_device(index); });
}

// The index a tensor on `device` lives on, resolving "axon" to the current one.
inline c10::DeviceIndex resolve_index(c10::Device device) {
  return device.has_index() ? device.index() : current_device();
}

}  // namespace at::axon
