#include "norm_util.h"

#include <algorithm>

#include "simd.h"

namespace axon::kernels {
namespace {

// At most this many blocks (partial rows): enough to spread over the threads.
constexpr int64_t kMaxBlocks = 64;

AXON_SIMD void sum_partials_simd(const float* partials, int64_t blocks, int64_t cols,
                                 float* out) {
  std::copy(partials, partials + cols, out);
  for (int64_t b = 1; b < blocks; ++b) {
    const float* p = partials + b * cols;
    simd::for_each(cols, [&](auto j) AXON_INLINE_LAMBDA {
      simd::store(out, j, simd::load(out, j) + simd::load(p, j));
    });
  }
}

}  // namespace

std::vector<float> float_weights(DType wdt, const void* weight, int64_t cols, float fill) {
  std::vector<float> w(cols, fill);
  if (weight != nullptr) convert_to_float(wdt, weight, cols, w.data());
  return w;
}

RowBlocks::RowBlocks(int64_t rows_)
    : rows(rows_),
      block_rows(std::max<int64_t>(1, (rows_ + kMaxBlocks - 1) / kMaxBlocks)),
      count((rows_ + block_rows - 1) / block_rows) {}

void sum_partials(const float* partials, int64_t blocks, int64_t cols, float* out) {
  if (blocks == 0) {
    std::fill(out, out + cols, 0.0f);
  } else {
    sum_partials_simd(partials, blocks, cols, out);
  }
}

}  // namespace axon::kernels
