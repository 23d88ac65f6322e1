// Byte counts as people write them: "8GiB" in, "2.00 GiB" out.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace axon::rt {

// Parses "1024", "512MiB", "1.5 GiB", "4k", "1GB" (case-insensitive).
// K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024; KB/MB/GB/TB are powers of
// 1000 (SI), so "1GB" is 10^9 bytes.  nullopt for garbage, negatives and
// values that do not fit in 63 bits.
std::optional<size_t> parse_bytes(std::string_view text);

// "64 bytes", "1.50 KiB", "2.00 GiB": the style of PyTorch's OOM messages.
std::string format_bytes(size_t bytes);

}  // namespace axon::rt
