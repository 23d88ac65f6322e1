// Shared by attention.cc (forward) and attention_backward.cc: the problem geometry,
// float32 tiles loaded from strided q/k/v tensors, the two tile products, and the
// score mask (causal, user mask, padding, dropout).
//
// Rows: the q heads that share a kv head (a group of G = q_heads / kv_heads heads)
// are processed together, as one matrix of G * q_len rows, row r = (head g, query i)
// with r = g * q_len + i. So a kv tile, once loaded, serves every q head that reads
// it, and decoding (q_len = 1) with grouped-query attention still has G rows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "axon/kernels/attention.h"
#include "counter_rng.h"
#include "simd.h"

namespace axon::kernels::attention {

using simd::kLanes;
using simd::load;
using simd::store;
using simd::Vec;
using simd::VecAt;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Keys per kv tile, and rows per q tile (forward: per task).
constexpr int64_t kBlockK = 64;
constexpr int64_t kBlockQ = 64;

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

struct Geometry {
  explicit Geometry(const AttentionShape& s)
      : shape(s),
        group(s.q_heads / s.kv_heads),
        rows(group * s.q_len),
        dim_p(round_up(s.head_dim, kLanes)),
        vdim_p(round_up(s.v_head_dim, kLanes)) {}

  int64_t head(int64_t kv_head, int64_t row) const { return kv_head * group + row / shape.q_len; }
  int64_t query(int64_t row) const { return row % shape.q_len; }
  // Rows from `row` on (at most n) that belong to the same head: consecutive queries.
  int64_t run(int64_t row, int64_t n) const { return std::min(n, shape.q_len - query(row)); }

  AttentionShape shape;
  int64_t group;   // q heads per kv head
  int64_t rows;    // rows per group: group * q_len
  int64_t dim_p;   // head_dim rounded up to a whole vector
  int64_t vdim_p;  // v_head_dim rounded up to a whole vector
};

// A per-thread float32 matrix: rows of ld elements (ld a whole number of vectors),
// zero-initialised so that padding columns stay zero.
struct Tile {
  Tile(int64_t rows, int64_t ld_) : ld(ld_), data(rows * ld_, 0.0f) {}
  float* row(int64_t r) { return data.data() + r * ld; }

  int64_t ld;
  std::vector<float> data;
};

// A strided [batch, heads, seq, dim] tensor of dtype dt (Ptr: const void* for
// inputs, void* for outputs); row(b, h, s) is the address of element (b, h, s, 0).
template <class Ptr>
struct Strided4 {
  Ptr data;
  Strides4 st;

  auto row(DType dt, int64_t b, int64_t h, int64_t s) const {
    using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<Ptr>>, const char, char>;
    return static_cast<Byte*>(data) +
           (b * st.s[0] + h * st.s[1] + s * st.s[2]) * int64_t(dtype_size(dt));
  }
};
using Tensor4 = Strided4<const void*>;
using OutTensor4 = Strided4<void*>;

// n elements with element stride `stride` at p, as float32 into out.
inline void load_strided(DType dt, const char* p, int64_t stride, int64_t n, float* out) {
  if (stride == 1) return convert_to_float(dt, p, n, out);
  const int64_t step = stride * int64_t(dtype_size(dt));
  for (int64_t d = 0; d < n; ++d) convert_to_float(dt, p + d * step, 1, out + d);
}

// `rows` rows of n elements (row stride row_stride, element stride stride) at p, as
// float32 rows of leading dimension ld into out; one conversion when they are
// contiguous.
inline void load_rows(DType dt, const char* p, int64_t row_stride, int64_t stride, int64_t rows,
                      int64_t n, float* out, int64_t ld) {
  if (stride == 1 && row_stride == n && ld == n) return convert_to_float(dt, p, rows * n, out);
  for (int64_t r = 0; r < rows; ++r)
    load_strided(dt, p + r * row_stride * int64_t(dtype_size(dt)), stride, n, out + r * ld);
}

// n float32 values to dtype dt at p with element stride `stride`.
inline void store_strided(DType dt, const float* values, int64_t n, char* p, int64_t stride) {
  if (stride == 1) return convert_from_float(dt, values, n, p);
  const int64_t step = stride * int64_t(dtype_size(dt));
  for (int64_t d = 0; d < n; ++d) convert_from_float(dt, values + d, 1, p + d * step);
}

// The inverse of load_rows.
inline void store_rows(DType dt, const float* values, int64_t ld, int64_t rows, int64_t n,
                       char* p, int64_t row_stride, int64_t stride) {
  if (stride == 1 && row_stride == n && ld == n) return convert_from_float(dt, values, rows * n, p);
  for (int64_t r = 0; r < rows; ++r)
    store_strided(dt, values + r * ld, n, p + r * row_stride * int64_t(dtype_size(dt)), stride);
}

// C[M x N] (+)= A[M x K] B[K x N], A(m, k) = a[m * a_m + k * a_k] (so A may be a
// transposed view), B and C row-major with leading dimensions ldb, ldc; N a multiple
// of kLanes. Register tiles of up to 4 rows x 2 vectors: B rows are loaded once per
// k for 4 rows, A elements are broadcast.
template <int kRows, int kVecs>
AXON_INLINE void gemm_tile(int64_t K, const float* a, int64_t a_m, int64_t a_k, const float* b,
                           int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  Vec acc[kRows][kVecs];
  for (int m = 0; m < kRows; ++m)
    for (int v = 0; v < kVecs; ++v)
      acc[m][v] = accumulate ? load(c + m * ldc, VecAt{v * kLanes}) : Vec{};
  for (int64_t k = 0; k < K; ++k) {
    Vec brow[kVecs];
    for (int v = 0; v < kVecs; ++v) brow[v] = load(b + k * ldb, VecAt{v * kLanes});
    for (int m = 0; m < kRows; ++m) {
      const float am = a[m * a_m + k * a_k];
      for (int v = 0; v < kVecs; ++v) acc[m][v] += am * brow[v];
    }
  }
  for (int m = 0; m < kRows; ++m)
    for (int v = 0; v < kVecs; ++v) store(c + m * ldc, VecAt{v * kLanes}, acc[m][v]);
}

template <int kRows>
AXON_INLINE void gemm_rows(int64_t N, int64_t K, const float* a, int64_t a_m, int64_t a_k,
                           const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  int64_t n = 0;
  for (; n + 2 * kLanes <= N; n += 2 * kLanes)
    gemm_tile<kRows, 2>(K, a, a_m, a_k, b + n, ldb, c + n, ldc, accumulate);
  if (n < N) gemm_tile<kRows, 1>(K, a, a_m, a_k, b + n, ldb, c + n, ldc, accumulate);
}

AXON_INLINE void gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_m, int64_t a_k,
                      const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4)
    gemm_rows<4>(N, K, a + m * a_m, a_m, a_k, b, ldb, c + m * ldc, ldc, accumulate);
  for (; m < M; ++m) gemm_rows<1>(N, K, a + m * a_m, a_m, a_k, b, ldb, c + m * ldc, ldc, accumulate);
}

