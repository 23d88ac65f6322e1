#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "axon/kernels/dtype.h"
#include "test_util.h"
#include "typed.h"

namespace axon::kernels {
namespace {

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Round to nearest even by comparing the two neighbouring bf16 values in double
// (past the largest finite value, the next one up is 2^128, which rounds to inf).
uint16_t reference_bf16(float x) {
  if (std::isnan(x)) return 0x7fc0;
  const uint32_t u = float_to_bits(x);
  const uint16_t down = uint16_t(u >> 16);
  if ((u & 0xffff) == 0) return down;
  const uint16_t up = uint16_t(down + 1);
  const auto value = [](uint16_t h) {
    return (h & 0x7fff) == 0x7f80 ? std::copysign(std::ldexp(1.0, 128), bf16_to_float(h))
                                  : double(bf16_to_float(h));
  };
  const double d_down = std::abs(double(x) - value(down));
  const double d_up = std::abs(double(x) - value(up));
  if (d_down != d_up) return d_down < d_up ? down : up;
  return (down & 1) ? up : down;
}

std::vector<float> interesting_floats() {
  std::vector<float> v = testing::random_floats(20000, 1, -70000, 70000);
  for (float x : testing::random_floats(20000, 2, -1e-4f, 1e-4f)) v.push_back(x);  // f16 subnormals
  for (uint32_t u : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                     0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x00000001u, 0x477ff000u, 0x477fefffu})
    v.push_back(bits_to_float(u));
  for (float x : {1.0f, 65504.0f, 65519.0f, 65520.0f, 1e9f, 5.96e-8f, 2.98e-8f, 2.99e-8f})
    v.push_back(x);
  return v;
}

TEST(BFloat16, EveryValueRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_float(uint16_t(h));
    EXPECT_EQ(float_to_bits(f), h << 16);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f))));
    } else {
      EXPECT_EQ(float_to_bf16(f), h);
    }
  }
}

TEST(BFloat16, RoundsToNearestEven) {
  for (float x : interesting_floats()) {
    const uint16_t got = float_to_bf16(x);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(got))) << x;
    } else {
      EXPECT_EQ(got, reference_bf16(x)) << x;
    }
  }
  EXPECT_EQ(float_to_bf16(bits_to_float(0x3f808000u)), 0x3f80);  // tie, to even: down
  EXPECT_EQ(float_to_bf16(bits_to_float(0x3f818000u)), 0x3f82);  // tie, to even: up
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to inf
}

// GCC's _Float16 conversions are IEEE round-to-nearest-even: the reference.
TEST(Float16, EveryValueMatchesFloat16) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t bits = uint16_t(h);
    _Float16 ref;
    std::memcpy(&ref, &bits, 2);
    const float f = f16_to_float(bits);
    if (std::isnan(float(ref))) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(f))));
    } else {
      EXPECT_EQ(f, float(ref)) << h;
      EXPECT_EQ(float_to_f16(f), bits);
    }
  }
}

TEST(Float16, RoundsLikeFloat16) {
  for (float x : interesting_floats()) {
    const _Float16 ref = _Float16(x);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(x))));
    } else {
      EXPECT_EQ(float_to_f16(x), ref_bits) << x;
    }
  }
}

// The vector forms of the codecs (used when the CPU lacks F16C, and inline in
// kernels) agree with the scalar conversions on every 16-bit value.
TEST(Convert, VectorCodecsMatchScalar) {
  std::vector<uint16_t> all(0x10000), back(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) all[h] = uint16_t(h);
  std::vector<float> f(0x10000);
  for (int64_t i = 0; i < 0x10000; i += simd::kLanes) {
    simd::store(f.data(), simd::VecAt{i}, simd::Float16::load(all.data(), simd::VecAt{i}));
    simd::Float16::store(back.data(), simd::VecAt{i}, simd::load(f.data(), simd::VecAt{i}));
  }
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float ref = f16_to_float(uint16_t(h));
    if (std::isnan(ref)) continue;
    EXPECT_EQ(float_to_bits(f[h]), float_to_bits(ref));
    EXPECT_EQ(back[h], h);
  }
  const std::vector<float> values = interesting_floats();
  const int64_t n = int64_t(values.size()) / simd::kLanes * simd::kLanes;
  std::vector<uint16_t> h16(n), b16(n);
  for (int64_t i = 0; i < n; i += simd::kLanes) {
    simd::Float16::store(h16.data(), simd::VecAt{i}, simd::load(values.data(), simd::VecAt{i}));
    simd::BFloat16::store(b16.data(), simd::VecAt{i}, simd::load(values.data(), simd::VecAt{i}));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(values[i])) continue;
    EXPECT_EQ(h16[i], float_to_f16(values[i])) << values[i];
    EXPECT_EQ(b16[i], float_to_bf16(values[i])) << values[i];
  }
}

TEST(Convert, BulkMatchesScalar) {
  const std::vector<float> values = interesting_floats();
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (int64_t n : {0, 1, 7, 16, 17, 100, 1000}) {
      std::vector<uint16_t> bits(n);
      std::vector<float> back(n);
      if (dt == DType::kFloat32) {
        std::vector<float> out(n);
        convert_from_float(dt, values.data(), n, out.data());
        convert_to_float(dt, out.data(), n, back.data());
        for (int64_t i = 0; i < n; ++i) EXPECT_EQ(float_to_bits(back[i]), float_to_bits(values[i]));
        continue;
      }
      convert_from_float(dt, values.data(), n, bits.data());
      convert_to_float(dt, bits.data(), n, back.data());
      const bool bf = dt == DType::kBFloat16;
      for (int64_t i = 0; i < n; ++i) {
        const float x = values[i];
        if (std::isnan(x)) {
          EXPECT_TRUE(std::isnan(back[i]));
          continue;
        }
        EXPECT_EQ(bits[i], bf ? float_to_bf16(x) : float_to_f16(x)) << i;
        EXPECT_EQ(float_to_bits(back[i]),
                  float_to_bits(bf ? bf16_to_float(bits[i]) : f16_to_float(bits[i])));
      }
    }
  }
  EXPECT_EQ(dtype_size(DType::kFloat32), 4u);
  EXPECT_EQ(dtype_size(DType::kBFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kFloat16), 2u);
}

}  // namespace
}  // namespace axon::kernels
