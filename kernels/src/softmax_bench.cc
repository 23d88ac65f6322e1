// Softmax / log-softmax forward and backward, single thread (rows = 8 * 256).
#include <cstdio>

#include "axon/kernels/softmax.h"
#include "bench_util.h"

using namespace axon::kernels;

int main() {
  const int64_t rows = 8 * 256;
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (int64_t cols : {512, 1024, 4096}) {
      const double bytes = double(rows * cols * dtype_size(dt));
      auto x = bench::random_buffer(dt, rows * cols, -8, 8), y = x, dx = x;
      for (bool log : {false, true}) {
        char name[96];
        std::snprintf(name, sizeof name, "%s_forward %s %ldx%ld", log ? "log_softmax" : "softmax",
                      bench::dtype_name(dt), long(rows), long(cols));
        bench::report(name, bench::seconds_per_call([&] {
                        softmax_forward(dt, rows, cols, x.data(), cols, y.data(), log);
                      }),
                      2 * bytes);
        std::snprintf(name, sizeof name, "%s_backward %s %ldx%ld", log ? "log_softmax" : "softmax",
                      bench::dtype_name(dt), long(rows), long(cols));
        bench::report(name, bench::seconds_per_call([&] {
                        softmax_backward(dt, rows, cols, x.data(), y.data(), dx.data(), log);
                      }),
                      3 * bytes);
      }
    }
  }
}
