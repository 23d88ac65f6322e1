// Softmax and log-softmax over the last dimension. x rows have unit column stride
// and a row stride in elements; y, dy, dx are contiguous [rows, cols]; all of dtype
// dt, math in float32. rows == 0 is a no-op.
#pragma once

#include <cstdint>

#include "axon/kernels/dtype.h"

namespace axon::kernels {

// y = softmax(x) or, if log, log_softmax(x).
void softmax_forward(DType dt, int64_t rows, int64_t cols, const void* x, int64_t x_row_stride,
                     void* y, bool log);

// From the forward's output y: softmax: dx = y * (dy - sum(dy * y));
// log_softmax: dx = dy - exp(y) * sum(dy).
void softmax_backward(DType dt, int64_t rows, int64_t cols, const void* dy, const void* y,
                      void* dx, bool log);

}  // namespace axon::kernels
