#include "config.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>

#include "axon/env.h"
#include "bytes.h"

namespace axon::rt {
namespace {

// Limits that keep memory * cores_per_device far from overflow.
constexpr int kMaxCores = 1024;
constexpr size_t kMaxCoreMemory = size_t{1} << 50;  // 1 PiB
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kDefaultCoreMemory = size_t{8} << 30;

// A cgroup limit file ("max" or bytes); 0 when absent or unlimited.
size_t read_limit(const char* path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s == "max") return 0;
  auto v = parse_bytes(s);
  return v ? *v : 0;
}

}  // namespace

std::optional<std::string_view> value_of(const char* raw) {
  if (raw == nullptr) return std::nullopt;
  std::string_view s(raw);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  if (s.empty()) return std::nullopt;
  return s;
}

std::optional<long long> parse_int(std::string_view s, long long lo, long long hi) {
  long long v = 0;
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

std::string ignored(const char* var, std::string_view value, const std::string& expected,
                    const std::string& fallback) {
  return std::string("axon: ignoring ") + var + "='" + std::string(value) + "' (expected " +
         expected + "); using " + fallback;
}

size_t detect_host_memory() noexcept {
  try {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page = sysconf(_SC_PAGE_SIZE);
    size_t total = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page)
                                         : 0;
    for (const char* path : {"/sys/fs/cgroup/memory.max",
                             "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
      const size_t limit = read_limit(path);
      if (limit > 0 && (total == 0 || limit < total)) total = limit;
    }
    return total;
  } catch (...) {
    return 0;
  }
}

std::vector<int> parse_visible_devices(const char* raw, int defined,
                                       std::vector<std::string>* warnings) {
  std::vector<int> visible;
  if (raw == nullptr) {
    for (int i = 0; i < defined; ++i) visible.push_back(i);
    return visible;
  }
  const std::string_view all = value_of(raw).value_or(std::string_view{});
  std::string_view rest = all;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view token = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    std::string text(token);
    text = std::string(value_of(text.c_str()).value_or(std::string_view{}));
    long long v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    const bool integer = !text.empty() && ec == std::errc() && end == text.data() + text.size();
    if (integer && v < 0) break;  // "-1": no (more) devices, as CUDA
    std::string why;
    if (!integer) why = "'" + text + "' is not a device index";
    else if (v >= defined)
      why = "device " + text + " does not exist (" + std::to_string(defined) +
            " device(s) defined by AXON_NUM_DEVICES / AXON_LOGICAL_CORE_CONFIG)";
    else if (std::find(visible.begin(), visible.end(), static_cast<int>(v)) != visible.end())
      why = "device " + text + " is listed twice";
    if (!why.empty()) {
      if (warnings)
        warnings->push_back("axon: AXON_VISIBLE_DEVICES='" + std::string(all) + "': " + why +
                            "; the list ends there (" + std::to_string(visible.size()) +
                            " device(s) visible)");
      break;
    }
    visible.push_back(static_cast<int>(v));
  }
  return visible;
}

