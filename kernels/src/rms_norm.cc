// RMSNorm over float32 rows (float_rows.h). Forward, per row: one pass for the sum
// of squares, one to write y = x * rstd * w while the row is still in cache.
// Backward, per row:
//   dx = rstd * dy * w - x * rstd^3 / cols * sum(dy * w * x),
// and dweight = sum over rows of dy * x * rstd, summed per fixed row block, then over
// blocks (deterministic whatever the thread split). Rows spread with parallel_for.
#include <cmath>
#include <vector>

#include "axon/kernels/norm.h"
#include "axon/kernels/parallel.h"
#include "float_rows.h"
#include "norm_util.h"
#include "simd.h"

namespace axon::kernels {
namespace {

using simd::load;
using simd::store;

// y = x * rstd * w; returns rstd.
AXON_SIMD float forward_row(const float* x, const float* w, int64_t n, float eps, float* y) {
  const float sum_sq = simd::sum_of(n, [&](auto j) AXON_INLINE_LAMBDA {
    const auto v = load(x, j);
    return v * v;
  });
  const float rstd = 1.0f / std::sqrt(sum_sq / float(n) + eps);
  simd::for_each(n, [&](auto j) AXON_INLINE_LAMBDA {
    store(y, j, load(x, j) * rstd * load(w, j));
  });
  return rstd;
}

AXON_SIMD void backward_dx_row(const float* dy, const float* x, const float* w, float rstd,
                               int64_t n, float* dx) {
  const float dot = simd::sum_of(n, [&](auto j) AXON_INLINE_LAMBDA {
    return load(dy, j) * load(w, j) * load(x, j);
  });
  const float c = rstd * rstd * rstd * dot / float(n);
  simd::for_each(n, [&](auto j) AXON_INLINE_LAMBDA {
    store(dx, j, rstd * load(dy, j) * load(w, j) - c * load(x, j));
  });
}

AXON_SIMD void accumulate_dweight(const float* dy, const float* x, float rstd, int64_t n,
                                  float* dw) {
  simd::for_each(n, [&](auto j) AXON_INLINE_LAMBDA {
    store(dw, j, load(dw, j) + load(dy, j) * load(x, j) * rstd);
  });
}

}  // namespace

void rms_norm_forward(DType dt, int64_t rows, int64_t cols, const void* x, int64_t x_row_stride,
                      DType wdt, const void* weight, double eps, void* y, float* rstd) {
  if (rows <= 0) return;
  const std::vector<float> w = float_weights(wdt, weight, cols, 1.0f);
  parallel_for(0, rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    std::vector<float> scratch = row_scratch(dt, 2, cols);
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = load_row(dt, row_ptr(dt, x, r * x_row_stride), cols, scratch.data());
      void* y_row = row_ptr(dt, y, r * cols);
      float* yr = output_row(dt, y_row, scratch.data() + cols);
      const float rs = forward_row(xr, w.data(), cols, float(eps), yr);
      store_row(dt, yr, cols, y_row);
      if (rstd != nullptr) rstd[r] = rs;
    }
  });
}

void rms_norm_backward(DType dt, int64_t rows, int64_t cols, const void* dy, const void* x,
                       DType wdt, const void* weight, const float* rstd, void* dx,
                       float* dweight) {
  const std::vector<float> w = float_weights(wdt, weight, cols, 1.0f);
  const RowBlocks blocks(rows);
  std::vector<float> partials(dweight != nullptr ? blocks.count * cols : 0, 0.0f);
  parallel_for(0, blocks.count, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> scratch = row_scratch(dt, 3, cols);
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t r = blocks.begin(b); r < blocks.end(b); ++r) {
        const float* dyr = load_row(dt, row_ptr(dt, dy, r * cols), cols, scratch.data());
        const float* xr = load_row(dt, row_ptr(dt, x, r * cols), cols, scratch.data() + cols);
        if (dx != nullptr) {
          void* dx_row = row_ptr(dt, dx, r * cols);
          float* dxr = output_row(dt, dx_row, scratch.data() + 2 * cols);
          backward_dx_row(dyr, xr, w.data(), rstd[r], cols, dxr);
          store_row(dt, dxr, cols, dx_row);
        }
        if (dweight != nullptr) accumulate_dweight(dyr, xr, rstd[r], cols, &partials[b * cols]);
      }
    }
  });
  if (dweight != nullptr) sum_partials(partials.data(), blocks.count, cols, dweight);
}

}  // namespace axon::kernels
