// linear_small_m at decoding sizes, single thread: time per call and the rate
// the weights are read at (the bound: memory bandwidth), with the weights in
// cache (one matrix, called again and again) and from memory (as decoding
// reads them: copies of the matrix in turn, 512 MiB in all, beyond any cache),
// in float32, bfloat16 and float16.  Buffers are 64-byte aligned, as device memory is.
#include <cstdio>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "axon/kernels/linear.h"
#include "bench_util.h"

using namespace axon::kernels;

namespace {

struct Free {
  void operator()(float* p) const { std::free(p); }
};
// `bytes` bytes, zeroed, 64-byte aligned.
std::unique_ptr<float[], Free> aligned(int64_t bytes) {
  auto* p = static_cast<float*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
  if (p == nullptr) {
    std::fprintf(stderr, "out of memory (%lld bytes)\n", static_cast<long long>(bytes));
    std::exit(1);
  }
  std::memset(p, 0, (bytes + 63) / 64 * 64);
  return std::unique_ptr<float[], Free>(p);
}

}  // namespace

int main() {
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const int64_t size = int64_t(dtype_size(dt));
    for (auto [n, k] : {std::pair<int64_t, int64_t>{1408, 512}, {512, 1408}, {32000, 512}}) {
      for (int64_t m : {1, 8}) {
        // "memory": as many copies as make 512 MiB (at least 2).
        const int64_t matrix = n * k * size;
        for (int64_t copies : {int64_t{1}, std::max<int64_t>(2, (int64_t{512} << 20) / matrix)}) {
          // 0x3e80: 0.25 in bf16, 1.625 in f16; any finite value does.
          auto a = aligned(m * k * size), w = aligned(copies * matrix), out = aligned(m * n * size);
          if (dt == DType::kFloat32) {
            std::fill_n(a.get(), m * k, 0.5f);
            std::fill_n(w.get(), copies * n * k, 0.25f);
          } else {
            std::fill_n(reinterpret_cast<uint16_t*>(a.get()), m * k, uint16_t{0x3e80});
            std::fill_n(reinterpret_cast<uint16_t*>(w.get()), copies * n * k, uint16_t{0x3e80});
          }
          char name[96];
          std::snprintf(name, sizeof name, "linear %s m=%ld n=%ld k=%ld %s",
                        bench::dtype_name(dt), long(m), long(n), long(k),
                        copies == 1 ? "cached" : "memory");
          int64_t next = 0;
          const auto* wb = reinterpret_cast<const char*>(w.get());
          bench::report(name, bench::seconds_per_call([&] {
                          linear_small_m(dt, m, n, k, a.get(), k, wb + next * matrix, k,
                                         nullptr, out.get(), n);
                          next = (next + 1) % copies;
                        }),
                        double(n * k * size), 2.0 * double(m * n * k));
        }
      }
    }
  }
}
