#include <cmath>
#include <limits>
#include <vector>

#include "axon/kernels/softmax.h"
#include "simd.h"
#include "test_util.h"

namespace axon::kernels {
namespace {

using testing::Buffer;
using testing::expect_close;
using testing::random_floats;
using testing::rounded;

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(SimdExp, MatchesStdExp) {
  for (float x = -87.0f; x <= 88.0f; x += 0.01f) {
    const double expected = std::exp(double(x));
    ASSERT_NEAR(simd::exp(x), expected, 3e-7 * expected) << x;
  }
  EXPECT_EQ(simd::exp(-kInf), 0.0f);
  EXPECT_EQ(simd::exp(-100.0f), 0.0f);
  EXPECT_EQ(simd::exp(0.0f), 1.0f);
  EXPECT_EQ(simd::exp(kInf), kInf);
  EXPECT_TRUE(std::isnan(simd::exp(std::numeric_limits<float>::quiet_NaN())));
}

struct Shape {
  int64_t rows, cols, row_stride;
};

std::vector<double> reference_softmax(const std::vector<float>& x, Shape s, bool log) {
  std::vector<double> y;
  for (int64_t r = 0; r < s.rows; ++r) {
    const float* xr = &x[r * s.row_stride];
    double m = -INFINITY, sum = 0;
    for (int64_t j = 0; j < s.cols; ++j) m = std::max(m, double(xr[j]));
    for (int64_t j = 0; j < s.cols; ++j) sum += std::exp(xr[j] - m);
    for (int64_t j = 0; j < s.cols; ++j)
      y.push_back(log ? xr[j] - m - std::log(sum) : std::exp(xr[j] - m) / sum);
  }
  return y;
}

class Softmax : public testing::KernelTest {};

TEST_P(Softmax, ForwardMatchesReference) {
  for (Shape s : {Shape{4, 1, 1}, Shape{3, 3, 5}, Shape{5, 17, 17}, Shape{7, 1000, 1003},
                  Shape{33, 64, 64}}) {
    for (bool log : {false, true}) {
      SCOPED_TRACE(::testing::Message() << s.rows << "x" << s.cols << " stride " << s.row_stride
                                        << " log " << log);
      std::vector<float> x = random_floats(s.rows * s.row_stride, 1, -30, 30);
      if (s.cols > 2) x[1] = x[s.row_stride + 2] = -kInf;  // masked entries
      x = rounded(dt(), x);
      Buffer xb(dt(), x), y(dt(), s.rows * s.cols);
      softmax_forward(dt(), s.rows, s.cols, xb.data(), s.row_stride, y.data(), log);
      // log-softmax values are large: compare relative to the row's scale.
      expect_close(y.floats(), reference_softmax(x, s, log), log ? 4 * tol() : tol(), "y");
    }
  }
}

TEST_P(Softmax, InPlace) {
  const Shape s{6, 50, 50};
  const std::vector<float> x = rounded(dt(), random_floats(s.rows * s.cols, 2, -5, 5));
  for (bool log : {false, true}) {
    Buffer xy(dt(), x);
    softmax_forward(dt(), s.rows, s.cols, xy.data(), s.cols, xy.data(), log);
    expect_close(xy.floats(), reference_softmax(x, s, log), 4 * tol(), "y");
  }
}

TEST_P(Softmax, BackwardMatchesReference) {
  for (Shape s : {Shape{4, 1, 1}, Shape{3, 3, 3}, Shape{5, 17, 17}, Shape{7, 1000, 1000}}) {
    for (bool log : {false, true}) {
      SCOPED_TRACE(::testing::Message() << s.rows << "x" << s.cols << " log " << log);
      const int64_t n = s.rows * s.cols;
      const std::vector<float> x = random_floats(n, 3, -4, 4);
      const std::vector<double> y64 = reference_softmax(x, s, log);
      const std::vector<float> y = rounded(dt(), std::vector<float>(y64.begin(), y64.end()));
      const std::vector<float> dy = rounded(dt(), random_floats(n, 4));
      Buffer yb(dt(), y), dyb(dt(), dy), dx(dt(), n);
      softmax_backward(dt(), s.rows, s.cols, dyb.data(), yb.data(), dx.data(), log);
      std::vector<double> dx_ref;
      for (int64_t r = 0; r < s.rows; ++r) {
        const float* yr = &y[r * s.cols];
        const float* dyr = &dy[r * s.cols];
        double sum = 0;
        for (int64_t j = 0; j < s.cols; ++j) sum += log ? dyr[j] : double(dyr[j]) * yr[j];
        for (int64_t j = 0; j < s.cols; ++j)
          dx_ref.push_back(log ? dyr[j] - std::exp(double(yr[j])) * sum : yr[j] * (dyr[j] - sum));
      }
      expect_close(dx.floats(), dx_ref, tol(), "dx");
    }
  }
}

TEST_P(Softmax, EmptyInputIsNoOp) {
  Buffer y(dt(), 4);
  const Buffer before = y;
  softmax_forward(dt(), 0, 4, nullptr, 4, y.data(), false);
  softmax_backward(dt(), 0, 4, nullptr, nullptr, y.data(), true);
  EXPECT_TRUE(testing::same_bytes(y, before));
}

TEST_P(Softmax, ResultsDoNotDependOnThreadSplit) {
  const int64_t rows = 1000, cols = 70;
  const std::vector<float> x = random_floats(rows * cols, 5, -3, 3);
  Buffer xb(dt(), x), y(dt(), rows * cols), dx(dt(), rows * cols), y1 = y, dx1 = dx;
  softmax_forward(dt(), rows, cols, xb.data(), cols, y.data(), false);
  softmax_backward(dt(), rows, cols, xb.data(), y.data(), dx.data(), false);
  testing::ScopedBackend serial(false);
  softmax_forward(dt(), rows, cols, xb.data(), cols, y1.data(), false);
  softmax_backward(dt(), rows, cols, xb.data(), y1.data(), dx1.data(), false);
  EXPECT_TRUE(testing::same_bytes(y, y1));
  EXPECT_TRUE(testing::same_bytes(dx, dx1));
}

INSTANTIATE_TEST_SUITE_P(All, Softmax, ::testing::ValuesIn(testing::all_configs()),
                         testing::config_name);

}  // namespace
}  // namespace axon::kernels
