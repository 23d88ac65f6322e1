// The process-wide configuration, read once from the environment.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace axon::rt {

// PyTorch's device index is an int8_t (c10::DeviceIndex), -1 meaning "the
// current device": at most 127 devices can be indexed.
constexpr int kMaxDevices = 127;

struct Config {
  // As given (or defaulted).
  int physical_cores = 8;                  // AXON_NUM_DEVICES
  size_t core_memory = size_t{8} << 30;    // AXON_DEVICE_MEMORY
  int cores_per_device = 1;                // AXON_LOGICAL_CORE_CONFIG
  bool launch_blocking = false;            // AXON_LAUNCH_BLOCKING
  bool shareable_memory = true;            // AXON_SHAREABLE_MEMORY
  // Host memory device memory may use in total (AXON_HOST_MEMORY, else the
  // host's physical memory or its cgroup limit, whichever is smaller); 0 when
  // unknown (no limit).  The default AXON_DEVICE_MEMORY is
  // min(8GiB, host_memory / AXON_NUM_DEVICES), rounded down to a MiB.
  size_t host_memory = 0;
  // AXON_VISIBLE_DEVICES (as CUDA_VISIBLE_DEVICES): the index, among the
  // devices AXON_NUM_DEVICES / AXON_LOGICAL_CORE_CONFIG define, of each
  // device the process sees, in the order given; unset: all of them.
  std::vector<int> visible;
  // Derived: the logical devices the runtime exposes (visible.size()).
  int device_count = 8;
  size_t device_memory = size_t{8} << 30;
  // One line per ignored or surprising value, printed once to stderr.
  std::vector<std::string> warnings;
};

// Pure, so tests can cover it: a null or blank value means "unset".  Bad
// values fall back to the default and add a warning; nothing throws.
// detected_host_memory: what the host has (0: unknown, no limit).
Config parse_config(const char* num_devices, const char* memory, const char* logical,
                    const char* launch_blocking = nullptr, const char* shareable = nullptr,
                    const char* host_memory = nullptr, size_t detected_host_memory = 0,
                    const char* visible_devices = nullptr);

// AXON_VISIBLE_DEVICES, as CUDA reads CUDA_VISIBLE_DEVICES: comma-separated
// indices of the `defined` devices; a blank value hides every device; the
// list ends at the first entry that is not an index below `defined` or that
// repeats one (a negative one ends it silently, the usual "-1" meaning "no
// device"; any other adds a warning).  null: every device, in order.
std::vector<int> parse_visible_devices(const char* raw, int defined,
                                       std::vector<std::string>* warnings);

// The configuration of this process (parsed on first call, thread-safe).
const Config& config() noexcept;

// The host's physical memory, or its cgroup's memory limit if smaller; 0 if
// unknown.
size_t detect_host_memory() noexcept;

// The parsers behind env.h, pure for tests.  value_of: trimmed, nullopt when
// null or blank.
std::optional<std::string_view> value_of(const char* raw);
std::optional<bool> parse_bool(std::string_view s);
std::optional<long long> parse_int(std::string_view s, long long lo, long long hi);
std::string ignored(const char* var, std::string_view value, const std::string& expected,
                    const std::string& fallback);

}  // namespace axon::rt
