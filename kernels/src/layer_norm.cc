// LayerNorm over float32 rows (float_rows.h). Forward, per row, three passes while
// the row is in cache: mean, then the variance of x - mean (two-pass, so no
// cancellation), then y = (x - mean) * rstd * w + b. Backward, with
// xhat = (x - mean) * rstd and g = dy * w:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
// dweight = sum over rows of dy * xhat, dbias = sum of dy, summed per fixed row
// block and then over blocks (deterministic whatever the thread split).
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

struct Moments {
  float mean, rstd;
};

AXON_SIMD Moments forward_row(const float* x, const float* w, const float* b, int64_t n,
                              float eps, float* y) {
  const float mean = simd::sum_of(n, [&](auto j) AXON_INLINE_LAMBDA { return load(x, j); }) / float(n);
  const float var = simd::sum_of(n, [&](auto j) AXON_INLINE_LAMBDA {
                      const auto d = load(x, j) - mean;
                      return d * d;
                    }) / float(n);
  const float rstd = 1.0f / std::sqrt(var + eps);
  simd::for_each(n, [&](auto j) AXON_INLINE_LAMBDA {
    store(y, j, (load(x, j) - mean) * rstd * load(w, j) + load(b, j));
  });
  return {mean, rstd};
}

AXON_SIMD void backward_dx_row(const float* dy, const float* x, const float* w, Moments m,
                               int64_t n, float* dx) {
  const float mean_g = simd::sum_of(n, [&](auto j) AXON_INLINE_LAMBDA {
                         return load(dy, j) * load(w, j);
                       }) / float(n);
  const float mean_gx = simd::sum_of(n, [&](auto j) AXON_INLINE_LAMBDA {
                          return load(dy, j) * load(w, j) * ((load(x, j) - m.mean) * m.rstd);
                        }) / float(n);
  simd::for_each(n, [&](auto j) AXON_INLINE_LAMBDA {
    const auto xhat = (load(x, j) - m.mean) * m.rstd;
    store(dx, j, m.rstd * (load(dy, j) * load(w, j) - mean_g - xhat * mean_gx));
  });
}

AXON_SIMD void accumulate_dweight(const float* dy, const float* x, Moments m, int64_t n,
                                  float* dw) {
  simd::for_each(n, [&](auto j) AXON_INLINE_LAMBDA {
    store(dw, j, load(dw, j) + load(dy, j) * ((load(x, j) - m.mean) * m.rstd));
  });
}

AXON_SIMD void accumulate_dbias(const float* dy, int64_t n, float* db) {
  simd::for_each(n, [&](auto j) AXON_INLINE_LAMBDA { store(db, j, load(db, j) + load(dy, j)); });
}

}  // namespace

void layer_norm_forward(DType dt, int64_t rows, int64_t cols, const void* x, int64_t x_row_stride,
                        DType wdt, const void* weight, const void* bias, double eps, void* y,
                        float* mean, float* rstd) {
  if (rows <= 0) return;
  const std::vector<float> w = float_weights(wdt, weight, cols, 1.0f);
  const std::vector<float> b = float_weights(wdt, bias, cols, 0.0f);
  parallel_for(0, rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    std::vector<float> scratch = row_scratch(dt, 2, cols);
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = load_row(dt, row_ptr(dt, x, r * x_row_stride), cols, scratch.data());
      void* y_row = row_ptr(dt, y, r * cols);
      float* yr = output_row(dt, y_row, scratch.data() + cols);
      const Moments m = forward_row(xr, w.data(), b.data(), cols, float(eps), yr);
      store_row(dt, yr, cols, y_row);
      if (mean != nullptr) mean[r] = m.mean;
      if (rstd != nullptr) rstd[r] = m.rstd;
    }
  });
}

void layer_norm_backward(DType dt, int64_t rows, int64_t cols, const void* dy, const void* x,
                         const float* mean, const float* rstd, DType wdt, const void* weight,
                         void* dx, float* dweight, float* dbias) {
  const std::vector<float> w = float_weights(wdt, weight, cols, 1.0f);
  const RowBlocks blocks(rows);
  std::vector<float> dw_partials(dweight != nullptr ? blocks.count * cols : 0, 0.0f);
  std::vector<float> db_partials(dbias != nullptr ? blocks.count * cols : 0, 0.0f);
  parallel_for(0, blocks.count, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> scratch = row_scratch(dt, 3, cols);
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t r = blocks.begin(b); r < blocks.end(b); ++r) {
        const float* dyr = load_row(dt, row_ptr(dt, dy, r * cols), cols, scratch.data());
        const float* xr = load_row(dt, row_ptr(dt, x, r * cols), cols, scratch.data() + cols);
        const Moments m{mean[r], rstd[r]};
        if (dx != nullptr) {
          void* dx_row = row_ptr(dt, dx, r * cols);
          float* dxr = output_row(dt, dx_row, scratch.data() + 2 * cols);
          backward_dx_row(dyr, xr, w.data(), m, cols, dxr);
          store_row(dt, dxr, cols, dx_row);
        }
        if (dweight != nullptr) accumulate_dweight(dyr, xr, m, cols, &dw_partials[b * cols]);
        if (dbias != nullptr) accumulate_dbias(dyr, cols, &db_partials[b * cols]);
      }
    }
  });
  if (dweight != nullptr) sum_partials(dw_partials.data(), blocks.count, cols, dweight);
  if (dbias != nullptr) sum_partials(db_partials.data(), blocks.count, cols, dbias);
}

}  // namespace axon::kernels
