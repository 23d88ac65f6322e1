#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

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
  int fd;          // memfd, or -1 for private memory
  uint64_t id;
  uint64_t inode;  // the memfd's (0 for private memory)
  bool imported;   // mapped from another process (memory_import)
};

uint64_t next_allocation_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

uint64_t inode_of(int fd) {
  struct stat st;
  return fd >= 0 && fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// Never destroyed (usable from static destructors).
RangeRegistry<Allocation>& allocations() {
  static auto* r = new RangeRegistry<Allocation>;
  return *r;
}

bool shareable() {
  static const bool on = [] {
    if (!config().shareable_memory) return false;
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

// A memfd mapping of size bytes, or nullptr (then private memory is used);
// *why names the failing call.
void* map_shared(size_t size, int* fd_out, std::string* why) {
  int fd = memfd_create("axon-device-memory", MFD_CLOEXEC);
  if (fd < 0) {
    *why = std::string("memfd_create: ") + std::strerror(errno);
    return nullptr;
  }
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    *why = std::string("ftruncate: ") + std::strerror(errno);
    close(fd);
    return nullptr;
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    *why = std::string("mmap: ") + std::strerror(errno);
    close(fd);
    return nullptr;
  }
  *fd_out = fd;
  return p;
}

// Bytes of device memory of all devices of this process (the commit that the
// host must back), checked against config().host_memory.
std::atomic<size_t> g_host_used{0};

// What the host says it can still supply (MemAvailable, or the cgroup's
// room if smaller); SIZE_MAX when unknown.
size_t host_available() {
  size_t avail = SIZE_MAX;
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kb = 0;
    while (std::fgets(line, sizeof line, f)) {
      if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
        avail = static_cast<size_t>(kb) * 1024;
        break;
      }
    }
    std::fclose(f);
  }
  unsigned long long max = 0, cur = 0;
  std::FILE* fm = std::fopen("/sys/fs/cgroup/memory.max", "r");
  std::FILE* fc = std::fopen("/sys/fs/cgroup/memory.current", "r");
  if (fm && fc && std::fscanf(fm, "%llu", &max) == 1 && std::fscanf(fc, "%llu", &cur) == 1) {
    avail = std::min<size_t>(avail, max > cur ? max - cur : 0);
  }
  if (fm) std::fclose(fm);
  if (fc) std::fclose(fc);
  return avail;
}

// Allocations at least this big ask the host whether it can supply them.
constexpr size_t kAskHostFrom = size_t{1} << 20;

OutOfMemoryError host_out_of_memory(int d, size_t requested, size_t used, size_t capacity,
                                    const std::string& detail) {
  return OutOfMemoryError("axon:" + std::to_string(d) +
                              " out of memory: the host ran out of memory: tried to allocate " +
                              format_bytes(requested) + "; " + detail,
                          d, requested, used, capacity, /*host=*/true);
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

  // The device has room; now the host.
  const auto give_back = [&] {
    return dev.used.fetch_sub(size, std::memory_order_relaxed) - size;
  };
  const size_t host_limit = config().host_memory;
  size_t host_used = g_host_used.load(std::memory_order_relaxed);
  do {
    if (host_limit > 0 && size > host_limit - std::min(host_limit, host_used)) {
      const size_t now = give_back();
      throw host_out_of_memory(
          d, bytes, now, dev.capacity,
          "the devices of this process use " + format_bytes(host_used) + " of the " +
              format_bytes(host_limit) + " of host memory they may use together "
              "(AXON_HOST_MEMORY; default the host's physical memory)");
    }
  } while (!g_host_used.compare_exchange_weak(host_used, host_used + size,
                                              std::memory_order_relaxed));
  const auto give_back_all = [&] {
    g_host_used.fetch_sub(size, std::memory_order_relaxed);
    return give_back();
  };
  if (size >= kAskHostFrom) {
    if (const size_t avail = host_available(); size > avail) {
      const size_t now = give_back_all();
      throw host_out_of_memory(d, bytes, now, dev.capacity,
                               "the host has " + format_bytes(avail) + " available");
    }
  }

  int fd = -1;
  std::string why;
  void* p = shareable() ? map_shared(size, &fd, &why) : nullptr;
  if (p == nullptr) {
    p = std::aligned_alloc(kAlignment, size);
    if (p == nullptr) why += std::string(why.empty() ? "" : ", ") + "aligned_alloc failed";
  }
  if (p == nullptr) {
    const size_t now = give_back_all();
    throw host_out_of_memory(d, bytes, now, dev.capacity,
                             "the host refused " + format_bytes(size) + " (" + why + ")");
  }
  allocations().insert(p, size, Allocation{d, fd, next_allocation_id(), inode_of(fd), false});
  return p;
}

