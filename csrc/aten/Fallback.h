// Tier 3: every op without an axon kernel runs its CPU kernel on host views of
// the axon tensors, after the device's current stream has drained.  Counted
// per op for torch.axon.fallback_stats().
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace at::axon {

std::map<std::string, int64_t> fallbackStats();
void resetFallbackStats();

}  // namespace at::axon
