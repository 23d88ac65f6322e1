#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "axon/kernels/attention.h"
#include "test_util.h"

namespace axon::kernels {
namespace {

using testing::Buffer;
using testing::expect_close;
using testing::random_floats;
using testing::rounded;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Memory layouts of a [batch, heads, seq, dim] tensor.
enum class Layout { kContiguous, kSeqMajor /* [batch, seq, heads, dim] */, kDimStride2 };

// A tensor of dtype dt in some layout, built from and read back to canonical
// [batch, heads, seq, dim] float values.
struct Tensor {
  Tensor(DType dt, int64_t b, int64_t h, int64_t s, int64_t d, Layout layout)
      : dims{b, h, s, d}, buf(dt, b * h * s * d * (layout == Layout::kDimStride2 ? 2 : 1)) {
    switch (layout) {
      case Layout::kContiguous:
        st = {{h * s * d, s * d, d, 1}};
        break;
      case Layout::kSeqMajor:
        st = {{s * h * d, d, h * d, 1}};
        break;
      case Layout::kDimStride2:
        st = {{2 * h * s * d, 2 * s * d, 2 * d, 2}};
        break;
    }
  }
  int64_t offset(int64_t i) const {  // canonical index -> element offset
    const int64_t d = i % dims[3], s = i / dims[3] % dims[2], h = i / (dims[3] * dims[2]) % dims[1],
                  b = i / (dims[3] * dims[2] * dims[1]);
    return b * st.s[0] + h * st.s[1] + s * st.s[2] + d * st.s[3];
  }
  int64_t numel() const { return dims[0] * dims[1] * dims[2] * dims[3]; }
  void set(const std::vector<float>& canonical) {
    std::vector<float> all = buf.floats();
    for (int64_t i = 0; i < numel(); ++i) all[offset(i)] = canonical[i];
    buf = Buffer(buf.dt, all);
  }
  std::vector<float> get() const {
    const std::vector<float> all = buf.floats();
    std::vector<float> out(numel());
    for (int64_t i = 0; i < numel(); ++i) out[i] = all[offset(i)];
    return out;
  }

  int64_t dims[4];
  Strides4 st;
  Buffer buf;
};

// kBoolRuns: a static KV cache's mask, whole tiles of keys hidden from every query
// (batch 0 sees keys [0, 70) and [200, 210), query 1 also [130, 135); batch 1
// keys [0, 3)): a tile is skipped only if no query of the task sees a key in it.
// kAdditiveRuns: the same as an additive mask of 0 and -inf, as PyTorch's
// scaled_dot_product_attention passes a boolean mask to a fused kernel.
enum class Mask { kNone, kAdditiveBroadcast, kAdditivePerHead, kBool, kBoolRuns, kAdditiveRuns };

struct Case {
  AttentionShape shape;
  bool causal;
  Mask mask;
  Layout layout;
  double dropout_p;

