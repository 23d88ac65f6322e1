// Pinned host memory: pin_memory(), is_pinned() and the staging side of
// asynchronous copies.  A cache, as CUDA's caching host allocator: requests
// round up to a power of two, a freed buffer is kept, and an allocation of
// its size reuses it once no queued copy uses it any more (the runtime tracks
// the copies of each buffer: host_in_use), so freeing never waits for the
// device.  empty_cache() returns the cached buffers to the runtime.
#include <map>
#include <unordered_map>
#include <vector>

#include <ATen/core/CachingHostAllocator.h>
#include <c10/util/llvmMathExtras.h>

#include "AxonRuntime.h"

namespace at::axon {
namespace {

class AxonHostAllocator final : public at::HostAllocator {
 public:
  at::DataPtr allocate(size_t nbytes) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (nbytes == 0) return {nullptr, nullptr, &deleter, cpu};
    const size_t size = c10::llvm::PowerOf2Ceil(nbytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end()) {
        auto& list = it->second;
        for (size_t i = 0; i < list.size(); ++i) {
          void* p = list[i];
          if (rt_call([&] { return rt::host_in_use(p); })) continue;
          list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));
          blocks_.at(p).in_use = true;
          stats_.active_requests.increase(1);
          stats_.active_bytes.increase(size);
          return {p, p, &deleter, cpu};
        }
      }
    }
    void* p = rt_call([&] { return rt::host_alloc(size); });
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_[p] = Block{size, true};
    stats_.allocations.increase(1);
    stats_.allocated_bytes.increase(size);
    stats_.active_requests.increase(1);
    stats_.active_bytes.increase(size);
    stats_.num_host_alloc += 1;
    return {p, p, &deleter, cpu};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &deleter; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  // The runtime records which copies use a buffer (host_in_use).
  bool record_event(void*, void*, c10::Stream) override { return true; }

  void empty_cache() override {
    std::vector<void*> release;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [size, list] : free_) {
        for (void* p : list) {
          release.push_back(p);
          blocks_.erase(p);
          stats_.allocations.decrease(1);
          stats_.allocated_bytes.decrease(size);
          stats_.num_host_free += 1;
        }
      }
      free_.clear();
    }
    // host_free waits for copies still using a buffer.
    for (void* p : release) rt_call([&] { rt::host_free(p); });
  }

  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* s : {&stats_.allocations, &stats_.allocated_bytes, &stats_.active_requests,
                    &stats_.active_bytes}) {
      s->reset_accumulated();
    }
    stats_.num_host_alloc = 0;
    stats_.num_host_free = 0;
  }
  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* s : {&stats_.allocations, &stats_.allocated_bytes, &stats_.active_requests,
                    &stats_.active_bytes}) {
      s->reset_peak();
    }
  }

  static AxonHostAllocator& instance() {
    static auto* a = new AxonHostAllocator();  // outlives static tensors
    return *a;
  }

 private:
  struct Block {
    size_t size;
    bool in_use;
  };

  static void deleter(void* p) {
    if (p == nullptr) return;
    auto& self = instance();
    std::lock_guard<std::mutex> lock(self.mutex_);
    auto it = self.blocks_.find(p);
    if (it == self.blocks_.end() || !it->second.in_use) return;
    it->second.in_use = false;
    self.stats_.active_requests.decrease(1);
    self.stats_.active_bytes.decrease(it->second.size);
    self.free_[it->second.size].push_back(p);
  }

  mutable std::mutex mutex_;
  at::HostStats stats_;
  std::unordered_map<void*, Block> blocks_;
  std::map<size_t, std::vector<void*>> free_;  // cached buffers by size
};

struct Registrar {
  Registrar() { at::setHostAllocator(kAxon, &AxonHostAllocator::instance()); }
} registrar;

}  // namespace

at::Allocator* getAxonHostAllocator() { return &AxonHostAllocator::instance(); }

}  // namespace at::axon
