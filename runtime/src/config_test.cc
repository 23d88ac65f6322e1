#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "axon/env.h"
#include "bytes.h"
#include "config.h"

namespace axon::rt {
namespace {

constexpr size_t kKiB = size_t{1} << 10, kMiB = size_t{1} << 20, kGiB = size_t{1} << 30;

TEST(ParseBytes, AcceptsSuffixesCaseInsensitively) {
  EXPECT_EQ(parse_bytes("1024"), 1024u);
  EXPECT_EQ(parse_bytes("8GiB"), 8 * kGiB);
  EXPECT_EQ(parse_bytes("512MiB"), 512 * kMiB);
  EXPECT_EQ(parse_bytes("512mib"), 512 * kMiB);
  EXPECT_EQ(parse_bytes("4k"), 4 * kKiB);
  EXPECT_EQ(parse_bytes("4KiB"), 4 * kKiB);
  EXPECT_EQ(parse_bytes("2G"), 2 * kGiB);
  EXPECT_EQ(parse_bytes("3M"), 3 * kMiB);
  EXPECT_EQ(parse_bytes(" 2 GiB "), 2 * kGiB);
  EXPECT_EQ(parse_bytes("1.5GiB"), kGiB + kGiB / 2);
  EXPECT_EQ(parse_bytes("100B"), 100u);
}

TEST(ParseBytes, SiSuffixesArePowersOf1000) {
  EXPECT_EQ(parse_bytes("1GB"), 1000000000u);
  EXPECT_EQ(parse_bytes("2mb"), 2000000u);
  EXPECT_EQ(parse_bytes("3KB"), 3000u);
}

TEST(ParseBytes, RejectsGarbage) {
  for (const char* bad : {"", "GiB", "abc", "-1", "-1GiB", "1XB", "1 2", "1.2.3", "99999999999999GiB",
                          "18446744073709551616", "inf", "0x10"}) {
    EXPECT_EQ(parse_bytes(bad), std::nullopt) << bad;
  }
}

TEST(FormatBytes, HumanReadable) {
  EXPECT_EQ(format_bytes(0), "0 bytes");
  EXPECT_EQ(format_bytes(64), "64 bytes");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(20 * kMiB), "20.00 MiB");
  EXPECT_EQ(format_bytes(2 * kGiB), "2.00 GiB");
  EXPECT_EQ(format_bytes(7 * kGiB + kGiB / 2), "7.50 GiB");
}

TEST(ParseConfig, Defaults) {
  const Config c = parse_config(nullptr, nullptr, nullptr, nullptr);
  EXPECT_EQ(c.physical_cores, 8);
  EXPECT_EQ(c.device_count, 8);
  EXPECT_EQ(c.core_memory, 8 * kGiB);
  EXPECT_EQ(c.device_memory, 8 * kGiB);
  EXPECT_EQ(c.cores_per_device, 1);
  EXPECT_FALSE(c.launch_blocking);
  EXPECT_TRUE(c.warnings.empty());
}

TEST(ParseConfig, BlankValuesMeanUnset) {
  const Config c = parse_config("", "  ", "", "");
  EXPECT_EQ(c.device_count, 8);
  EXPECT_TRUE(c.warnings.empty());
}

TEST(ParseConfig, LogicalCoresGroupDevices) {
  const Config c = parse_config("4", "64MiB", "2");
  EXPECT_EQ(c.device_count, 2);
  EXPECT_EQ(c.device_memory, 128 * kMiB);
  EXPECT_EQ(c.cores_per_device, 2);
  EXPECT_TRUE(c.warnings.empty());
}

TEST(ParseConfig, NonDividingGroupingFloorsAndWarns) {
  const Config c = parse_config("8", nullptr, "3");
  EXPECT_EQ(c.device_count, 2);
  EXPECT_EQ(c.device_memory, 24 * kGiB);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("2 physical core(s) unused"), std::string::npos) << c.warnings[0];
}

