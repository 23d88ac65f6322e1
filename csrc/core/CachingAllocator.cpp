#include "CachingAllocator.h"
#include "StreamWork.h"

#include <c10/core/AllocatorConfig.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <cstdio>

#include "AxonRuntime.h"
#include "AxonStream.h"

namespace at::axon {
namespace {

using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;
using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::BlockInfo;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::SegmentInfo;
using c10::CachingDeviceAllocator::TraceEntry;
using Context = std::shared_ptr<c10::GatheredContext>;

constexpr size_t kMinBlockSize = 512;       // every size is a multiple of this
constexpr size_t kSmallSize = 1 << 20;      // largest "small" request
constexpr size_t kSmallBuffer = 2 << 20;    // segment size for small requests
constexpr size_t kLargeBuffer = 20 << 20;   // segment size for medium requests
constexpr size_t kMinLargeAlloc = 10 << 20; // below this, use kLargeBuffer
constexpr size_t kRoundLarge = 2 << 20;     // large segments round up to this

struct Block;
struct PrivatePool;

struct BlockPool {
  struct Order {
    bool operator()(const Block* a, const Block* b) const;
  };
  explicit BlockPool(bool small, PrivatePool* owner = nullptr) : is_small(small), owner(owner) {}
  std::set<Block*, Order> blocks;
  const bool is_small;
  PrivatePool* const owner;  // null for the device's shared pools
};

// A MemPool's or graph's memory: its own segments, which only allocations
// routed to it use (CUDA's PrivatePool).
struct PrivatePool {
  explicit PrivatePool(c10::MempoolId_t id) : id(id), small(true, this), large(false, this) {}
  const c10::MempoolId_t id;
  int use_count = 1;      // owners (graphs, MemPools, use_mem_pool scopes)
  int64_t segments = 0;   // runtime allocations it holds
  BlockPool small, large;
};

struct Block {
  c10::DeviceIndex device;
  c10::StreamId stream;  // the stream it was allocated on
  size_t size;           // bytes of the block
  size_t requested = 0;  // bytes the user asked for
  BlockPool* pool;
  char* ptr;
  bool allocated = false;
  // Counted in oversize_allocations (while allocated) / oversize_segments (a
  // segment's first block): the limit may change in between.
  bool oversize_allocation = false;
  bool oversize_segment = false;
  int pending_events = 0;  // events to complete before the block is free
  Block* prev = nullptr;   // neighbours inside the same segment
  Block* next = nullptr;
  std::set<c10::StreamId> stream_uses;  // record_stream()
  Context context;          // where it was allocated (memory history)
  Context segment_context;  // first block of a segment: where the segment was made

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

// PYTORCH_ALLOC_CONF (also PYTORCH_CUDA_ALLOC_CONF, and
// torch._C._accelerator_setAllocatorSettings): c10's device-generic settings,
// as CUDA's allocator reads them.  max_split_size_mb: blocks this large or
// larger are "oversize": never split, and a free one serves only a request
// at least max_split_size and within max_non_split_rounding_mb of its size.
// garbage_collection_threshold (with set_per_process_memory_fraction): before
// a new segment, reserved memory over that share of the allowed memory sends
// the cached free segments back to the device.  expandable_segments is not
// implemented (one warning).
using AllocConf = c10::CachingAllocator::AcceleratorAllocatorConfig;

size_t max_split_size() { return AllocConf::max_split_size(); }

void warn_unsupported_settings() {
  static std::atomic<bool> warned{false};
  if (AllocConf::use_expandable_segments() && !warned.exchange(true)) {
    TORCH_WARN("axon's caching allocator does not implement expandable_segments "
               "(PYTORCH_ALLOC_CONF); it is ignored");
  }
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

// Memory history settings (recordHistory).  g_history is the only thing the
// allocation path reads when history is off.
enum HistoryBits : int { kTrace = 1 };
std::atomic<int> g_history{0};                 // kTrace | context << 1
// torch.axon.caching_allocator_enable: off, allocations go straight to the
// runtime and frees wait for the device first (CUDA's uncached path).
std::atomic<bool> g_caching_enabled{true};
std::atomic<size_t> g_trace_max{0};
std::atomic<unsigned> g_trace_skip{0};  // 1 << TraceEntry::Action: not recorded
std::atomic<c10::CachingDeviceAllocator::CreateContextFn> g_gather{nullptr};

RecordContext history_context(int h) { return static_cast<RecordContext>(h >> 1); }

// h: g_history, loaded once per allocation or free.
Context gather_context(int h, RecordContext at_least) {
  if (h == 0 || history_context(h) < at_least) return nullptr;
  auto gather = g_gather.load(std::memory_order_acquire);
  return gather != nullptr ? gather() : nullptr;
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void* stream_tag(c10::StreamId s) { return reinterpret_cast<void*>(static_cast<intptr_t>(s)); }

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
      : device_(device), small_(true), large_(false) {
    stats_.max_split_size = -1;  // CUDA's "no limit": any large block may split
  }

  // Null only when !last_try and the device refused the memory even after
  // the cache was released (the caller then releases finished work's
  // references and tries once more: only that last try raises).
  Block* malloc(size_t orig_size, c10::StreamId stream, int h, Context context, bool last_try) {
    std::unique_lock<std::mutex> lock(mutex_);
    process_events();
    warn_unsupported_settings();
    const size_t max_split = max_split_size();
    size_t size = round_size(orig_size);
    PrivatePool* priv = nullptr;
    for (auto& [id, filter] : captures_) {
      if (filter(stream)) {
        priv = pools_.at(id).get();
        break;
      }
    }
    BlockPool& pool = priv != nullptr ? (size <= kSmallSize ? priv->small : priv->large)
                                      : (size <= kSmallSize ? small_ : large_);
    Block* block = find_free(pool, stream, size, max_split);
    if (block == nullptr) {
      if (priv == nullptr) maybe_collect_garbage();
      block = new_segment(pool, stream, size, orig_size, h, context, last_try, lock);
      if (block == nullptr) return nullptr;
      if (block->size >= max_split) {
        block->oversize_segment = true;
        stats_.oversize_segments.increase(1);
      }
    }
    block = maybe_split(block, size, max_split);
    block->oversize_allocation = block->size >= max_split;
    if (block->oversize_allocation) stats_.oversize_allocations.increase(1);
    block->allocated = true;
    block->requested = orig_size;
    if (h != 0) {
      block->context = history_context(h) >= RecordContext::STATE ? context : nullptr;
      record(h, TraceEntry::ALLOC, block->ptr, orig_size, stream, pool,
             history_context(h) >= RecordContext::ALLOC ? context : nullptr);
    }
    for_pool(pool, [&](StatType t) {
      stats_.allocation[idx(t)].increase(1);
      stats_.allocated_bytes[idx(t)].increase(block->size);
      stats_.active[idx(t)].increase(1);
      stats_.active_bytes[idx(t)].increase(block->size);
      stats_.requested_bytes[idx(t)].increase(orig_size);
    });
    return block;
  }

  void free(Block* block, int h, const Context& context) {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_INTERNAL_ASSERT(block->allocated, "axon: freeing a block that is not allocated");
    block->allocated = false;
    block->context.reset();
    if (h != 0) {
      record(h, TraceEntry::FREE_REQUESTED, block->ptr, block->requested, block->stream,
             *block->pool, context);
    }
    if (block->oversize_allocation) stats_.oversize_allocations.decrease(1);
    block->oversize_allocation = false;
    for_pool(*block->pool, [&](StatType t) {
      stats_.allocation[idx(t)].decrease(1);
      stats_.allocated_bytes[idx(t)].decrease(block->size);
      stats_.requested_bytes[idx(t)].decrease(block->requested);
    });
    if (!block->stream_uses.empty()) {
      // Other streams may still read or write it: reuse after their work.
      if (rt::device_is_capturing(device_)) {
        // An event recorded on a capturing stream would join the graph, and
        // querying it would invalidate the capture: wait for the capture's
        // end (CUDA defers such frees the same way).
        ++block->pending_events;
        deferred_.push_back(block);
        return;
      }
      insert_events(block);
      return;
    }
    log_free(block);
    released(release_to_pool(block, h));
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

  // Whether the last refused allocation was refused by the host (device
  // memory is host memory: every device's cache holds some of it).
  bool host_refused() {
    std::lock_guard<std::mutex> lock(mutex_);
    return !host_oom_.empty();
  }

  // ---- private pools

  void begin_allocate_to_pool(c10::MempoolId_t id, std::function<bool(c10::StreamId)> filter) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& c : captures_) {
      TORCH_CHECK(c.first != id, "beginAllocateToPool: already recording to mempool_id (",
                  id.first, ", ", id.second, ")");
    }
    create_or_incref(id);
    captures_.emplace_back(id, std::move(filter));
  }

  void end_allocate_to_pool(c10::MempoolId_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = captures_.begin(); it != captures_.end(); ++it) {
      if (it->first == id) {
        captures_.erase(it);
        return;
      }
    }
    TORCH_CHECK(false, "endAllocateToPool: allocations are not routed to mempool_id (", id.first,
                ", ", id.second, ")");
  }

