// Pinned host memory: pin_memory(), is_pinned() and the staging side of
// asynchronous copies.  The runtime tracks which copies use a buffer and makes
// host_free wait for them, so no caching or events are needed here.
#include <ATen/core/CachingHostAllocator.h>

#include "AxonRuntime.h"

namespace at::axon {
namespace {

class AxonHostAllocator final : public at::HostAllocator {
 public:
  at::DataPtr allocate(size_t nbytes) override {
    void* p = nbytes == 0 ? nullptr : rt_call([&] { return rt::host_alloc(nbytes); });
    std::lock_guard<std::mutex> lock(mutex_);
    if (p != nullptr) {
      stats_.allocations.increase(1);
      stats_.allocated_bytes.increase(nbytes);
      sizes_[p] = nbytes;
    }
    return {p, p, &deleter, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &deleter; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.allocations.reset_accumulated();
    stats_.allocated_bytes.reset_accumulated();
  }
  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.allocations.reset_peak();
    stats_.allocated_bytes.reset_peak();
  }

  static AxonHostAllocator& instance() {
    static auto* a = new AxonHostAllocator();  // outlives static tensors
    return *a;
  }

 private:
  static void deleter(void* p) {
    if (p == nullptr) return;
    auto& self = instance();
    {
      std::lock_guard<std::mutex> lock(self.mutex_);
      auto it = self.sizes_.find(p);
      if (it != self.sizes_.end()) {
        self.stats_.allocations.decrease(1);
        self.stats_.allocated_bytes.decrease(it->second);
        self.sizes_.erase(it);
      }
    }
    rt::host_free(p);
  }

  mutable std::mutex mutex_;
  at::HostStats stats_;
  std::unordered_map<void*, size_t> sizes_;
};

struct Registrar {
  Registrar() { at::setHostAllocator(kAxon, &AxonHostAllocator::instance()); }
} registrar;

}  // namespace

at::Allocator* getAxonHostAllocator() { return &AxonHostAllocator::instance(); }

}  // namespace at::axon
