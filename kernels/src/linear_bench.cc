// linear_small_m at decoding sizes, single thread: time per call and the rate
// the weights are read at (the bound: memory bandwidth).
#include <cstdio>
#include <vector>

#include "axon/kernels/linear.h"
#include "bench_util.h"

using namespace axon::kernels;

int main() {
  for (auto [n, k] : {std::pair<int64_t, int64_t>{1408, 512}, {512, 1408}, {32000, 512}}) {
    for (int64_t m : {1, 8}) {
      std::vector<float> a(m * k, 0.5f), w(n * k, 0.25f), out(m * n);
      char name[96];
      std::snprintf(name, sizeof name, "linear_small_m m=%ld n=%ld k=%ld", long(m), long(n),
                    long(k));
      bench::report(name, bench::seconds_per_call([&] {
                      linear_small_m(m, n, k, a.data(), k, w.data(), k, nullptr, out.data(), n);
                    }),
                    double(n * k * sizeof(float)));
    }
  }
}
