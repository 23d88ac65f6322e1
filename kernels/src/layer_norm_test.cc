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

struct Moments {
  double mean, rstd;
};

Moments reference_moments(const float* x, int64_t cols) {
  double mean = 0, var = 0;
  for (int64_t j = 0; j < cols; ++j) mean += x[j];
  mean /= double(cols);
  for (int64_t j = 0; j < cols; ++j) var += (x[j] - mean) * (x[j] - mean);
  return {mean, 1.0 / std::sqrt(var / double(cols) + kEps)};
}

class LayerNorm : public testing::KernelTest {};

TEST_P(LayerNorm, ForwardMatchesReference) {
  for (Shape s : {Shape{4, 1, 1}, Shape{3, 3, 5}, Shape{5, 17, 17}, Shape{7, 1000, 1003},
                  Shape{33, 64, 64}}) {
    for (int affine = 0; affine < 3; ++affine) {  // weight and bias, weight only, neither
      SCOPED_TRACE(::testing::Message() << s.rows << "x" << s.cols << " stride " << s.row_stride
                                        << " affine " << affine);
      // An offset mean checks the variance is computed without cancellation.
      const std::vector<float> x = rounded(dt(), random_floats(s.rows * s.row_stride, 1, 2, 6));
      const std::vector<float> w = random_floats(s.cols, 2, 0.5f, 1.5f);
      const std::vector<float> b = random_floats(s.cols, 3);
      Buffer xb(dt(), x), y(dt(), s.rows * s.cols);
      std::vector<float> mean(s.rows), rstd(s.rows);
      layer_norm_forward(dt(), s.rows, s.cols, xb.data(), s.row_stride, DType::kFloat32,
                         affine < 2 ? w.data() : nullptr, affine < 1 ? b.data() : nullptr, kEps,
                         y.data(), mean.data(), rstd.data());
      std::vector<double> y_ref, mean_ref, rstd_ref;
      for (int64_t r = 0; r < s.rows; ++r) {
        const float* xr = x.data() + r * s.row_stride;
        const Moments m = reference_moments(xr, s.cols);
        mean_ref.push_back(m.mean);
        rstd_ref.push_back(m.rstd);
        for (int64_t j = 0; j < s.cols; ++j)
          y_ref.push_back((xr[j] - m.mean) * m.rstd * (affine < 2 ? w[j] : 1) + (affine < 1 ? b[j] : 0));
      }
      expect_close(y.floats(), y_ref, tol(), "y");
      expect_close(mean, mean_ref, 1e-5, "mean");
      // rstd amplifies the rounding of the row's deviations from its mean.
      expect_close(rstd, rstd_ref, s.cols == 1 ? 1e-2 : 1e-4, "rstd");
    }
  }
}

