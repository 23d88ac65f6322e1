// Environment variables: one parser per kind, shared by every layer that
// reads an AXON_* variable (runtime/, comm/, csrc/; Python through
// torch_axon._C._env_bool/_env_bytes).
//
// Unset or blank means `fallback`.  A value that does not parse, or is out of
// range, prints one line to stderr, once per variable and process:
//   axon: ignoring AXON_X='value' (expected ...); using <fallback>
// and yields `fallback`.  None of them throws.
#pragma once

#include <cstddef>
#include <cstdint>

namespace axon::rt {

// 1/true/yes/on, 0/false/no/off (case-insensitive).
bool env_bool(const char* name, bool fallback) noexcept;

// A byte count: "1048576", "4MiB", "1.5GiB", "4MB" (see parse_bytes), in
// [min, max].
size_t env_bytes(const char* name, size_t fallback, size_t min = 0,
                 size_t max = SIZE_MAX) noexcept;

// A decimal integer in [min, max].
int64_t env_int(const char* name, int64_t fallback, int64_t min, int64_t max) noexcept;

}  // namespace axon::rt