  void retain_pool(c10::MempoolId_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    create_or_incref(id);
  }

  void release_pool(c10::MempoolId_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pools_.find(id);
    TORCH_CHECK(it != pools_.end() && it->second->use_count > 0,
                "releasePool: no live memory pool with id (", id.first, ", ", id.second, ")");
    PrivatePool* pool = it->second.get();
    if (pool->use_count == 1) {
      for (auto& c : captures_) {
        TORCH_CHECK(c.first != id, "releasePool: allocations are still routed to mempool_id (",
                    id.first, ", ", id.second, "); call endAllocateToPool first");
      }
    }
    if (--pool->use_count > 0) return;
    // Free what is free now; the rest goes when its last block does.
    std::vector<Block*> whole;
    for (BlockPool* bp : {&pool->small, &pool->large}) {
      for (Block* b : bp->blocks) {
        if (!b->is_split()) whole.push_back(b);
      }
    }
    for (Block* b : whole) free_segment_when_idle(b);
    maybe_erase(pool);
  }

  int use_count(c10::MempoolId_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pools_.find(id);
    return it == pools_.end() ? 0 : it->second->use_count;
  }

  // ---- memory fraction

  void set_fraction(double fraction, size_t total) {
    std::lock_guard<std::mutex> lock(mutex_);
    fraction_ = fraction;
    allowed_ = fraction >= 1.0 ? std::numeric_limits<size_t>::max()
                               : static_cast<size_t>(fraction * static_cast<double>(total));
  }

