#include <cmath>
#include <limits>
#include <vector>

#include "axon/kernels/dropout.h"
#include "test_util.h"

namespace axon::kernels {
namespace {

using testing::Buffer;
using testing::KernelTest;

// SplitMix64 number (offset + index) of the stream seeded with seed, written
// out independently of the kernel's code.
uint64_t reference_z(uint64_t seed, uint64_t offset, uint64_t index) {
  uint64_t z = seed + (offset + index + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double clamp01(double p) { return p < 0 ? 0 : p > 1 ? 1 : p; }

// dropout.h's rules: dropout keeps, Bernoulli draws 1.
bool reference_keep(uint64_t seed, uint64_t offset, uint64_t index, double p) {
  return double(reference_z(seed, offset, index) >> 40) >= std::round(clamp01(p) * 16777216.0);
}
bool reference_draw(uint64_t seed, uint64_t offset, uint64_t index, double p) {
  return double(reference_z(seed, offset, index) >> 32) < std::round(clamp01(p) * 4294967296.0);
}

class Dropout : public KernelTest {};

// Every element: the rule's decision, and x * (1 / (1 - p)) or x * 0 rounded
// to the dtype; lengths around the vector width, the chunk grain, and
// non-finite inputs.
TEST_P(Dropout, KeepsByTheRuleAndScales) {
  const float kInf = std::numeric_limits<float>::infinity();
  for (double p : {0.0, 0.1, 0.5, 0.9, 1.0}) {
    for (int64_t n : {0, 1, 15, 16, 17, 100, 40000}) {
      std::vector<float> values = testing::random_floats(n, uint32_t(n + 7), -4, 4);
      if (n > 3) values[1] = std::nanf(""), values[2] = kInf, values[3] = -kInf;
      const Buffer x(dt(), values);
      Buffer y(dt(), n);
      std::vector<uint8_t> mask(n, 7);
      const uint64_t seed = 1234567, offset = 99;
      dropout_forward(dt(), n, x.data(), y.data(), mask.data(), seed, offset, p);
      const float scale = p < 1 ? float(1.0 / (1.0 - p)) : 0.0f;
      const std::vector<float> xs = x.floats();
      std::vector<float> expected(n);
      for (int64_t i = 0; i < n; ++i) {
        const bool keep = reference_keep(seed, offset, uint64_t(i), p);
        ASSERT_EQ(mask[i], keep ? 1 : 0) << "p " << p << " n " << n << " i " << i;
        ASSERT_EQ(dropout_keep(seed, offset, uint64_t(i), p), keep);
        expected[i] = xs[i] * (keep ? scale : 0.0f);
      }
      const Buffer want(dt(), expected);
      EXPECT_TRUE(testing::same_bytes(y, want)) << "p " << p << " n " << n;
    }
  }
}

// A pure function of (seed, offset + index): a run over a suffix with the
// offset moved by the suffix's start gives the full run's suffix, whatever
// the vector alignment; in place gives the same bytes.
TEST_P(Dropout, DependsOnlyOnTheCounter) {
  const int64_t n = 5000;
  const Buffer x(dt(), testing::random_floats(n, 3));
  Buffer full(dt(), n);
  std::vector<uint8_t> mask(n), tail_mask(n);
  dropout_forward(dt(), n, x.data(), full.data(), mask.data(), 5, 1000, 0.3);
  for (int64_t k : {1, 7, 16, 333}) {
    const size_t es = dtype_size(dt());
    Buffer tail(dt(), n);
    dropout_forward(dt(), n - k, x.bytes.data() + k * es, tail.bytes.data(), tail_mask.data(), 5,
                    1000 + uint64_t(k), 0.3);
    EXPECT_EQ(0, std::memcmp(tail.bytes.data(), full.bytes.data() + k * es, (n - k) * es)) << k;
    EXPECT_EQ(0, std::memcmp(tail_mask.data(), mask.data() + k, n - k)) << k;
  }
  Buffer inplace = x;
  std::vector<uint8_t> mask2(n);
  dropout_forward(dt(), n, inplace.data(), inplace.data(), mask2.data(), 5, 1000, 0.3);
  EXPECT_TRUE(testing::same_bytes(inplace, full));
  EXPECT_EQ(mask2, mask);
}

TEST_P(Dropout, KeepsAboutOneMinusP) {
  const int64_t n = 200000;
  const Buffer x(dt(), std::vector<float>(n, 1.0f));
  Buffer y(dt(), n);
  std::vector<uint8_t> mask(n);
  for (double p : {0.1, 0.5, 0.9}) {
    dropout_forward(dt(), n, x.data(), y.data(), mask.data(), 42, 0, p);
    int64_t kept = 0;
    for (uint8_t m : mask) kept += m;
    // 5 standard deviations of a binomial proportion.
    EXPECT_NEAR(double(kept) / n, 1 - p, 5 * std::sqrt(p * (1 - p) / n)) << p;
  }
}

// dy * mask * scale with scale rounded to float, as ATen's
// native_dropout_backward computes it; a NaN gradient stays NaN where dropped.
TEST_P(Dropout, BackwardIsGradTimesMaskTimesScale) {
  for (int64_t n : {0, 1, 17, 40000}) {
    std::vector<float> g = testing::random_floats(n, uint32_t(n), -3, 3);
    if (n > 2) g[0] = std::nanf(""), g[1] = std::numeric_limits<float>::infinity();
    std::vector<uint8_t> mask(n);
    for (int64_t i = 0; i < n; ++i) mask[i] = (i * 7 + 3) % 5 != 0;
    if (n > 2) mask[0] = 0;
    const Buffer dy(dt(), g);
    Buffer dx(dt(), n);
    const double scale = 1 / 0.7;
    dropout_backward(dt(), n, dy.data(), mask.data(), scale, dx.data());
    const std::vector<float> gs = dy.floats();
    std::vector<float> expected(n);
    for (int64_t i = 0; i < n; ++i) expected[i] = gs[i] * (mask[i] ? float(scale) : 0.0f);
    EXPECT_TRUE(testing::same_bytes(dx, Buffer(dt(), expected))) << n;
    Buffer inplace = dy;
    dropout_backward(dt(), n, inplace.data(), mask.data(), scale, inplace.data());
    EXPECT_TRUE(testing::same_bytes(inplace, dx)) << n;
  }
}

// Bernoulli draws: every element the rule's, including probabilities below
// dropout's 2^-24 resolution and next to 1; the rate of a small p.
TEST(Bernoulli, DrawsByTheRule) {
  const uint64_t seed = 77, offset = 5;
  for (double p : {0.0, 1e-9, 3e-8, 0.3, 0.5, 1 - 1e-9, 1 - 1e-10, 1.0}) {
    for (int64_t n : {0, 1, 15, 16, 17, 40000}) {
      std::vector<uint8_t> mask(n, 7);
      bernoulli_mask(n, mask.data(), seed, offset, p);
      for (int64_t i = 0; i < n; ++i) {
        const bool one = reference_draw(seed, offset, uint64_t(i), p);
        ASSERT_EQ(mask[i], one ? 1 : 0) << "p " << p << " n " << n << " i " << i;
        ASSERT_EQ(bernoulli_draw(seed, offset, uint64_t(i), p), one);
      }
    }
  }
  // p = 1e-6 over 4M draws: about 4 ones (a 2^-24 grid would give none).
  const int64_t n = int64_t(1) << 22;
  std::vector<uint8_t> mask(n);
  bernoulli_mask(n, mask.data(), 3, 0, 1e-6);
  int64_t ones = 0;
  for (uint8_t m : mask) ones += m;
  EXPECT_GE(ones, 1);
  EXPECT_LE(ones, 20);
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, Dropout, ::testing::ValuesIn(testing::all_configs()),
                         testing::config_name);

}  // namespace
}  // namespace axon::kernels
