// linear_small_m: out[i, j] = dot(a[i, :], w[j, :]) (+ bias[j]) for up to
// kLinearMaxRows rows of a.  Work is split over output columns j (weight
// rows); for each weight row, one pass over k accumulates the dot products of
// a group of rows of `a` in 16-lane vectors (one accumulator per row, so the
// weight row is loaded once per group), then each accumulator is summed across
// lanes.
//
// The weights stream from memory once; what keeps the loop fed is that the
// rows of `a` it reads with every weight line stay in L1 (a panel of
// kPanelBytes) and that the weight stream is prefetched ahead:
//   - all M rows form one group while M x k floats fit the panel (k = 512:
//     8 rows, 16 KB);
//   - otherwise (the down projection's k = 1408: 8 x 5.6 KB) the rows are
//     split into groups that fit, and the weight is walked in blocks of about
//     kBlockBytes: the first group reads a block from memory, the others from
//     L2.  Measured on the Zen 5 CI machine, m = 8, n = 512, k = 1408, weights
//     from DRAM: 330 us as one group of 8, 145 us as two groups of 4;
//   - a software prefetch kPrefetchBytes ahead of the weight read keeps
//     enough memory reads in flight (the hardware prefetcher alone lost track
//     of the weight stream next to the 8 rows of `a`: up to 15% slower).
// Each output is the same sum in the same order whichever path computes it.
//
// bfloat16 / float16: the rows of `a` are converted to float32 once (into a
// scratch panel), each 16-bit weight vector is widened to float32 as it is
// loaded, sums are float32, and each output is rounded once (+ bias) to the
// storage type.  Half the bytes of float32 weights to read: decoding in bf16
// reads its weights at the same rate as in float32, twice the parameters.
#include "axon/kernels/linear.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "axon/kernels/parallel.h"
#include "linear_isa.h"
#include "simd.h"

namespace axon::kernels {
namespace {

using simd::Vec;
using simd::VecAt;

constexpr int64_t kPanelBytes = 24 * 1024;
constexpr int64_t kBlockBytes = 192 * 1024;
constexpr uintptr_t kPrefetchBytes = 8192;
constexpr int kPrefetchLocality = 0;  // NTA: measured no worse than T0/T1 on Zen 5 (only)

// Prefetches the weight kPrefetchBytes past p (an address, not a pointer into
// the weights: past their end it only hints, and prefetches never fault).
AXON_INLINE void prefetch_ahead(const void* p) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) + kPrefetchBytes),
                     0, kPrefetchLocality);
}

// How weights become float32: 16 from memory (vec) and one (scalar).
struct F32 {
  using Elem = float;
  AXON_INLINE static Vec vec(const float* w) { return simd::load(w, VecAt{0}); }
  AXON_INLINE static float scalar(float x) { return x; }
};

// The M dot products of a weight row with rows a[0..M) (float32), in 16-lane
// accumulators summed across lanes at the end: the same order for every M.
template <int M, class L>
AXON_INLINE void dot_rows(int64_t k, const float* const* a, const typename L::Elem* w,
                          float* result) {
  Vec acc[M] = {};
  int64_t i = 0;
  for (; i + simd::kLanes <= k; i += simd::kLanes) {
    if (i * int64_t{sizeof(typename L::Elem)} % 64 == 0) prefetch_ahead(w + i);  // once a line
    const Vec wv = L::vec(w + i);
    for (int r = 0; r < M; ++r) acc[r] += simd::load(a[r], VecAt{i}) * wv;
  }
  for (int r = 0; r < M; ++r) {
    float s = simd::reduce_add(acc[r]);
    for (int64_t t = i; t < k; ++t) s += a[r][t] * L::scalar(w[t]);
    result[r] = s;
  }
}

