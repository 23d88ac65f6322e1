// Rotary position embedding (the "rotate half" form of Llama, GPT-NeoX, ...) for axon:
//   out = x * cos + rotate_half(x) * sin,  rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])
// for the query and the key in one launch.
//
// rotary(q, cos_q, sin_q, out_q, k, cos_k, sin_k, out_k): 4-d tensors [A, B, C, D] (any
// strides; unit stride in the last dim), cos/sin broadcast to the shape of their input by
// zero strides; D even. float32, bfloat16 or float16, all alike; computed in float32.
#include <axon/kernel.h>

using namespace axon::kernel;

namespace {

template <class T>
inline void rotate_row(const T* x, const T* c, const T* s, T* o, int64_t half) {
  constexpr int L = Vec::kLanes;
  int64_t i = 0;
  for (; i + L <= half; i += L) {
    const Vec x1 = Vec::load(x + i), x2 = Vec::load(x + half + i);
    (x1 * Vec::load(c + i) - x2 * Vec::load(s + i)).store(o + i);
    fma(x1, Vec::load(s + half + i), x2 * Vec::load(c + half + i)).store(o + half + i);
  }
  for (; i < half; ++i) {
    const float x1 = float(x[i]), x2 = float(x[half + i]);
    o[i] = T(x1 * float(c[i]) - x2 * float(s[i]));
    o[half + i] = T(x2 * float(c[half + i]) + x1 * float(s[half + i]));
  }
}

template <class T>
void run(const AxonKernelContext* ctx, const AxonTensor* t) {
  const View<T> q = as<T>(t[0]), k = as<T>(t[4]);
  const int64_t rows_q = q.size(0) * q.size(1) * q.size(2);
  const int64_t rows_k = k.size(0) * k.size(1) * k.size(2);
  const int64_t half = q.size(3) / 2;
  const int64_t grain = half >= 4096 ? 1 : 4096 / (half > 0 ? half : 1);  // D = 0: nothing per row
  parallel_for(ctx, 0, rows_q + rows_k, grain, [=](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const bool is_q = r < rows_q;
      const AxonTensor* g = t + (is_q ? 0 : 4);
      const View<T> x = as<T>(g[0]), c = as<T>(g[1]), s = as<T>(g[2]), o = as<T>(g[3]);
      int64_t i = is_q ? r : r - rows_q;
      const int64_t i2 = i % x.size(2);
      i /= x.size(2);
      const int64_t i1 = i % x.size(1);
      const int64_t i0 = i / x.size(1);
      rotate_row(x.ptr(i0, i1, i2), c.ptr(i0, i1, i2), s.ptr(i0, i1, i2), o.ptr(i0, i1, i2), half);
    }
  });
}

}  // namespace

AXON_KERNEL(rotary) {
  AXON_CHECK(ctx, args->num_tensors == 8, "rotary expects (q, cos_q, sin_q, out_q, k, cos_k, sin_k, out_k)");
  const AxonTensor* t = args->tensors;
  for (int g = 0; g < 2; ++g) {
    const AxonTensor& x = t[4 * g];
    AXON_CHECK(ctx, x.ndim == 4 && x.sizes[3] % 2 == 0, "rotary: 4-d inputs with an even last dim");
    for (int j = 0; j < 4; ++j) {
      const AxonTensor& y = t[4 * g + j];
      AXON_CHECK(ctx, y.ndim == 4 && y.dtype == t[0].dtype, "rotary: 4-d tensors of one dtype");
      for (int d = 0; d < 4; ++d) AXON_CHECK(ctx, y.sizes[d] == x.sizes[d], "rotary: shapes differ");
      AXON_CHECK(ctx, y.strides[3] == 1 || y.sizes[3] <= 1, "rotary: unit stride in the last dim");
    }
  }
  AXON_CHECK(ctx, t[0].sizes[3] == t[4].sizes[3], "rotary: q and k head dims differ");
  const bool ok = dispatch_float(t[0].dtype, [&](auto tag) { run<decltype(tag)>(ctx, t); });
  AXON_CHECK(ctx, ok, "rotary: unsupported dtype");
}
