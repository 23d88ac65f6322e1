// RMSNorm and LayerNorm over the last dim, each optionally fused with the residual add
// before it, for axon. One row per iteration of a parallel_for over rows; statistics in
// float32; the output rounded once.
//
// norm(x, [residual,] weight, bias, out, [res_out]; ints = (kind, has_residual, has_weight,
//      has_bias); floats = (eps,))
//   kind 0: RMSNorm     out = h * rsqrt(mean(h^2) + eps) * weight
//   kind 1: LayerNorm   out = (h - mean(h)) * rsqrt(var(h) + eps) * weight + bias
//   h = x, or with has_residual: h = x + residual, written to res_out (in the input dtype;
//   the statistics are taken of the rounded h, as the unfused ops do).
// Every tensor is [rows, d] with unit stride in the last dim and any row stride (weight
// and bias: [1, d]; pass x in place of an absent one). float32, bfloat16 or float16, all
// alike.
#include <axon/kernel.h>

using namespace axon::kernel;

namespace {

template <class T, bool kLayerNorm, bool kResidual>
void run(const AxonKernelContext* ctx, const AxonTensor* t, bool has_w, bool has_b, float eps) {
  const View<T> x = as<T>(t[0]);
  const int off = kResidual ? 1 : 0;
  const View<T> res = as<T>(t[off]);  // residual (== x without one)
  const View<T> w = as<T>(t[1 + off]), b = as<T>(t[2 + off]), out = as<T>(t[3 + off]);
  const View<T> res_out = kResidual ? as<T>(t[4 + off]) : out;
  const int64_t rows = out.size(0), d = out.size(1);
  constexpr int L = Vec::kLanes;
  const int64_t grain = d >= 8192 ? 1 : 8192 / (d > 0 ? d : 1);  // d = 0: nothing per row
  const T* wp = w.data();
  const T* bp = b.data();
  const float inv_d = 1.0f / float(d);
  parallel_for(ctx, 0, rows, grain, [=](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      // Pass 1: h (= x, or x + residual written to res_out and read back rounded) and the
      // sum of h (LayerNorm) or of h^2 (RMSNorm).
      const T* src = x.ptr(r);
      Vec acc = Vec::zero();
      float s = 0.0f;
      int64_t j = 0;
      if constexpr (kResidual) {
        const T* rr = res.ptr(r);
        T* h = res_out.ptr(r);
        for (; j + L <= d; j += L) {
          (Vec::load(src + j) + Vec::load(rr + j)).store(h + j);
          const Vec v = Vec::load(h + j);
          acc = kLayerNorm ? acc + v : fma(v, v, acc);
        }
        for (; j < d; ++j) {
          h[j] = T(float(src[j]) + float(rr[j]));
          const float v = float(h[j]);
          s += kLayerNorm ? v : v * v;
        }
        src = h;
      } else {
        for (; j + L <= d; j += L) {
          const Vec v = Vec::load(src + j);
          acc = kLayerNorm ? acc + v : fma(v, v, acc);
        }
        for (; j < d; ++j) {
          const float v = float(src[j]);
          s += kLayerNorm ? v : v * v;
        }
      }
      s += reduce_sum(acc);
      float mean = 0.0f;
      if constexpr (kLayerNorm) {
        // Pass 2 (the row is in cache): the variance about the mean.
        mean = s * inv_d;
        const Vec vm = Vec::broadcast(mean);
        acc = Vec::zero();
        for (j = 0; j + L <= d; j += L) {
          const Vec c = Vec::load(src + j) - vm;
          acc = fma(c, c, acc);
        }
        s = reduce_sum(acc);
        for (; j < d; ++j) s += (float(src[j]) - mean) * (float(src[j]) - mean);
      }
      const Vec vmean = Vec::broadcast(mean);
      const float rstd = 1.0f / std::sqrt(s * inv_d + eps);
      const Vec vr = Vec::broadcast(rstd);
      T* o = out.ptr(r);
      for (j = 0; j + L <= d; j += L) {
        Vec y = (Vec::load(src + j) - vmean) * vr;
        if (has_w) y = y * Vec::load(wp + j);
        if (has_b) y = y + Vec::load(bp + j);
        y.store(o + j);
      }
      for (; j < d; ++j) {
        float y = (float(src[j]) - mean) * rstd;
        if (has_w) y *= float(wp[j]);
        if (has_b) y += float(bp[j]);
        o[j] = T(y);
      }
    }
  });
}

template <class T>
void run_kind(const AxonKernelContext* ctx, const AxonTensor* t, bool ln, bool resid, bool has_w,
              bool has_b, float eps) {
  if (ln) {
    if (resid) run<T, true, true>(ctx, t, has_w, has_b, eps);
    else run<T, true, false>(ctx, t, has_w, has_b, eps);
  } else {
    if (resid) run<T, false, true>(ctx, t, has_w, has_b, eps);
    else run<T, false, false>(ctx, t, has_w, has_b, eps);
  }
}

}  // namespace

AXON_KERNEL(norm) {
  AXON_CHECK(ctx, args->num_ints == 4 && args->num_floats == 1,
             "norm expects ints=(kind, has_residual, has_weight, has_bias), floats=(eps,)");
  const int64_t kind = args->ints[0];
  const bool resid = args->ints[1] != 0;
  AXON_CHECK(ctx, kind == 0 || kind == 1, "norm: kind must be 0 (rms) or 1 (layer)");
  AXON_CHECK(ctx, args->num_tensors == (resid ? 6 : 4),
             "norm expects (x, [residual,] weight, bias, out, [res_out])");
  const AxonTensor* t = args->tensors;
  const AxonTensor& out = t[resid ? 4 : 3];
  for (int i = 0; i < args->num_tensors; ++i) {
    AXON_CHECK(ctx, t[i].ndim == 2 && t[i].dtype == out.dtype, "norm: 2-d tensors of one dtype");
    AXON_CHECK(ctx, t[i].strides[1] == 1 || t[i].sizes[1] <= 1, "norm: unit stride in the last dim");
    AXON_CHECK(ctx, t[i].sizes[1] == out.sizes[1], "norm: sizes differ in the last dim");
  }
  const bool ok = dispatch_float(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    run_kind<T>(ctx, t, kind == 1, resid, args->ints[2] != 0, args->ints[3] != 0,
                float(args->floats[0]));
  });
  AXON_CHECK(ctx, ok, "norm: unsupported dtype");
}