TEST_P(LayerNorm, BackwardMatchesReference) {
  for (Shape s : {Shape{4, 1, 1}, Shape{3, 3, 3}, Shape{5, 17, 17}, Shape{7, 1000, 1000},
                  Shape{130, 24, 24}}) {
    for (bool with_weight : {true, false}) {
      SCOPED_TRACE(::testing::Message() << s.rows << "x" << s.cols << " weight " << with_weight);
      const int64_t n = s.rows * s.cols;
      const std::vector<float> x = rounded(dt(), random_floats(n, 5, -2, 2));
      const std::vector<float> dy = rounded(dt(), random_floats(n, 6));
      const std::vector<float> w = rounded(dt(), random_floats(s.cols, 7, 0.5f, 1.5f));
      Buffer xb(dt(), x), dyb(dt(), dy), wb(dt(), w), dx(dt(), n);
      std::vector<float> mean(s.rows), rstd(s.rows), dw(s.cols, 123.0f), db(s.cols, 123.0f);
      for (int64_t r = 0; r < s.rows; ++r) {
        const Moments m = reference_moments(&x[r * s.cols], s.cols);
        mean[r] = float(m.mean);
        rstd[r] = float(m.rstd);
      }
      const void* weight = with_weight ? wb.data() : nullptr;
      layer_norm_backward(dt(), s.rows, s.cols, dyb.data(), xb.data(), mean.data(), rstd.data(),
                          dt(), weight, dx.data(), dw.data(), db.data());
      std::vector<double> dx_ref(n), dw_ref(s.cols, 0.0), db_ref(s.cols, 0.0);
      for (int64_t r = 0; r < s.rows; ++r) {
        const float* xr = &x[r * s.cols];
        const float* dyr = &dy[r * s.cols];
        double mean_g = 0, mean_gx = 0;
        for (int64_t j = 0; j < s.cols; ++j) {
          const double g = double(dyr[j]) * (with_weight ? w[j] : 1);
          const double xhat = (xr[j] - double(mean[r])) * rstd[r];
          mean_g += g / s.cols;
          mean_gx += g * xhat / s.cols;
          dw_ref[j] += dyr[j] * xhat;
          db_ref[j] += dyr[j];
        }
        for (int64_t j = 0; j < s.cols; ++j) {
          const double g = double(dyr[j]) * (with_weight ? w[j] : 1);
          const double xhat = (xr[j] - double(mean[r])) * rstd[r];
          dx_ref[r * s.cols + j] = rstd[r] * (g - mean_g - xhat * mean_gx);
        }
      }
      expect_close(dx.floats(), dx_ref, tol(), "dx");
      expect_close(dw, dw_ref, 1e-5, "dweight");
      expect_close(db, db_ref, 1e-5, "dbias");

      // Each output alone gives the same values.
      Buffer dx_only(dt(), n);
      std::vector<float> dw_only(s.cols), db_only(s.cols);
      layer_norm_backward(dt(), s.rows, s.cols, dyb.data(), xb.data(), mean.data(), rstd.data(),
                          dt(), weight, dx_only.data(), nullptr, nullptr);
      layer_norm_backward(dt(), s.rows, s.cols, dyb.data(), xb.data(), mean.data(), rstd.data(),
                          dt(), weight, nullptr, dw_only.data(), nullptr);
      layer_norm_backward(dt(), s.rows, s.cols, dyb.data(), xb.data(), mean.data(), rstd.data(),
                          dt(), weight, nullptr, nullptr, db_only.data());
      EXPECT_TRUE(testing::same_bytes(dx_only, dx));
      EXPECT_EQ(dw_only, dw);
      EXPECT_EQ(db_only, db);
    }
  }
}

TEST_P(LayerNorm, EmptyInputIsNoOp) {
  Buffer y(dt(), 4);
  const Buffer before = y;
  layer_norm_forward(dt(), 0, 4, nullptr, 4, dt(), nullptr, nullptr, kEps, y.data(), nullptr,
                     nullptr);
  EXPECT_TRUE(testing::same_bytes(y, before));
  std::vector<float> dw(4, 1.0f), db(4, 1.0f);
  layer_norm_backward(dt(), 0, 4, nullptr, nullptr, nullptr, nullptr, dt(), nullptr, nullptr,
                      dw.data(), db.data());
  EXPECT_EQ(dw, std::vector<float>(4, 0.0f));  // sums over no rows
  EXPECT_EQ(db, std::vector<float>(4, 0.0f));
}

TEST_P(LayerNorm, ResultsDoNotDependOnThreadSplit) {
  const int64_t rows = 300, cols = 96;
  const std::vector<float> x = random_floats(rows * cols, 8), dy = random_floats(rows * cols, 9);
  Buffer xb(dt(), x), dyb(dt(), dy);
  auto run = [&](Buffer& y, Buffer& dx, std::vector<float>& stats, std::vector<float>& grads) {
    layer_norm_forward(dt(), rows, cols, xb.data(), cols, dt(), nullptr, nullptr, kEps, y.data(),
                       stats.data(), stats.data() + rows);
    layer_norm_backward(dt(), rows, cols, dyb.data(), xb.data(), stats.data(),
                        stats.data() + rows, dt(), nullptr, dx.data(), grads.data(),
                        grads.data() + cols);
  };
  Buffer y(dt(), rows * cols), dx(dt(), rows * cols), y1 = y, dx1 = dx;
  std::vector<float> stats(2 * rows), grads(2 * cols), stats1 = stats, grads1 = grads;
  run(y, dx, stats, grads);
  testing::ScopedBackend serial(false);
  run(y1, dx1, stats1, grads1);
  EXPECT_TRUE(testing::same_bytes(y, y1));
  EXPECT_TRUE(testing::same_bytes(dx, dx1));
  EXPECT_EQ(stats, stats1);
  EXPECT_EQ(grads, grads1);
}

INSTANTIATE_TEST_SUITE_P(All, LayerNorm, ::testing::ValuesIn(testing::all_configs()),
                         testing::config_name);

}  // namespace
}  // namespace axon::kernels