  double fraction() {
    std::lock_guard<std::mutex> lock(mutex_);
    return fraction_;
  }

  // ---- history and snapshots

  void clear_trace() {
    std::lock_guard<std::mutex> lock(mutex_);
    trace_.clear();
    trace_next_ = 0;
  }

  void snapshot(std::optional<c10::MempoolId_t> only, bool include_traces, Snapshot& out) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Block* head : segments_) {
      const c10::MempoolId_t id = pool_id(*head->pool);
      if (only && id != *only) continue;
      SegmentInfo seg;
      seg.device = device_;
      seg.address = reinterpret_cast<size_t>(head->ptr);
      seg.stream = stream_tag(head->stream);
      seg.is_large = !head->pool->is_small;
      seg.owner_private_pool_id = id;
      seg.context_when_allocated = head->segment_context;
      for (Block* b = head; b != nullptr; b = b->next) {
        BlockInfo info;
        info.size = b->size;
        info.requested_size = b->allocated ? b->requested : 0;
        info.allocated = b->allocated;
        info.active = b->allocated || b->pending_events > 0;
        info.context_when_allocated = b->context;
        seg.total_size += b->size;
        if (info.allocated) {
          seg.allocated_size += b->size;
          seg.requested_size += b->requested;
        }
        if (info.active) seg.active_size += b->size;
        seg.blocks.push_back(std::move(info));
      }
      out.segments.push_back(std::move(seg));
    }
    if (!include_traces) return;
    if (out.device_traces.size() <= static_cast<size_t>(device_)) {
      out.device_traces.resize(device_ + 1);
    }
    auto& t = out.device_traces[device_];
    // The ring's oldest entry first.
    for (size_t i = 0; i < trace_.size(); ++i) {
      t.push_back(trace_[(trace_next_ + i) % trace_.size()]);
    }
  }

  DeviceStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t max_split = max_split_size();
    stats_.max_split_size =
        max_split == std::numeric_limits<size_t>::max() ? -1 : static_cast<int64_t>(max_split);
    return stats_;
  }

  void reset_accumulated() {
    std::lock_guard<std::mutex> lock(mutex_);
    for_each_stat([](Stat& s) { s.reset_accumulated(); });
    stats_.num_alloc_retries = 0;
    stats_.num_ooms = 0;
    stats_.num_device_alloc = 0;
    stats_.num_device_free = 0;
    stats_.num_sync_all_streams = 0;
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

  Block* find_free(BlockPool& pool, c10::StreamId stream, size_t size, size_t max_split) {
    Block key(stream, size);
    auto it = pool.blocks.lower_bound(&key);
    if (it == pool.blocks.end() || (*it)->stream != stream) return nullptr;
    Block* block = *it;
    // An oversize block (never split) serves only an oversize request that
    // wastes at most max_non_split_rounding_size of it (CUDA's rules).
    if (size < max_split && block->size >= max_split) return nullptr;
    if (size >= max_split && block->size >= size + AllocConf::max_non_split_rounding_size()) {
      return nullptr;
    }
    pool.blocks.erase(it);
    if (block->is_split()) {
      for_pool(pool, [&](StatType t) {
        stats_.inactive_split[idx(t)].decrease(1);
        stats_.inactive_split_bytes[idx(t)].decrease(block->size);
      });
    }
    return block;
  }

  static c10::MempoolId_t pool_id(const BlockPool& pool) {
    return pool.owner != nullptr ? pool.owner->id : c10::MempoolId_t{0, 0};
  }

  // Appends to the device's event ring (history on: h != 0).
  void record(int h, TraceEntry::Action action, const void* addr, size_t size,
              c10::StreamId stream, const BlockPool& pool, Context context) {
    if ((h & kTrace) == 0) return;
    if ((g_trace_skip.load(std::memory_order_relaxed) >> static_cast<unsigned>(action)) & 1u) {
      return;
    }
    const size_t max = g_trace_max.load(std::memory_order_relaxed);
    if (max == 0) return;
    TraceEntry e(action, device_, reinterpret_cast<size_t>(addr), size, stream_tag(stream),
                 pool_id(pool), now_us(), std::move(context));
    if (trace_.size() < max) {
      trace_.push_back(std::move(e));
      trace_next_ = 0;  // the ring starts at 0 until it is full
    } else {
      trace_[trace_next_ % trace_.size()] = std::move(e);
      trace_next_ = (trace_next_ + 1) % trace_.size();
    }
  }

  void create_or_incref(c10::MempoolId_t id) {
    TORCH_CHECK(id != c10::MempoolId_t(0, 0), "axon: (0, 0) is not a private pool's id");
    auto it = pools_.find(id);
    if (it == pools_.end()) {
      pools_.emplace(id, std::make_unique<PrivatePool>(id));
    } else {
      // Revives a released pool whose segments are not all gone yet.
      ++it->second->use_count;
    }
  }

  // A released pool with no segments left is forgotten.
  void maybe_erase(PrivatePool* pool) {
    if (pool->use_count == 0 && pool->segments == 0) pools_.erase(pool->id);
  }

  // A block just became free (merged with its free neighbours): a released
  // pool's segment goes back to the runtime once it is wholly free.
  void released(Block* block) {
    PrivatePool* owner = block->pool->owner;
    if (owner == nullptr || owner->use_count > 0 || block->is_split()) return;
    free_segment_when_idle(block);
    maybe_erase(owner);
  }

  // Frees a whole free segment once the work queued on its stream has run
  // (the stream's last users of it are before that point).  A capture in
  // progress forbids querying; the segment then waits in its pool for the
  // next release_cached.
  void free_segment_when_idle(Block* block) {
    if (rt::device_is_capturing(device_)) return;
    // A private pool's memory is used by a graph's replays, on whatever
    // streams replayed it, and by its outputs' users: like cudaFree, wait for
    // every stream of the device (an event on each one still busy).
    constexpr int kStreams = 1 + 2 * rt::kStreamPoolSize + rt::kDedicatedStreams;
    std::vector<rt::Event*> events;
    try {
      for (int id = 0; id < kStreams; ++id) {
        const rt::Stream s{device_, id};
        if (rt::stream_query(s)) continue;
        events.push_back(rt::event_create(device_));
        rt::event_record(events.back(), s);
      }
    } catch (...) {
      for (rt::Event* ev : events) rt::event_destroy(ev);
      return;  // errors stay for the user; release_cached frees it later
    }
    remove_free(block);
    if (events.empty()) {
      free_segment(block, nullptr);
      return;
    }
    block->pending_events = static_cast<int>(events.size());
    for (rt::Event* ev : events) doomed_.emplace_back(ev, block);
  }

  // Returns a wholly free segment (not in a free set any more) to the runtime.
  void free_segment(Block* block, const Context& context) {
    const int h = g_history.load(std::memory_order_relaxed);
    if (h != 0) {
      record(h, TraceEntry::SEGMENT_FREE, block->ptr, block->size, block->stream, *block->pool,
             context);
    }
    rt::free(block->ptr);
    stats_.num_device_free += 1;
    if (block->oversize_segment) stats_.oversize_segments.decrease(1);
    for_pool(*block->pool, [&](StatType t) {
      stats_.segment[idx(t)].decrease(1);
      stats_.reserved_bytes[idx(t)].decrease(block->size);
    });
    if (PrivatePool* owner = block->pool->owner) --owner->segments;
    segments_.erase(block);
    delete block;
  }

  Block* new_segment(BlockPool& pool, c10::StreamId stream, size_t size,
                     size_t orig_size, int h, const Context& context, bool last_try,
                     std::unique_lock<std::mutex>& lock) {
    size_t alloc = segment_size(size);
    void* ptr = try_device_malloc(alloc);
    if (ptr == nullptr && alloc != size) {
      alloc = size;  // a whole segment doesn't fit; an exact one might
      ptr = try_device_malloc(alloc);
    }
    if (ptr == nullptr) {
      // Give the cache back to the device and try once more.
      if (!last_try) stats_.num_alloc_retries += 1;
      drain_events();
      release_cached();
      ptr = try_device_malloc(alloc);
    }
    if (ptr == nullptr) {
      if (!last_try) return nullptr;
      stats_.num_ooms += 1;
      raise_oom(orig_size, stream, pool, h, lock);
    }
    stats_.num_device_alloc += 1;
    for_pool(pool, [&](StatType t) {
      stats_.segment[idx(t)].increase(1);
      stats_.reserved_bytes[idx(t)].increase(alloc);
    });
    auto* block = new Block(device_, stream, alloc, &pool, static_cast<char*>(ptr));
    if (pool.owner != nullptr) ++pool.owner->segments;
    segments_.insert(block);
    if (h != 0) {
      if (history_context(h) >= RecordContext::STATE) block->segment_context = context;
      record(h, TraceEntry::SEGMENT_ALLOC, ptr, alloc, stream, pool,
             history_context(h) >= RecordContext::ALLOC ? context : nullptr);
    }
    return block;
  }

  void* try_device_malloc(size_t bytes) {
    over_fraction_ = false;
    if (allowed_ != std::numeric_limits<size_t>::max() &&
        (bytes > allowed_ ||
         static_cast<size_t>(stats_.reserved_bytes[0].current) > allowed_ - bytes)) {
      over_fraction_ = true;  // set_per_process_memory_fraction's limit
      host_oom_.clear();
      return nullptr;
    }
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

  [[noreturn]] void raise_oom(size_t requested, c10::StreamId stream, const BlockPool& pool,
                              int h, std::unique_lock<std::mutex>& lock) {
    auto info = rt::mem_get_info(device_);
    if (h != 0) {
      // CUDA's oom entry: addr is the memory the device still reports free.
      record(h, TraceEntry::OOM, reinterpret_cast<const void*>(info.free), requested, stream,
             pool, nullptr);
    }
    int64_t allocated = stats_.allocated_bytes[0].current;
    int64_t reserved = stats_.reserved_bytes[0].current;
    // Memory allocated in private pools (MemPool, graphs), told apart as CUDA does.
    int64_t in_pools = 0;
    for (Block* head : segments_) {
      if (head->pool->owner == nullptr) continue;
      for (Block* b = head; b != nullptr; b = b->next) {
        if (b->allocated) in_pools += static_cast<int64_t>(b->size);
      }
    }
    const std::string pools_msg =
        in_pools > 0 ? "with " + format_size(in_pools) + " allocated in private pools (e.g., graphs), "
                     : "";
    std::ostringstream allowed_msg;
    if (over_fraction_) {
      allowed_msg << format_size(allowed_) << " allowed (per-process memory fraction "
                  << fraction_ << "); ";
    }
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
          " is allocated by PyTorch, ", pools_msg, "and ", format_size(reserved - allocated),
          " is reserved by PyTorch but unallocated. Free tensors on any axon device (and call "
          "torch.axon.empty_cache()), or lower AXON_DEVICE_MEMORY.");
    }
    TORCH_CHECK_WITH(
        OutOfMemoryError, false,
        "axon out of memory. Tried to allocate ", format_size(requested),
        ". axon:", static_cast<int>(device_), " has a total capacity of ",
        format_size(info.total), " of which ", format_size(info.free),
        " is free. ", allowed_msg.str(), "Of the allocated memory ", format_size(allocated),
        " is allocated by PyTorch, ", pools_msg, "and ", format_size(reserved - allocated),
        " is reserved by PyTorch but unallocated. Free tensors (and call "
        "torch.axon.empty_cache()) to make room.");
  }

  Block* maybe_split(Block* block, size_t size, size_t max_split) {
    size_t remaining = block->size - size;
    bool split = block->pool->is_small ? remaining >= kMinBlockSize
                                       : remaining > kSmallSize && size < max_split;
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

  // A block nobody uses any more: merge with free neighbours, back to the
  // pool.  Returns the merged free block.
  Block* release_to_pool(Block* block, int h) {
    if (h != 0) {
      record(h, TraceEntry::FREE_COMPLETED, block->ptr, block->requested, block->stream,
             *block->pool, nullptr);
    }
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
    return block;
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

  void insert_events(Block* block) {
    for (c10::StreamId s : block->stream_uses) {
      rt::Event* ev = rt::event_create(device_);
      rt::event_record(ev, rt::Stream{device_, s});
      pending_.emplace_back(ev, block);
      ++block->pending_events;
    }
    block->stream_uses.clear();
  }

  // Frees deferred during a capture get their events once no capture runs.
  void insert_deferred_events() {
    if (deferred_.empty() || rt::device_is_capturing(device_)) return;
    for (Block* block : deferred_) {
      --block->pending_events;
      insert_events(block);
    }
    deferred_.clear();
  }

  // Frees blocks whose record_stream events have completed, and released
  // pools' segments whose last work has run.
  void process_events() {
    insert_deferred_events();
    while (!pending_.empty()) {
      auto [ev, block] = pending_.front();
      if (!rt::event_query(ev)) break;
      pending_.pop_front();
      rt::event_destroy(ev);
      if (--block->pending_events == 0) {
        released(release_to_pool(block, g_history.load(std::memory_order_relaxed)));
      }
    }
    while (!doomed_.empty()) {
      auto [ev, block] = doomed_.front();
      if (!rt::event_query(ev)) break;
      doomed_.pop_front();
      rt::event_destroy(ev);
      if (--block->pending_events > 0) continue;
      PrivatePool* owner = block->pool->owner;
      free_segment(block, nullptr);
      maybe_erase(owner);
    }
  }

  // CUDA's synchronize_and_free_events.
  void drain_events() {
    stats_.num_sync_all_streams += 1;
    insert_deferred_events();
    for (auto& [ev, block] : pending_) {
      rt::event_wait(ev);  // the user's errors stay pending for the user
      rt::event_destroy(ev);
      if (--block->pending_events == 0) {
        released(release_to_pool(block, g_history.load(std::memory_order_relaxed)));
      }
    }
    pending_.clear();
    for (auto& [ev, block] : doomed_) {
      rt::event_wait(ev);
      rt::event_destroy(ev);
      if (--block->pending_events > 0) continue;
      PrivatePool* owner = block->pool->owner;
      free_segment(block, nullptr);
      maybe_erase(owner);
    }
    doomed_.clear();
  }

  // garbage_collection_threshold (with a per-process memory fraction, as
  // CUDA's): before a new segment, if the reserved memory is over the
  // threshold's share of what the process may reserve and whole free
  // segments are cached, they go back to the device (all of them; CUDA's
  // picks the older ones).
  void maybe_collect_garbage() {
    const double threshold = AllocConf::garbage_collection_threshold();
    if (threshold <= 0.0 || allowed_ == std::numeric_limits<size_t>::max()) return;
    const auto reserved = static_cast<double>(stats_.reserved_bytes[0].current);
    if (reserved <= threshold * static_cast<double>(allowed_)) return;
    const auto cached = [](const BlockPool& pool) {
      return std::any_of(pool.blocks.begin(), pool.blocks.end(),
                         [](const Block* b) { return !b->is_split(); });
    };
    if (cached(large_) || cached(small_)) release_cached();
  }

  // Returns every whole free segment of the shared pools and of released
  // private pools to the runtime (a live private pool keeps its cache, as
  // CUDA's graph pools do).
  void release_cached() {
    // Work already enqueued may still touch freed blocks; the runtime may only
    // reclaim memory nobody uses.
    rt::device_wait(device_);  // errors stay pending for the user's next synchronize
    std::vector<BlockPool*> pools{&small_, &large_};
    std::vector<PrivatePool*> released_pools;
    for (auto& [id, p] : pools_) {
      if (p->use_count > 0) continue;
      pools.push_back(&p->small);
      pools.push_back(&p->large);
      released_pools.push_back(p.get());
    }
    for (BlockPool* pool : pools) {
      for (auto it = pool->blocks.begin(); it != pool->blocks.end();) {
        Block* block = *it;
        if (block->is_split()) {
          ++it;
          continue;
        }
        it = pool->blocks.erase(it);
        free_segment(block, nullptr);
      }
    }
    for (PrivatePool* p : released_pools) maybe_erase(p);
  }

  const c10::DeviceIndex device_;
  FreeLog free_log_;
  std::mutex mutex_;
  BlockPool small_, large_;
  std::deque<std::pair<rt::Event*, Block*>> pending_;
  std::vector<Block*> deferred_;  // freed with stream uses during a capture
  // Released pools' free segments waiting for their stream's last work.
  std::deque<std::pair<rt::Event*, Block*>> doomed_;
  std::string host_oom_;  // the runtime's message when the host refused memory
  bool over_fraction_ = false;  // the last refusal was the memory fraction's
  double fraction_ = 1.0;
  size_t allowed_ = std::numeric_limits<size_t>::max();
  std::map<c10::MempoolId_t, std::unique_ptr<PrivatePool>> pools_;
  // Routings to private pools, first match wins (beginAllocateToPool).
  std::vector<std::pair<c10::MempoolId_t, std::function<bool(c10::StreamId)>>> captures_;
  struct ByAddress {
    bool operator()(const Block* a, const Block* b) const { return a->ptr < b->ptr; }
  };
  std::set<Block*, ByAddress> segments_;  // the first block of each segment
  std::vector<TraceEntry> trace_;  // a ring once full; trace_next_ is the oldest
  size_t trace_next_ = 0;
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
    // As CUDA's caching allocator (sizes past this overflow its rounding).
    constexpr size_t kOneExaByte = size_t{1} << 60;
    TORCH_CHECK_WITH(OutOfMemoryError, nbytes <= kOneExaByte,
                     "axon out of memory. Tried to allocate more than 1EB memory.");
    if (!g_caching_enabled.load(std::memory_order_relaxed)) {
      TORCH_CHECK(!rt::device_is_capturing(device),
                  "axon graph capture needs the caching allocator: allocations would not come "
                  "from the graph's pool (torch.axon.caching_allocator_enable(True))");
      void* p = rt_call([&] { return rt::malloc(device, nbytes); });
      return c10::DataPtr(p, p, &uncachedDeleter, dev);
    }
    c10::StreamId stream = getCurrentAxonStream(device).id();
    // History off: this load is all it costs.
    const int h = g_history.load(std::memory_order_relaxed);
    Context context = gather_context(h, RecordContext::STATE);
    Block* block = cache(device).malloc(nbytes, stream, h, context, /*last_try=*/false);
    if (block == nullptr) {
      // Kernels that have run may still hold the last references to memory.
      rt_call([&] { rt::device_wait(device); });  // errors stay pending for the user
      releaseFinishedWork();
      if (cache(device).host_refused()) {
        // The host is full, not the device: the other devices' caches give
        // their free segments back too (no cache lock is held here).
        for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
          if (d == device) continue;
          if (auto* c = existing(d)) rt_call([&] { c->empty_cache(); });
        }
      }
      block = cache(device).malloc(nbytes, stream, h, context, /*last_try=*/true);
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
  // Like cudaFree: no stream may still use the memory, so the device drains
  // first (without raising its errors, which stay for the user).
  static void uncachedDeleter(void* ptr) {
    const int device = rt::pointer_device(ptr);
    try {
      if (device >= 0) rt::device_wait(device);
      rt::free(ptr);
    } catch (const std::exception& e) {
      TORCH_WARN("axon: freeing uncached device memory failed: ", e.what());
    }
  }

  static void deleter(void* ctx) {
    auto* block = static_cast<Block*>(ctx);
    const int h = g_history.load(std::memory_order_relaxed);
    instance().cache(block->device).free(block, h, gather_context(h, RecordContext::ALL));
  }

 public:
  DeviceCache* existing(c10::DeviceIndex device) {
    return caches_[device].load(std::memory_order_acquire);
  }

  static constexpr int kMaxDevices = 128;

 private:
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

c10::MempoolId_t newPoolId(bool for_graph) {
  static std::atomic<c10::CaptureId_t> uid{1};
  const c10::CaptureId_t id = uid.fetch_add(1);
  return for_graph ? c10::MempoolId_t{id, 0} : c10::MempoolId_t{0, id};
}

namespace {
DeviceCache& cache_of(c10::DeviceIndex device) {
  return AxonCachingAllocator::instance().cache(device);
}
}  // namespace

void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t pool,
                         std::function<bool(c10::StreamId)> filter) {
  cache_of(device).begin_allocate_to_pool(pool, std::move(filter));
}

void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t pool) {
  cache_of(device).end_allocate_to_pool(pool);
}