template <int M>
AXON_SIMD void linear_rows(int64_t n0, int64_t n1, int64_t k, const float* a, int64_t lda,
                           const float* w, int64_t ldw, const float* bias, float* out,
                           int64_t ldo) {
  const float* rows[M];
  for (int r = 0; r < M; ++r) rows[r] = a + r * lda;
  float result[M];
  for (int64_t j = n0; j < n1; ++j) {
    dot_rows<M, F32>(k, rows, w + j * ldw, result);
    const float b = bias != nullptr ? bias[j] : 0.0f;
    for (int r = 0; r < M; ++r) out[r * ldo + j] = result[r] + b;
  }
}

using RowsFn = void (*)(int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t,
                        const float*, float*, int64_t);
constexpr RowsFn kRows[kLinearMaxRows] = {linear_rows<1>, linear_rows<2>, linear_rows<3>,
                                          linear_rows<4>, linear_rows<5>, linear_rows<6>,
                                          linear_rows<7>, linear_rows<8>};

// 16-bit weights: the portable forms (baseline clones); the ISA-specific ones below.
struct Bf16 {
  using Elem = uint16_t;
  static constexpr DType kType = DType::kBFloat16;
  AXON_INLINE static Vec vec(const uint16_t* w) {
    return simd::bf16_to_float(simd::load_u16(w, VecAt{0}));
  }
  AXON_INLINE static float scalar(uint16_t h) { return simd::bf16_to_float(uint32_t{h}); }
};
struct F16 {  // bit arithmetic: ~12 vector instructions per 16 weights
  using Elem = uint16_t;
  static constexpr DType kType = DType::kFloat16;
  AXON_INLINE static Vec vec(const uint16_t* w) {
    return simd::f16_to_float(simd::load_u16(w, VecAt{0}));
  }
  AXON_INLINE static float scalar(uint16_t h) { return simd::f16_to_float(uint32_t{h}); }
};

// a: float32 rows (converted), w / bias / out: 16-bit.  Sums (+ bias) of up
// to kOutBlock columns are kept in float32, then each row of them is rounded
// to the storage type in one vectorised pass: rounding one output at a time
// cost as much as a third of the dot products (k = 512).
constexpr int64_t kOutBlock = 64;
template <int M, class L>
AXON_INLINE void rows16_body(int64_t n0, int64_t n1, int64_t k, const float* a, int64_t lda,
                             const uint16_t* w, int64_t ldw, const uint16_t* bias,
                             uint16_t* out, int64_t ldo) {
  const float* rows[M];
  for (int r = 0; r < M; ++r) rows[r] = a + r * lda;
  float result[M];
  float sums[M][kOutBlock];
  for (int64_t j0 = n0; j0 < n1; j0 += kOutBlock) {
    const int64_t j1 = std::min(n1, j0 + kOutBlock);
    for (int64_t j = j0; j < j1; ++j) {
      dot_rows<M, L>(k, rows, w + j * ldw, result);
      const float b = bias != nullptr ? L::scalar(bias[j]) : 0.0f;
      for (int r = 0; r < M; ++r) sums[r][j - j0] = result[r] + b;
    }
    for (int r = 0; r < M; ++r) convert_from_float(L::kType, sums[r], j1 - j0, out + r * ldo + j0);
  }
}

template <int M, class L>
AXON_SIMD void linear_rows16(int64_t n0, int64_t n1, int64_t k, const float* a, int64_t lda,
                             const uint16_t* w, int64_t ldw, const uint16_t* bias,
                             uint16_t* out, int64_t ldo) {
  rows16_body<M, L>(n0, n1, k, a, lda, w, ldw, bias, out, ldo);
}

using Rows16Fn = void (*)(int64_t, int64_t, int64_t, const float*, int64_t, const uint16_t*,
                          int64_t, const uint16_t*, uint16_t*, int64_t);
template <class L>
constexpr Rows16Fn kRows16[kLinearMaxRows] = {
    linear_rows16<1, L>, linear_rows16<2, L>, linear_rows16<3, L>, linear_rows16<4, L>,
    linear_rows16<5, L>, linear_rows16<6, L>, linear_rows16<7, L>, linear_rows16<8, L>};

