// Dropout with counter-based random numbers: element `index` is kept iff
// dropout_keep(seed, offset, index, p), a pure function of its arguments (the
// rule attention's dropout uses too, attention.h), so any split of the work
// over threads or tiles gives the same result.
#pragma once

#include <cstdint>

#include "axon/kernels/dtype.h"

namespace axon::kernels {

// With z = SplitMix64 output number (offset + index) of the stream seeded with
// seed, i.e. mix(seed + (offset + index + 1) * 0x9e3779b97f4a7c15) with
// SplitMix64's finaliser mix: kept iff (z >> 40) >= round(min(p, 1) * 2^24), so
// with probability ~1 - p (p <= 0 keeps everything, p >= 1 drops everything).
bool dropout_keep(uint64_t seed, uint64_t offset, uint64_t index, double p);

// For i in [0, n): mask[i] = dropout_keep(seed, offset, i, p) and
// y[i] = x[i] * (mask[i] ? scale : 0) in float32, rounded to dt, where scale
// = float(1 / (1 - p)) (0 when p >= 1), so a NaN or inf input stays NaN where
// dropped, as x * 0 does. x and y are contiguous arrays of dt (y may be x);
// mask holds 0 or 1 per element.
void dropout_forward(DType dt, int64_t n, const void* x, void* y, uint8_t* mask, uint64_t seed,
                     uint64_t offset, double p);

// Bernoulli draws (bernoulli_ with a number p) at the resolution of a 32-bit
// uniform: with z as above, 1 iff (z >> 32) < round(min(max(p, 0), 1) * 2^32),
// so with probability p to within 2^-33 (p <= 0: never; p >= 1 - 2^-33: always).
bool bernoulli_draw(uint64_t seed, uint64_t offset, uint64_t index, double p);

// mask[i] = bernoulli_draw(seed, offset, i, p) for i in [0, n), 0 or 1.
void bernoulli_mask(int64_t n, uint8_t* mask, uint64_t seed, uint64_t offset, double p);

// The backward: dx[i] = dy[i] * (mask[i] ? float(scale) : 0) in float32,
// rounded to dt (ATen's native_dropout_backward, dy * mask * scale). dy and dx
// contiguous arrays of dt (dx may be dy); mask 0 or 1 per element.
void dropout_backward(DType dt, int64_t n, const void* dy, const uint8_t* mask, double scale,
                      void* dx);

}  // namespace axon::kernels
