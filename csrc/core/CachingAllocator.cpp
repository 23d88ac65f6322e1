#include "CachingAllocator.h"
#include "StreamWork.h"

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <cstdio>

#include "AxonRuntime.h"
#include "AxonStream.h"

namespace at::axon {
namespace {

using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;
using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;

constexpr size_t kMinBlockSize = 512;       // every size is a multiple of this
constexpr size_t kSmallSize = 1 << 20;      // largest "small" request
constexpr size_t kSmallBuffer = 2 << 20;    // segment size for small requests
constexpr size_t kLargeBuffer = 20 << 20;   // segment size for medium requests
constexpr size_t kMinLargeAlloc = 10 << 20; // below this, use kLargeBuffer
constexpr size_t kRoundLarge = 2 << 20;     // large segments round up to this

struct Block;

struct BlockPool {
  struct Order {
    bool operator()(const Block* a, const Block* b) const;
  };
  explicit BlockPool(bool small) : is_small(small) {}
  std::set<Block*, Order> blocks;
  const bool is_small;
};

struct Block {
  c10::DeviceIndex device;
  c10::StreamId stream;  // the stream it was allocated on
  size_t size;           // bytes of the block
  size_t requested = 0;  // bytes the user asked for
  BlockPool* pool;
  char* ptr;
  bool allocated = false;
  int pending_events = 0;  // events to complete before the block is free
  Block* prev = nullptr;   // neighbours inside the same segment
  Block* next = nullptr;
  std::set<c10::StreamId> stream_uses;  // record_stream()

  Block(c10::DeviceIndex d, c10::StreamId s, size_t sz, BlockPool* p, char* ptr)
      : device(d), stream(s), size(sz), pool(p), ptr(ptr) {}
  // For lookups in a pool.
  Block(c10::StreamId s, size_t sz) : device(0), stream(s), size(sz), pool(nullptr), ptr(nullptr) {}

