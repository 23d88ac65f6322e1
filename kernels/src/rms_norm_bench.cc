// RMSNorm forward/backward, single thread, at transformer sizes (rows = 8 * 256).
#include <cstdio>
#include <vector>

#include "axon/kernels/norm.h"
#include "bench_util.h"

using namespace axon::kernels;

int main() {
  const int64_t rows = 8 * 256;
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (int64_t cols : {512, 1024, 4096}) {
      const double elt = double(dtype_size(dt)), n = double(rows * cols);
      auto x = bench::random_buffer(dt, rows * cols), dy = bench::random_buffer(dt, rows * cols);
      auto w = bench::random_buffer(dt, cols), y = x, dx = x;
      std::vector<float> rstd(rows), dw(cols);
      char name[96];
      std::snprintf(name, sizeof name, "rms_norm_forward %s %ldx%ld", bench::dtype_name(dt),
                    long(rows), long(cols));
      bench::report(name, bench::seconds_per_call([&] {
                      rms_norm_forward(dt, rows, cols, x.data(), cols, dt, w.data(), 1e-6,
                                       y.data(), rstd.data());
                    }),
                    2 * n * elt);
      std::snprintf(name, sizeof name, "rms_norm_backward %s %ldx%ld", bench::dtype_name(dt),
                    long(rows), long(cols));
      bench::report(name, bench::seconds_per_call([&] {
                      rms_norm_backward(dt, rows, cols, dy.data(), x.data(), dt, w.data(),
                                        rstd.data(), dx.data(), dw.data());
                    }),
                    3 * n * elt);
    }
  }
}
