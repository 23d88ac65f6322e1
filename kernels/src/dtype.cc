// Scalar and bulk dtype conversions (the bit manipulations live in simd.h, the
// typed loads and stores in typed.h). Bulk float16 conversion uses the F16C
// instructions when the CPU has them.
#include "axon/kernels/dtype.h"

#include <cstring>

#include "simd.h"
#include "typed.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define AXON_HAVE_F16C 1
#endif

namespace axon::kernels {
namespace {

template <class Codec>
AXON_INLINE void to_float_n(const void* src, int64_t n, float* dst) {
  const auto* s = static_cast<const typename Codec::Storage*>(src);
  simd::for_each(n, [&](auto i) AXON_INLINE_LAMBDA { simd::store(dst, i, Codec::load(s, i)); });
}

template <class Codec>
AXON_INLINE void from_float_n(const float* src, int64_t n, void* dst) {
  auto* d = static_cast<typename Codec::Storage*>(dst);
  simd::for_each(n, [&](auto i) AXON_INLINE_LAMBDA { Codec::store(d, i, simd::load(src, i)); });
}

AXON_SIMD void bf16_to_float_n(const void* src, int64_t n, float* dst) {
  to_float_n<simd::BFloat16>(src, n, dst);
}
AXON_SIMD void float_to_bf16_n(const float* src, int64_t n, void* dst) {
  from_float_n<simd::BFloat16>(src, n, dst);
}
AXON_SIMD void f16_to_float_n(const void* src, int64_t n, float* dst) {
  to_float_n<simd::Float16>(src, n, dst);
}
AXON_SIMD void float_to_f16_n(const float* src, int64_t n, void* dst) {
  from_float_n<simd::Float16>(src, n, dst);
}

#ifdef AXON_HAVE_F16C
// GCC does not vectorise _Float16 conversions, hence the intrinsics.
bool cpu_has_f16c() {
  static const bool yes = (__builtin_cpu_init(), __builtin_cpu_supports("f16c"));
  return yes;
}

__attribute__((target("avx,f16c"))) void f16_to_float_f16c(const void* src, int64_t n,
                                                            float* dst) {
  const auto* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) dst[i] = simd::f16_to_float(uint32_t(s[i]));
}

__attribute__((target("avx,f16c"))) void float_to_f16_f16c(const float* src, int64_t n,
                                                            void* dst) {
  auto* d = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) d[i] = uint16_t(simd::float_to_f16(src[i]));
}
#endif

}  // namespace

size_t dtype_size(DType dt) { return dt == DType::kFloat32 ? 4 : 2; }

float bf16_to_float(uint16_t bits) { return simd::bf16_to_float(uint32_t(bits)); }
uint16_t float_to_bf16(float value) { return uint16_t(simd::float_to_bf16(value)); }
float f16_to_float(uint16_t bits) { return simd::f16_to_float(uint32_t(bits)); }
uint16_t float_to_f16(float value) { return uint16_t(simd::float_to_f16(value)); }

void convert_to_float(DType dt, const void* src, int64_t n, float* dst) {
  switch (dt) {
    case DType::kFloat32:
      if (n > 0) std::memcpy(dst, src, n * sizeof(float));
      break;
    case DType::kBFloat16:
      bf16_to_float_n(src, n, dst);
      break;
    case DType::kFloat16:
#ifdef AXON_HAVE_F16C
      if (cpu_has_f16c()) return f16_to_float_f16c(src, n, dst);
#endif
      f16_to_float_n(src, n, dst);
      break;
  }
}

void convert_from_float(DType dt, const float* src, int64_t n, void* dst) {
  switch (dt) {
    case DType::kFloat32:
      if (n > 0) std::memcpy(dst, src, n * sizeof(float));
      break;
    case DType::kBFloat16:
      float_to_bf16_n(src, n, dst);
      break;
    case DType::kFloat16:
#ifdef AXON_HAVE_F16C
      if (cpu_has_f16c()) return float_to_f16_f16c(src, n, dst);
#endif
      float_to_f16_n(src, n, dst);
      break;
  }
}

}  // namespace axon::kernels
