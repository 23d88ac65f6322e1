// linear_small_m: out[i, j] = dot(a[i, :], w[j, :]) (+ bias[j]) for up to
// kLinearMaxRows rows of a.  Work is split over output columns j (weight
// rows); for each weight row, one pass over k accumulates the M dot products
// in 16-lane vectors (M accumulators, so the weight row is loaded once), then
// each accumulator is summed across lanes.  The rows of `a` stay in cache.
#include "axon/kernels/linear.h"

#include "axon/kernels/parallel.h"
#include "simd.h"

namespace axon::kernels {
namespace {

using simd::Vec;
using simd::VecAt;

template <int M>
AXON_INLINE void dot_rows(int64_t k, const float* const* a, const float* w, float* result) {
  Vec acc[M] = {};
  int64_t i = 0;
  for (; i + simd::kLanes <= k; i += simd::kLanes) {
    const Vec wv = simd::load(w, VecAt{i});
    for (int r = 0; r < M; ++r) acc[r] += simd::load(a[r], VecAt{i}) * wv;
  }
  for (int r = 0; r < M; ++r) {
    float s = simd::reduce_add(acc[r]);
    for (int64_t t = i; t < k; ++t) s += a[r][t] * w[t];
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
    dot_rows<M>(k, rows, w + j * ldw, result);
    const float b = bias != nullptr ? bias[j] : 0.0f;
    for (int r = 0; r < M; ++r) out[r * ldo + j] = result[r] + b;
  }
}

using RowsFn = void (*)(int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t,
                        const float*, float*, int64_t);
constexpr RowsFn kRows[kLinearMaxRows] = {linear_rows<1>, linear_rows<2>, linear_rows<3>,
                                          linear_rows<4>, linear_rows<5>, linear_rows<6>,
                                          linear_rows<7>, linear_rows<8>};

}  // namespace

void linear_small_m(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                    const float* w, int64_t ldw, const float* bias, float* out, int64_t ldo) {
  if (m <= 0 || n <= 0) return;
  const RowsFn rows = kRows[m - 1];
  // ~16K weight elements per task: enough to amortise a task, fine enough to balance.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(k, 1));
  parallel_for(0, n, grain, [&](int64_t n0, int64_t n1) {
    rows(n0, n1, k, a, lda, w, ldw, bias, out, ldo);
  });
}

}  // namespace axon::kernels
