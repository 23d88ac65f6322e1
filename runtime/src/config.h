// The process-wide configuration, read once from the environment.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace axon::rt {

struct Config {
  // As given (or defaulted).
  int physical_cores = 8;                  // AXON_NUM_DEVICES
  size_t core_memory = size_t{8} << 30;    // AXON_DEVICE_MEMORY
  int cores_per_device = 1;                // AXON_LOGICAL_CORE_CONFIG
  bool launch_blocking = false;            // AXON_LAUNCH_BLOCKING
  // Derived: the logical devices the runtime exposes.
  int device_count = 8;
  size_t device_memory = size_t{8} << 30;
  // One line per ignored or surprising value, printed once to stderr.
  std::vector<std::string> warnings;
};

// Pure, so tests can cover it: a null or blank value means "unset".  Bad
// values fall back to the default and add a warning; nothing throws.
Config parse_config(const char* num_devices, const char* memory,
                    const char* logical, const char* launch_blocking = nullptr);

// The configuration of this process (parsed on first call, thread-safe).
const Config& config() noexcept;

}  // namespace axon::rt