  std::string name() const {
    return ::testing::PrintToString(std::vector<int64_t>{shape.batch, shape.q_heads, shape.kv_heads,
                                                         shape.q_len, shape.kv_len, shape.head_dim,
                                                         shape.v_head_dim}) +
           " causal " + std::to_string(causal) + " mask " + std::to_string(int(mask)) +
           " layout " + std::to_string(int(layout)) + " dropout " + std::to_string(dropout_p);
  }
};

// Inputs in canonical layout (rounded to the dtype) and the kernel's arguments.
struct Problem {
  Problem(DType dt, const Case& c)
      : c(c),
        params{0.7 / std::sqrt(double(c.shape.head_dim)), c.causal, c.dropout_p, 1234, 99},
        q(dt, c.shape.batch, c.shape.q_heads, c.shape.q_len, c.shape.head_dim, c.layout),
        k(dt, c.shape.batch, c.shape.kv_heads, c.shape.kv_len, c.shape.head_dim, c.layout),
        v(dt, c.shape.batch, c.shape.kv_heads, c.shape.kv_len, c.shape.v_head_dim, c.layout),
        out(dt, c.shape.batch, c.shape.q_heads, c.shape.q_len, c.shape.v_head_dim, c.layout),
        mask_values(DType::kFloat32, 0) {
    const AttentionShape& s = c.shape;
    qv = rounded(dt, random_floats(q.numel(), 11, -2, 2));
    kv = rounded(dt, random_floats(k.numel(), 12, -2, 2));
    vv = rounded(dt, random_floats(v.numel(), 13, -2, 2));
    q.set(qv);
    k.set(kv);
    v.set(vv);
    // Masks: [batch or 1, q_heads or 1, q_len, kv_len].
    const int64_t mb = c.mask == Mask::kAdditiveBroadcast ? 1 : s.batch;
    const int64_t mh = c.mask == Mask::kAdditivePerHead ? s.q_heads : 1;
    const int64_t n = mb * mh * s.q_len * s.kv_len;
    mask_strides = {{mb == 1 ? 0 : mh * s.q_len * s.kv_len, mh == 1 ? 0 : s.q_len * s.kv_len,
                     s.kv_len, 1}};
    if (c.mask == Mask::kBool) {
      std::vector<float> r = random_floats(n, 14, 0, 1);
      keep.resize(n);
      for (int64_t i = 0; i < n; ++i) keep[i] = r[i] < 0.8f;
      // Query 1 of batch 0 sees nothing.
      if (s.q_len > 1)
        for (int64_t j = 0; j < s.kv_len; ++j) keep[s.kv_len + j] = 0;
      mask = {MaskKind::kBool, DType::kFloat32, keep.data(), mask_strides};
    } else if (c.mask == Mask::kBoolRuns || c.mask == Mask::kAdditiveRuns) {
      keep.resize(n);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t b = i / (mh * s.q_len * s.kv_len), j = i % s.kv_len;
        const int64_t q = i / s.kv_len % s.q_len;
        keep[i] = b == 0 ? (j < 70 || (j >= 200 && j < 210) || (q == 1 && j >= 130 && j < 135))
                         : j < 3;
      }
      if (c.mask == Mask::kBoolRuns) {
        mask = {MaskKind::kBool, DType::kFloat32, keep.data(), mask_strides};
      } else {
        std::vector<float> values(n);
        for (int64_t i = 0; i < n; ++i) values[i] = keep[i] ? 0.0f : -kInf;
        mask_values = Buffer(dt, values);
        additive = mask_values.floats();
        mask = {MaskKind::kAdditive, dt, mask_values.data(), mask_strides};
      }
    } else if (c.mask != Mask::kNone) {
      std::vector<float> values = rounded(dt, random_floats(n, 15, -2, 2));
      values[n / 2] = -kInf;
      mask_values = Buffer(dt, values);
      additive = mask_values.floats();
      mask = {MaskKind::kAdditive, dt, mask_values.data(), mask_strides};
    }
  }

  double mask_at(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const int64_t idx = b * mask_strides.s[0] + h * mask_strides.s[1] + i * mask_strides.s[2] + j;
    switch (c.mask) {
      case Mask::kNone:
        return 0;
      case Mask::kBool:
      case Mask::kBoolRuns:
        return keep[idx] ? 0 : -INFINITY;
      default:
        return additive[idx];
    }
  }

  void forward(float* lse) {
    attention_forward(q.buf.dt, c.shape, params, q.buf.data(), q.st, k.buf.data(), k.st,
                      v.buf.data(), v.st, mask, out.buf.data(), out.st, lse);
  }