Config parse_config(const char* num_devices, const char* memory, const char* logical,
                    const char* launch_blocking, const char* shareable, const char* host_memory,
                    size_t detected_host_memory, const char* visible_devices) {
  Config c;
  if (auto s = value_of(num_devices)) {
    if (auto v = parse_int(*s, 0, kMaxCores)) c.physical_cores = static_cast<int>(*v);
    else c.warnings.push_back(ignored("AXON_NUM_DEVICES", *s, "an integer in 0..1024",
                                      std::to_string(c.physical_cores)));
  }
  if (auto s = value_of(logical)) {
    if (auto v = parse_int(*s, 1, kMaxCores)) c.cores_per_device = static_cast<int>(*v);
    else c.warnings.push_back(ignored("AXON_LOGICAL_CORE_CONFIG", *s, "an integer >= 1",
                                      std::to_string(c.cores_per_device)));
  }
  // PyTorch cannot index more devices (casting more into its 8-bit index
  // breaks `import torch` or wraps around).
  if (c.physical_cores / c.cores_per_device > kMaxDevices) {
    const int max_cores = std::min(kMaxCores, kMaxDevices * c.cores_per_device +
                                                  c.cores_per_device - 1);
    std::string expected = "an integer in 0.." + std::to_string(max_cores);
    if (c.cores_per_device > 1)
      expected += " with AXON_LOGICAL_CORE_CONFIG=" + std::to_string(c.cores_per_device);
    expected += ": PyTorch indexes at most " + std::to_string(kMaxDevices) + " devices";
    c.physical_cores = Config{}.physical_cores;
    c.warnings.push_back(ignored("AXON_NUM_DEVICES", *value_of(num_devices), expected,
                                 std::to_string(c.physical_cores)));
  }

  c.host_memory = detected_host_memory;
  if (auto s = value_of(host_memory)) {
    auto v = parse_bytes(*s);
    if (v && *v > 0) c.host_memory = *v;
    else c.warnings.push_back(ignored("AXON_HOST_MEMORY", *s,
                                      "a size such as 16GiB, 512MiB or 1073741824",
                                      c.host_memory ? format_bytes(c.host_memory) : "no limit"));
  }
  // Never promise memory the host cannot back: by default the devices share
  // the host's memory.
  size_t default_core = kDefaultCoreMemory;
  if (c.host_memory > 0 && c.physical_cores > 0) {
    default_core = std::min(default_core, c.host_memory / static_cast<size_t>(c.physical_cores) /
                                              kMiB * kMiB);
    default_core = std::max(default_core, kMiB);
  }
  c.core_memory = default_core;
  bool memory_given = false;
  if (auto s = value_of(memory)) {
    auto v = parse_bytes(*s);
    if (v && *v > 0 && *v <= kMaxCoreMemory) {
      c.core_memory = *v;
      memory_given = true;
    } else {
      c.warnings.push_back(ignored("AXON_DEVICE_MEMORY", *s,
                                   "a size such as 8GiB, 512MiB or 1073741824",
                                   format_bytes(c.core_memory)));
    }
  }
  if (auto s = value_of(launch_blocking)) {
    if (auto v = parse_bool(*s)) c.launch_blocking = *v;
    else c.warnings.push_back(ignored("AXON_LAUNCH_BLOCKING", *s, "0 or 1", "0"));
  }
  if (auto s = value_of(shareable)) {
    if (auto v = parse_bool(*s)) c.shareable_memory = *v;
    else c.warnings.push_back(ignored("AXON_SHAREABLE_MEMORY", *s, "0 or 1", "1"));
  }

  c.visible = parse_visible_devices(visible_devices, c.physical_cores / c.cores_per_device,
                                    &c.warnings);
  c.device_count = static_cast<int>(c.visible.size());
  c.device_memory = c.core_memory * static_cast<size_t>(c.cores_per_device);
  // Leftover cores are legal but almost certainly a mistake worth a word.
  if (const int unused = c.physical_cores % c.cores_per_device; unused != 0) {
    c.warnings.push_back("axon: AXON_LOGICAL_CORE_CONFIG=" + std::to_string(c.cores_per_device) +
                         " does not divide AXON_NUM_DEVICES=" +
                         std::to_string(c.physical_cores) + "; " + std::to_string(unused) +
                         " physical core(s) unused, " +
                         std::to_string(c.physical_cores / c.cores_per_device) +
                         " device(s) available");
  }
  const size_t total = c.device_memory * static_cast<size_t>(c.device_count);
  if (memory_given && c.host_memory > 0 && total > c.host_memory) {
    c.warnings.push_back("axon: " + std::to_string(c.device_count) + " device(s) x " +
                         format_bytes(c.device_memory) + " (AXON_DEVICE_MEMORY) is more than the " +
                         format_bytes(c.host_memory) +
                         " of host memory; allocations past the host's memory raise "
                         "torch.OutOfMemoryError");
  }
  return c;
}

namespace {
std::atomic<bool> g_config_read{false};
}  // namespace

bool devices_initialized() noexcept { return g_config_read.load(std::memory_order_acquire); }

const Config& config() noexcept {
  static const Config c = [] {
    Config parsed = parse_config(
        std::getenv("AXON_NUM_DEVICES"), std::getenv("AXON_DEVICE_MEMORY"),
        std::getenv("AXON_LOGICAL_CORE_CONFIG"), std::getenv("AXON_LAUNCH_BLOCKING"),
        std::getenv("AXON_SHAREABLE_MEMORY"), std::getenv("AXON_HOST_MEMORY"),
        detect_host_memory(), std::getenv("AXON_VISIBLE_DEVICES"));
    for (const auto& w : parsed.warnings) std::fprintf(stderr, "%s\n", w.c_str());
    return parsed;
  }();
  g_config_read.store(true, std::memory_order_release);
  return c;
}

// ---------------------------------------------------------------- env.h

namespace {

// Prints `line` unless a warning for `name` was printed already.
void warn_once(const char* name, const std::string& line) noexcept {
  try {
    static std::mutex mu;
    static auto* warned = new std::set<std::string>;
    std::lock_guard lk(mu);
    if (warned->insert(name).second) std::fprintf(stderr, "%s\n", line.c_str());
  } catch (...) {
  }
}

}  // namespace

bool env_bool(const char* name, bool fallback) noexcept {
  auto s = value_of(std::getenv(name));
  if (!s) return fallback;
  if (auto v = parse_bool(*s)) return *v;
  warn_once(name, ignored(name, *s, "0 or 1", fallback ? "1" : "0"));
  return fallback;
}

size_t env_bytes(const char* name, size_t fallback, size_t min, size_t max) noexcept {
  auto s = value_of(std::getenv(name));
  if (!s) return fallback;
  auto v = parse_bytes(*s);
  if (v && *v >= min && *v <= max) return *v;
  try {
    std::string expected = "a size such as 1048576 or 4MiB";
    if (max < SIZE_MAX) expected += ", in " + std::to_string(min) + ".." + std::to_string(max);
    else if (min > 0) expected += ", at least " + std::to_string(min);
    warn_once(name, ignored(name, *s, expected, std::to_string(fallback)));
  } catch (...) {
  }
  return fallback;
}

int64_t env_int(const char* name, int64_t fallback, int64_t min, int64_t max) noexcept {
  auto s = value_of(std::getenv(name));
  if (!s) return fallback;
  if (auto v = parse_int(*s, min, max)) return *v;
  try {
    warn_once(name, ignored(name, *s,
                            "an integer in " + std::to_string(min) + ".." + std::to_string(max),
                            std::to_string(fallback)));
  } catch (...) {
  }
  return fallback;
}

}  // namespace axon::rt