TEST(ParseConfig, GroupLargerThanCoresLeavesNoDevice) {
  const Config c = parse_config("8", nullptr, "16");
  EXPECT_EQ(c.device_count, 0);
  EXPECT_EQ(c.warnings.size(), 1u);
}

TEST(ParseConfig, ZeroDevicesIsValid) {
  const Config c = parse_config("0", nullptr, nullptr);
  EXPECT_EQ(c.device_count, 0);
  EXPECT_TRUE(c.warnings.empty());
}

TEST(ParseConfig, BadValuesFallBackWithOneWarningEach) {
  const Config c = parse_config("many", "lots", "0", "maybe");
  EXPECT_EQ(c.device_count, 8);
  EXPECT_EQ(c.device_memory, 8 * kGiB);
  EXPECT_EQ(c.cores_per_device, 1);
  EXPECT_FALSE(c.launch_blocking);
  ASSERT_EQ(c.warnings.size(), 4u);
  EXPECT_EQ(c.warnings[0],
            "axon: ignoring AXON_NUM_DEVICES='many' (expected an integer in 0..1024); using 8");
  EXPECT_NE(c.warnings[1].find("AXON_LOGICAL_CORE_CONFIG='0'"), std::string::npos);
  EXPECT_NE(c.warnings[2].find("AXON_DEVICE_MEMORY='lots'"), std::string::npos);
  EXPECT_NE(c.warnings[3].find("AXON_LAUNCH_BLOCKING='maybe'"), std::string::npos);
}

TEST(ParseConfig, RejectsNegativeAndZeroMemory) {
  EXPECT_EQ(parse_config("-2", "0", "-1").warnings.size(), 3u);
}

TEST(ParseConfig, LaunchBlocking) {
  EXPECT_TRUE(parse_config(nullptr, nullptr, nullptr, "1").launch_blocking);
  EXPECT_TRUE(parse_config(nullptr, nullptr, nullptr, "TRUE").launch_blocking);
  EXPECT_FALSE(parse_config(nullptr, nullptr, nullptr, "0").launch_blocking);
}

TEST(ParseConfig, DeviceCountIsCappedAtWhatPyTorchIndexes) {
  for (const char* n : {"128", "255", "256", "300", "1024"}) {
    const Config c = parse_config(n, nullptr, nullptr);
    EXPECT_EQ(c.device_count, 8) << n;
    ASSERT_EQ(c.warnings.size(), 1u) << n;
    EXPECT_EQ(c.warnings[0], std::string("axon: ignoring AXON_NUM_DEVICES='") + n +
                                 "' (expected an integer in 0..127: PyTorch indexes at most 127 "
                                 "devices); using 8");
  }
  EXPECT_EQ(parse_config("127", nullptr, nullptr).device_count, 127);
  EXPECT_TRUE(parse_config("127", nullptr, nullptr).warnings.empty());
  // Grouped cores: what counts is the number of logical devices.
  const Config g = parse_config("254", nullptr, "2");
  EXPECT_EQ(g.device_count, 127);
  EXPECT_TRUE(g.warnings.empty());
  const Config bad = parse_config("256", nullptr, "2");
  EXPECT_EQ(bad.device_count, 4);
  ASSERT_EQ(bad.warnings.size(), 1u);
  EXPECT_NE(bad.warnings[0].find("0..255 with AXON_LOGICAL_CORE_CONFIG=2"), std::string::npos)
      << bad.warnings[0];
}

