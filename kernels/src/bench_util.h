// Helpers for the single-threaded micro-benchmarks: timing and typed buffers.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "axon/kernels/dtype.h"

namespace axon::kernels::bench {

inline const char* dtype_name(DType dt) {
  return dt == DType::kFloat32 ? "f32" : dt == DType::kBFloat16 ? "bf16" : "f16";
}

// n random elements of type dt in [lo, hi).
inline std::vector<uint8_t> random_buffer(DType dt, int64_t n, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(42);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> values(n);
  for (float& v : values) v = dist(gen);
  std::vector<uint8_t> out(n * dtype_size(dt));
  convert_from_float(dt, values.data(), n, out.data());
  return out;
}

// Median seconds per call of f over repeated runs of about 0.2 s in total.
template <class F>
double seconds_per_call(const F& f) {
  using clock = std::chrono::steady_clock;
  f();  // warm up
  const auto t0 = clock::now();
  f();
  const double once = std::chrono::duration<double>(clock::now() - t0).count();
  const int reps = std::clamp(int(0.2 / std::max(once, 1e-9)), 3, 1000);
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    const auto t = clock::now();
    f();
    times.push_back(std::chrono::duration<double>(clock::now() - t).count());
  }
  std::nth_element(times.begin(), times.begin() + reps / 2, times.end());
  return times[reps / 2];
}

// Prints "name  time  GB/s" (bytes moved) and GFLOP/s if flops > 0.
inline void report(const char* name, double seconds, double bytes, double flops = 0) {
  std::printf("%-44s %9.1f us %8.1f GB/s", name, seconds * 1e6, bytes / seconds * 1e-9);
  if (flops > 0) std::printf(" %8.1f GFLOP/s", flops / seconds * 1e-9);
  std::printf("\n");
}

}  // namespace axon::kernels::bench