  bool is_split() const { return prev != nullptr || next != nullptr; }
};

bool BlockPool::Order::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  if (a->size != b->size) return a->size < b->size;
  return a->ptr < b->ptr;
}

size_t round_size(size_t size) {
  if (size < kMinBlockSize) return kMinBlockSize;
  return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

size_t segment_size(size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((size + kRoundLarge - 1) / kRoundLarge);
}

std::string format_size(uint64_t bytes) {
  char buf[64];
  if (bytes < (1 << 10)) {
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
  } else if (bytes < (1 << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", bytes / 1024.0);
  } else if (bytes < (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / 1048576.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / 1073741824.0);
  }
  return buf;
}

// The free log (see freedAt in the header): a ring the host writes under
// the device's mutex and workers read without a lock, each entry guarded by
// a version (odd while it is written).
class FreeLog {
 public:
  static constexpr uint64_t kEntries = 1024;

  uint64_t mark() const { return head_.load(std::memory_order_acquire); }

  void add(const void* ptr, c10::StreamId stream, uint64_t launched) {
    const uint64_t i = head_.load(std::memory_order_relaxed);
    Entry& e = entries_[i % kEntries];
    const uint64_t v = e.version.load(std::memory_order_relaxed);
    e.version.store(v + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    e.index.store(i, std::memory_order_relaxed);
    e.ptr.store(reinterpret_cast<uintptr_t>(ptr), std::memory_order_relaxed);
    e.stream.store(stream, std::memory_order_relaxed);
    e.launched.store(launched, std::memory_order_relaxed);
    e.version.store(v + 2, std::memory_order_release);
    head_.store(i + 1, std::memory_order_release);
  }

  std::optional<uint64_t> find(c10::StreamId stream, const void* ptr, uint64_t mark) const {
    const uint64_t head = head_.load(std::memory_order_acquire);
    // Entries before mark may be gone, and a slot being rewritten is unknown.
    if (head > mark + kEntries - 1) return std::nullopt;
    for (uint64_t i = mark; i < head; ++i) {
      const Entry& e = entries_[i % kEntries];
      const uint64_t v1 = e.version.load(std::memory_order_acquire);
      const uint64_t index = e.index.load(std::memory_order_relaxed);
      const uintptr_t p = e.ptr.load(std::memory_order_relaxed);
      const c10::StreamId s = e.stream.load(std::memory_order_relaxed);
      const uint64_t launched = e.launched.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if ((v1 & 1) != 0 || e.version.load(std::memory_order_relaxed) != v1 || index != i) {
        return std::nullopt;
      }
      if (p == reinterpret_cast<uintptr_t>(ptr) && s == stream) return launched;
    }
    return std::nullopt;
  }

 private:
  struct Entry {
    std::atomic<uint64_t> version{0};
    std::atomic<uint64_t> index{~uint64_t{0}};
    std::atomic<uintptr_t> ptr{0};
    std::atomic<c10::StreamId> stream{0};
    std::atomic<uint64_t> launched{0};
  };
  std::atomic<uint64_t> head_{0};
  Entry entries_[kEntries];
};

// All state of one device, under one mutex.
class DeviceCache {
 public:
  explicit DeviceCache(c10::DeviceIndex device)
      : device_(device), small_(true), large_(false) {}

  Block* malloc(size_t orig_size, c10::StreamId stream) {
    std::unique_lock<std::mutex> lock(mutex_);
    process_events();
    size_t size = round_size(orig_size);
    BlockPool& pool = size <= kSmallSize ? small_ : large_;
    Block* block = find_free(pool, stream, size);
    if (block == nullptr) {
      block = new_segment(pool, stream, size, orig_size, lock);
    }
    block = maybe_split(block, size);
    block->allocated = true;
    block->requested = orig_size;
    for_pool(pool, [&](StatType t) {
      stats_.allocation[idx(t)].increase(1);
      stats_.allocated_bytes[idx(t)].increase(block->size);
      stats_.active[idx(t)].increase(1);
      stats_.active_bytes[idx(t)].increase(block->size);
      stats_.requested_bytes[idx(t)].increase(orig_size);
    });
    return block;
  }

  void free(Block* block) {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_INTERNAL_ASSERT(block->allocated, "axon: freeing a block that is not allocated");
    block->allocated = false;
    for_pool(*block->pool, [&](StatType t) {
      stats_.allocation[idx(t)].decrease(1);
      stats_.allocated_bytes[idx(t)].decrease(block->size);
      stats_.requested_bytes[idx(t)].decrease(block->requested);
    });
    if (!block->stream_uses.empty()) {
      // Other streams may still read or write it: reuse after their work.
      for (c10::StreamId s : block->stream_uses) {
        rt::Event* ev = rt::event_create(device_);
        rt::event_record(ev, rt::Stream{device_, s});
        pending_.emplace_back(ev, block);
        ++block->pending_events;
      }
      block->stream_uses.clear();
      return;
    }
    log_free(block);
    release_to_pool(block);
  }

  const FreeLog& free_log() const { return free_log_; }

  // Never throws (it runs in tensor deleters): a forked child's runtime
  // refuses every call, and then nothing is logged.
  void log_free(Block* block) noexcept {
    if (!adaptiveEager()) return;  // only fusion reads it
    try {
      free_log_.add(block->ptr, block->stream,
                    rt::stream_launched(rt::Stream{device_, block->stream}));
    } catch (...) {
    }
  }

  void record_stream(Block* block, c10::StreamId stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stream != block->stream) block->stream_uses.insert(stream);
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    drain_events();
    release_cached();
  }

  DeviceStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_accumulated() {
    std::lock_guard<std::mutex> lock(mutex_);
    for_each_stat([](Stat& s) { s.reset_accumulated(); });
    stats_.num_alloc_retries = 0;
    stats_.num_ooms = 0;
    stats_.num_device_alloc = 0;
    stats_.num_device_free = 0;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    for_each_stat([](Stat& s) { s.reset_peak(); });
  }

  int64_t num_device_alloc() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_.num_device_alloc;
  }

 private:
  static size_t idx(StatType t) { return static_cast<size_t>(t); }

  template <typename F>
  static void for_pool(const BlockPool& pool, F f) {
    f(StatType::AGGREGATE);
    f(pool.is_small ? StatType::SMALL_POOL : StatType::LARGE_POOL);
  }

  template <typename F>
  void for_each_stat(F f) {
    for (StatArray* a : {&stats_.allocation, &stats_.segment, &stats_.active,
                         &stats_.inactive_split, &stats_.allocated_bytes,
                         &stats_.reserved_bytes, &stats_.active_bytes,
                         &stats_.inactive_split_bytes, &stats_.requested_bytes}) {
      for (Stat& s : *a) f(s);
    }
  }

  Block* find_free(BlockPool& pool, c10::StreamId stream, size_t size) {
    Block key(stream, size);
    auto it = pool.blocks.lower_bound(&key);
    if (it == pool.blocks.end() || (*it)->stream != stream) return nullptr;
    Block* block = *it;
    pool.blocks.erase(it);
    if (block->is_split()) {
      for_pool(pool, [&](StatType t) {
        stats_.inactive_split[idx(t)].decrease(1);
        stats_.inactive_split_bytes[idx(t)].decrease(block->size);
      });
    }
    return block;
  }

  Block* new_segment(BlockPool& pool, c10::StreamId stream, size_t size,
                     size_t orig_size, std::unique_lock<std::mutex>& lock) {
    size_t alloc = segment_size(size);
    void* ptr = try_device_malloc(alloc);
    if (ptr == nullptr && alloc != size) {
      alloc = size;  // a whole segment doesn't fit; an exact one might
      ptr = try_device_malloc(alloc);
    }
    if (ptr == nullptr) {
      // Give the cache back to the device and try once more.
      stats_.num_alloc_retries += 1;
      drain_events();
      release_cached();
      ptr = try_device_malloc(alloc);
    }
    if (ptr == nullptr) {
      stats_.num_ooms += 1;
      raise_oom(orig_size, lock);
    }
    stats_.num_device_alloc += 1;
    for_pool(pool, [&](StatType t) {
      stats_.segment[idx(t)].increase(1);
      stats_.reserved_bytes[idx(t)].increase(alloc);
    });
    return new Block(device_, stream, alloc, &pool, static_cast<char*>(ptr));
  }

  void* try_device_malloc(size_t bytes) {
    try {
      void* p = rt::malloc(device_, bytes);
      host_oom_.clear();
      return p;
    } catch (const rt::OutOfMemoryError& e) {
      // The device had room but the host did not: say so in the error.
      if (e.host) host_oom_ = e.what();
      else host_oom_.clear();
      return nullptr;
    }
  }

  [[noreturn]] void raise_oom(size_t requested, std::unique_lock<std::mutex>& lock) {
    auto info = rt::mem_get_info(device_);
    int64_t allocated = stats_.allocated_bytes[0].current;
    int64_t reserved = stats_.reserved_bytes[0].current;
    const std::string host_oom = std::move(host_oom_);
    host_oom_.clear();
    lock.unlock();
    if (!host_oom.empty()) {
      // Device memory is host memory: here the host, not the device, is full.
      TORCH_CHECK_WITH(
          OutOfMemoryError, false,
          "axon out of memory. Tried to allocate ", format_size(requested), " on axon:",
          static_cast<int>(device_), ", but the host ran out of memory (", host_oom,
          "). Of the allocated memory ", format_size(allocated),
          " is allocated by PyTorch, and ", format_size(reserved - allocated),
          " is reserved by PyTorch but unallocated. Free tensors on any axon device (and call "
          "torch.axon.empty_cache()), or lower AXON_DEVICE_MEMORY.");
    }
    TORCH_CHECK_WITH(
        OutOfMemoryError, false,
        "axon out of memory. Tried to allocate ", format_size(requested),
        ". axon:", static_cast<int>(device_), " has a total capacity of ",
        format_size(info.total), " of which ", format_size(info.free),
        " is free. Of the allocated memory ", format_size(allocated),
        " is allocated by PyTorch, and ", format_size(reserved - allocated),
        " is reserved by PyTorch but unallocated. Free tensors (and call "
        "torch.axon.empty_cache()) to make room.");
  }

  Block* maybe_split(Block* block, size_t size) {
    size_t remaining = block->size - size;
    bool split = block->pool->is_small ? remaining >= kMinBlockSize
                                       : remaining > kSmallSize;
    if (!split) return block;
    auto* rest = new Block(device_, block->stream, remaining, block->pool,
                           block->ptr + size);
    rest->prev = block;
    rest->next = block->next;
    if (rest->next) rest->next->prev = rest;
    block->next = rest;
    block->size = size;
    insert_free(rest);
    return block;
  }

  // A block nobody uses any more: merge with free neighbours, back to the pool.
  void release_to_pool(Block* block) {
    for_pool(*block->pool, [&](StatType t) {
      stats_.active[idx(t)].decrease(1);
      stats_.active_bytes[idx(t)].decrease(block->size);
    });
    for (Block* n : {block->prev, block->next}) {
      if (n == nullptr || n->allocated || n->pending_events > 0) continue;
      remove_free(n);
      if (n == block->prev) {
        n->size += block->size;
        n->next = block->next;
        if (n->next) n->next->prev = n;
        delete block;
        block = n;
      } else {
        block->size += n->size;
        block->next = n->next;
        if (block->next) block->next->prev = block;
        delete n;
      }
    }
    insert_free(block);
  }

  void insert_free(Block* block) {
    block->pool->blocks.insert(block);
    if (block->is_split()) {
      for_pool(*block->pool, [&](StatType t) {
        stats_.inactive_split[idx(t)].increase(1);
        stats_.inactive_split_bytes[idx(t)].increase(block->size);
      });
    }
  }

  void remove_free(Block* block) {
    block->pool->blocks.erase(block);
    if (block->is_split()) {
      for_pool(*block->pool, [&](StatType t) {
        stats_.inactive_split[idx(t)].decrease(1);
        stats_.inactive_split_bytes[idx(t)].decrease(block->size);
      });
    }
  }

  // Frees blocks whose record_stream events have completed.
  void process_events() {
    while (!pending_.empty()) {
      auto [ev, block] = pending_.front();
      if (!rt::event_query(ev)) break;
      pending_.pop_front();
      rt::event_destroy(ev);
      if (--block->pending_events == 0) release_to_pool(block);
    }
  }

  void drain_events() {
    for (auto& [ev, block] : pending_) {
      rt::event_wait(ev);  // the user's errors stay pending for the user
      rt::event_destroy(ev);
      if (--block->pending_events == 0) release_to_pool(block);
    }
    pending_.clear();
  }

  // Returns every whole free segment to the runtime.
  void release_cached() {
    // Work already enqueued may still touch freed blocks; the runtime may only
    // reclaim memory nobody uses.
    rt::device_wait(device_);  // errors stay pending for the user's next synchronize
    for (BlockPool* pool : {&small_, &large_}) {
      for (auto it = pool->blocks.begin(); it != pool->blocks.end();) {
        Block* block = *it;
        if (block->is_split()) {
          ++it;
          continue;
        }
        it = pool->blocks.erase(it);
        rt::free(block->ptr);
        stats_.num_device_free += 1;
        for_pool(*pool, [&](StatType t) {
          stats_.segment[idx(t)].decrease(1);
          stats_.reserved_bytes[idx(t)].decrease(block->size);
        });
        delete block;
      }
    }
  }

  const c10::DeviceIndex device_;
  FreeLog free_log_;
  std::mutex mutex_;
  BlockPool small_, large_;
  std::deque<std::pair<rt::Event*, Block*>> pending_;
  std::string host_oom_;  // the runtime's message when the host refused memory
  DeviceStats stats_;
};

class AxonCachingAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    c10::DeviceIndex device = current_device();
    c10::Device dev(kAxon, device);
    if (nbytes == 0) {
      return c10::DataPtr(nullptr, dev);
    }
    c10::StreamId stream = getCurrentAxonStream(device).id();
    Block* block = nullptr;
    try {
      block = cache(device).malloc(nbytes, stream);
    } catch (const c10::OutOfMemoryError&) {
      // Kernels that have run may still hold the last references to memory.
      rt_call([&] { rt::device_wait(device); });  // errors stay pending for the user
      releaseFinishedWork();
      block = cache(device).malloc(nbytes, stream);
    }
    // The context is the block: freeing it needs no lookup.
    return c10::DataPtr(block->ptr, block, &deleter, dev);
  }

