#include <gtest/gtest.h>

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
  EXPECT_NE(c.warnings[1].find("AXON_DEVICE_MEMORY='lots'"), std::string::npos);
  EXPECT_NE(c.warnings[2].find("AXON_LOGICAL_CORE_CONFIG='0'"), std::string::npos);
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

}  // namespace
}  // namespace axon::rt
