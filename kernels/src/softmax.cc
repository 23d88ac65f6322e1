// Softmax and log-softmax over float32 rows (float_rows.h), one row at a time while
// it is in cache. Softmax: m = max(x); y = exp(x - m) and s = sum(y) in one pass;
// y *= 1 / s. Log-softmax: m, then s = sum(exp(x - m)), y = (x - m) - log(s).
// exp is simd::exp, a vectorised polynomial. Backward, per row:
//   softmax: dx = y * (dy - sum(dy * y)); log-softmax: dx = dy - exp(y) * sum(dy).
#include <cmath>
#include <vector>

#include "axon/kernels/parallel.h"
#include "axon/kernels/softmax.h"
#include "float_rows.h"
#include "simd.h"

namespace axon::kernels {
namespace {

using simd::load;
using simd::store;

AXON_SIMD void softmax_row(const float* x, int64_t n, float* y) {
  const float m = simd::max_of(n, [&](auto j) AXON_INLINE_LAMBDA { return load(x, j); });
  const float s = simd::sum_of(n, [&](auto j) AXON_INLINE_LAMBDA {
    const auto e = simd::exp(load(x, j) - m);
    store(y, j, e);
    return e;
  });
  const float inv = 1.0f / s;
  simd::for_each(n, [&](auto j) AXON_INLINE_LAMBDA { store(y, j, load(y, j) * inv); });
}

AXON_SIMD void log_softmax_row(const float* x, int64_t n, float* y) {
  const float m = simd::max_of(n, [&](auto j) AXON_INLINE_LAMBDA { return load(x, j); });
  const float s = simd::sum_of(n, [&](auto j) AXON_INLINE_LAMBDA {
    return simd::exp(load(x, j) - m);
  });
  // (x - m) - log(s), not x - (m + log(s)): next to a large m, m + log(s)
  // rounds log(s) away (log_softmax([1e7, 1e7 + 1, ...]) would end in 0).
  const float ls = std::log(s);
  simd::for_each(n, [&](auto j) AXON_INLINE_LAMBDA { store(y, j, (load(x, j) - m) - ls); });
}

AXON_SIMD void softmax_backward_row(const float* dy, const float* y, int64_t n, float* dx) {
  const float s = simd::sum_of(n, [&](auto j) AXON_INLINE_LAMBDA {
    return load(dy, j) * load(y, j);
  });
  simd::for_each(n, [&](auto j) AXON_INLINE_LAMBDA {
    store(dx, j, load(y, j) * (load(dy, j) - s));
  });
}

AXON_SIMD void log_softmax_backward_row(const float* dy, const float* y, int64_t n, float* dx) {
  const float s = simd::sum_of(n, [&](auto j) AXON_INLINE_LAMBDA { return load(dy, j); });
  simd::for_each(n, [&](auto j) AXON_INLINE_LAMBDA {
    store(dx, j, load(dy, j) - simd::exp(load(y, j)) * s);
  });
}

}  // namespace

void softmax_forward(DType dt, int64_t rows, int64_t cols, const void* x, int64_t x_row_stride,
                     void* y, bool log) {
  parallel_for(0, rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    std::vector<float> scratch = row_scratch(dt, 2, cols);
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = load_row(dt, row_ptr(dt, x, r * x_row_stride), cols, scratch.data());
      void* y_row = row_ptr(dt, y, r * cols);
      float* yr = output_row(dt, y_row, scratch.data() + cols);
      (log ? log_softmax_row : softmax_row)(xr, cols, yr);
      store_row(dt, yr, cols, y_row);
    }
  });
}

void softmax_backward(DType dt, int64_t rows, int64_t cols, const void* dy, const void* y,
                      void* dx, bool log) {
  parallel_for(0, rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    std::vector<float> scratch = row_scratch(dt, 3, cols);
    for (int64_t r = r0; r < r1; ++r) {
      const float* dyr = load_row(dt, row_ptr(dt, dy, r * cols), cols, scratch.data());
      const float* yr = load_row(dt, row_ptr(dt, y, r * cols), cols, scratch.data() + cols);
      void* dx_row = row_ptr(dt, dx, r * cols);
      float* dxr = output_row(dt, dx_row, scratch.data() + 2 * cols);
      (log ? log_softmax_backward_row : softmax_backward_row)(dyr, yr, cols, dxr);
      store_row(dt, dxr, cols, dx_row);
    }
  });
}

}  // namespace axon::kernels
