// Shared by the norm kernels: float copies of weights, and per-column sums over
// rows (dweight, dbias) that are deterministic whatever the thread split.
#pragma once

#include <cstdint>
#include <vector>

#include "axon/kernels/dtype.h"

namespace axon::kernels {

// weight as float32 [cols]; `fill` for every column if weight is null.
std::vector<float> float_weights(DType wdt, const void* weight, int64_t cols, float fill);

// Rows cut into fixed blocks that depend only on the row count: each block sums its
// rows into its own partial row, then the partials are added in block order.
struct RowBlocks {
  explicit RowBlocks(int64_t rows);
  int64_t begin(int64_t block) const { return block * block_rows; }
  int64_t end(int64_t block) const { return block + 1 == count ? rows : begin(block + 1); }

  int64_t rows, block_rows, count;
};

// out[j] = sum over b < blocks of partials[b * cols + j].
void sum_partials(const float* partials, int64_t blocks, int64_t cols, float* out);

}  // namespace axon::kernels
