// Typed loads and stores for kernels that convert inline rather than through
// float32 rows: Codec::load(p, i) / Codec::store(p, i, v) with i an index or a
// simd::VecAt, for each storage type.
#pragma once

#include <cstdint>

#include "simd.h"

namespace axon::kernels::simd {

struct Float32 {
  using Storage = float;
  AXON_INLINE static auto load(const float* p, auto i) { return simd::load(p, i); }
  AXON_INLINE static void store(float* p, auto i, auto v) { simd::store(p, i, v); }
};

struct BFloat16 {
  using Storage = uint16_t;
  AXON_INLINE static auto load(const uint16_t* p, auto i) { return bf16_to_float(load_u16(p, i)); }
  AXON_INLINE static void store(uint16_t* p, auto i, auto v) { store_u16(p, i, float_to_bf16(v)); }
};

// float16 by bit manipulation: any CPU.
struct Float16 {
  using Storage = uint16_t;
  AXON_INLINE static auto load(const uint16_t* p, auto i) { return f16_to_float(load_u16(p, i)); }
  AXON_INLINE static void store(uint16_t* p, auto i, auto v) { store_u16(p, i, float_to_f16(v)); }
};

}  // namespace axon::kernels::simd
