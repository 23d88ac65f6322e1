#include "bytes.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>

namespace axon::rt {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::optional<uint64_t> multiplier(std::string_view unit) {
  std::string u;
  for (char c : unit) u += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (u.empty() || u == "b") return 1;
  static constexpr const char* kPrefixes = "kmgt";
  for (int i = 0; kPrefixes[i]; ++i) {
    const std::string p(1, kPrefixes[i]);
    const uint64_t binary = uint64_t{1} << (10 * (i + 1));
    uint64_t si = 1;
    for (int k = 0; k <= i; ++k) si *= 1000;
    if (u == p || u == p + "ib") return binary;
    if (u == p + "b") return si;
  }
  return std::nullopt;
}

constexpr uint64_t kMaxBytes = uint64_t{1} << 63;

}  // namespace

std::optional<size_t> parse_bytes(std::string_view text) {
  text = trim(text);
  size_t digits = 0;
  while (digits < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.'))
    ++digits;
  const std::string_view number = text.substr(0, digits);
  const auto mult = multiplier(trim(text.substr(digits)));
  if (number.empty() || !mult) return std::nullopt;

  // Integers stay exact; only fractions ("1.5GiB") go through floating point.
  if (number.find('.') == std::string_view::npos) {
    uint64_t n = 0;
    auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), n);
    if (ec != std::errc() || end != number.data() + number.size()) return std::nullopt;
    if (n > kMaxBytes / *mult) return std::nullopt;
    return static_cast<size_t>(n * *mult);
  }
  double x = 0;
  auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), x);
  if (ec != std::errc() || end != number.data() + number.size()) return std::nullopt;
  const long double bytes = static_cast<long double>(x) * *mult;
  if (!std::isfinite(bytes) || bytes >= static_cast<long double>(kMaxBytes)) return std::nullopt;
  return static_cast<size_t>(bytes);
}

std::string format_bytes(size_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " bytes";
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit + 1 < static_cast<int>(std::size(kUnits))) {
    value /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", value, kUnits[unit]);
  return buf;
}

}  // namespace axon::rt