// The widening in one or two instructions (bf16: zero-extend and shift, which
// GCC's generic vector code does in six; f16: F16C's conversion instead of the
// bit arithmetic, 3x faster): explicit AVX-512 and AVX2 builds picked at run
// time, as intrinsics cannot go through target_clones' baseline clone.
// (`flatten` inlines the loaders into the builds; an always_inline loader with
// a target attribute could not be inlined into the portable templates.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define AXON_X86_LINEAR16 1
#define AXON_V4 __attribute__((target("arch=x86-64-v4")))
#define AXON_V3 __attribute__((target("arch=x86-64-v3")))
struct Bf16v4 : Bf16 {
  AXON_V4 static inline Vec vec(const uint16_t* w) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    // (Masked forms here and below: the plain intrinsics start from an
    // undefined vector, which GCC 12 warns about.)
    return (Vec)_mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, h), 16);
  }
};
struct Bf16v3 : Bf16 {
  AXON_V3 static inline Vec vec(const uint16_t* w) {
    const __m128i* p = reinterpret_cast<const __m128i*>(w);
    const __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p)), 16);
    const __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p + 1)), 16);
    Vec v;
    std::memcpy(&v, &lo, sizeof lo);
    std::memcpy(reinterpret_cast<char*>(&v) + sizeof lo, &hi, sizeof hi);
    return v;
  }
};
struct F16v4 : F16 {
  AXON_V4 static inline Vec vec(const uint16_t* w) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    return (Vec)_mm512_maskz_cvtph_ps(0xffff, h);
  }
};
struct F16v3 : F16 {
  AXON_V3 static inline Vec vec(const uint16_t* w) {
    const __m128i* p = reinterpret_cast<const __m128i*>(w);
    const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128(p));
    const __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128(p + 1));
    Vec v;
    std::memcpy(&v, &lo, sizeof lo);
    std::memcpy(reinterpret_cast<char*>(&v) + sizeof lo, &hi, sizeof hi);
    return v;
  }
};
// One build of the loops per target: NAME<M, L>, and its table kNAME<L>.
#define AXON_ROWS16_BUILD(NAME, TARGET)                                                     \
  template <int M, class L>                                                                 \
  TARGET __attribute__((flatten)) void NAME(int64_t n0, int64_t n1, int64_t k,              \
                                            const float* a, int64_t lda, const uint16_t* w, \
                                            int64_t ldw, const uint16_t* bias,              \
                                            uint16_t* out, int64_t ldo) {                   \
    rows16_body<M, L>(n0, n1, k, a, lda, w, ldw, bias, out, ldo);                           \
  }                                                                                         \
  template <class L>                                                                        \
  constexpr Rows16Fn k##NAME[kLinearMaxRows] = {NAME<1, L>, NAME<2, L>, NAME<3, L>,         \
                                                NAME<4, L>, NAME<5, L>, NAME<6, L>,         \
                                                NAME<7, L>, NAME<8, L>};
AXON_ROWS16_BUILD(rows16_v4, AXON_V4)
AXON_ROWS16_BUILD(rows16_v3, AXON_V3)
#undef AXON_ROWS16_BUILD
#undef AXON_V4
#undef AXON_V3
#endif

// The builds for dt (bfloat16 or float16) for `isa` (linear_isa.h; -1: the best
// this CPU runs).
const Rows16Fn* rows16_for(DType dt, int isa) {
#ifdef AXON_X86_LINEAR16
  static const int best = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("x86-64-v4") ? 4 : __builtin_cpu_supports("x86-64-v3") ? 3 : 0;
  }();
  if (isa < 0) isa = best;
  if (isa == 4) return dt == DType::kBFloat16 ? krows16_v4<Bf16v4> : krows16_v4<F16v4>;
  if (isa == 3) return dt == DType::kBFloat16 ? krows16_v3<Bf16v3> : krows16_v3<F16v3>;
#else
  (void)isa;
#endif
  return dt == DType::kBFloat16 ? kRows16<Bf16> : kRows16<F16>;
}

