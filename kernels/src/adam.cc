// Fused Adam/AdamW step, elementwise, as PyTorch's fused CPU kernel
// (aten/src/ATen/native/cpu/FusedAdamKernel.cpp), math in float32:
//   g = grad / grad_scale; g = maximize ? -g : g
//   Adam: g += weight_decay * param      AdamW: param *= 1 - lr * weight_decay
//   exp_avg = lerp(exp_avg, g, 1 - beta1); exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) g^2
//   v = amsgrad ? (max_exp_avg_sq = max(max_exp_avg_sq, exp_avg_sq)) : exp_avg_sq
//   param -= lr / (1 - beta1^step) * exp_avg / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// One pass over the arrays, bfloat16 converted in registers (typed.h), ranges spread
// with parallel_for.
#include <algorithm>
#include <cmath>

#include "axon/kernels/optimizer.h"
#include "axon/kernels/parallel.h"
#include "simd.h"
#include "typed.h"

namespace axon::kernels {
namespace {

struct Coefficients {
  bool scaled;
  float grad_scale;
  float weight_decay;  // Adam: added to the gradient
  float param_decay;   // AdamW: 1 - lr * weight_decay
  float lerp_weight;   // 1 - beta1
  float beta2, one_minus_beta2;
  float step_size;  // lr / (1 - beta1^step)
  float bias_correction2_sqrt, eps;
  bool maximize, coupled_decay, decoupled_decay, amsgrad;
};

struct Arrays {
  void* param;
  const void* grad;
  void *exp_avg, *exp_avg_sq, *max_exp_avg_sq;
};

template <class Codec>
AXON_INLINE void adam_range(const Coefficients& c, const Arrays& a, int64_t begin, int64_t end) {
  using S = typename Codec::Storage;
  S* param = static_cast<S*>(a.param) + begin;
  const S* grad = static_cast<const S*>(a.grad) + begin;
  S* exp_avg = static_cast<S*>(a.exp_avg) + begin;
  S* exp_avg_sq = static_cast<S*>(a.exp_avg_sq) + begin;
  S* max_exp_avg_sq = c.amsgrad ? static_cast<S*>(a.max_exp_avg_sq) + begin : nullptr;
  simd::for_each(end - begin, [&](auto i) AXON_INLINE_LAMBDA {
    auto p = Codec::load(param, i);
    auto g = Codec::load(grad, i);
    if (c.scaled) g /= c.grad_scale;
    if (c.maximize) g = -g;
    if (c.coupled_decay) g += p * c.weight_decay;
    if (c.decoupled_decay) p *= c.param_decay;
    // lerp(m, g, w) = m + w * (g - m) for w < 0.5, else g + (w - 1) * (g - m), as torch.
    const auto m_old = Codec::load(exp_avg, i);
    const auto m = c.lerp_weight < 0.5f ? m_old + c.lerp_weight * (g - m_old)
                                        : g + (c.lerp_weight - 1.0f) * (g - m_old);
    auto v = Codec::load(exp_avg_sq, i) * c.beta2 + c.one_minus_beta2 * g * g;
    Codec::store(exp_avg, i, m);
    Codec::store(exp_avg_sq, i, v);
    if (c.amsgrad) {
      const auto v_max = Codec::load(max_exp_avg_sq, i);
      v = v_max > v ? v_max : v;
      Codec::store(max_exp_avg_sq, i, v);
    }
    const auto denom = simd::sqrt(v) / c.bias_correction2_sqrt + c.eps;
    Codec::store(param, i, p - c.step_size * m / denom);
  });
}

AXON_SIMD void adam_float32(const Coefficients& c, const Arrays& a, int64_t begin, int64_t end) {
  adam_range<simd::Float32>(c, a, begin, end);
}
AXON_SIMD void adam_bfloat16(const Coefficients& c, const Arrays& a, int64_t begin, int64_t end) {
  adam_range<simd::BFloat16>(c, a, begin, end);
}

// float16 goes through float32 copies of short segments, since GCC cannot convert
// it in registers with F16C (convert_to_float can); the segments are short so that
// all arrays stream from memory together.
void adam_float16(const Coefficients& c, const Arrays& a, int64_t begin, int64_t end) {
  constexpr int64_t kSegment = 256;
  float buf[5][kSegment];
  const Arrays f{buf[0], buf[1], buf[2], buf[3], buf[4]};
  const void* in[5] = {a.param, a.grad, a.exp_avg, a.exp_avg_sq, a.max_exp_avg_sq};
  void* out[5] = {a.param, nullptr, a.exp_avg, a.exp_avg_sq, a.max_exp_avg_sq};
  const int arrays = c.amsgrad ? 5 : 4;
  for (int64_t s = begin; s < end; s += kSegment) {
    const int64_t len = std::min(kSegment, end - s);
    for (int k = 0; k < arrays; ++k)
      convert_to_float(DType::kFloat16, static_cast<const uint16_t*>(in[k]) + s, len, buf[k]);
    adam_float32(c, f, 0, len);
    for (int k = 0; k < arrays; ++k)
      if (out[k] != nullptr)
        convert_from_float(DType::kFloat16, buf[k], len, static_cast<uint16_t*>(out[k]) + s);
  }
}

using AdamRange = void (*)(const Coefficients&, const Arrays&, int64_t, int64_t);

AdamRange adam_for(DType dt) {
  switch (dt) {
    case DType::kFloat32:
      return adam_float32;
    case DType::kBFloat16:
      return adam_bfloat16;
    case DType::kFloat16:
      return adam_float16;
  }
  return nullptr;
}

}  // namespace

void adam_step(DType dt, int64_t n, void* param, const void* grad, void* exp_avg,
               void* exp_avg_sq, void* max_exp_avg_sq, double step, const AdamParams& hp,
               const float* grad_scale, const float* found_inf) {
  if (n <= 0 || (found_inf != nullptr && *found_inf != 0.0f)) return;
  const bool decay = hp.weight_decay != 0.0;
  const Coefficients c{
      grad_scale != nullptr,
      grad_scale != nullptr ? *grad_scale : 1.0f,
      float(hp.weight_decay),
      float(1.0 - hp.lr * hp.weight_decay),
      float(1.0 - hp.beta1),
      float(hp.beta2),
      float(1.0 - hp.beta2),
      float(hp.lr / (1.0 - std::pow(hp.beta1, step))),
      float(std::sqrt(1.0 - std::pow(hp.beta2, step))),
      float(hp.eps),
      hp.maximize,
      decay && !hp.decoupled_weight_decay,
      decay && hp.decoupled_weight_decay,
      hp.amsgrad,
  };
  const Arrays arrays{param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq};
  const AdamRange run = adam_for(dt);
  // Chunks of 16K elements, so that each thread streams long runs of every array.
  parallel_for(0, n, 16384, [&](int64_t begin, int64_t end) { run(c, arrays, begin, end); });
}

}  // namespace axon::kernels