  Case c;
  AttentionParams params;
  Tensor q, k, v, out;
  std::vector<float> qv, kv, vv;
  Strides4 mask_strides{};
  std::vector<uint8_t> keep;
  Buffer mask_values;
  std::vector<float> additive;
  AttentionMask mask;
};

// Double-precision attention of one problem, with any q/k/v values.
struct Reference {
  std::vector<double> out, lse;  // canonical layout
  std::vector<double> dq, dk, dv;
};

Reference reference(const Problem& pb, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const std::vector<double>* dout) {
  const AttentionShape& s = pb.c.shape;
  const int64_t G = s.q_heads / s.kv_heads, D = s.head_dim, Dv = s.v_head_dim;
  const double scale = pb.params.scale, p_drop = pb.params.dropout_p;
  Reference r;
  r.out.assign(s.batch * s.q_heads * s.q_len * Dv, 0.0);
  r.lse.assign(s.batch * s.q_heads * s.q_len, -INFINITY);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.q_heads; ++h)
      for (int64_t i = 0; i < s.q_len; ++i) {
        const int64_t hk = h / G, row = (b * s.q_heads + h) * s.q_len + i;
        const double* qi = &q[row * D];
        std::vector<double> sc(s.kv_len), p(s.kv_len), z(s.kv_len, 1.0);
        double m = -INFINITY;
        for (int64_t j = 0; j < s.kv_len; ++j) {
          const double* kj = &k[((b * s.kv_heads + hk) * s.kv_len + j) * D];
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += qi[d] * kj[d];
          sc[j] = (pb.c.causal && j > i) ? -INFINITY : scale * dot + pb.mask_at(b, h, i, j);
          m = std::max(m, sc[j]);
          if (p_drop > 0) {
            const uint64_t index = uint64_t(row * s.kv_len + j);
            z[j] = attention_dropout_keep(pb.params.seed, pb.params.offset, index, p_drop)
                       ? 1 / (1 - p_drop)
                       : 0;
          }
        }
        if (m == -INFINITY) continue;  // fully masked: zeros, lse -inf
        double sum = 0;
        for (int64_t j = 0; j < s.kv_len; ++j) sum += std::exp(sc[j] - m);
        r.lse[row] = m + std::log(sum);
        for (int64_t j = 0; j < s.kv_len; ++j) p[j] = std::exp(sc[j] - m) / sum;
        const int64_t kv_row0 = (b * s.kv_heads + hk) * s.kv_len;
        for (int64_t j = 0; j < s.kv_len; ++j)
          for (int64_t d = 0; d < Dv; ++d) r.out[row * Dv + d] += p[j] * z[j] * v[(kv_row0 + j) * Dv + d];
        if (dout == nullptr) continue;
        const double* go = &(*dout)[row * Dv];
        std::vector<double> dpd(s.kv_len, 0.0);
        double delta = 0;
        for (int64_t j = 0; j < s.kv_len; ++j) {
          for (int64_t d = 0; d < Dv; ++d) dpd[j] += go[d] * v[(kv_row0 + j) * Dv + d];
          delta += p[j] * z[j] * dpd[j];
        }
        for (int64_t j = 0; j < s.kv_len; ++j) {
          const double ds = scale * p[j] * (z[j] * dpd[j] - delta);
          for (int64_t d = 0; d < D; ++d) {
            r.dq[row * D + d] += ds * k[(kv_row0 + j) * D + d];
            r.dk[(kv_row0 + j) * D + d] += ds * qi[d];
          }
          for (int64_t d = 0; d < Dv; ++d) r.dv[(kv_row0 + j) * Dv + d] += p[j] * z[j] * go[d];
        }
      }
  return r;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {{2, 2, 2, 5, 7, 8, 8}, false, Mask::kNone, Layout::kContiguous, 0},
      {{1, 2, 2, 70, 70, 16, 16}, true, Mask::kNone, Layout::kContiguous, 0},  // several tiles
      {{1, 2, 2, 70, 70, 16, 16}, false, Mask::kNone, Layout::kSeqMajor, 0},
      {{2, 1, 1, 3, 7, 4, 4}, true, Mask::kNone, Layout::kContiguous, 0},   // q_len < kv_len
      {{2, 1, 1, 7, 3, 4, 4}, true, Mask::kNone, Layout::kContiguous, 0},   // q_len > kv_len
      {{2, 4, 2, 1, 130, 16, 16}, false, Mask::kNone, Layout::kContiguous, 0},  // GQA decode
      {{1, 4, 2, 20, 33, 8, 8}, true, Mask::kNone, Layout::kSeqMajor, 0},      // GQA prefill
      {{1, 2, 1, 9, 11, 3, 5}, false, Mask::kNone, Layout::kDimStride2, 0},    // odd dims
      {{1, 2, 2, 9, 17, 17, 17}, false, Mask::kNone, Layout::kContiguous, 0},
      {{2, 2, 2, 6, 10, 8, 8}, false, Mask::kAdditiveBroadcast, Layout::kContiguous, 0},
      {{2, 4, 2, 6, 10, 8, 8}, true, Mask::kAdditivePerHead, Layout::kSeqMajor, 0},
      {{2, 2, 1, 6, 10, 8, 8}, false, Mask::kBool, Layout::kContiguous, 0},
      {{2, 2, 1, 9, 70, 8, 8}, true, Mask::kBool, Layout::kContiguous, 0},
      {{1, 4, 2, 12, 15, 8, 8}, false, Mask::kNone, Layout::kContiguous, 0.3},
      {{1, 2, 2, 5, 70, 8, 8}, true, Mask::kBool, Layout::kSeqMajor, 0.5},
      // Static-cache masks: tiles no query of a task sees are skipped.
      {{2, 4, 2, 1, 260, 16, 16}, false, Mask::kBoolRuns, Layout::kContiguous, 0},
      {{2, 2, 2, 3, 260, 8, 8}, false, Mask::kBoolRuns, Layout::kSeqMajor, 0.3},
      {{1, 1, 1, 2, 1100, 8, 8}, false, Mask::kBoolRuns, Layout::kContiguous, 0},  // split keys
      {{2, 4, 2, 1, 260, 16, 16}, false, Mask::kAdditiveRuns, Layout::kContiguous, 0},
      // Few groups, many keys: the forward splits the keys.
      {{1, 1, 1, 2, 600, 8, 8}, false, Mask::kBool, Layout::kContiguous, 0},
      {{1, 2, 1, 3, 700, 16, 16}, true, Mask::kAdditivePerHead, Layout::kContiguous, 0.2},
  };
  return all;
}

