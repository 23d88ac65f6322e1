// linear_small_m at decoding sizes, single thread: time per call and the rate
// the weights are read at (the bound: memory bandwidth), with the weights in
// cache (one matrix, called again and again) and from memory (as decoding
// reads them: 64 matrices in turn, 92-1050 MB, beyond any cache).  Buffers are
// 64-byte aligned, as device memory is.
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "axon/kernels/linear.h"
#include "bench_util.h"

using namespace axon::kernels;

namespace {

struct Free {
  void operator()(float* p) const { std::free(p); }
};
std::unique_ptr<float[], Free> aligned(int64_t n, float value) {
  auto* p = static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64));
  for (int64_t i = 0; i < n; ++i) p[i] = value;
  return std::unique_ptr<float[], Free>(p);
}

}  // namespace

int main() {
  for (auto [n, k] : {std::pair<int64_t, int64_t>{1408, 512}, {512, 1408}, {32000, 512}}) {
    for (int64_t m : {1, 8}) {
      for (int64_t copies : {int64_t{1}, int64_t{64}}) {
        auto a = aligned(m * k, 0.5f), w = aligned(copies * n * k, 0.25f), out = aligned(m * n, 0);
        char name[96];
        std::snprintf(name, sizeof name, "linear_small_m m=%ld n=%ld k=%ld %s", long(m), long(n),
                      long(k), copies == 1 ? "cached" : "memory");
        int64_t next = 0;
        bench::report(name, bench::seconds_per_call([&] {
                        linear_small_m(m, n, k, a.get(), k, w.get() + next * n * k, k, nullptr,
                                       out.get(), n);
                        next = (next + 1) % copies;
                      }),
                      double(n * k * sizeof(float)), 2.0 * double(m * n * k));
      }
    }
  }
}