  // No raw interface: it requires the context to be the data pointer, and
  // ours is the block (c10::Allocator::raw_allocate asserts, raw_deallocate
  // refuses, instead of handing deleter a data pointer as a Block*).
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    rt_call([&] {
      int device = rt::pointer_device(dest);
      if (device < 0) device = rt::pointer_device(src);
      rt::Stream s = current_rt_stream(device < 0 ? current_device() : device);
      rt::memcpy(dest, src, count, s);
      rt::stream_synchronize(s);
    });
  }

  bool initialized() override { return true; }

  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      if (auto* c = existing(d)) c->empty_cache();
    }
  }

  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    TORCH_CHECK(stream.device_type() == kAxon,
                "record_stream: expected an axon stream, but got a ", stream.device_type(),
                " stream; an axon tensor can only be recorded on an axon stream");
    // Not ours (an empty tensor's null pointer, memory from elsewhere): nothing to delay.
    if (ptr.get_context() == nullptr || ptr.get_deleter() != &deleter) return;
    auto* block = static_cast<Block*>(ptr.get_context());
    // A stream of another device never touches this memory's reuse order.
    if (stream.device_index() != block->device) return;
    cache(block->device).record_stream(block, stream.id());
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    return cache(device).stats();
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    cache(device).reset_accumulated();
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    cache(device).reset_peak();
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    auto info = rt_call([&] { return rt::mem_get_info(device); });
    return {info.free, info.total};
  }

  static AxonCachingAllocator& instance();

  DeviceCache& cache(c10::DeviceIndex device) {
    check_device(device);
    TORCH_CHECK(device < kMaxDevices, "axon supports at most ", kMaxDevices,
                " devices");
    DeviceCache* c = caches_[device].load(std::memory_order_acquire);
    if (c == nullptr) {
      std::lock_guard<std::mutex> lock(create_mutex_);
      c = caches_[device].load(std::memory_order_relaxed);
      if (c == nullptr) {
        c = new DeviceCache(device);  // lives as long as the process
        caches_[device].store(c, std::memory_order_release);
      }
    }
    return *c;
  }

 private:
  static void deleter(void* ctx) {
    auto* block = static_cast<Block*>(ctx);
    instance().cache(block->device).free(block);
  }

  DeviceCache* existing(c10::DeviceIndex device) {
    return caches_[device].load(std::memory_order_acquire);
  }

  static constexpr int kMaxDevices = 128;
  std::mutex create_mutex_;
  std::atomic<DeviceCache*> caches_[kMaxDevices] = {};
};

// Never destroyed: tensors may be freed by static destructors at exit.
AxonCachingAllocator& AxonCachingAllocator::instance() {
  static auto* a = new AxonCachingAllocator();
  return *a;
}

struct Registrar {
  Registrar() { c10::SetAllocator(kAxon, &AxonCachingAllocator::instance()); }
} registrar;

}  // namespace

c10::DeviceAllocator* getCachingAllocator() {
  return &AxonCachingAllocator::instance();
}

int64_t numDeviceAllocs(c10::DeviceIndex device) {
  return static_cast<AxonCachingAllocator*>(getCachingAllocator())
      ->cache(device)
      .num_device_alloc();
}

uint64_t freeLogMark(c10::DeviceIndex device) {
  return AxonCachingAllocator::instance().cache(device).free_log().mark();
}

std::optional<uint64_t> freedAt(c10::DeviceIndex device, c10::StreamId stream, const void* ptr,
                                uint64_t mark) {
  return AxonCachingAllocator::instance().cache(device).free_log().find(stream, ptr, mark);
}

}  // namespace at::axon