class Attention : public testing::KernelTest {
 protected:
  // Gradients involve more rounding than the forward.
  double grad_tol() const { return dt() == DType::kFloat32 ? 1e-4 : 2 * tol(); }
};

TEST_P(Attention, ForwardMatchesReference) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name());
    Problem pb(dt(), c);
    std::vector<float> lse(c.shape.batch * c.shape.q_heads * c.shape.q_len);
    pb.forward(lse.data());
    const Reference r = reference(pb, to_double(pb.qv), to_double(pb.kv), to_double(pb.vv), nullptr);
    expect_close(pb.out.get(), r.out, tol(), "out");
    expect_close(lse, r.lse, 1e-5, "lse");
  }
}

TEST_P(Attention, BackwardMatchesReference) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name());
    Problem pb(dt(), c);
    const AttentionShape& s = c.shape;
    std::vector<float> lse(s.batch * s.q_heads * s.q_len);
    pb.forward(lse.data());
    Tensor dout(dt(), s.batch, s.q_heads, s.q_len, s.v_head_dim, c.layout);
    const std::vector<float> go = rounded(dt(), random_floats(dout.numel(), 16));
    dout.set(go);
    Tensor dq(dt(), s.batch, s.q_heads, s.q_len, s.head_dim, c.layout);
    Tensor dk(dt(), s.batch, s.kv_heads, s.kv_len, s.head_dim, c.layout);
    Tensor dv(dt(), s.batch, s.kv_heads, s.kv_len, s.v_head_dim, c.layout);
    attention_backward(dt(), s, pb.params, dout.buf.data(), dout.st, pb.q.buf.data(), pb.q.st,
                       pb.k.buf.data(), pb.k.st, pb.v.buf.data(), pb.v.st, pb.mask,
                       pb.out.buf.data(), pb.out.st, lse.data(), dq.buf.data(), dq.st,
                       dk.buf.data(), dk.st, dv.buf.data(), dv.st);
    const std::vector<double> go64 = to_double(go);
    const Reference r = reference(pb, to_double(pb.qv), to_double(pb.kv), to_double(pb.vv), &go64);
    expect_close(dq.get(), r.dq, grad_tol(), "dq");
    expect_close(dk.get(), r.dk, grad_tol(), "dk");
    expect_close(dv.get(), r.dv, grad_tol(), "dv");
  }
}

