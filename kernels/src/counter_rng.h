// Counter-based random bits shared by the kernels that draw them (dropout.h,
// attention's dropout): number n of the SplitMix64 stream seeded with `seed`,
// computable for any n independently, on scalars and on vectors of counters.
#pragma once

#include <cmath>
#include <cstdint>

#include "simd.h"

namespace axon::kernels {

constexpr uint64_t kSplitMixGamma = 0x9e3779b97f4a7c15ull;

// SplitMix64's finaliser; U is uint64_t or a vector of them.
template <class U>
AXON_INLINE U splitmix64_mix(U z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

AXON_INLINE uint64_t splitmix64(uint64_t seed, uint64_t n) {
  return splitmix64_mix(seed + (n + 1) * kSplitMixGamma);
}

// Dropout with probability p keeps a number z iff (z >> 40) >= this (24 bits).
inline uint64_t dropout_threshold(double p) {
  return uint64_t(std::llround(std::min(std::max(p, 0.0), 1.0) * 16777216.0));
}

// A Bernoulli draw with probability p is 1 iff (z >> 32) < this (32 bits, the
// resolution of CUDA's curand_uniform; 2^32 when p rounds to 1).
inline uint64_t bernoulli_threshold(double p) {
  return uint64_t(std::llround(std::min(std::max(p, 0.0), 1.0) * 4294967296.0));
}

// The factor kept values are scaled by: 1 / (1 - p), 0 when everything drops.
inline float dropout_scale(double p) { return p < 1 ? float(1.0 / (1.0 - p)) : 0.0f; }

}  // namespace axon::kernels
