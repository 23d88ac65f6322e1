// A linear layer for a few rows: out = a @ w^T (+ bias), the matrix-vector
// products of decoding.  Memory-bound: each weight row is read once for all
// rows of `a`, with 16-lane dot products (BLAS GEMV routines read a
// transposed weight far below memory bandwidth on these CPUs).
#pragma once

#include <cstdint>

#include "axon/kernels/dtype.h"

namespace axon::kernels {

// Rows of `a` a call handles (more rows: use a GEMM).
constexpr int64_t kLinearMaxRows = 8;

// a: [m, k] rows (row stride lda, unit column stride); w: [n, k] rows (row
// stride ldw); bias: [n] or nullptr; out: [m, n] (row stride ldo).  float32;
// 1 <= m <= kLinearMaxRows.
void linear_small_m(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                    const float* w, int64_t ldw, const float* bias, float* out, int64_t ldo);

// The same in any DType: a, w, bias (or nullptr) and out all of type dt (strides
// in elements).  bfloat16 / float16 accumulate in float32 and round each output
// (plus bias) once.
void linear_small_m(DType dt, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                    const void* w, int64_t ldw, const void* bias, void* out, int64_t ldo);

}  // namespace axon::kernels