void free(void* ptr) {
  if (ptr == nullptr) return;
  bool imported = false;
  allocations().with(ptr, [&](auto& e) {
    imported = e.payload.imported && e.base == reinterpret_cast<uintptr_t>(ptr);
  });
  if (imported) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "axon: free of %p, device memory mapped from another process "
                  "(memory_import): release it with memory_close", ptr);
    throw Error(buf);
  }
  auto e = allocations().erase(ptr);
  if (!e) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "axon: free of %p, which is not a pointer returned by malloc",
                  ptr);
    throw Error(buf);
  }
  if (e->payload.fd >= 0) {
    // Truncated first: the pages go now even if other processes still map
    // the memfd (the collectives' peer caches); they see the size drop and
    // unmap (axon::comm::ShmGroup::map_peer).
    if (ftruncate(e->payload.fd, 0) != 0) {
      // Nothing to do: the pages then go when the last mapping does.
    }
    munmap(ptr, e->size);
    close(e->payload.fd);
  } else {
    std::free(ptr);
  }
  created_device(e->payload.device)->used.fetch_sub(e->size, std::memory_order_relaxed);
  g_host_used.fetch_sub(e->size, std::memory_order_relaxed);
}

MemoryInfo host_memory_info() noexcept {
  const size_t limit = config().host_memory;
  const size_t used = g_host_used.load(std::memory_order_relaxed);
  return MemoryInfo{limit > used ? limit - used : 0, limit};
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
    out->inode = e.payload.inode;
    ok = true;
  });
  return ok;
}

void* map_process_memory(int pid, int fd, size_t size, uint64_t inode, int* local_fd,
                         std::string* why) {
  const auto fail = [&](const std::string& what) -> void* {
    if (why != nullptr) *why = what;
    return nullptr;
  };
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  const int local = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (local < 0) return fail("cannot open " + path + ": " + std::strerror(errno));
  struct stat st;
  std::string bad;
  if (fstat(local, &st) != 0) {
    bad = std::string("fstat: ") + std::strerror(errno);
  } else if (inode != 0 && static_cast<uint64_t>(st.st_ino) != inode) {
    bad = path + " is no longer the exported memory";
  } else if (static_cast<size_t>(st.st_size) < size) {
    bad = "the exported memory was freed (" + std::to_string(st.st_size) + " of " +
          std::to_string(size) + " bytes left)";
  }
  void* p = nullptr;
  if (bad.empty()) {
    p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, local, 0);
    if (p == MAP_FAILED) bad = std::string("mmap: ") + std::strerror(errno);
  }
  if (!bad.empty()) {
    close(local);
    return fail(bad);
  }
  *local_fd = local;
  return p;
}

void* memory_import(int d, int pid, const MemoryExport& ex) {
  check_device(d);
  if (ex.size == 0 || ex.offset >= ex.size) {
    throw Error("axon: memory_import of an empty range (offset " + std::to_string(ex.offset) +
                " of " + std::to_string(ex.size) + " bytes)");
  }
  int fd = -1;
  std::string why;
  void* base = map_process_memory(pid, ex.fd, ex.size, ex.inode, &fd, &why);
  if (base == nullptr) {
    throw Error("axon: cannot map the device memory process " + std::to_string(pid) +
                " shared (is it still running?): " + why);
  }
  allocations().insert(base, ex.size,
                       Allocation{d, fd, next_allocation_id(), inode_of(fd), true});
  return static_cast<char*>(base) + ex.offset;
}

void memory_close(void* ptr) {
  uintptr_t base = 0;
  bool imported = false;
  allocations().with(ptr, [&](auto& e) {
    base = e.base;
    imported = e.payload.imported;
  });
  if (!imported) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "axon: memory_close of %p, which memory_import did not return",
                  ptr);
    throw Error(buf);
  }
  auto e = allocations().erase(reinterpret_cast<void*>(base));
  if (!e) return;  // closed concurrently
  munmap(reinterpret_cast<void*>(e->base), e->size);
  close(e->payload.fd);
}

bool is_device_range(const void* p, size_t n, const char* what) {
  return allocations().with(p, [&](auto& e) { check_range(e.base, e.size, p, n, what, "device"); });
}

}  // namespace axon::rt
