// PrivateUse1 hooks: what ATen asks of "the accelerator" (generators, pinned
// memory, pointer queries, device switching) answered for axon.
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include <ATen/core/CachingHostAllocator.h>

#include "AxonGenerator.h"
#include "AxonRuntime.h"
#include "AxonStorage.h"

namespace at::axon {
namespace {

struct AxonHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }

  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_device(d); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }

  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    c10::DeviceIndex old = current_device();
    if (d != old) set_device(d);
    return old;
  }

  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    if (d < 0 || d >= device_count()) return current_device();
    return exchangeDevice(d);
  }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override {
    return getDefaultAxonGenerator(d);
  }

  at::Generator getNewGenerator(c10::DeviceIndex d) const override {
    return createAxonGenerator(d);
  }

  at::Allocator* getPinnedMemoryAllocator() const override {
    return at::getHostAllocator(kAxon);
  }

  bool isPinnedPtr(const void* data) const override {
    return rt::is_host_pinned(data);
  }

  at::Device getDeviceFromPtr(void* data) const override {
    int d = rt::pointer_device(data);
    TORCH_CHECK(d >= 0, "pointer ", data, " is not axon device memory");
    return at::Device(kAxon, static_cast<c10::DeviceIndex>(d));
  }

  // untyped_storage().resize_() on an axon storage.
  void resizePrivateUse1Bytes(const c10::Storage& storage,
                              size_t newsize) const override {
    resizeStorageBytes(storage.unsafeGetStorageImpl(), newsize);
  }
};

struct Registrar {
  Registrar() {
    static AxonHooks hooks;
    at::RegisterPrivateUse1HooksInterface(&hooks);
  }
} registrar;

}  // namespace
}  // namespace at::axon
