#include "config.h"

#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "bytes.h"

namespace axon::rt {
namespace {

// Limits that keep memory * cores_per_device far from overflow.
constexpr int kMaxCores = 1024;
constexpr size_t kMaxCoreMemory = size_t{1} << 50;  // 1 PiB

std::optional<std::string_view> value_of(const char* raw) {
  if (raw == nullptr) return std::nullopt;
  std::string_view s(raw);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  if (s.empty()) return std::nullopt;
  return s;
}

std::optional<int> parse_int(std::string_view s, int lo, int hi) {
  int v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi) return std::nullopt;
  return v;
}

std::optional<bool> parse_bool(std::string_view s) {
  std::string l;
  for (char c : s) l += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (l == "1" || l == "true" || l == "yes" || l == "on") return true;
  if (l == "0" || l == "false" || l == "no" || l == "off") return false;
  return std::nullopt;
}

std::string ignored(const char* var, std::string_view value, const char* expected,
                    const std::string& fallback) {
  return std::string("axon: ignoring ") + var + "='" + std::string(value) + "' (expected " +
         expected + "); using " + fallback;
}

}  // namespace

Config parse_config(const char* num_devices, const char* memory, const char* logical,
                    const char* launch_blocking) {
  Config c;
  if (auto s = value_of(num_devices)) {
    if (auto v = parse_int(*s, 0, kMaxCores)) c.physical_cores = *v;
    else c.warnings.push_back(ignored("AXON_NUM_DEVICES", *s, "an integer in 0..1024",
                                      std::to_string(c.physical_cores)));
  }
  if (auto s = value_of(memory)) {
    auto v = parse_bytes(*s);
    if (v && *v > 0 && *v <= kMaxCoreMemory) c.core_memory = *v;
    else c.warnings.push_back(ignored("AXON_DEVICE_MEMORY", *s,
                                      "a size such as 8GiB, 512MiB or 1073741824",
                                      format_bytes(c.core_memory)));
  }
  if (auto s = value_of(logical)) {
    if (auto v = parse_int(*s, 1, kMaxCores)) c.cores_per_device = *v;
    else c.warnings.push_back(ignored("AXON_LOGICAL_CORE_CONFIG", *s, "an integer >= 1",
                                      std::to_string(c.cores_per_device)));
  }
  if (auto s = value_of(launch_blocking)) {
    if (auto v = parse_bool(*s)) c.launch_blocking = *v;
    else c.warnings.push_back(ignored("AXON_LAUNCH_BLOCKING", *s, "0 or 1", "0"));
  }

  c.device_count = c.physical_cores / c.cores_per_device;
  c.device_memory = c.core_memory * static_cast<size_t>(c.cores_per_device);
  // Leftover cores are legal but almost certainly a mistake worth a word.
  if (const int unused = c.physical_cores % c.cores_per_device; unused != 0) {
    c.warnings.push_back("axon: AXON_LOGICAL_CORE_CONFIG=" + std::to_string(c.cores_per_device) +
                         " does not divide AXON_NUM_DEVICES=" +
                         std::to_string(c.physical_cores) + "; " + std::to_string(unused) +
                         " physical core(s) unused, " + std::to_string(c.device_count) +
                         " device(s) available");
  }
  return c;
}

const Config& config() noexcept {
  static const Config c = [] {
    Config parsed = parse_config(std::getenv("AXON_NUM_DEVICES"), std::getenv("AXON_DEVICE_MEMORY"),
                                 std::getenv("AXON_LOGICAL_CORE_CONFIG"),
                                 std::getenv("AXON_LAUNCH_BLOCKING"));
    for (const auto& w : parsed.warnings) std::fprintf(stderr, "%s\n", w.c_str());
    return parsed;
  }();
  return c;
}

}  // namespace axon::rt
