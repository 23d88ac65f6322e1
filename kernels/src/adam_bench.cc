// Fused Adam/AdamW step, single thread, on 1M and 16M parameters.
#include <cstdio>

#include "axon/kernels/optimizer.h"
#include "bench_util.h"

using namespace axon::kernels;

int main() {
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (int64_t n : {int64_t(1) << 20, int64_t(1) << 24}) {
      auto p = bench::random_buffer(dt, n), g = bench::random_buffer(dt, n);
      auto m = bench::random_buffer(dt, n, -0.1f, 0.1f), v = bench::random_buffer(dt, n, 0, 0.01f);
      auto vmax = v;
      for (bool amsgrad : {false, true}) {
        const AdamParams hp{1e-3, 0.9, 0.999, 0.01, 1e-8, amsgrad, false, true};
        char name[96];
        std::snprintf(name, sizeof name, "adamw%s %s n=%ldM", amsgrad ? "+amsgrad" : "",
                      bench::dtype_name(dt), long(n >> 20));
        // Reads param, grad, both states (+ max), writes param and states (+ max).
        const double bytes = double(n * dtype_size(dt)) * (amsgrad ? 9 : 7);
        bench::report(name, bench::seconds_per_call([&] {
                        adam_step(dt, n, p.data(), g.data(), m.data(), v.data(),
                                  amsgrad ? vmax.data() : nullptr, 10.0, hp, nullptr, nullptr);
                      }),
                      bytes);
      }
    }
  }
}