TEST_P(Attention, FullyMaskedRowsGiveZerosNotNaN) {
  Case c{{1, 2, 2, 3, 4, 8, 8}, false, Mask::kBool, Layout::kContiguous, 0};
  Problem pb(dt(), c);
  std::fill(pb.keep.begin(), pb.keep.end(), 0);  // every score masked
  std::vector<float> lse(6, 0.0f);
  pb.forward(lse.data());
  for (float x : pb.out.get()) EXPECT_EQ(x, 0.0f);
  for (float x : lse) EXPECT_EQ(x, -kInf);
  Buffer dout(dt(), random_floats(pb.out.numel(), 3)), dq(dt(), pb.q.numel()),
      dk(dt(), pb.k.numel()), dv(dt(), pb.v.numel());
  attention_backward(dt(), c.shape, pb.params, dout.data(), pb.out.st, pb.q.buf.data(), pb.q.st,
                     pb.k.buf.data(), pb.k.st, pb.v.buf.data(), pb.v.st, pb.mask,
                     pb.out.buf.data(), pb.out.st, lse.data(), dq.data(), pb.q.st, dk.data(),
                     pb.k.st, dv.data(), pb.v.st);
  for (const Buffer* g : {&dq, &dk, &dv})
    for (float x : g->floats()) EXPECT_EQ(x, 0.0f);
}

TEST_P(Attention, ZeroDropoutIsNoDropout) {
  Case c{{1, 2, 2, 6, 9, 8, 8}, true, Mask::kNone, Layout::kContiguous, 0};
  Problem a(dt(), c), b(dt(), c);
  b.params.seed = 77;  // a seed without dropout changes nothing
  a.forward(nullptr);
  b.forward(nullptr);
  EXPECT_TRUE(testing::same_bytes(a.out.buf, b.out.buf));
}

TEST_P(Attention, EmptyInputIsNoOp) {
  AttentionParams params{1.0, false, 0.0, 0, 0};
  attention_forward(dt(), {0, 2, 2, 4, 4, 8, 8}, params, nullptr, {}, nullptr, {}, nullptr, {}, {},
                    nullptr, {}, nullptr);
  attention_forward(dt(), {2, 2, 2, 0, 4, 8, 8}, params, nullptr, {}, nullptr, {}, nullptr, {}, {},
                    nullptr, {}, nullptr);
}

TEST_P(Attention, ResultsDoNotDependOnThreadSplit) {
  Case c{{2, 4, 2, 70, 70, 16, 16}, true, Mask::kNone, Layout::kContiguous, 0.2};
  const AttentionShape& s = c.shape;
  auto run = [&](std::vector<float>& out, std::vector<float>& grads) {
    Problem pb(dt(), c);
    std::vector<float> lse(s.batch * s.q_heads * s.q_len);
    pb.forward(lse.data());
    Buffer dout(dt(), random_floats(pb.out.numel(), 5)), dq(dt(), pb.q.numel()),
        dk(dt(), pb.k.numel()), dv(dt(), pb.v.numel());
    attention_backward(dt(), s, pb.params, dout.data(), pb.out.st, pb.q.buf.data(), pb.q.st,
                       pb.k.buf.data(), pb.k.st, pb.v.buf.data(), pb.v.st, pb.mask,
                       pb.out.buf.data(), pb.out.st, lse.data(), dq.data(), pb.q.st, dk.data(),
                       pb.k.st, dv.data(), pb.v.st);
    out = pb.out.get();
    out.insert(out.end(), lse.begin(), lse.end());
    for (const Buffer* g : {&dq, &dk, &dv}) {
      const std::vector<float> f = g->floats();
      grads.insert(grads.end(), f.begin(), f.end());
    }
  };
  std::vector<float> out, grads, out1, grads1;
  run(out, grads);
  testing::ScopedBackend serial(false);
  run(out1, grads1);
  EXPECT_EQ(out, out1);
  EXPECT_EQ(grads, grads1);
}

