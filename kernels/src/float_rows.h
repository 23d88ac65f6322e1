// Kernels compute on float32 rows: a row of another dtype is converted into a
// scratch row first (one vectorised pass in cache), and results are computed into a
// scratch row and converted back. float32 rows are used in place.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "axon/kernels/dtype.h"

namespace axon::kernels {

// The n elements at `row` as float32: `row` itself for float32, else converted into
// scratch (n floats).
inline const float* load_row(DType dt, const void* row, int64_t n, float* scratch) {
  if (dt == DType::kFloat32) return static_cast<const float*>(row);
  convert_to_float(dt, row, n, scratch);
  return scratch;
}

// An in/out row as float32: `row` itself for float32, else converted into scratch;
// store_row writes it back.
inline float* load_row(DType dt, void* row, int64_t n, float* scratch) {
  if (dt == DType::kFloat32) return static_cast<float*>(row);
  convert_to_float(dt, row, n, scratch);
  return scratch;
}

// Where to compute an output row: the row itself for float32, else scratch.
inline float* output_row(DType dt, void* row, float* scratch) {
  return dt == DType::kFloat32 ? static_cast<float*>(row) : scratch;
}

// Writes a row computed at output_row(dt, row, ...) to row.
inline void store_row(DType dt, const float* values, int64_t n, void* row) {
  if (dt != DType::kFloat32) convert_from_float(dt, values, n, row);
}

// Scratch for `rows` float rows of n elements, allocated only for dtypes that need it.
inline std::vector<float> row_scratch(DType dt, int64_t rows, int64_t n) {
  return std::vector<float>(dt == DType::kFloat32 ? 0 : rows * n);
}

// Rows per parallel_for chunk: about 32K elements.
inline int64_t row_grain(int64_t cols) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, cols));
}

// Element i of a typed row pointer.
inline const char* row_ptr(DType dt, const void* base, int64_t i) {
  return static_cast<const char*>(base) + i * int64_t(dtype_size(dt));
}
inline char* row_ptr(DType dt, void* base, int64_t i) {
  return static_cast<char*>(base) + i * int64_t(dtype_size(dt));
}

}  // namespace axon::kernels
