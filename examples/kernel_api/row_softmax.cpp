// Worked example 2 (docs/kernels.md): a row-wise kernel with reductions and scratch.
//
//   row_softmax(x, y)                 y[r] = softmax(x[r])           (over the last dim)
//   row_softmax_backward(g, y, gx)    gx[r] = y[r] * (g[r] - <g[r], y[r]>)
//
// x, y, g, gx: (rows, cols), rows may be strided, columns contiguous; one float dtype
// (float32, bfloat16, float16), computed in float32.  Each row: a max, then exp(x - max)
// into float scratch (one row per chunk of rows) with their sum, then the scaled store.
#include <axon/kernel.h>

using namespace axon::kernel;

namespace {

constexpr int L = Vec::kLanes;

bool check_2d(const AxonKernelContext* ctx, const AxonTensor* ts[], int n) {
  for (int i = 0; i < n; ++i) {
    const AxonTensor& t = *ts[i];
    if (t.ndim != 2 || t.dtype != ts[0]->dtype || t.sizes[0] != ts[0]->sizes[0] ||
        t.sizes[1] != ts[0]->sizes[1]) {
      ctx->fail(ctx->impl, "row_softmax: tensors must be 2-d, of one shape and dtype");
      return false;
    }
    if (t.sizes[1] > 1 && t.strides[1] != 1) {
      ctx->fail(ctx->impl, "row_softmax: the last dim must be contiguous");
      return false;
    }
  }
  return true;
}

int64_t grain(int64_t cols) { return cols > 0 && cols < 8192 ? 8192 / cols : 1; }

template <class T>
void forward(const AxonKernelContext* ctx, View<T> x, View<T> y) {
  const int64_t rows = x.size(0), cols = x.size(1);
  parallel_for(ctx, 0, rows, grain(cols), [&](int64_t r0, int64_t r1) {
    float* e = scratch<float>(ctx, size_t(cols));
    if (e == nullptr) return ctx->fail(ctx->impl, "row_softmax: out of scratch memory");
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x.ptr(r);
      // 1. max (tail lanes filled with -inf so they do not count)
      Vec m = Vec::broadcast(-INFINITY);
      for (int64_t j = 0; j < cols; j += L) {
        const int64_t n = cols - j < L ? cols - j : L;
        m = max(m, Vec::load_partial(xr + j, n, -INFINITY));
      }
      const Vec mx = Vec::broadcast(reduce_max(m));
      // 2. e = exp(x - max), and its sum (tail lanes: exp(-inf) = 0)
      Vec s = Vec::zero();
      for (int64_t j = 0; j < cols; j += L) {
        const int64_t n = cols - j < L ? cols - j : L;
        const Vec v = exp(Vec::load_partial(xr + j, n, -INFINITY) - mx);
        v.store_partial(e + j, n);
        s += v;
      }
      // 3. y = e / sum
      const Vec inv = Vec::broadcast(1.0f / reduce_sum(s));
      T* yr = y.ptr(r);
      for (int64_t j = 0; j < cols; j += L) {
        const int64_t n = cols - j < L ? cols - j : L;
        (Vec::load_partial(e + j, n) * inv).store_partial(yr + j, n);
      }
    }
  });
}

template <class T>
void backward(const AxonKernelContext* ctx, View<T> g, View<T> y, View<T> gx) {
  const int64_t rows = y.size(0), cols = y.size(1);
  parallel_for(ctx, 0, rows, grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T *gr = g.ptr(r), *yr = y.ptr(r);
      Vec dot = Vec::zero();
      for (int64_t j = 0; j < cols; j += L) {
        const int64_t n = cols - j < L ? cols - j : L;
        dot = fma(Vec::load_partial(gr + j, n), Vec::load_partial(yr + j, n), dot);
      }
      const Vec d = Vec::broadcast(reduce_sum(dot));
      T* out = gx.ptr(r);
      for (int64_t j = 0; j < cols; j += L) {
        const int64_t n = cols - j < L ? cols - j : L;
        (Vec::load_partial(yr + j, n) * (Vec::load_partial(gr + j, n) - d)).store_partial(out + j, n);
      }
    }
  });
}

}  // namespace

AXON_KERNEL(row_softmax) {
  AXON_CHECK(ctx, args->num_tensors == 2, "row_softmax(x, y)");
  const AxonTensor* ts[] = {&args->tensors[0], &args->tensors[1]};
  if (!check_2d(ctx, ts, 2)) return;
  const bool ok = dispatch_float(ts[0]->dtype, [&](auto tag) {
    using T = decltype(tag);
    forward<T>(ctx, as<T>(*ts[0]), as<T>(*ts[1]));
  });
  AXON_CHECK(ctx, ok, "row_softmax: expected float32, bfloat16 or float16");
}

AXON_KERNEL(row_softmax_backward) {
  AXON_CHECK(ctx, args->num_tensors == 3, "row_softmax_backward(g, y, gx)");
  const AxonTensor* ts[] = {&args->tensors[0], &args->tensors[1], &args->tensors[2]};
  if (!check_2d(ctx, ts, 3)) return;
  const bool ok = dispatch_float(ts[0]->dtype, [&](auto tag) {
    using T = decltype(tag);
    backward<T>(ctx, as<T>(*ts[0]), as<T>(*ts[1]), as<T>(*ts[2]));
  });
  AXON_CHECK(ctx, ok, "row_softmax_backward: expected float32, bfloat16 or float16");
}