// Transposing 16 x 16 blocks with vector shuffles, in four stages: at stage bs,
// rows r and r + bs exchange their alternate runs of bs elements.
constexpr int transpose_lane(int bs, bool high, int i) {
  const int block = i / bs, chunk = i / (2 * bs) * 2 * bs + (high ? bs : 0);
  return (block % 2 == 0 ? 0 : kLanes) + chunk + i % bs;
}

template <int bs, bool high, size_t... I>
AXON_INLINE Vec interleave(Vec a, Vec b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, transpose_lane(bs, high, int(I))...);
}

template <int bs>
AXON_INLINE void transpose_stage(Vec (&m)[kLanes]) {
  for (int r = 0; r < kLanes; ++r) {
    if (r & bs) continue;
    const Vec a = m[r], b = m[r + bs];
    m[r] = interleave<bs, false>(a, b, std::make_index_sequence<kLanes>());
    m[r + bs] = interleave<bs, true>(a, b, std::make_index_sequence<kLanes>());
  }
}

// dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols.
AXON_INLINE void transpose(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                           int64_t ldd) {
  int64_t r0 = 0;
  for (; r0 + kLanes <= rows; r0 += kLanes) {
    int64_t c0 = 0;
    for (; c0 + kLanes <= cols; c0 += kLanes) {
      Vec m[kLanes];
      for (int r = 0; r < kLanes; ++r) m[r] = load(src + (r0 + r) * lds + c0, VecAt{0});
      transpose_stage<8>(m);
      transpose_stage<4>(m);
      transpose_stage<2>(m);
      transpose_stage<1>(m);
      for (int c = 0; c < kLanes; ++c) store(dst + (c0 + c) * ldd + r0, VecAt{0}, m[c]);
    }
    for (int64_t r = r0; r < r0 + kLanes; ++r)
      for (int64_t c = c0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
  }
  for (int64_t r = r0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}

// C[M x N] = A[M x K] B[N x K]^T by dot products (A, B row-major, K a multiple of
// kLanes, zero-padded): for few rows, where transposing B would cost more than the
// product. Each B row is loaded once for up to 4 rows of A.
template <int kRows>
AXON_INLINE void dot_rows(int64_t K, const float* a, int64_t lda, const float* bn, float* c,
                          int64_t ldc) {
  Vec acc[kRows] = {};
  for (int64_t k = 0; k < K; k += kLanes) {
    const Vec bk = load(bn, VecAt{k});
    for (int m = 0; m < kRows; ++m) acc[m] += load(a + m * lda, VecAt{k}) * bk;
  }
  for (int m = 0; m < kRows; ++m) c[m * ldc] = simd::reduce_add(acc[m]);
}

AXON_INLINE void gemm_nt(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda,
                         const float* b, int64_t ldb, float* c, int64_t ldc) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4)
    for (int64_t n = 0; n < N; ++n) dot_rows<4>(K, a + m * lda, lda, b + n * ldb, c + m * ldc + n, ldc);
  for (; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) dot_rows<1>(K, a + m * lda, lda, b + n * ldb, c + m * ldc + n, ldc);
}

