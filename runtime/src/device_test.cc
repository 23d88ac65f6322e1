#include <algorithm>
#include <thread>

#include <gtest/gtest.h>

#include "axon/runtime.h"
#include "config.h"
#include "test_util.h"

namespace axon::rt {
namespace {

TEST(Device, DefaultCountAndProperties) {
  AXON_REQUIRE_DEFAULT_ENV();
  EXPECT_EQ(device_count(), 8);
  EXPECT_FALSE(launch_blocking());
  const DeviceProperties p = get_device_properties(7);
  EXPECT_EQ(p.name, "Axon simulated device");
  // min(8GiB, host memory / 8 devices), whole MiB (config.h)
  const size_t host = detect_host_memory();
  const size_t expected = host == 0 ? size_t{8} << 30
                                    : std::min(size_t{8} << 30, host / 8 >> 20 << 20);
  EXPECT_EQ(p.total_memory, expected);
  if (host > 0) {
    EXPECT_LE(p.total_memory * 8, host);
  }
  EXPECT_EQ(p.compute_units, 1);
  EXPECT_EQ(p.physical_cores, 1);
  EXPECT_TRUE(p.host_accessible);
}

TEST(Device, InvalidIndexMessage) {
  AXON_REQUIRE_DEFAULT_ENV();
  for (int bad : {8, -1}) {
    try {
      check_device(bad);
      FAIL() << "no exception for " << bad;
    } catch (const InvalidDeviceError& e) {
      EXPECT_EQ(std::string(e.what()), "Invalid device index: axon:" + std::to_string(bad) +
                                           "; the device count is 8 (valid indices are 0..7)");
    }
  }
  EXPECT_NO_THROW(check_device(0));
  EXPECT_THROW(get_device_properties(8), InvalidDeviceError);
  EXPECT_THROW(malloc(8, 16), InvalidDeviceError);
  EXPECT_THROW(stream_from_pool(-1, 0), InvalidDeviceError);
  EXPECT_THROW(event_create(99), InvalidDeviceError);
  EXPECT_THROW(mem_get_info(8), InvalidDeviceError);
  EXPECT_THROW(device_synchronize(8), InvalidDeviceError);
}

TEST(Device, InvalidDeviceErrorIsAnError) {
  EXPECT_THROW(check_device(-5), Error);
}

TEST(Device, CurrentDeviceIsPerThread) {
  AXON_REQUIRE_DEFAULT_ENV();
  EXPECT_EQ(current_device(), 0);
  set_device(3);
  EXPECT_EQ(current_device(), 3);
  int other = -1;
  std::thread([&] { other = current_device(); }).join();
  EXPECT_EQ(other, 0);
  EXPECT_THROW(set_device(8), InvalidDeviceError);
  EXPECT_EQ(current_device(), 3);
  set_device(0);
}

TEST(Device, SynchronizeIdleDevice) {
  AXON_REQUIRE_DEFAULT_ENV();
  EXPECT_NO_THROW(device_synchronize(5));
}

}  // namespace
}  // namespace axon::rt