// Splits the columns over threads, and the rows of `a` into groups that fit
// the panel (k floats per row) over blocks of weight rows (w_row_bytes each):
// run(rows, r0, j0, j1) computes rows r0 .. r0 + rows - 1 of columns j0 .. j1 - 1.
template <class Run>
void for_groups(int64_t m, int64_t n, int64_t k, int64_t w_row_bytes, const Run& run) {
  const int64_t row_bytes = std::max<int64_t>(k, 1) * int64_t{sizeof(float)};
  // Rows of `a` per group: as many as fit the panel, in groups of equal size.
  const int64_t fit = std::clamp<int64_t>(kPanelBytes / row_bytes, 1, m);
  const int64_t groups = (m + fit - 1) / fit;
  const int64_t per_group = (m + groups - 1) / groups;
  const int64_t block =
      groups == 1 ? n : std::max<int64_t>(4, kBlockBytes / std::max<int64_t>(w_row_bytes, 1));
  // ~16K weight elements per task: enough to amortise a task, fine enough to balance.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(k, 1));
  parallel_for(0, n, grain, [&](int64_t n0, int64_t n1) {
    for (int64_t j0 = n0; j0 < n1; j0 += block) {
      const int64_t j1 = std::min(n1, j0 + block);
      for (int64_t r0 = 0; r0 < m; r0 += per_group) {
        run(std::min(per_group, m - r0), r0, j0, j1);
      }
    }
  });
}

void check_rows(int64_t m) {
  if (m > kLinearMaxRows) {
    throw std::invalid_argument("linear_small_m: " + std::to_string(m) + " rows, at most " +
                                std::to_string(kLinearMaxRows));
  }
}

}  // namespace

void linear_small_m(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                    const float* w, int64_t ldw, const float* bias, float* out, int64_t ldo) {
  if (m <= 0 || n <= 0) return;
  check_rows(m);
  for_groups(m, n, k, k * int64_t{sizeof(float)}, [&](int64_t rows, int64_t r0, int64_t j0,
                                                      int64_t j1) {
    kRows[rows - 1](j0, j1, k, a + r0 * lda, lda, w, ldw, bias, out + r0 * ldo, ldo);
  });
}

void linear_small_m(DType dt, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                    const void* w, int64_t ldw, const void* bias, void* out, int64_t ldo) {
  linear_small_m_isa(-1, dt, m, n, k, a, lda, w, ldw, bias, out, ldo);
}

void linear_small_m_isa(int isa, DType dt, int64_t m, int64_t n, int64_t k, const void* a,
                        int64_t lda, const void* w, int64_t ldw, const void* bias, void* out,
                        int64_t ldo) {
  if (dt == DType::kFloat32) {
    linear_small_m(m, n, k, static_cast<const float*>(a), lda, static_cast<const float*>(w),
                   ldw, static_cast<const float*>(bias), static_cast<float*>(out), ldo);
    return;
  }
  if (m <= 0 || n <= 0) return;
  check_rows(m);
  // The rows of `a` in float32: converted once, read for every weight row.
  // Each row starts on a cache line.  The panel is the calling thread's,
  // kept between calls (it only grows).
  const int64_t ldf = (k + 15) / 16 * 16;
  thread_local std::vector<float> panel;
  if (panel.size() < static_cast<size_t>(m * ldf + 15)) panel.resize(m * ldf + 15);
  float* af = panel.data() + ((64 - reinterpret_cast<uintptr_t>(panel.data()) % 64) % 64) / 4;
  for (int64_t r = 0; r < m; ++r) {
    convert_to_float(dt, static_cast<const uint16_t*>(a) + r * lda, k, af + r * ldf);
  }
  const auto* wp = static_cast<const uint16_t*>(w);
  const auto* bp = static_cast<const uint16_t*>(bias);
  auto* op = static_cast<uint16_t*>(out);
  const Rows16Fn* fns = rows16_for(dt, isa);
  for_groups(m, n, k, k * int64_t{sizeof(uint16_t)}, [&](int64_t rows, int64_t r0, int64_t j0,
                                                         int64_t j1) {
    fns[rows - 1](j0, j1, k, af + r0 * ldf, ldf, wp, ldw, bp, op + r0 * ldo, ldo);
  });
}

}  // namespace axon::kernels
