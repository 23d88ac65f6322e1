// Worked example 1 (docs/kernels.md): a fused elementwise kernel.
//
//   scale_bias_gelu(x, bias, y; floats: scale)      y = gelu(x * scale + bias)
//   scale_bias_gelu_backward(g, x, bias, gz; scale)  gz = g * gelu'(x * scale + bias)
//
// gelu(v) = v/2 (1 + erf(v / sqrt 2)) (PyTorch's default, approximate="none").
// x, y, g, gz: contiguous (rows, cols); bias: contiguous (cols); one float dtype
// (float32, bfloat16 or float16), computed in float32.
#include <axon/kernel.h>

using namespace axon::kernel;

namespace {

constexpr float kSqrtHalf = 0.70710678118654752f;     // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143268f;   // 1 / sqrt(2 pi)

// Checks shared by both entry points; returns false after ctx->fail.
bool check(const AxonKernelContext* ctx, const AxonTensor& x, const AxonTensor& bias,
           const AxonTensor* others[], int n_others) {
  if (x.ndim != 2 || bias.ndim != 1 || bias.sizes[0] != x.sizes[1]) {
    ctx->fail(ctx->impl, "scale_bias_gelu: expected x (rows, cols) and bias (cols)");
    return false;
  }
  if (!as<float>(x).is_contiguous() || !as<float>(bias).is_contiguous() || bias.dtype != x.dtype) {
    ctx->fail(ctx->impl, "scale_bias_gelu: x and bias must be contiguous, of one dtype");
    return false;
  }
  for (int i = 0; i < n_others; ++i) {
    const AxonTensor& t = *others[i];
    if (t.dtype != x.dtype || t.ndim != 2 || t.sizes[0] != x.sizes[0] ||
        t.sizes[1] != x.sizes[1] || !as<float>(t).is_contiguous()) {
      ctx->fail(ctx->impl, "scale_bias_gelu: every tensor must be contiguous, shaped and typed as x");
      return false;
    }
  }
  return true;
}

// Rows per parallel_for chunk: about 16K elements.
int64_t grain(int64_t cols) { return cols > 0 && cols < 16384 ? 16384 / cols : 1; }

template <class T>
void forward(const AxonKernelContext* ctx, View<T> x, View<T> bias, View<T> y, float scale) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const Vec s = Vec::broadcast(scale);
  auto gelu = [](Vec v) { return 0.5f * v * (1.0f + erf(v * kSqrtHalf)); };
  parallel_for(ctx, 0, rows, grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x.ptr(r);
      T* yr = y.ptr(r);
      int64_t j = 0;
      for (; j + Vec::kLanes <= cols; j += Vec::kLanes)
        gelu(fma(Vec::load(xr + j), s, Vec::load(bias.data() + j))).store(yr + j);
      if (j < cols) {
        const int64_t n = cols - j;
        gelu(fma(Vec::load_partial(xr + j, n), s, Vec::load_partial(bias.data() + j, n)))
            .store_partial(yr + j, n);
      }
    }
  });
}

template <class T>
void backward(const AxonKernelContext* ctx, View<T> g, View<T> x, View<T> bias, View<T> gz,
              float scale) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const Vec s = Vec::broadcast(scale);
  // d/dv gelu(v) = Phi(v) + v phi(v)
  auto dgelu = [](Vec v) {
    return 0.5f * (1.0f + erf(v * kSqrtHalf)) + v * (kInvSqrt2Pi * exp(-0.5f * v * v));
  };
  parallel_for(ctx, 0, rows, grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T *xr = x.ptr(r), *gr = g.ptr(r);
      T* out = gz.ptr(r);
      for (int64_t j = 0; j < cols; j += Vec::kLanes) {
        const int64_t n = cols - j < Vec::kLanes ? cols - j : Vec::kLanes;
        const Vec v = fma(Vec::load_partial(xr + j, n), s, Vec::load_partial(bias.data() + j, n));
        (Vec::load_partial(gr + j, n) * dgelu(v)).store_partial(out + j, n);
      }
    }
  });
}

}  // namespace

AXON_KERNEL(scale_bias_gelu) {
  AXON_CHECK(ctx, args->num_tensors == 3 && args->num_floats == 1,
             "scale_bias_gelu(x, bias, y; scale)");
  const AxonTensor &x = args->tensors[0], &bias = args->tensors[1], &y = args->tensors[2];
  const AxonTensor* others[] = {&y};
  if (!check(ctx, x, bias, others, 1)) return;
  const bool ok = dispatch_float(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    forward<T>(ctx, as<T>(x), as<T>(bias), as<T>(y), float(args->floats[0]));
  });
  AXON_CHECK(ctx, ok, "scale_bias_gelu: expected float32, bfloat16 or float16");
}

AXON_KERNEL(scale_bias_gelu_backward) {
  AXON_CHECK(ctx, args->num_tensors == 4 && args->num_floats == 1,
             "scale_bias_gelu_backward(g, x, bias, gz; scale)");
  const AxonTensor &g = args->tensors[0], &x = args->tensors[1], &bias = args->tensors[2],
                   &gz = args->tensors[3];
  const AxonTensor* others[] = {&g, &gz};
  if (!check(ctx, x, bias, others, 2)) return;
  const bool ok = dispatch_float(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    backward<T>(ctx, as<T>(g), as<T>(x), as<T>(bias), as<T>(gz), float(args->floats[0]));
  });
  AXON_CHECK(ctx, ok, "scale_bias_gelu_backward: expected float32, bfloat16 or float16");
}