void retainPool(c10::DeviceIndex device, c10::MempoolId_t pool) {
  cache_of(device).retain_pool(pool);
}

void releasePool(c10::DeviceIndex device, c10::MempoolId_t pool) {
  cache_of(device).release_pool(pool);
}

int poolUseCount(c10::DeviceIndex device, c10::MempoolId_t pool) {
  return cache_of(device).use_count(pool);
}

void setMemoryFraction(c10::DeviceIndex device, double fraction) {
  TORCH_CHECK(fraction >= 0 && fraction <= 1, "invalid fraction:", fraction,
              ". Please set within [0, 1].");
  auto info = rt_call([&] { return rt::mem_get_info(device); });
  cache_of(device).set_fraction(fraction, info.total);
}

double getMemoryFraction(c10::DeviceIndex device) { return cache_of(device).fraction(); }

void setCachingEnabled(bool enabled) { g_caching_enabled.store(enabled); }
bool cachingEnabled() { return g_caching_enabled.load(); }

void recordHistory(bool trace, RecordContext context,
                   c10::CachingDeviceAllocator::CreateContextFn gather, size_t max_entries,
                   bool clear, unsigned skip) {
  auto& a = AxonCachingAllocator::instance();
  g_gather.store(gather, std::memory_order_release);
  g_trace_max.store(trace ? max_entries : 0, std::memory_order_relaxed);
  g_trace_skip.store(skip, std::memory_order_relaxed);
  const int h = (trace ? kTrace : 0) | (static_cast<int>(context) << 1);
  g_history.store(h, std::memory_order_release);
  if (clear || !trace) {
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      if (auto* c = a.existing(d)) c->clear_trace();
    }
  }
}

Snapshot snapshot(std::optional<c10::MempoolId_t> pool, bool include_traces) {
  auto& a = AxonCachingAllocator::instance();
  Snapshot out;
  if (include_traces) out.device_traces.resize(device_count());
  for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
    if (auto* c = a.existing(d)) c->snapshot(pool, include_traces, out);
  }
  return out;
}

}  // namespace at::axon
