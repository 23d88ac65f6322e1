#include "axon/kernels/linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "linear_isa.h"
#include "test_util.h"

namespace axon::kernels {
namespace {

// out = a @ w^T + bias against a double-precision reference, for every row
// count, odd sizes, row strides larger than the rows, with and without bias,
// serially and split over threads.
void check(int64_t m, int64_t n, int64_t k, bool with_bias, int64_t pad) {
  std::mt19937 rng(static_cast<unsigned>(m * 1000 + n * 10 + k));
  std::uniform_real_distribution<float> u(-1, 1);
  const int64_t lda = k + pad, ldw = k + pad, ldo = n + pad;
  std::vector<float> a(m * lda), w(n * ldw), bias(n), out(m * ldo, -7.0f);
  for (float& x : a) x = u(rng);
  for (float& x : w) x = u(rng);
  for (float& x : bias) x = u(rng);
  linear_small_m(m, n, k, a.data(), lda, w.data(), ldw, with_bias ? bias.data() : nullptr,
                 out.data(), ldo);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double ref = with_bias ? bias[j] : 0.0;
      for (int64_t t = 0; t < k; ++t) ref += double(a[i * lda + t]) * w[j * ldw + t];
      ASSERT_NEAR(out[i * ldo + j], ref, 1e-5 * (1 + std::sqrt(double(k))))
          << "m=" << m << " n=" << n << " k=" << k << " i=" << i << " j=" << j;
    }
    for (int64_t j = n; j < ldo; ++j) ASSERT_EQ(out[i * ldo + j], -7.0f) << "padding written";
  }
}

TEST(LinearSmallM, MatchesReference) {
  for (int64_t m = 1; m <= kLinearMaxRows; ++m) {
    for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 1}, {3, 17}, {33, 64}, {100, 1000}}) {
      check(m, n, k, /*with_bias=*/m % 2 == 0, /*pad=*/m % 3);
    }
  }
}

// Long rows of `a` (more than fit the L1 panel together): the rows are split
// into groups that each walk the weight in blocks.  Uneven groups (5 rows: 3 +
// 2), one row per group (k = 7000), several blocks and a partial one.
TEST(LinearSmallM, LongRowsInGroups) {
  check(8, 300, 1500, true, 0);
  check(5, 9, 1400, false, 2);
  check(7, 50, 7000, true, 1);
  check(2, 70, 4000, false, 0);
}

TEST(LinearSmallM, SplitOverThreads) {
  testing::ScopedBackend threads(true);
  check(3, 1000, 257, true, 1);
  check(8, 4097, 64, false, 0);
  check(8, 333, 1408, true, 0);
}

// bfloat16 / float16: a, w, bias and out of the same type; the reference is
// the exact sum of the stored (rounded) inputs, and the kernel rounds its
// float32 sum once, so the error is half a unit in the last place of the
// type plus float32 accumulation.
void check16(DType dt, int64_t m, int64_t n, int64_t k, bool with_bias, int64_t pad,
             int isa = -1) {
  const int64_t lda = k + pad, ldw = k + pad, ldo = n + pad;
  const auto av = testing::rounded(dt, testing::random_floats(m * lda, uint32_t(m * 7 + k)));
  const auto wv = testing::rounded(dt, testing::random_floats(n * ldw, uint32_t(n * 3 + k)));
  const auto bv = testing::rounded(dt, testing::random_floats(n, uint32_t(n)));
  testing::Buffer a(dt, av), w(dt, wv), bias(dt, bv);
  testing::Buffer out(dt, std::vector<float>(m * ldo, -7.0f));
  linear_small_m_isa(isa, dt, m, n, k, a.data(), lda, w.data(), ldw,
                     with_bias ? bias.data() : nullptr, out.data(), ldo);
  const std::vector<float> got = out.floats();
  // Half a unit in the last place, relative: 2^-8 (bf16), 2^-11 (f16).
  const double ulp = dt == DType::kBFloat16 ? 1.0 / 256 : 1.0 / 2048;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double ref = with_bias ? bv[j] : 0.0;
      double mag = std::abs(ref);
      for (int64_t t = 0; t < k; ++t) {
        ref += double(av[i * lda + t]) * wv[j * ldw + t];
        mag += std::abs(double(av[i * lda + t]) * wv[j * ldw + t]);
      }
      ASSERT_NEAR(got[i * ldo + j], ref, ulp * std::abs(ref) + 1e-6 * mag + 1e-30)
          << testing::dtype_name(dt) << " isa=" << isa << " m=" << m << " n=" << n
          << " k=" << k << " i=" << i
          << " j=" << j;
    }
    for (int64_t j = n; j < ldo; ++j) ASSERT_EQ(got[i * ldo + j], -7.0f) << "padding written";
  }
}

TEST(LinearSmallM, SixteenBitTypesMatchReference) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t m = 1; m <= kLinearMaxRows; ++m) {
      for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 1}, {3, 17}, {33, 64}, {100, 1000}}) {
        check16(dt, m, n, k, /*with_bias=*/m % 2 == 1, /*pad=*/m % 3);
      }
    }
    check16(dt, 8, 70, 1500, true, 0);  // rows in groups over weight blocks
    testing::ScopedBackend threads(true);
    check16(dt, 8, 333, 1408, false, 1);
  }
}

// Every build of the 16-bit loops this CPU runs (AVX-512, AVX2, portable), not
// only the one linear_small_m picks.
TEST(LinearSmallM, SixteenBitBuildsForEachInstructionSet) {
  std::vector<int> isas = {0};
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v3")) isas.push_back(3);
  if (__builtin_cpu_supports("x86-64-v4")) isas.push_back(4);
#endif
  for (int isa : isas) {
    for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
      for (int64_t m : {1, 3, 8}) check16(dt, m, 37, 100, m != 3, 1, isa);
      check16(dt, 8, 20, 1500, true, 0, isa);
    }
  }
}

TEST(LinearSmallM, TooManyRowsThrow) {
  float x = 0;
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    try {
      linear_small_m(dt, kLinearMaxRows + 1, 1, 1, &x, 1, &x, 1, nullptr, &x, 1);
      ADD_FAILURE() << "no error for " << testing::dtype_name(dt);
    } catch (const std::invalid_argument& e) {
      EXPECT_STREQ(e.what(), "linear_small_m: 9 rows, at most 8");
    }
  }
}

// The float32 overload with a DType is the float32 kernel.
TEST(LinearSmallM, Float32ThroughTheTypedEntryIsTheSame) {
  const auto av = testing::random_floats(3 * 40, 1), wv = testing::random_floats(9 * 40, 2);
  std::vector<float> typed(3 * 9), plain(3 * 9);
  linear_small_m(DType::kFloat32, 3, 9, 40, av.data(), 40, wv.data(), 40, nullptr,
                 typed.data(), 9);
  linear_small_m(3, 9, 40, av.data(), 40, wv.data(), 40, nullptr, plain.data(), 9);
  EXPECT_EQ(typed, plain);
}

TEST(LinearSmallM, EmptyIsNoOp) {
  float out = 5.0f;
  linear_small_m(1, 0, 4, nullptr, 4, nullptr, 4, nullptr, &out, 1);
  EXPECT_EQ(out, 5.0f);
}

}  // namespace
}  // namespace axon::kernels
