#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "axon/runtime.h"
#include "test_util.h"

namespace axon::rt {
namespace {

using testing::Gate;

TEST(Pinned, AllocFreeAndInteriorPointers) {
  auto* p = static_cast<char*>(host_alloc(100));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  EXPECT_TRUE(is_host_pinned(p));
  EXPECT_TRUE(is_host_pinned(p + 99));
  EXPECT_EQ(pointer_device(p), -1);  // pinned host memory is not device memory
  std::vector<char> pageable(16);
  EXPECT_FALSE(is_host_pinned(pageable.data()));
  EXPECT_FALSE(is_host_pinned(nullptr));
  host_free(p);
  EXPECT_FALSE(is_host_pinned(p));
}

TEST(Pinned, DeviceMemoryIsNotPinned) {
  void* d = malloc(0, 64);
  EXPECT_FALSE(is_host_pinned(d));
  free(d);
}

TEST(Pinned, FreeNullIsNoOpAndForeignPointerThrows) {
  EXPECT_NO_THROW(host_free(nullptr));
  int x = 0;
  EXPECT_THROW(host_free(&x), Error);
  void* d = malloc(0, 64);
  EXPECT_THROW(host_free(d), Error);
  free(d);
}

TEST(Pinned, InUseWhileACopyUsesTheBuffer) {
  constexpr size_t n = 256;
  auto* host = static_cast<unsigned char*>(host_alloc(n));
  auto* dev = static_cast<unsigned char*>(malloc(0, n));
  const Stream s = stream_from_pool(0, 0);
  EXPECT_FALSE(host_in_use(host));
  Gate gate;
  launch(s, "gate", [&] { gate.wait(); });
  memcpy(dev, host + 16, 64, s);  // an interior pointer counts for the buffer
  if (!launch_blocking()) {
    EXPECT_TRUE(host_in_use(host));
  }
  gate.open();
  stream_synchronize(s);
  EXPECT_FALSE(host_in_use(host));
  EXPECT_FALSE(host_in_use(dev));  // not pinned memory
  host_free(host);
  free(dev);
}

TEST(Pinned, HostFreeWaitsForPendingCopies) {
  AXON_REQUIRE_DEFAULT_ENV();
  constexpr size_t n = 4096;
  auto* host = static_cast<unsigned char*>(host_alloc(n));
  std::memset(host, 0x5a, n);
  auto* dev = static_cast<unsigned char*>(malloc(0, n));
  std::memset(dev, 0, n);
  const Stream s = stream_from_pool(0, 0);

  Gate gate;
  launch(s, "gate", [&] { gate.wait(); });
  memcpy(dev, host, n, s);  // asynchronous: queued behind the gate
  EXPECT_FALSE(stream_query(s));

  std::atomic<bool> freed{false};
  bool copied = false;
  std::thread freer([&] {
    host_free(host);
    // host_free returned, so the copy reading the buffer has completed.
    // (If it had not waited, ASan would also flag the copy's read.)
    copied = dev[0] == 0x5a && dev[n - 1] == 0x5a;
    freed = true;
  });
  // Give the freer a head start so that it really blocks; correctness of the
  // assertions below does not depend on it.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(freed);
  gate.open();
  freer.join();
  EXPECT_TRUE(copied);
  stream_synchronize(s);
  free(dev);
}

}  // namespace
}  // namespace axon::rt
