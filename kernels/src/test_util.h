// Helpers for the kernel tests: typed buffers, random data, tolerances, and a
// parallel backend that really runs chunks on std::threads.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "axon/kernels/dtype.h"
#include "axon/kernels/parallel.h"

namespace axon::kernels::testing {

inline const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
  }
  return "?";
}

// A typed array: values are rounded to dt when stored.
struct Buffer {
  Buffer(DType dt_, int64_t n) : dt(dt_), bytes(n * dtype_size(dt_)) {}
  Buffer(DType dt_, const std::vector<float>& values) : Buffer(dt_, int64_t(values.size())) {
    convert_from_float(dt, values.data(), int64_t(values.size()), data());
  }
  int64_t size() const { return int64_t(bytes.size() / dtype_size(dt)); }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  std::vector<float> floats() const {
    std::vector<float> out(size());
    convert_to_float(dt, data(), size(), out.data());
    return out;
  }

  DType dt;
  std::vector<uint8_t> bytes;
};

inline std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// values as dt would store them.
inline std::vector<float> rounded(DType dt, const std::vector<float>& values) {
  return Buffer(dt, values).floats();
}

// |actual - expected| <= atol + rtol * |expected|; the same number for both.
inline double tolerance(DType dt) {
  switch (dt) {
    case DType::kFloat32:
      return 1e-5;
    case DType::kBFloat16:
      return 2e-2;
    case DType::kFloat16:
      return 2e-3;
  }
  return 0;
}

inline void expect_close(const std::vector<float>& actual, const std::vector<double>& expected,
                         double tol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double diff = std::abs(double(actual[i]) - expected[i]);
    const bool same = std::isnan(expected[i]) ? std::isnan(actual[i]) : actual[i] == expected[i];
    if (!same && !(diff <= tol + tol * std::abs(expected[i])) && reported++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << actual[i] << ", expected "
                    << expected[i];
    }
  }
}

inline bool same_bytes(const Buffer& a, const Buffer& b) { return a.bytes == b.bytes; }

// A parallel backend that runs up to kThreads chunks of at least `grain` on
// std::threads, the calling thread taking the first.
struct ThreadBackend {
  static constexpr int64_t kThreads = 4;

  static void run(int64_t begin, int64_t end, int64_t grain, void* ctx, ParallelBody body) {
    const int64_t chunks = std::min(kThreads, (end - begin + grain - 1) / grain);
    const int64_t chunk = (end - begin + chunks - 1) / chunks;
    std::vector<std::thread> threads;
    for (int64_t b = begin + chunk; b < end; b += chunk)
      threads.emplace_back(body, ctx, b, std::min(end, b + chunk));
    body(ctx, begin, std::min(end, begin + chunk));
    for (std::thread& t : threads) t.join();
  }
};

// Installs ThreadBackend (or the serial default) for a scope.
struct ScopedBackend {
  explicit ScopedBackend(bool threaded) {
    set_parallel_backend(threaded ? &ThreadBackend::run : nullptr);
  }
  ~ScopedBackend() { set_parallel_backend(nullptr); }
};

// Tests of a kernel run for every dtype, serially and on threads.
struct Config {
  DType dt;
  bool threaded;
};

inline std::vector<Config> all_configs() {
  std::vector<Config> out;
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16})
    for (bool threaded : {false, true}) out.push_back({dt, threaded});
  return out;
}

inline std::string config_string(const Config& c) {
  return std::string(dtype_name(c.dt)) + (c.threaded ? "_threads" : "_serial");
}
inline void PrintTo(const Config& c, std::ostream* os) { *os << config_string(c); }
inline std::string config_name(const ::testing::TestParamInfo<Config>& info) {
  return config_string(info.param);
}

class KernelTest : public ::testing::TestWithParam<Config> {
 protected:
  DType dt() const { return GetParam().dt; }
  double tol() const { return tolerance(dt()); }

 private:
  ScopedBackend backend_{GetParam().threaded};
};

}  // namespace axon::kernels::testing
