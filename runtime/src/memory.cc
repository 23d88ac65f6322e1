#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "axon/runtime.h"
#include "bytes.h"
#include "config.h"
#include "device.h"
#include "memory.h"
#include "registry.h"

namespace axon::rt {
namespace {

struct Allocation {
  int device;
  int fd;        // memfd, or -1 for private memory
  uint64_t id;
};

// Never destroyed (usable from static destructors).
RangeRegistry<Allocation>& allocations() {
  static auto* r = new RangeRegistry<Allocation>;
  return *r;
}

bool shareable() {
  static const bool on = [] {
    const char* v = std::getenv("AXON_SHAREABLE_MEMORY");
    if (v != nullptr && std::strcmp(v, "0") == 0) return false;
    // One descriptor per live allocation: raise the soft limit to the hard one.
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
    }
    return true;
  }();
  return on;
}

// A memfd mapping of size bytes, or nullptr (then private memory is used).
void* map_shared(size_t size, int* fd_out) {
  int fd = memfd_create("axon-device-memory", MFD_CLOEXEC);
  if (fd < 0) return nullptr;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return nullptr;
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return nullptr;
  }
  *fd_out = fd;
  return p;
}

OutOfMemoryError out_of_memory(int d, size_t requested, size_t used, size_t capacity) {
  return OutOfMemoryError("axon:" + std::to_string(d) + " out of memory: tried to allocate " +
                              format_bytes(requested) + "; " + format_bytes(used) + " of " +
                              format_bytes(capacity) + " in use",
                          d, requested, used, capacity);
}

}  // namespace

size_t granule_size(size_t bytes) noexcept {
  if (bytes == 0) return kAlignment;
  if (bytes > SIZE_MAX - (kAlignment - 1)) return 0;
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

void check_range(uintptr_t base, size_t size, const void* p, size_t n, const char* what,
                 const char* kind) {
  const size_t offset = reinterpret_cast<uintptr_t>(p) - base;
  if (n > size - offset) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "axon: %s of %zu bytes at %p overruns its %s allocation (%zu "
                  "bytes at offset %zu)", what, n, p, kind, size, offset);
    throw Error(buf);
  }
}

// Accounting charges whole granules, the memory actually reserved.
void* malloc(int d, size_t bytes) {
  Device& dev = device(d);
  const size_t size = granule_size(bytes);
  size_t used = dev.used.load(std::memory_order_relaxed);
  do {
    if (size == 0 || size > dev.capacity - used) throw out_of_memory(d, bytes, used, dev.capacity);
  } while (!dev.used.compare_exchange_weak(used, used + size, std::memory_order_relaxed));

  static std::atomic<uint64_t> next_id{1};
  int fd = -1;
  void* p = shareable() ? map_shared(size, &fd) : nullptr;
  if (p == nullptr) p = std::aligned_alloc(kAlignment, size);
  if (p == nullptr) {
    const size_t now = dev.used.fetch_sub(size, std::memory_order_relaxed) - size;
    throw OutOfMemoryError("axon:" + std::to_string(d) + " out of memory: the host could not "
                               "allocate " + format_bytes(bytes),
                           d, bytes, now, dev.capacity);
  }
  allocations().insert(p, size, Allocation{d, fd, next_id.fetch_add(1)});
  return p;
}

void free(void* ptr) {
  if (ptr == nullptr) return;
  auto e = allocations().erase(ptr);
  if (!e) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "axon: free of %p, which is not a pointer returned by malloc",
                  ptr);
    throw Error(buf);
  }
  if (e->payload.fd >= 0) {
    munmap(ptr, e->size);
    close(e->payload.fd);
  } else {
    std::free(ptr);
  }
  created_device(e->payload.device)->used.fetch_sub(e->size, std::memory_order_relaxed);
}

MemoryInfo mem_get_info(int d) {
  check_device(d);
  const Device* dev = created_device(d);
  const size_t total = config().device_memory;
  const size_t used = dev ? dev->used.load(std::memory_order_relaxed) : 0;
  return MemoryInfo{total - used, total};
}

int pointer_device(const void* ptr) noexcept {
  int d = -1;
  allocations().with(ptr, [&](auto& e) { d = e.payload.device; });
  return d;
}

bool memory_export(const void* ptr, MemoryExport* out) noexcept {
  bool ok = false;
  allocations().with(ptr, [&](auto& e) {
    if (e.payload.fd < 0) return;
    out->fd = e.payload.fd;
    out->id = e.payload.id;
    out->size = e.size;
    out->offset = reinterpret_cast<uintptr_t>(ptr) - e.base;
    ok = true;
  });
  return ok;
}

bool is_device_range(const void* p, size_t n, const char* what) {
  return allocations().with(p, [&](auto& e) { check_range(e.base, e.size, p, n, what, "device"); });
}

}  // namespace axon::rt
