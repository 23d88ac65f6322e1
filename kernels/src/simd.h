// Internal building blocks of the kernels: per-ISA cloning of entry points, a
// 16-float vector type (GCC vector extensions: one AVX-512 register, two AVX2 ones,
// four SSE ones, so one source serves every ISA without intrinsics), loops and
// reductions over float rows, exp, and the dtype conversions.
//
// Kernel bodies are generic lambdas `[&](auto i) { ... load(x, i) ... }` called with
// a VecAt (16 elements) for the bulk of a row and with a plain index for its tail:
// the same arithmetic compiles to vector and to scalar code.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

// AXON_SIMD marks a kernel entry point: it is compiled for AVX-512, AVX2+FMA and the
// baseline, and the loader picks the best the CPU supports (an ifunc). A function
// compiled for the baseline is not inlined into an AVX-512 clone, so everything an
// entry point calls in its loops is AXON_INLINE (lambdas: AXON_INLINE_LAMBDA).
// ThreadSanitizer instruments the ifunc resolvers, which run before it is
// initialised: its builds use the baseline code only.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define AXON_SIMD __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define AXON_SIMD
#endif
#define AXON_INLINE [[gnu::always_inline]] inline
#define AXON_INLINE_LAMBDA __attribute__((always_inline))

namespace axon::kernels::simd {

constexpr int kLanes = 16;
typedef float Vec __attribute__((vector_size(4 * kLanes)));
typedef uint32_t VecU __attribute__((vector_size(4 * kLanes)));
typedef int32_t VecI __attribute__((vector_size(4 * kLanes)));
typedef uint16_t VecH __attribute__((vector_size(2 * kLanes)));

// Elements i .. i + kLanes - 1.
struct VecAt {
  int64_t i;
};

AXON_INLINE float load(const float* p, int64_t i) { return p[i]; }
AXON_INLINE Vec load(const float* p, VecAt at) {
  Vec v;
  std::memcpy(&v, p + at.i, sizeof v);
  return v;
}
AXON_INLINE void store(float* p, int64_t i, float v) { p[i] = v; }
AXON_INLINE void store(float* p, VecAt at, Vec v) { std::memcpy(p + at.i, &v, sizeof v); }

// 16-bit elements (bf16/f16 bits), zero-extended to 32-bit lanes, and back.
AXON_INLINE uint32_t load_u16(const uint16_t* p, int64_t i) { return p[i]; }
AXON_INLINE VecU load_u16(const uint16_t* p, VecAt at) {
  VecH h;
  std::memcpy(&h, p + at.i, sizeof h);
  return __builtin_convertvector(h, VecU);
}
AXON_INLINE void store_u16(uint16_t* p, int64_t i, uint32_t v) { p[i] = uint16_t(v); }
AXON_INLINE void store_u16(uint16_t* p, VecAt at, VecU v) {
  const VecH h = __builtin_convertvector(v, VecH);
  std::memcpy(p + at.i, &h, sizeof h);
}

// c as a float or a Vec.
template <class V>
AXON_INLINE V splat(float c) {
  return V{} + c;
}

// Bit casts, for scalars and vectors.
AXON_INLINE float as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
AXON_INLINE Vec as_float(VecU u) { return (Vec)u; }
AXON_INLINE uint32_t as_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
AXON_INLINE VecU as_bits(Vec f) { return (VecU)f; }
// All ones where c holds, zero elsewhere.
AXON_INLINE uint32_t mask_if(bool c) { return 0u - uint32_t(c); }
AXON_INLINE VecU mask_if(VecI c) { return (VecU)c; }
// a where mask is all ones, b where it is zero.
template <class U>
AXON_INLINE U select_bits(U mask, U a, U b) {
  return (a & mask) | (b & ~mask);
}

// body(VecAt) over the full vectors of [0, n), then body(i) over the tail.
template <class Body>
AXON_INLINE void for_each(int64_t n, const Body& body) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) body(VecAt{i});
  for (; i < n; ++i) body(i);
}

AXON_INLINE float sqrt(float x) { return std::sqrt(x); }
AXON_INLINE Vec sqrt(Vec x) {
  Vec r;
  for (int l = 0; l < kLanes; ++l) r[l] = std::sqrt(x[l]);  // vectorises to one sqrt
  return r;
}

// Sum of the lanes, halving the vector each step (a fixed order on every ISA).
AXON_INLINE float reduce_add(Vec v) {
  typedef float V8 __attribute__((vector_size(32)));
  typedef float V4 __attribute__((vector_size(16)));
  const V8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const V4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}
AXON_INLINE float reduce_max(Vec v) {
  float m = v[0];
  for (int l = 1; l < kLanes; ++l) m = v[l] > m ? v[l] : m;
  return m;
}

