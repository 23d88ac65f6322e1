// Vision-transformer kernels for axon.
//
// attention(q, k, v, out; floats = (scale,)): softmax(q k^T * scale) v for every (batch,
//   head), in one pass per query row (scores, softmax and the weighted sum of v never
//   leave the core's cache). q, k, v, out: [B, S, H, D] (the projections' layout before
//   the head transpose: any strides, unit stride in the last dim), out written in the same
//   layout, so [B, S, H * D] is a view of it. Scores, softmax and the sum in float32.
// add_layer_norm(x, residual, weight, bias, h, out; floats = (eps,)): h = x + residual,
//   out = LayerNorm(h) * weight + bias over the last dim; [rows, d] tensors (weight, bias:
//   [1, d]), unit stride in the last dim.
// bias_gelu(x, bias, out): out = gelu(x + bias) (erf), x/out [rows, d], bias [1, d].
// float32, bfloat16 or float16, all tensors of a launch alike.
#include <axon/kernel.h>

#include <memory>

using namespace axon::kernel;

namespace {

constexpr int L = Vec::kLanes;

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Scores of R query rows against keys [j, j + 2L): R * 2 accumulators, each k load shared
// by the R rows.
template <int R>
inline void scores(const float* qf, int64_t D, const float* kt, int64_t Sp, int64_t j, float scale,
                   float* p) {
  Vec a[R][2];
  for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = Vec::zero();
  for (int64_t d = 0; d < D; ++d) {
    const float* row = kt + d * Sp + j;
    const Vec k0 = Vec::load(row), k1 = Vec::load(row + L);
    for (int r = 0; r < R; ++r) {
      const Vec qd = Vec::broadcast(qf[r * D + d]);
      a[r][0] = fma(qd, k0, a[r][0]);
      a[r][1] = fma(qd, k1, a[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    (a[r][0] * scale).store(p + r * Sp + j);
    (a[r][1] * scale).store(p + r * Sp + j + L);
  }
}

// out rows = p rows (R of them, already normalised) times v, head-dim lanes [d, d + 2L).
template <int R>
inline void weighted_v(const float* p, int64_t Sp, int64_t S, const float* vf, int64_t Dp, int64_t d,
                       float* o) {
  Vec a[R][2];
  for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = Vec::zero();
  for (int64_t j = 0; j < S; ++j) {
    const float* vr = vf + j * Dp + d;
    const Vec v0 = Vec::load(vr), v1 = Vec::load(vr + L);
    for (int r = 0; r < R; ++r) {
      const Vec pj = Vec::broadcast(p[r * Sp + j]);
      a[r][0] = fma(pj, v0, a[r][0]);
      a[r][1] = fma(pj, v1, a[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    a[r][0].store(o + r * Dp + d);
    a[r][1].store(o + r * Dp + d + L);
  }
}

constexpr int kRows = 4;  // query rows processed together
constexpr int64_t kGroupBytes = int64_t(16) << 20;  // scratch for the k/v of a group of heads

template <class T>
void attention(const AxonKernelContext* ctx, const AxonTensor* t, float scale) {
  const View<T> q = as<T>(t[0]), k = as<T>(t[1]), v = as<T>(t[2]), out = as<T>(t[3]);
  const int64_t B = q.size(0), S = q.size(1), H = q.size(2), D = q.size(3);
  const int64_t Sp = round_up(S, 2 * L), Dp = round_up(D, 2 * L);
  // Per (batch, head): k transposed [D][Sp] and v [S][Dp] in float32; per query block: the
  // rows of q in float32 [kRows][D], their scores [kRows][Sp] and outputs [kRows][Dp].
  const int64_t per_head = D * Sp + S * Dp;
  const int64_t per_block = kRows * (D + Sp + Dp);
  const int64_t blocks = (S + kRows - 1) / kRows;
  // The heads in groups whose float32 k/v take at most kGroupBytes of scratch (the arena
  // keeps blocks up to 64 MiB; all B * H heads at once would often be more).
  const int64_t tasks = B * H;
  const int64_t fit = kGroupBytes / int64_t(sizeof(float)) / (per_head > 0 ? per_head : 1);
  const int64_t group = fit < 1 ? 1 : fit < tasks ? fit : tasks;
  float* heads = scratch<float>(ctx, size_t(group * per_head) + 1);
  AXON_CHECK(ctx, heads != nullptr, "attention: out of scratch memory");
  for (int64_t g0 = 0; g0 < tasks; g0 += group) {
    const int64_t g1 = tasks - g0 < group ? tasks : g0 + group;
    // 1) k and v of every head of the group in float32 (k transposed, zero-padded)
    parallel_for(ctx, g0, g1, 1, [=](int64_t t0, int64_t t1) {
      for (int64_t task = t0; task < t1; ++task) {
        const int64_t b = task / H, h = task % H;
        float* kt = heads + (task - g0) * per_head;
        float* vf = kt + D * Sp;
        for (int64_t j = 0; j < S; ++j) {
          const T* kj = k.ptr(b, j, h);
          for (int64_t d = 0; d < D; ++d) kt[d * Sp + j] = float(kj[d]);
          const T* vj = v.ptr(b, j, h);
          for (int64_t d = 0; d < Dp; d += L) {
            const int64_t n = D - d < L ? (D - d < 0 ? 0 : D - d) : L;
            Vec::load_partial(vj + d, n).store(vf + j * Dp + d);
          }
        }
        for (int64_t d = 0; d < D; ++d)
          for (int64_t j = S; j < Sp; ++j) kt[d * Sp + j] = 0.0f;
      }
    });
    // 2) blocks of query rows of every head of the group (a buffer per chunk of blocks)
    parallel_for(ctx, g0 * blocks, g1 * blocks, 1, [=](int64_t t0, int64_t t1) {
      std::unique_ptr<float[]> buf(new float[size_t(per_block) + 2 * L]);
      float* qf = buf.get();
      float* p = qf + kRows * D;
      float* o = p + kRows * Sp;
      for (int64_t item = t0; item < t1; ++item) {
        const int64_t task = item / blocks, i0 = (item % blocks) * kRows;
        const int64_t b = task / H, h = task % H;
        const int64_t rows = S - i0 < kRows ? S - i0 : kRows;
        const float* kt = heads + (task - g0) * per_head;
        const float* vf = kt + D * Sp;
        for (int64_t r = 0; r < kRows; ++r) {
          const T* qi = q.ptr(b, i0 + (r < rows ? r : 0), h);
          for (int64_t d = 0; d < D; ++d) qf[r * D + d] = float(qi[d]);
        }
        for (int64_t j = 0; j < Sp; j += 2 * L) scores<kRows>(qf, D, kt, Sp, j, scale, p);
        for (int64_t r = 0; r < rows; ++r) {
          float* pr = p + r * Sp;
          float m = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < S; ++j) m = pr[j] > m ? pr[j] : m;
          const Vec vm = Vec::broadcast(m);
          Vec vs = Vec::zero();
          int64_t j = 0;
          for (; j + L <= S; j += L) {
            const Vec e = exp(Vec::load(pr + j) - vm);
            e.store(pr + j);
            vs += e;
          }
          float tail = 0.0f;
          if (j < S) {
            const Vec e = exp(Vec::load_partial(pr + j, S - j) - vm);
            e.store_partial(pr + j, S - j);
            const Lanes l = lanes(e);
            for (int64_t u = 0; u < S - j; ++u) tail += l[int(u)];
          }
          const Vec inv = Vec::broadcast(1.0f / (reduce_sum(vs) + tail));
          for (j = 0; j + L <= S; j += L) (Vec::load(pr + j) * inv).store(pr + j);
          for (; j < S; ++j) pr[j] *= lanes(inv)[0];
        }
        for (int64_t d = 0; d < Dp; d += 2 * L) weighted_v<kRows>(p, Sp, S, vf, Dp, d, o);
        for (int64_t r = 0; r < rows; ++r) {
          T* oi = out.ptr(b, i0 + r, h);
          int64_t d = 0;
          for (; d + L <= D; d += L) Vec::load(o + r * Dp + d).store(oi + d);
          if (d < D) Vec::load(o + r * Dp + d).store_partial(oi + d, D - d);
        }
      }
    });
  }
}

template <class T>
void add_layer_norm(const AxonKernelContext* ctx, const AxonTensor* t, float eps) {
  const View<T> x = as<T>(t[0]), r = as<T>(t[1]), w = as<T>(t[2]), bb = as<T>(t[3]),
                h = as<T>(t[4]), out = as<T>(t[5]);
  const int64_t rows = out.size(0), d = out.size(1);
  const float inv_d = 1.0f / float(d);
  parallel_for(ctx, 0, rows, d >= 8192 ? 1 : 8192 / (d > 0 ? d : 1), [=](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      const T* xr = x.ptr(row);
      const T* rr = r.ptr(row);
      T* hr = h.ptr(row);
      // h = x + residual, stored and read back rounded, summed in the same pass
      Vec acc = Vec::zero();
      float s = 0.0f;
      int64_t j = 0;
      for (; j + L <= d; j += L) {
        (Vec::load(xr + j) + Vec::load(rr + j)).store(hr + j);
        acc += Vec::load(hr + j);
      }
      for (; j < d; ++j) {
        hr[j] = T(float(xr[j]) + float(rr[j]));
        s += float(hr[j]);
      }
      s += reduce_sum(acc);
      const float mean = s * inv_d;
      const Vec vmean = Vec::broadcast(mean);
      acc = Vec::zero();
      for (j = 0; j + L <= d; j += L) {
        const Vec c = Vec::load(hr + j) - vmean;
        acc = fma(c, c, acc);
      }
      s = reduce_sum(acc);
      for (; j < d; ++j) s += (float(hr[j]) - mean) * (float(hr[j]) - mean);
      const float rstd = 1.0f / std::sqrt(s * inv_d + eps);
      const Vec vr = Vec::broadcast(rstd);
      T* o = out.ptr(row);
      for (j = 0; j + L <= d; j += L)
        fma((Vec::load(hr + j) - vmean) * vr, Vec::load(w.data() + j), Vec::load(bb.data() + j)).store(o + j);
      for (; j < d; ++j) o[j] = T((float(hr[j]) - mean) * rstd * float(w.data()[j]) + float(bb.data()[j]));
    }
  });
}

// GELU (erf form) without computing erf: 1 + erf(u) = erfc(-u), and erfc(|u|) from
// Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7), so the result's absolute error is
// <= 0.5 |g| 1.5e-7 and nothing cancels for negative g. Half the work of 1 + erf(u) with
// the header's full-precision erf.
inline Vec gelu_erf(Vec g) {
  const Vec u = abs(g) * 0.70710678118654752f;
  const Vec t = 1.0f / fma(u, Vec::broadcast(0.3275911f), Vec::broadcast(1.0f));
  Vec q = Vec::broadcast(1.061405429f);
  q = fma(q, t, Vec::broadcast(-1.453152027f));
  q = fma(q, t, Vec::broadcast(1.421413741f));
  q = fma(q, t, Vec::broadcast(-0.284496736f));
  q = fma(q, t, Vec::broadcast(0.254829592f));
  const Vec erfc = q * t * exp(-(u * u));
  return 0.5f * g * select_lt(g, Vec::zero(), erfc, 2.0f - erfc);
}
inline Vec gelu(Vec g) { return gelu_erf(g); }

template <class T>
void bias_gelu(const AxonKernelContext* ctx, const AxonTensor* t) {
  const View<T> x = as<T>(t[0]), b = as<T>(t[1]), out = as<T>(t[2]);
  const int64_t rows = out.size(0), d = out.size(1);
  parallel_for(ctx, 0, rows, d >= 16384 ? 1 : 16384 / (d > 0 ? d : 1), [=](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      const T* xr = x.ptr(row);
      T* o = out.ptr(row);
      const T* bp = b.data();
      int64_t j = 0;
      for (; j + L <= d; j += L) gelu(Vec::load(xr + j) + Vec::load(bp + j)).store(o + j);
      if (j < d) {
        const int64_t n = d - j;
        gelu(Vec::load_partial(xr + j, n) + Vec::load_partial(bp + j, n)).store_partial(o + j, n);
      }
    }
  });
}

bool same_dtype(const AxonKernelArgs* args) {
  for (int i = 0; i < args->num_tensors; ++i)
    if (args->tensors[i].dtype != args->tensors[0].dtype) return false;
  return true;
}

bool unit_last(const AxonKernelArgs* args) {
  for (int i = 0; i < args->num_tensors; ++i) {
    const AxonTensor& x = args->tensors[i];
    if (x.strides[x.ndim - 1] != 1 && x.sizes[x.ndim - 1] > 1) return false;
  }
  return true;
}

}  // namespace

AXON_KERNEL(attention) {
  AXON_CHECK(ctx, args->num_tensors == 4 && args->num_floats == 1, "attention(q, k, v, out; scale)");
  AXON_CHECK(ctx, same_dtype(args) && unit_last(args), "attention: one dtype, unit stride in the last dim");
  for (int i = 0; i < 4; ++i) {
    AXON_CHECK(ctx, args->tensors[i].ndim == 4, "attention: 4-d tensors [B, S, H, D]");
    for (int d = 0; d < 4; ++d)
      AXON_CHECK(ctx, args->tensors[i].sizes[d] == args->tensors[0].sizes[d], "attention: shapes differ");
  }
  const float scale = float(args->floats[0]);
  const bool ok = dispatch_float(args->tensors[0].dtype,
                                 [&](auto tag) { attention<decltype(tag)>(ctx, args->tensors, scale); });
  AXON_CHECK(ctx, ok, "attention: unsupported dtype");
}

AXON_KERNEL(add_layer_norm) {
  AXON_CHECK(ctx, args->num_tensors == 6 && args->num_floats == 1,
             "add_layer_norm(x, residual, weight, bias, h, out; eps)");
  AXON_CHECK(ctx, same_dtype(args) && unit_last(args), "add_layer_norm: one dtype, unit stride in the last dim");
  for (int i = 0; i < 6; ++i)
    AXON_CHECK(ctx, args->tensors[i].ndim == 2 && args->tensors[i].sizes[1] == args->tensors[5].sizes[1],
               "add_layer_norm: 2-d tensors of one width");
  const float eps = float(args->floats[0]);
  const bool ok = dispatch_float(args->tensors[0].dtype,
                                 [&](auto tag) { add_layer_norm<decltype(tag)>(ctx, args->tensors, eps); });
  AXON_CHECK(ctx, ok, "add_layer_norm: unsupported dtype");
}

AXON_KERNEL(bias_gelu) {
  AXON_CHECK(ctx, args->num_tensors == 3, "bias_gelu(x, bias, out)");
  AXON_CHECK(ctx, same_dtype(args) && unit_last(args), "bias_gelu: one dtype, unit stride in the last dim");
  for (int i = 0; i < 3; ++i)
    AXON_CHECK(ctx, args->tensors[i].ndim == 2 && args->tensors[i].sizes[1] == args->tensors[2].sizes[1],
               "bias_gelu: 2-d tensors of one width");
  const bool ok = dispatch_float(args->tensors[0].dtype,
                                 [&](auto tag) { bias_gelu<decltype(tag)>(ctx, args->tensors); });
  AXON_CHECK(ctx, ok, "bias_gelu: unsupported dtype");
}
