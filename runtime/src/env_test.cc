// Suites that need a non-default environment.  Each runs as its own ctest
// entry with the environment set (see runtime/CMakeLists.txt) and skips
// itself anywhere else.
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "axon/runtime.h"

namespace axon::rt {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

bool env_is(const char* var, const char* value) {
  const char* v = std::getenv(var);
  return v != nullptr && std::strcmp(v, value) == 0;
}

// AXON_NUM_DEVICES=4 AXON_LOGICAL_CORE_CONFIG=2 AXON_DEVICE_MEMORY=64MiB
class SmallConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!env_is("AXON_NUM_DEVICES", "4") || !env_is("AXON_LOGICAL_CORE_CONFIG", "2") ||
        !env_is("AXON_DEVICE_MEMORY", "64MiB"))
      GTEST_SKIP() << "runs as ctest entry axonrt_small_config";
  }
};

TEST_F(SmallConfig, TwoLogicalDevicesOfTwoCores) {
  EXPECT_EQ(device_count(), 2);
  const DeviceProperties p = get_device_properties(1);
  EXPECT_EQ(p.total_memory, 128 * kMiB);
  EXPECT_EQ(p.compute_units, 2);
  EXPECT_EQ(p.physical_cores, 2);
  EXPECT_EQ(mem_get_info(1).total, 128 * kMiB);
  try {
    check_device(2);
    FAIL();
  } catch (const InvalidDeviceError& e) {
    EXPECT_EQ(std::string(e.what()),
              "Invalid device index: axon:2; the device count is 2 (valid indices are 0..1)");
  }
}

TEST_F(SmallConfig, OutOfMemoryPastCapacityThenWorksAfterFree) {
  void* big = malloc(0, 100 * kMiB);
  try {
    malloc(0, 29 * kMiB);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.device, 0);
    EXPECT_EQ(e.requested, 29 * kMiB);
    EXPECT_EQ(e.used, 100 * kMiB);
    EXPECT_EQ(e.capacity, 128 * kMiB);
    EXPECT_EQ(std::string(e.what()),
              "axon:0 out of memory: tried to allocate 29.00 MiB; 100.00 MiB of 128.00 MiB in use");
  }
  void* rest = malloc(0, 28 * kMiB);  // exactly fills the device
  EXPECT_EQ(mem_get_info(0).free, 0u);
  EXPECT_THROW(malloc(0, 1), OutOfMemoryError);
  free(big);
  void* again = malloc(0, 29 * kMiB);
  EXPECT_NE(again, nullptr);
  free(again);
  free(rest);
  EXPECT_EQ(mem_get_info(0).free, 128 * kMiB);
}

// AXON_NUM_DEVICES=0
class NoDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!env_is("AXON_NUM_DEVICES", "0")) GTEST_SKIP() << "runs as ctest entry axonrt_no_device";
  }
};

TEST_F(NoDevice, NothingIsAvailable) {
  EXPECT_EQ(device_count(), 0);
  try {
    check_device(0);
    FAIL();
  } catch (const InvalidDeviceError& e) {
    EXPECT_EQ(std::string(e.what()), "Invalid device index: axon:0; no axon device is available");
  }
  EXPECT_THROW(malloc(0, 64), InvalidDeviceError);
  EXPECT_THROW(launch(Stream{0, 0}, "x", [] {}), InvalidDeviceError);
  EXPECT_EQ(pointer_device(&kMiB), -1);
  void* pinned = host_alloc(64);  // pinned host memory needs no device
  EXPECT_TRUE(is_host_pinned(pinned));
  host_free(pinned);
}

// AXON_LAUNCH_BLOCKING=1
class LaunchBlocking : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!env_is("AXON_LAUNCH_BLOCKING", "1"))
      GTEST_SKIP() << "runs as ctest entry axonrt_launch_blocking";
  }
};

TEST_F(LaunchBlocking, LaunchCompletesBeforeReturning) {
  EXPECT_TRUE(launch_blocking());
  const Stream s = stream_from_pool(0, 0);
  bool ran = false;
  launch(s, "op", [&] { ran = true; });
  EXPECT_TRUE(ran);
  EXPECT_TRUE(stream_query(s));
}

TEST_F(LaunchBlocking, ErrorIsThrownByTheLaunch) {
  const Stream s{0, 0};
  try {
    launch(s, "bad_op", [] { throw std::runtime_error("at once"); });
    FAIL() << "expected AsyncError";
  } catch (const AsyncError& e) {
    EXPECT_EQ(std::string(e.what()),
              "axon: asynchronous error in 'bad_op' on axon:0 stream 0: at once");
  }
  EXPECT_NO_THROW(stream_synchronize(s));
}

TEST_F(LaunchBlocking, DeviceToPinnedCopyCompletesBeforeReturning) {
  auto* pinned = static_cast<char*>(host_alloc(64));
  auto* d = static_cast<char*>(malloc(1, 64));
  std::memset(d, 7, 64);
  memcpy(pinned, d, 64, stream_from_pool(1, 0));
  EXPECT_EQ(pinned[63], 7);
  host_free(pinned);
  free(d);
}

// AXON_NUM_DEVICES=2 AXON_DEVICE_MEMORY=48MiB AXON_HOST_MEMORY=64MiB: each
// device has room for 40 MiB, the host for only one of them.
class HostLimit : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!env_is("AXON_NUM_DEVICES", "2") || !env_is("AXON_DEVICE_MEMORY", "48MiB") ||
        !env_is("AXON_HOST_MEMORY", "64MiB"))
      GTEST_SKIP() << "runs as ctest entry axonrt_host_limit";
  }
};

TEST_F(HostLimit, DevicesTogetherNeverExceedTheHost) {
  EXPECT_EQ(host_memory_info().total, 64 * kMiB);
  void* a = malloc(0, 40 * kMiB);
  EXPECT_EQ(host_memory_info().free, 24 * kMiB);
  try {
    malloc(1, 40 * kMiB);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_TRUE(e.host);
    EXPECT_EQ(e.device, 1);
    EXPECT_EQ(e.used, 0u);  // nothing charged to the device
    EXPECT_EQ(std::string(e.what()),
              "axon:1 out of memory: the host ran out of memory: tried to allocate 40.00 MiB; "
              "the devices of this process use 40.00 MiB of the 64.00 MiB of host memory they "
              "may use together (AXON_HOST_MEMORY; default the host's physical memory)");
  }
  EXPECT_EQ(mem_get_info(1).free, 48 * kMiB);
  try {
    malloc(0, 9 * kMiB);  // the device's own capacity: not a host failure
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_FALSE(e.host);
  }
  free(a);
  EXPECT_EQ(host_memory_info().free, 64 * kMiB);
  void* b = malloc(1, 40 * kMiB);
  free(b);
}

}  // namespace
}  // namespace axon::rt