// Sum over [0, n) of term(i): four vector accumulators (to hide the add latency),
// then the tail. The order of additions depends only on n, not on the ISA.
// Rows longer than a block are summed block by block, each block's sum added
// in double: each lane then adds at most 64 terms in float, so the error of a
// row of millions stays that of a short sum (as ATen's cascade sums), and rows
// of up to a block sum exactly as without blocks.
template <class Term>
AXON_INLINE float sum_of(int64_t n, const Term& term) {
  constexpr int64_t kBlock = 64 * 4 * kLanes;
  Vec a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t i = 0;
  const auto add4 = [&]() AXON_INLINE_LAMBDA {  // the four vectors from i on
    a0 += term(VecAt{i});
    a1 += term(VecAt{i + kLanes});
    a2 += term(VecAt{i + 2 * kLanes});
    a3 += term(VecAt{i + 3 * kLanes});
    i += 4 * kLanes;
  };
  double total = 0.0;  // the block sums of a row longer than a block
  for (; n > kBlock && i + kBlock <= n;) {
    for (const int64_t end = i + kBlock; i < end;) add4();
    total += static_cast<double>(reduce_add((a0 + a1) + (a2 + a3)));
    a0 = a1 = a2 = a3 = Vec{};
  }
  while (i + 4 * kLanes <= n) add4();
  for (; i + kLanes <= n; i += kLanes) a0 += term(VecAt{i});
  if (n <= kBlock) {
    float tail = 0.0f;
    for (; i < n; ++i) tail += term(i);
    return reduce_add((a0 + a1) + (a2 + a3)) + tail;
  }
  double tail = 0.0;
  for (; i < n; ++i) tail += static_cast<double>(term(i));
  return static_cast<float>(total + static_cast<double>(reduce_add((a0 + a1) + (a2 + a3))) + tail);
}

// Maximum over [0, n) of term(i); -inf if n == 0.
template <class Term>
AXON_INLINE float max_of(int64_t n, const Term& term) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  Vec acc = splat<Vec>(kNegInf);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const Vec v = term(VecAt{i});
    acc = v > acc ? v : acc;
  }
  float m = reduce_max(acc);
  for (; i < n; ++i) {
    const float v = term(i);
    m = v > m ? v : m;
  }
  return m;
}

// exp(x) for x <= 88 (about 1 ulp; 0 below -87.3, NaN stays NaN; inf above 88):
// Cephes' expf. x = n ln2 + r with |r| <= ln2/2, exp(r) by a polynomial, 2^n built
// in the exponent bits. n is rounded with the 1.5 * 2^23 trick, so no float -> int
// conversion is needed.
template <class V>
AXON_INLINE V exp(V x) {
  constexpr float kHi = 88.0f, kLo = -87.33654f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  V xc = x < kLo ? splat<V>(kLo) : x;
  xc = xc > kHi ? splat<V>(kHi) : xc;
  const V shifted = xc * 1.44269504088896341f + kRound;
  const V n = shifted - kRound;
  V r = xc - n * 0.693359375f;  // Cody-Waite: ln2 in two parts
  r = r - n * -2.12194440e-4f;
  V p = splat<V>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const V two_n = as_float((as_bits(shifted) - as_bits(kRound) + 127u) << 23);
  const V e = x < kLo ? splat<V>(0.0f) : p * two_n;
  return x > kHi ? splat<V>(std::numeric_limits<float>::infinity()) : e;
}

// dtype conversions on the bits of 16-bit values held in 32-bit lanes (U: uint32_t
// or VecU), branch-free so that scalar and vector code are the same.
template <class U>
AXON_INLINE auto bf16_to_float(U h) {
  return as_float(h << 16);
}

template <class V>
AXON_INLINE auto float_to_bf16(V v) {
  const auto u = as_bits(v);
  const auto rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // to nearest even
  const auto nan = (u >> 16) | 0x40u;                            // quiet NaN
  return select_bits(mask_if((u & 0x7fffffffu) > 0x7f800000u), nan, rounded);
}

template <class U>
AXON_INLINE auto f16_to_float(U h) {
  // Move exponent and mantissa into place and rebias; inf/NaN get the float
  // exponent, subnormals are renormalised by a float subtraction.
  const U shifted = (h & 0x7fffu) << 13;
  const U exponent = shifted & (0x7c00u << 13);
  const U normal = shifted + ((127u - 15u) << 23);
  const U inf_nan = shifted + ((255u - 31u) << 23);
  const U subnormal = as_bits(as_float(shifted + (113u << 23)) - as_float(113u << 23));
  U r = select_bits(mask_if(exponent == (0x7c00u << 13)), inf_nan, normal);
  r = select_bits(mask_if(exponent == 0u), subnormal, r);
  return as_float(r | ((h & 0x8000u) << 16));
}

template <class V>
AXON_INLINE auto float_to_f16(V v) {
  // F. Giesen's float_to_half_fast3_rtne, made branch-free.
  using U = decltype(as_bits(v));
  const U u = as_bits(v);
  const U sign = u & 0x80000000u;
  const U a = u ^ sign;
  // |v| >= 65520 rounds to inf; NaN becomes a quiet NaN.
  const U inf_nan = select_bits(mask_if(a > 0x7f800000u), U{} + 0x7e00u, U{} + 0x7c00u);
  // Subnormal or zero result: align the mantissa by a float addition (rounds to even).
  const float denorm_magic = as_float(((127u - 15u) + (23u - 10u) + 1u) << 23);
  const U subnormal = as_bits(as_float(a) + denorm_magic) - as_bits(denorm_magic);
  // Normal: rebias the exponent, round to nearest even.
  const U normal = (a + ((15u - 127u) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
  U r = select_bits(mask_if(a < (113u << 23)), subnormal, normal);
  r = select_bits(mask_if(a >= ((127u + 16u) << 23)), inf_nan, r);
  return r | (sign >> 16);
}

}  // namespace axon::kernels::simd