INSTANTIATE_TEST_SUITE_P(All, Attention, ::testing::ValuesIn(testing::all_configs()),
                         testing::config_name);

TEST(AttentionDropout, KeepsAboutOneMinusP) {
  for (double p : {0.1, 0.5, 0.9}) {
    int64_t kept = 0;
    const int64_t n = 200000;
    for (int64_t i = 0; i < n; ++i) kept += attention_dropout_keep(42, 7, uint64_t(i), p);
    EXPECT_NEAR(double(kept) / n, 1 - p, 0.005) << p;
  }
  EXPECT_TRUE(attention_dropout_keep(42, 7, 3, 0.0));
  EXPECT_FALSE(attention_dropout_keep(42, 7, 3, 1.0));
  // A pure function of (seed, offset + index).
  EXPECT_EQ(attention_dropout_keep(1, 10, 5, 0.5), attention_dropout_keep(1, 12, 3, 0.5));
}

// The backward of dropout attention agrees with finite differences of the forward
// (double-precision reference with the kernel's dropout decisions).
TEST(AttentionDropout, GradientsMatchFiniteDifferences) {
  const Case c{{1, 2, 1, 3, 4, 3, 2}, true, Mask::kNone, Layout::kContiguous, 0.4};
  Problem pb(DType::kFloat32, c);
  const AttentionShape& s = c.shape;
  std::vector<float> lse(s.q_heads * s.q_len);
  pb.forward(lse.data());
  const std::vector<float> w = random_floats(pb.out.numel(), 21);  // loss = sum(out * w)
  Buffer dout(DType::kFloat32, w), dq(DType::kFloat32, pb.q.numel()),
      dk(DType::kFloat32, pb.k.numel()), dv(DType::kFloat32, pb.v.numel());
  attention_backward(DType::kFloat32, s, pb.params, dout.data(), pb.out.st, pb.q.buf.data(),
                     pb.q.st, pb.k.buf.data(), pb.k.st, pb.v.buf.data(), pb.v.st, pb.mask,
                     pb.out.buf.data(), pb.out.st, lse.data(), dq.data(), pb.q.st, dk.data(),
                     pb.k.st, dv.data(), pb.v.st);
  std::vector<double> q = to_double(pb.qv), k = to_double(pb.kv), v = to_double(pb.vv);
  const auto loss = [&] {
    const Reference r = reference(pb, q, k, v, nullptr);
    double l = 0;
    for (size_t i = 0; i < r.out.size(); ++i) l += r.out[i] * w[i];
    return l;
  };
  const auto numeric = [&](std::vector<double>& x) {
    std::vector<double> g(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const double e = 1e-6, x0 = x[i];
      x[i] = x0 + e;
      const double up = loss();
      x[i] = x0 - e;
      const double down = loss();
      x[i] = x0;
      g[i] = (up - down) / (2 * e);
    }
    return g;
  };
  expect_close(dq.floats(), numeric(q), 1e-4, "dq");
  expect_close(dk.floats(), numeric(k), 1e-4, "dk");
  expect_close(dv.floats(), numeric(v), 1e-4, "dv");
  // Some weights were dropped, some kept.
  int kept = 0;
  for (int64_t i = 0; i < s.q_heads * s.q_len * s.kv_len; ++i)
    kept += attention_dropout_keep(pb.params.seed, pb.params.offset, uint64_t(i), c.dropout_p);
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, s.q_heads * s.q_len * s.kv_len);
}

}  // namespace
}  // namespace axon::kernels
