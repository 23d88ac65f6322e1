#include "axon/kernels/dropout.h"

#include <cstring>

#include "axon/kernels/parallel.h"
#include "counter_rng.h"
#include "simd.h"
#include "typed.h"

namespace axon::kernels {
namespace {

using simd::kLanes;
using simd::VecAt;
typedef uint64_t VecU64 __attribute__((vector_size(8 * kLanes)));
typedef uint8_t VecB __attribute__((vector_size(kLanes)));

// The keep decisions as all-ones / zero 32-bit lanes, for element i (global).
struct Keep {
  uint64_t seed, offset, threshold;
  AXON_INLINE uint32_t bits(int64_t i) const {
    return simd::mask_if((splitmix64(seed, offset + uint64_t(i)) >> 40) >= threshold);
  }
  AXON_INLINE simd::VecU bits(VecAt at) const {
    const VecU64 lanes = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const VecU64 z = splitmix64_mix(seed + (offset + uint64_t(at.i) + 1 + lanes) * kSplitMixGamma);
    // The top 24 bits, compared in 32-bit lanes (a 64-bit unsigned compare of
    // a two-register vector does not vectorise).
    const simd::VecI top = __builtin_convertvector(z >> 40, simd::VecI);
    return (simd::VecU)(top >= int32_t(threshold));
  }
};

// Bernoulli draws: all-ones lanes iff (z >> 32) < threshold (32 bits; a
// threshold of 2^32 is handled by the caller).
struct Below {
  uint64_t seed, offset;
  uint32_t threshold;
  AXON_INLINE uint32_t bits(int64_t i) const {
    return simd::mask_if(uint32_t(splitmix64(seed, offset + uint64_t(i)) >> 32) < threshold);
  }
  AXON_INLINE simd::VecU bits(VecAt at) const {
    const VecU64 lanes = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const VecU64 z = splitmix64_mix(seed + (offset + uint64_t(at.i) + 1 + lanes) * kSplitMixGamma);
    const simd::VecU top = __builtin_convertvector(z >> 32, simd::VecU);
    return (simd::VecU)(top < threshold);
  }
};

AXON_INLINE int64_t shifted(int64_t i, int64_t by) { return i + by; }
AXON_INLINE VecAt shifted(VecAt at, int64_t by) { return VecAt{at.i + by}; }

AXON_INLINE void store_mask(uint8_t* m, int64_t i, uint32_t bits) { m[i] = uint8_t(bits & 1u); }
AXON_INLINE void store_mask(uint8_t* m, VecAt at, simd::VecU bits) {
  const VecB b = __builtin_convertvector(bits & 1u, VecB);
  __builtin_memcpy(m + at.i, &b, sizeof b);
}

// Elements [begin, end).
template <class Codec>
AXON_INLINE void dropout_range(const void* x, void* y, uint8_t* mask, int64_t begin, int64_t end,
                               const Keep& keep, float scale) {
  using S = typename Codec::Storage;
  const S* xs = static_cast<const S*>(x) + begin;
  S* ys = static_cast<S*>(y) + begin;
  uint8_t* ms = mask + begin;
  const uint32_t scale_bits = simd::as_bits(scale);
  simd::for_each(end - begin, [&](auto i) AXON_INLINE_LAMBDA {
    const auto bits = keep.bits(shifted(i, begin));
    // x * factor, not a select: a dropped NaN or inf gives NaN, as x * 0.
    Codec::store(ys, i, Codec::load(xs, i) * simd::as_float(bits & scale_bits));
    store_mask(ms, i, bits);
  });
}

AXON_SIMD void dropout_chunk(DType dt, const void* x, void* y, uint8_t* mask, int64_t begin,
                             int64_t end, const Keep& keep, float scale) {
  switch (dt) {
    case DType::kFloat32:
      return dropout_range<simd::Float32>(x, y, mask, begin, end, keep, scale);
    case DType::kBFloat16:
      return dropout_range<simd::BFloat16>(x, y, mask, begin, end, keep, scale);
    case DType::kFloat16:
      return dropout_range<simd::Float16>(x, y, mask, begin, end, keep, scale);
  }
}

AXON_INLINE uint32_t load_mask(const uint8_t* m, int64_t i) { return 0u - uint32_t(m[i] != 0); }
AXON_INLINE simd::VecU load_mask(const uint8_t* m, VecAt at) {
  VecB b;
  __builtin_memcpy(&b, m + at.i, sizeof b);
  return (simd::VecU)(__builtin_convertvector(b, simd::VecI) != 0);
}

template <class Codec>
AXON_INLINE void dropout_backward_range(const void* dy, const uint8_t* mask, void* dx,
                                        int64_t begin, int64_t end, float scale) {
  using S = typename Codec::Storage;
  const S* g = static_cast<const S*>(dy) + begin;
  S* d = static_cast<S*>(dx) + begin;
  const uint8_t* ms = mask + begin;
  const uint32_t scale_bits = simd::as_bits(scale);
  simd::for_each(end - begin, [&](auto i) AXON_INLINE_LAMBDA {
    Codec::store(d, i, Codec::load(g, i) * simd::as_float(load_mask(ms, i) & scale_bits));
  });
}

AXON_SIMD void dropout_backward_chunk(DType dt, const void* dy, const uint8_t* mask, void* dx,
                                      int64_t begin, int64_t end, float scale) {
  switch (dt) {
    case DType::kFloat32:
      return dropout_backward_range<simd::Float32>(dy, mask, dx, begin, end, scale);
    case DType::kBFloat16:
      return dropout_backward_range<simd::BFloat16>(dy, mask, dx, begin, end, scale);
    case DType::kFloat16:
      return dropout_backward_range<simd::Float16>(dy, mask, dx, begin, end, scale);
  }
}

AXON_SIMD void mask_chunk(uint8_t* mask, int64_t begin, int64_t end, const Below& below) {
  uint8_t* ms = mask + begin;
  simd::for_each(end - begin, [&](auto i) AXON_INLINE_LAMBDA {
    store_mask(ms, i, below.bits(shifted(i, begin)));
  });
}

constexpr int64_t kGrain = 16384;

}  // namespace

bool dropout_keep(uint64_t seed, uint64_t offset, uint64_t index, double p) {
  return (splitmix64(seed, offset + index) >> 40) >= dropout_threshold(p);
}

void dropout_forward(DType dt, int64_t n, const void* x, void* y, uint8_t* mask, uint64_t seed,
                     uint64_t offset, double p) {
  const Keep keep{seed, offset, dropout_threshold(p)};
  const float scale = dropout_scale(p);
  parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    dropout_chunk(dt, x, y, mask, b, e, keep, scale);
  });
}

bool bernoulli_draw(uint64_t seed, uint64_t offset, uint64_t index, double p) {
  return (splitmix64(seed, offset + index) >> 32) < bernoulli_threshold(p);
}

void bernoulli_mask(int64_t n, uint8_t* mask, uint64_t seed, uint64_t offset, double p) {
  const uint64_t threshold = bernoulli_threshold(p);
  if (threshold > UINT32_MAX) {  // p rounds to 1: every draw is 1
    parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) { std::memset(mask + b, 1, e - b); });
    return;
  }
  const Below below{seed, offset, uint32_t(threshold)};
  parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) { mask_chunk(mask, b, e, below); });
}

void dropout_backward(DType dt, int64_t n, const void* dy, const uint8_t* mask, double scale,
                      void* dx) {
  const float s = float(scale);
  parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    dropout_backward_chunk(dt, dy, mask, dx, b, e, s);
  });
}

}  // namespace axon::kernels
