// RMSNorm and LayerNorm over the last dimension, forward and backward.
// All math is float32. Input rows of x have unit column stride and a row stride
// given in elements; dy, and the x given to the backward, are contiguous [rows, cols];
// outputs y and dx are contiguous [rows, cols] with dtype dt; weight and bias are
// contiguous [cols] with dtype wdt. rows == 0 is a no-op.
#pragma once

#include <cstdint>

#include "axon/kernels/dtype.h"

namespace axon::kernels {

// y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps). rstd: [rows], nullable.
void rms_norm_forward(DType dt, int64_t rows, int64_t cols, const void* x, int64_t x_row_stride,
                      DType wdt, const void* weight, double eps, void* y, float* rstd);

// dx (nullable, dtype dt) and dweight (nullable, float32 [cols], overwritten) from
// dy, x and the rstd saved by the forward.
void rms_norm_backward(DType dt, int64_t rows, int64_t cols, const void* dy, const void* x,
                       DType wdt, const void* weight, const float* rstd, void* dx,
                       float* dweight);

// y = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var(x) + eps) (biased variance).
// mean, rstd: [rows], nullable.
void layer_norm_forward(DType dt, int64_t rows, int64_t cols, const void* x, int64_t x_row_stride,
                        DType wdt, const void* weight, const void* bias, double eps, void* y,
                        float* mean, float* rstd);

// dx (nullable, dtype dt), dweight and dbias (nullable, float32 [cols], overwritten).
void layer_norm_backward(DType dt, int64_t rows, int64_t cols, const void* dy, const void* x,
                         const float* mean, const float* rstd, DType wdt, const void* weight,
                         void* dx, float* dweight, float* dbias);

}  // namespace axon::kernels