TEST(ParseVisibleDevices, UnsetIsEveryDeviceInOrder) {
  std::vector<std::string> w;
  EXPECT_EQ(parse_visible_devices(nullptr, 3, &w), (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(w.empty());
}

TEST(ParseVisibleDevices, ListedDevicesInTheGivenOrder) {
  std::vector<std::string> w;
  EXPECT_EQ(parse_visible_devices("2,0", 4, &w), (std::vector<int>{2, 0}));
  EXPECT_EQ(parse_visible_devices(" 3 , 1 ", 4, &w), (std::vector<int>{3, 1}));
  EXPECT_TRUE(w.empty());
}

TEST(ParseVisibleDevices, BlankOrNegativeHidesDevicesSilently) {
  std::vector<std::string> w;
  EXPECT_TRUE(parse_visible_devices("", 4, &w).empty());
  EXPECT_TRUE(parse_visible_devices("  ", 4, &w).empty());
  EXPECT_TRUE(parse_visible_devices("-1", 4, &w).empty());
  // As CUDA: the list ends at a negative entry.
  EXPECT_EQ(parse_visible_devices("1,-1,2", 4, &w), (std::vector<int>{1}));
  EXPECT_TRUE(w.empty());
}

TEST(ParseVisibleDevices, AnInvalidEntryEndsTheListWithAWarning) {
  struct Case {
    const char* value;
    std::vector<int> visible;
    const char* why;
  };
  for (const Case& c : {Case{"1,7,2", {1}, "device 7 does not exist (4 device(s) defined"},
                        Case{"0,x,2", {0}, "'x' is not a device index"},
                        Case{"0,1,0", {0, 1}, "device 0 is listed twice"},
                        Case{"2,,3", {2}, "'' is not a device index"},
                        Case{"1.5", {}, "'1.5' is not a device index"}}) {
    std::vector<std::string> w;
    EXPECT_EQ(parse_visible_devices(c.value, 4, &w), c.visible) << c.value;
    ASSERT_EQ(w.size(), 1u) << c.value;
    EXPECT_NE(w[0].find(std::string("AXON_VISIBLE_DEVICES='") + c.value + "': " + c.why),
              std::string::npos)
        << w[0];
    EXPECT_NE(w[0].find("(" + std::to_string(c.visible.size()) + " device(s) visible)"),
              std::string::npos)
        << w[0];
  }
}

TEST(ParseConfig, VisibleDevicesSetTheCountOverLogicalDevices) {
  // 8 cores in logical devices of 2: devices 0..3; "3,1" shows two of them.
  Config c = parse_config("8", "1GiB", "2", nullptr, nullptr, nullptr, 0, "3,1");
  EXPECT_EQ(c.device_count, 2);
  EXPECT_EQ(c.visible, (std::vector<int>{3, 1}));
  EXPECT_EQ(c.device_memory, 2 * kGiB);
  EXPECT_TRUE(c.warnings.empty());
  Config hidden = parse_config("8", nullptr, nullptr, nullptr, nullptr, nullptr, 0, "");
  EXPECT_EQ(hidden.device_count, 0);
  Config past = parse_config("8", nullptr, "2", nullptr, nullptr, nullptr, 0, "4");
  EXPECT_EQ(past.device_count, 0);
  ASSERT_EQ(past.warnings.size(), 1u);
  EXPECT_NE(past.warnings[0].find("device 4 does not exist (4 device(s) defined"),
            std::string::npos);
}

TEST(ParseConfig, BooleansWarnLikeTheOthers) {
  EXPECT_TRUE(parse_config(nullptr, nullptr, nullptr, "yes").launch_blocking);
  EXPECT_FALSE(parse_config(nullptr, nullptr, nullptr, nullptr, "off").shareable_memory);
  EXPECT_TRUE(parse_config(nullptr, nullptr, nullptr, nullptr, "1").shareable_memory);
  const Config c = parse_config(nullptr, nullptr, nullptr, "sometimes", "maybe");
  EXPECT_FALSE(c.launch_blocking);
  EXPECT_TRUE(c.shareable_memory);
  ASSERT_EQ(c.warnings.size(), 2u);
  EXPECT_EQ(c.warnings[0],
            "axon: ignoring AXON_LAUNCH_BLOCKING='sometimes' (expected 0 or 1); using 0");
  EXPECT_EQ(c.warnings[1],
            "axon: ignoring AXON_SHAREABLE_MEMORY='maybe' (expected 0 or 1); using 1");
}

TEST(ParseConfig, DefaultMemoryNeverExceedsTheHost) {
  // 24 GiB host, 8 devices: 3 GiB each, not 8 GiB.
  const Config c = parse_config(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 24 * kGiB);
  EXPECT_EQ(c.core_memory, 3 * kGiB);
  EXPECT_EQ(c.host_memory, 24 * kGiB);
  EXPECT_TRUE(c.warnings.empty());
  // Large hosts keep 8 GiB; odd sizes round down to a MiB.
  EXPECT_EQ(parse_config(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 512 * kGiB)
                .core_memory, 8 * kGiB);
  EXPECT_EQ(parse_config("3", nullptr, nullptr, nullptr, nullptr, nullptr, kGiB + 5)
                .core_memory, 341 * kMiB);
  // Grouped: the devices together still fit.
  const Config g = parse_config("8", nullptr, "2", nullptr, nullptr, nullptr, 16 * kGiB);
  EXPECT_EQ(g.device_memory * g.device_count, 16 * kGiB);
  // AXON_HOST_MEMORY overrides what was detected.
  const Config h = parse_config("2", nullptr, nullptr, nullptr, nullptr, "1GiB", 24 * kGiB);
  EXPECT_EQ(h.host_memory, kGiB);
  EXPECT_EQ(h.device_memory, 512 * kMiB);
  const Config bad = parse_config("2", nullptr, nullptr, nullptr, nullptr, "lots", 24 * kGiB);
  EXPECT_EQ(bad.host_memory, 24 * kGiB);
  ASSERT_EQ(bad.warnings.size(), 1u);
  EXPECT_NE(bad.warnings[0].find("ignoring AXON_HOST_MEMORY='lots'"), std::string::npos);
}

TEST(ParseConfig, ExplicitMemoryPastTheHostWarns) {
  const Config c = parse_config(nullptr, "8GiB", nullptr, nullptr, nullptr, nullptr, 24 * kGiB);
  EXPECT_EQ(c.device_memory, 8 * kGiB);  // as asked; allocations check the host
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_EQ(c.warnings[0],
            "axon: 8 device(s) x 8.00 GiB (AXON_DEVICE_MEMORY) is more than the 24.00 GiB of "
            "host memory; allocations past the host's memory raise torch.OutOfMemoryError");
}

TEST(DetectHostMemory, IsPositiveOnLinux) {
  EXPECT_GT(detect_host_memory(), size_t{0});
}

TEST(Env, OneParserPerKind) {
  ::setenv("AXON_TEST_ENV_BOOL", "yes", 1);
  EXPECT_TRUE(env_bool("AXON_TEST_ENV_BOOL", false));
  ::setenv("AXON_TEST_ENV_BOOL", "maybe", 1);
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(env_bool("AXON_TEST_ENV_BOOL", false));
  EXPECT_FALSE(env_bool("AXON_TEST_ENV_BOOL", false));  // warned once
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "axon: ignoring AXON_TEST_ENV_BOOL='maybe' (expected 0 or 1); using 0\n");
  ::setenv("AXON_TEST_ENV_BYTES", "4MiB", 1);
  EXPECT_EQ(env_bytes("AXON_TEST_ENV_BYTES", 7), 4 * kMiB);
  ::setenv("AXON_TEST_ENV_BYTES", "abc", 1);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(env_bytes("AXON_TEST_ENV_BYTES", 4194304, 1), 4194304u);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "axon: ignoring AXON_TEST_ENV_BYTES='abc' (expected a size such as 1048576 or 4MiB, "
            "at least 1); using 4194304\n");
  ::setenv("AXON_TEST_ENV_INT", "12", 1);
  EXPECT_EQ(env_int("AXON_TEST_ENV_INT", 3, 0, 100), 12);
  ::setenv("AXON_TEST_ENV_INT", "1000", 1);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(env_int("AXON_TEST_ENV_INT", 3, 0, 100), 3);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "axon: ignoring AXON_TEST_ENV_INT='1000' (expected an integer in 0..100); using 3\n");
  ::unsetenv("AXON_TEST_ENV_INT");
  EXPECT_EQ(env_int("AXON_TEST_ENV_INT", 3, 0, 100), 3);
}

}  // namespace
}  // namespace axon::rt
