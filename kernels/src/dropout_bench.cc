// Dropout forward, single thread: 8 x 256 x 768 elements (a GPT-2 small
// activation).
#include <cstdio>
#include <vector>

#include "axon/kernels/dropout.h"
#include "bench_util.h"

using namespace axon::kernels;

int main() {
  const int64_t n = 8 * 256 * 768;
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    auto x = bench::random_buffer(dt, n), y = x;
    std::vector<uint8_t> mask(n);
    char name[96];
    std::snprintf(name, sizeof name, "dropout_forward %s %ld", bench::dtype_name(dt), long(n));
    uint64_t offset = 0;
    bench::report(name, bench::seconds_per_call([&] {
                    dropout_forward(dt, n, x.data(), y.data(), mask.data(), 42, offset, 0.1);
                    offset += uint64_t(n);
                  }),
                  double(n) * (2 * dtype_size(dt) + 1));
  }
}
