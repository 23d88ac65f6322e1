// Gated activations for axon: out = act(gate) * up, one pass over memory.
//
// act_mul(gate, up, out; ints = (kind,)): gate, up and out are [rows, d] with unit stride in
// the last dim and any row stride (gate and up may be the two halves of one [rows, 2d]
// tensor); kind 0 = SiLU, 1 = GELU (erf), 2 = GELU (tanh approximation). float32, bfloat16
// or float16 (all three tensors alike); computed in float32, rounded once.
#include <axon/kernel.h>

using namespace axon::kernel;

namespace {

enum Kind : int64_t { kSilu = 0, kGelu = 1, kGeluTanh = 2 };

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

template <int K>
inline Vec act(Vec g) {
  if constexpr (K == kSilu) {
    return g / (1.0f + exp(-g));  // g * sigmoid(g), one division
  } else if constexpr (K == kGelu) {
    return gelu_erf(g);
  } else {
    const Vec inner = 0.79788456080286536f * fma(0.044715f * g * g, g, g);
    return 0.5f * g * (1.0f + tanh(inner));
  }
}

template <class T, int K>
void run(const AxonKernelContext* ctx, const AxonTensor& gt, const AxonTensor& ut,
         const AxonTensor& ot) {
  const View<T> gate = as<T>(gt), up = as<T>(ut), out = as<T>(ot);
  const int64_t rows = out.size(0), d = out.size(1);
  constexpr int L = Vec::kLanes;
  // ~16K elements per chunk: large enough to amortise the hand-off to a compute thread.
  const int64_t grain = d >= 16384 ? 1 : 16384 / (d > 0 ? d : 1);  // d = 0: nothing per row
  parallel_for(ctx, 0, rows, grain, [=](int64_t r0, int64_t r1) {
    // (captured by value: a store through o must not make the compiler reload d or the
    // views from the closure in every iteration)
    for (int64_t r = r0; r < r1; ++r) {
      const T* __restrict g = gate.ptr(r);
      const T* __restrict u = up.ptr(r);
      T* __restrict o = out.ptr(r);
      int64_t j = 0;
      for (; j + L <= d; j += L) (act<K>(Vec::load(g + j)) * Vec::load(u + j)).store(o + j);
      if (j < d) {
        const int64_t n = d - j;
        (act<K>(Vec::load_partial(g + j, n)) * Vec::load_partial(u + j, n)).store_partial(o + j, n);
      }
    }
  });
}

template <class T>
void run_kind(const AxonKernelContext* ctx, int64_t kind, const AxonTensor& g, const AxonTensor& u,
              const AxonTensor& o) {
  switch (kind) {
    case kSilu: run<T, kSilu>(ctx, g, u, o); break;
    case kGelu: run<T, kGelu>(ctx, g, u, o); break;
    default: run<T, kGeluTanh>(ctx, g, u, o); break;
  }
}

}  // namespace

AXON_KERNEL(act_mul) {
  AXON_CHECK(ctx, args->num_tensors == 3 && args->num_ints == 1,
             "act_mul expects (gate, up, out) and ints=(kind,)");
  const AxonTensor& g = args->tensors[0];
  const AxonTensor& u = args->tensors[1];
  const AxonTensor& o = args->tensors[2];
  AXON_CHECK(ctx, g.ndim == 2 && u.ndim == 2 && o.ndim == 2, "act_mul expects 2-d tensors");
  AXON_CHECK(ctx, g.dtype == o.dtype && u.dtype == o.dtype, "act_mul: dtypes differ");
  AXON_CHECK(ctx, g.sizes[0] == o.sizes[0] && u.sizes[0] == o.sizes[0] && g.sizes[1] == o.sizes[1] &&
                      u.sizes[1] == o.sizes[1],
             "act_mul: shapes differ");
  AXON_CHECK(ctx, (g.strides[1] == 1 || g.sizes[1] <= 1) && (u.strides[1] == 1 || u.sizes[1] <= 1) &&
                      (o.strides[1] == 1 || o.sizes[1] <= 1),
             "act_mul: the last dim must have unit stride");
  const int64_t kind = args->ints[0];
  AXON_CHECK(ctx, kind >= 0 && kind <= 2, "act_mul: kind must be 0 (silu), 1 (gelu) or 2 (gelu_tanh)");
  const bool ok = dispatch_float(o.dtype, [&](auto tag) {
    using T = decltype(tag);
    run_kind<T>(ctx, kind, g, u, o);
  });
  AXON_CHECK(ctx, ok, "act_mul: unsupported dtype");
}
