#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "axon/runtime.h"
#include "bytes.h"
#include "test_util.h"

namespace axon::rt {
namespace {

constexpr size_t kGiB = size_t{1} << 30;

// The default capacity: min(8GiB, host memory / 8 devices) (config.h).
size_t cap() { return get_device_properties(0).total_memory; }

bool aligned64(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

TEST(Memory, MallocIsAlignedWritableAndAccounted) {
  AXON_REQUIRE_DEFAULT_ENV();
  const MemoryInfo before = mem_get_info(1);
  EXPECT_EQ(before.total, cap());
  void* p = malloc(1, 1000);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(aligned64(p));
  std::memset(p, 0xab, 1000);  // host-accessible
  // Charged in 64-byte granules.
  EXPECT_EQ(mem_get_info(1).free, before.free - 1024);
  free(p);
  EXPECT_EQ(mem_get_info(1).free, before.free);
}

TEST(Memory, AccountingIsPerDevice) {
  AXON_REQUIRE_DEFAULT_ENV();
  const size_t free2 = mem_get_info(2).free;
  void* p = malloc(3, 4096);
  EXPECT_EQ(mem_get_info(2).free, free2);
  EXPECT_EQ(mem_get_info(3).free, cap() - 4096);
  free(p);
}

TEST(Memory, ZeroByteAllocationsAreUniqueAndNonNull) {
  void* a = malloc(0, 0);
  void* b = malloc(0, 0);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);
  EXPECT_EQ(pointer_device(a), 0);
  free(a);
  free(b);
}

TEST(Memory, PointerDeviceCoversTheWholeAllocation) {
  AXON_REQUIRE_DEFAULT_ENV();
  auto* p = static_cast<char*>(malloc(4, 256));
  EXPECT_EQ(pointer_device(p), 4);
  EXPECT_EQ(pointer_device(p + 100), 4);
  EXPECT_EQ(pointer_device(p + 255), 4);
  int on_stack = 0;
  std::vector<char> on_heap(16);
  EXPECT_EQ(pointer_device(&on_stack), -1);
  EXPECT_EQ(pointer_device(on_heap.data()), -1);
  EXPECT_EQ(pointer_device(nullptr), -1);
  free(p);
  EXPECT_EQ(pointer_device(p), -1);
}

TEST(Memory, FreeNullIsNoOp) { EXPECT_NO_THROW(free(nullptr)); }

TEST(Memory, AllocationsCanBeMappedByAnotherProcess) {
  AXON_REQUIRE_DEFAULT_ENV();
  const size_t n = 3 << 20;
  char* p = static_cast<char*>(malloc(0, n));
  MemoryExport ex;
  ASSERT_TRUE(memory_export(p + 1000, &ex));
  EXPECT_EQ(ex.offset, 1000u);
  EXPECT_GE(ex.size, n);
  // What a peer does: open the memfd through /proc and map it.
  std::string path = "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(ex.fd);
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char* q = static_cast<char*>(mmap(nullptr, ex.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  ASSERT_NE(q, MAP_FAILED);
  q[1000] = 42;                  // written through the peer's mapping
  EXPECT_EQ(p[1000], 42);        // seen by the owner
  p[n - 1] = 7;
  EXPECT_EQ(q[n - 1], 7);
  munmap(q, ex.size);
  MemoryExport other;
  char* r = static_cast<char*>(malloc(0, 64));
  ASSERT_TRUE(memory_export(r, &other));
  EXPECT_NE(other.id, ex.id);    // ids tell allocations apart (fd numbers get reused)
  free(r);
  free(p);
  EXPECT_FALSE(memory_export(p, &ex));
  int stack = 0;
  EXPECT_FALSE(memory_export(&stack, &ex));
}

TEST(Memory, ImportMapsAnExportedAllocationAsDeviceMemory) {
  AXON_REQUIRE_DEFAULT_ENV();
  const size_t n = 1 << 20;
  char* p = static_cast<char*>(malloc(0, n));
  MemoryExport ex;
  ASSERT_TRUE(memory_export(p + 256, &ex));
  EXPECT_NE(ex.inode, 0u);
  // Another process would pass the exporter's pid; this one maps itself.
  char* q = static_cast<char*>(memory_import(1, getpid(), ex));
  EXPECT_NE(q, p + 256);                // a mapping of its own ...
  q[0] = 5;
  EXPECT_EQ(p[256], 5);                 // ... of the same pages
  EXPECT_EQ(pointer_device(q), 1);      // device memory of the importing side's device
  EXPECT_EQ(pointer_device(q - 256), 1);
  MemoryExport again;
  ASSERT_TRUE(memory_export(q, &again));  // can be passed on
  EXPECT_EQ(again.inode, ex.inode);
  EXPECT_EQ(again.offset, 256u);
  EXPECT_EQ(mem_get_info(1).free, mem_get_info(1).total);  // not charged to device 1
  EXPECT_THROW(free(q - 256), Error);   // imported memory is closed, not freed
  EXPECT_THROW(memory_close(p), Error); // and own memory freed, not closed
  memory_close(q);
  EXPECT_EQ(pointer_device(q), -1);
  EXPECT_EQ(p[256], 5);                 // the exporter's allocation is untouched

  MemoryExport stale = ex;
  stale.inode += 1;                     // not that memfd (any more)
  EXPECT_THROW(memory_import(1, getpid(), stale), Error);
  EXPECT_THROW(memory_import(99, getpid(), ex), InvalidDeviceError);
  free(p);
  EXPECT_THROW(memory_import(1, getpid(), ex), Error);  // gone
}

TEST(Memory, FreeOfForeignPointerThrows) {
  int x = 0;
  EXPECT_THROW(free(&x), Error);
  auto* p = static_cast<char*>(malloc(0, 128));
  EXPECT_THROW(free(p + 64), Error);  // interior pointer
  free(p);
  EXPECT_THROW(free(p), Error);       // double free
}

TEST(Memory, OutOfMemoryCarriesDetailsAndIsRecoverable) {
  AXON_REQUIRE_DEFAULT_ENV();
  void* held = malloc(6, 1 << 20);
  try {
    malloc(6, cap() + kGiB);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.device, 6);
    EXPECT_EQ(e.requested, cap() + kGiB);
    EXPECT_EQ(e.used, size_t{1} << 20);
    EXPECT_EQ(e.capacity, cap());
    EXPECT_FALSE(e.host);
    EXPECT_EQ(std::string(e.what()), "axon:6 out of memory: tried to allocate " +
                                         format_bytes(cap() + kGiB) + "; 1.00 MiB of " +
                                         format_bytes(cap()) + " in use");
  }
  EXPECT_EQ(mem_get_info(6).free, cap() - (1 << 20));  // failure charged nothing
  EXPECT_THROW(malloc(6, SIZE_MAX), OutOfMemoryError);
  void* p = malloc(6, 1 << 20);
  free(p);
  free(held);
}

TEST(Memory, ConcurrentMallocFreeKeepsAccountingExact) {
  AXON_REQUIRE_DEFAULT_ENV();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < 200; ++i) free(malloc(7, 64 * (i % 7 + 1)));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mem_get_info(7).free, cap());
}

}  // namespace
}  // namespace axon::rt