// Dropout (attention_dropout_keep in attention.h; dropout.h states the rule).
struct Dropout {
  Dropout(const AttentionParams& p)
      : enabled(p.dropout_p > 0),
        seed(p.seed),
        offset(p.offset),
        threshold(dropout_threshold(p.dropout_p)),
        scale(dropout_scale(p.dropout_p)) {}

  // Factor of weight `index`: 1 / (1 - p) if kept, 0 if dropped.
  AXON_INLINE float factor(uint64_t index) const {
    return (splitmix64(seed, offset + index) >> 40) >= threshold ? scale : 0.0f;
  }

  bool enabled;
  uint64_t seed, offset, threshold;
  float scale;
};

// Everything that decides which scores count and how: causal, the user mask,
// dropout. Applied to one row of a score tile.
struct ScoreMask {
  ScoreMask(const AttentionShape& s, const AttentionParams& p, const AttentionMask& m)
      : shape(s), causal(p.is_causal), mask(m), dropout(p) {}

  // Keys [0, limit) of the tile starting at key j0 are visible to query i.
  int64_t visible(int64_t i, int64_t j0, int64_t n) const {
    return causal ? std::clamp<int64_t>(i + 1 - j0, 0, n) : n;
  }

  // s[0, n_padded) are the scores of query i (q head h) for keys j0 + j, n <= kBlockK:
  // adds the user mask and sets masked, causally hidden and padding entries to -inf.
  AXON_INLINE void apply(int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n,
                         int64_t n_padded, float* s) const {
    const int64_t limit = visible(i, j0, n);
    for (int64_t j = limit; j < n_padded; ++j) s[j] = kNegInf;
    if (mask.kind == MaskKind::kNone || limit == 0) return;
    const Strides4& ms = mask.strides;
    const int64_t base = b * ms.s[0] + h * ms.s[1] + i * ms.s[2] + j0 * ms.s[3];
    if (mask.kind == MaskKind::kBool) {
      const uint8_t* keep = static_cast<const uint8_t*>(mask.data) + base;
      for (int64_t j = 0; j < limit; ++j)
        if (keep[j * ms.s[3]] == 0) s[j] = kNegInf;
    } else if (mask.dt == DType::kFloat32 && ms.s[3] == 1) {
      const float* add = static_cast<const float*>(mask.data) + base;
      for (int64_t j = 0; j < limit; ++j) s[j] += add[j];
    } else {
      float add[kBlockK];
      load_strided(mask.dt, static_cast<const char*>(mask.data) + base * int64_t(dtype_size(mask.dt)),
                   ms.s[3], limit, add);
      for (int64_t j = 0; j < limit; ++j) s[j] += add[j];
    }
  }

  // True when the mask hides every key of [j0, j0 + n) from query i (q head h):
  // a boolean mask all false, an additive one all -inf (PyTorch's
  // scaled_dot_product_attention turns a boolean mask into that before a
  // fused kernel sees it).
  AXON_INLINE bool hides(int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n) const {
    if (mask.kind == MaskKind::kNone) return false;
    const Strides4& ms = mask.strides;
    const int64_t base = b * ms.s[0] + h * ms.s[1] + i * ms.s[2] + j0 * ms.s[3];
    if (mask.kind == MaskKind::kBool) {
      const uint8_t* keep = static_cast<const uint8_t*>(mask.data) + base;
      for (int64_t j = 0; j < n; ++j)
        if (keep[j * ms.s[3]] != 0) return false;
      return true;
    }
    if (mask.dt == DType::kFloat32) {
      const float* add = static_cast<const float*>(mask.data) + base;
      for (int64_t j = 0; j < n; ++j)
        if (!(add[j * ms.s[3]] == kNegInf)) return false;
      return true;
    }
    // bfloat16 / float16 -inf
    const uint16_t neg_inf = mask.dt == DType::kBFloat16 ? 0xff80 : 0xfc00;
    const uint16_t* add = static_cast<const uint16_t*>(mask.data) + base;
    for (int64_t j = 0; j < n; ++j)
      if (add[j * ms.s[3]] != neg_inf) return false;
    return true;
  }

  // p[0, n) *= dropout factors of (b, h, i, j0 + j).
  AXON_INLINE void drop(int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n, float* p) const {
    const uint64_t index = uint64_t(((b * shape.q_heads + h) * shape.q_len + i) * shape.kv_len + j0);
    for (int64_t j = 0; j < n; ++j) p[j] *= dropout.factor(index + uint64_t(j));
  }

  AttentionShape shape;
  bool causal;
  AttentionMask mask;
  Dropout dropout;
};

}  // namespace axon::kernels::attention
