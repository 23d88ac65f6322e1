// Address ranges of live allocations, so that any interior pointer can be
// traced back to its allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

namespace axon::rt {

template <class Payload>
class RangeRegistry {
 public:
  struct Entry {
    uintptr_t base;
    size_t size;
    Payload payload;
  };

  void insert(const void* base, size_t size, Payload payload) {
    std::lock_guard lk(mu_);
    map_.emplace(addr(base), Entry{addr(base), size, std::move(payload)});
  }

  // Removes the allocation starting exactly at base.
  std::optional<Entry> erase(const void* base) {
    std::lock_guard lk(mu_);
    auto it = map_.find(addr(base));
    if (it == map_.end()) return std::nullopt;
    Entry e = std::move(it->second);
    map_.erase(it);
    return e;
  }

  // Calls f(Entry&) under the lock if p is inside an allocation.
  template <class F>
  bool with(const void* p, F&& f) {
    std::lock_guard lk(mu_);
    auto it = map_.upper_bound(addr(p));
    if (it == map_.begin()) return false;
    --it;
    if (addr(p) - it->first >= it->second.size) return false;
    f(it->second);
    return true;
  }

 private:
  static uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

  std::mutex mu_;
  std::map<uintptr_t, Entry> map_;
};

}  // namespace axon::rt
