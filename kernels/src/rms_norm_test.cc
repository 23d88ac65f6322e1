#include <cmath>
#include <vector>

#include "axon/kernels/norm.h"
#include "test_util.h"

namespace axon::kernels {
namespace {

using testing::Buffer;
using testing::expect_close;
using testing::random_floats;
using testing::rounded;

constexpr double kEps = 1e-5;

struct Shape {
  int64_t rows, cols, row_stride;
};

double reference_rstd(const float* x, int64_t cols) {
  double ss = 0;
  for (int64_t j = 0; j < cols; ++j) ss += double(x[j]) * x[j];
  return 1.0 / std::sqrt(ss / double(cols) + kEps);
}

class RmsNorm : public testing::KernelTest {};

TEST_P(RmsNorm, ForwardMatchesReference) {
  for (Shape s : {Shape{4, 1, 1}, Shape{3, 3, 5}, Shape{5, 17, 17}, Shape{7, 1000, 1003},
                  Shape{33, 64, 64}}) {
    for (bool with_weight : {true, false}) {
      SCOPED_TRACE(::testing::Message() << s.rows << "x" << s.cols << " stride " << s.row_stride
                                      << " weight " << with_weight);
      const std::vector<float> x = rounded(dt(), random_floats(s.rows * s.row_stride, 1, -2, 2));
      const std::vector<float> w = random_floats(s.cols, 2, 0.5f, 1.5f);  // float32 weight
      Buffer xb(dt(), x), y(dt(), s.rows * s.cols);
      std::vector<float> rstd(s.rows);
      rms_norm_forward(dt(), s.rows, s.cols, xb.data(), s.row_stride, DType::kFloat32,
                       with_weight ? w.data() : nullptr, kEps, y.data(), rstd.data());
      std::vector<double> y_ref, rstd_ref;
      for (int64_t r = 0; r < s.rows; ++r) {
        const float* xr = x.data() + r * s.row_stride;
        const double rs = reference_rstd(xr, s.cols);
        rstd_ref.push_back(rs);
        for (int64_t j = 0; j < s.cols; ++j) y_ref.push_back(xr[j] * rs * (with_weight ? w[j] : 1));
      }
      expect_close(y.floats(), y_ref, tol(), "y");
      expect_close(rstd, rstd_ref, 1e-5, "rstd");
    }
  }
}

TEST_P(RmsNorm, WeightInActivationDtype) {
  const int64_t rows = 6, cols = 40;
  const std::vector<float> x = rounded(dt(), random_floats(rows * cols, 3));
  const std::vector<float> w = rounded(dt(), random_floats(cols, 4));
  Buffer xb(dt(), x), wb(dt(), w), y(dt(), rows * cols);
  rms_norm_forward(dt(), rows, cols, xb.data(), cols, dt(), wb.data(), kEps, y.data(), nullptr);
  std::vector<double> y_ref;
  for (int64_t r = 0; r < rows; ++r) {
    const double rs = reference_rstd(x.data() + r * cols, cols);
    for (int64_t j = 0; j < cols; ++j) y_ref.push_back(x[r * cols + j] * rs * w[j]);
  }
  expect_close(y.floats(), y_ref, tol(), "y");
}

TEST_P(RmsNorm, BackwardMatchesReference) {
  for (Shape s : {Shape{4, 1, 1}, Shape{3, 3, 3}, Shape{5, 17, 17}, Shape{7, 1000, 1000},
                  Shape{130, 24, 24}}) {
    for (bool with_weight : {true, false}) {
      SCOPED_TRACE(::testing::Message() << s.rows << "x" << s.cols << " weight " << with_weight);
      const int64_t n = s.rows * s.cols;
      const std::vector<float> x = rounded(dt(), random_floats(n, 5, -2, 2));
      const std::vector<float> dy = rounded(dt(), random_floats(n, 6));
      const std::vector<float> w = rounded(dt(), random_floats(s.cols, 7, 0.5f, 1.5f));
      Buffer xb(dt(), x), dyb(dt(), dy), wb(dt(), w), dx(dt(), n);
      std::vector<float> rstd(s.rows), dw(s.cols, 123.0f);
      for (int64_t r = 0; r < s.rows; ++r) rstd[r] = float(reference_rstd(&x[r * s.cols], s.cols));
      const void* weight = with_weight ? wb.data() : nullptr;
      rms_norm_backward(dt(), s.rows, s.cols, dyb.data(), xb.data(), dt(), weight, rstd.data(),
                        dx.data(), dw.data());
      std::vector<double> dx_ref(n), dw_ref(s.cols, 0.0);
      for (int64_t r = 0; r < s.rows; ++r) {
        const float* xr = &x[r * s.cols];
        const float* dyr = &dy[r * s.cols];
        const double rs = rstd[r];
        double dot = 0;
        for (int64_t j = 0; j < s.cols; ++j) dot += double(dyr[j]) * (with_weight ? w[j] : 1) * xr[j];
        for (int64_t j = 0; j < s.cols; ++j) {
          dx_ref[r * s.cols + j] =
              rs * dyr[j] * (with_weight ? w[j] : 1) - xr[j] * rs * rs * rs / s.cols * dot;
          dw_ref[j] += double(dyr[j]) * xr[j] * rs;
        }
      }
      expect_close(dx.floats(), dx_ref, tol(), "dx");
      expect_close(dw, dw_ref, 1e-5, "dweight");

      // Either output alone gives the same values.
      Buffer dx_only(dt(), n);
      rms_norm_backward(dt(), s.rows, s.cols, dyb.data(), xb.data(), dt(), weight, rstd.data(),
                        dx_only.data(), nullptr);
      EXPECT_TRUE(testing::same_bytes(dx_only, dx));
      std::vector<float> dw_only(s.cols);
      rms_norm_backward(dt(), s.rows, s.cols, dyb.data(), xb.data(), dt(), weight, rstd.data(),
                        nullptr, dw_only.data());
      EXPECT_EQ(dw_only, dw);
    }
  }
}

TEST_P(RmsNorm, EmptyInputIsNoOp) {
  Buffer y(dt(), 4);
  const Buffer before = y;
  rms_norm_forward(dt(), 0, 4, nullptr, 4, dt(), nullptr, kEps, y.data(), nullptr);
  EXPECT_TRUE(testing::same_bytes(y, before));
  std::vector<float> dw(4, 1.0f);
  rms_norm_backward(dt(), 0, 4, nullptr, nullptr, dt(), nullptr, nullptr, nullptr, dw.data());
  EXPECT_EQ(dw, std::vector<float>(4, 0.0f));  // a sum over no rows
}

TEST_P(RmsNorm, ResultsDoNotDependOnThreadSplit) {
  const int64_t rows = 300, cols = 96;
  const std::vector<float> x = random_floats(rows * cols, 8), dy = random_floats(rows * cols, 9);
  Buffer xb(dt(), x), dyb(dt(), dy), y(dt(), rows * cols), dx(dt(), rows * cols);
  std::vector<float> rstd(rows), dw(cols);
  rms_norm_forward(dt(), rows, cols, xb.data(), cols, dt(), nullptr, kEps, y.data(), rstd.data());
  rms_norm_backward(dt(), rows, cols, dyb.data(), xb.data(), dt(), nullptr, rstd.data(), dx.data(),
                    dw.data());
  testing::ScopedBackend serial(false);
  Buffer y1(dt(), rows * cols), dx1(dt(), rows * cols);
  std::vector<float> rstd1(rows), dw1(cols);
  rms_norm_forward(dt(), rows, cols, xb.data(), cols, dt(), nullptr, kEps, y1.data(), rstd1.data());
  rms_norm_backward(dt(), rows, cols, dyb.data(), xb.data(), dt(), nullptr, rstd1.data(),
                    dx1.data(), dw1.data());
  EXPECT_TRUE(testing::same_bytes(y, y1));
  EXPECT_TRUE(testing::same_bytes(dx, dx1));
  EXPECT_EQ(rstd, rstd1);
  EXPECT_EQ(dw, dw1);
}

INSTANTIATE_TEST_SUITE_P(All, RmsNorm, ::testing::ValuesIn(testing::all_configs()),
                         testing::config_name);

}  // namespace
}  // namespace axon::kernels
