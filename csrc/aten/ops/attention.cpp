// Attention: scaled-dot-product attention.
//   fused kernel (kernels/attention.h): _fused_sdp_choice_stub has a
//     PrivateUse1 kernel choosing the `overrideable` backend for 4-d inputs of
//     float32/bfloat16/float16 (causal, boolean or additive masks, grouped-query
//     heads, dropout); _scaled_dot_product_fused_attention_overrideable and its
//     backward run flash-style tiles with an online softmax.  Other inputs take
//     PyTorch's math path (compositions of axon ops).
//   kernel selection (KernelSelect.h): where ATen's CPU flash attention
//     (_scaled_dot_product_flash_attention_for_cpu and its backward) computes
//     the same thing, a launch runs ours or ATen's, whichever measured faster.
#include <algorithm>
#include <cmath>

#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward_cpu_dispatch.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_cpu_dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/stack.h>
#include <torch/library.h>

#include <axon/kernels/attention.h>

#include "../../core/AxonGenerator.h"
#include "../CpuKernel.h"
#include "../KernelSelect.h"
#include "../Kernels.h"
#include "../Launch.h"
#include "../OpDevice.h"
#include "../Registry.h"

namespace at::axon {
namespace {

namespace k = ::axon::kernels;

// ------------------------------------------------------------ attention

k::Strides4 strides4(const at::Tensor& t) {
  return {{t.stride(0), t.stride(1), t.stride(2), t.stride(3)}};
}

// SDPA's backend choice for axon tensors (registered as the PrivateUse1
// kernel of _fused_sdp_choice_stub): our fused kernel for 4-d inputs of
// one kernel dtype, with an additive mask or none (boolean masks arrive
// converted to additive ones); else PyTorch's math path.
}  // namespace

int64_t fusedSdpChoiceFor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::optional<at::Tensor>& mask, bool enable_gqa);

int64_t fusedSdpChoice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask, double /*dropout_p*/,
                         bool /*is_causal*/, std::optional<double> /*scale*/, bool enable_gqa) {
  const int64_t choice = fusedSdpChoiceFor(q, k, v, mask, enable_gqa);
  // Math disabled (sdpa_kernel with fused backends only) and the fused kernel
  // cannot take these inputs: PyTorch's error, not math anyway.
  TORCH_CHECK(choice != static_cast<int64_t>(at::SDPBackend::math) ||
                  at::globalContext().userEnabledMathSDP(),
              "No available kernel. Aborting execution. (axon's fused attention kernel takes "
              "4-D query, key and value of one dtype (float32, bfloat16, float16) with matching "
              "sizes; the math backend, which takes the rest, is disabled)");
  return choice;
}

int64_t fusedSdpChoiceFor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::optional<at::Tensor>& mask, bool enable_gqa) {
  // torch.nn.attention.sdpa_kernel: axon's fused kernel stands for the fused
  // backends (overrideable, flash, memory-efficient); math for math.  With
  // none of them enabled, PyTorch's error.
  const at::Context& ctx = at::globalContext();
  const bool fused_enabled = ctx.userEnabledOverrideableSDP() || ctx.userEnabledFlashSDP() ||
                             ctx.userEnabledMemEfficientSDP();
  const bool math_enabled = ctx.userEnabledMathSDP();
  TORCH_CHECK(fused_enabled || math_enabled,
              "No viable backend for scaled_dot_product_attention was found. axon runs the "
              "math backend and its fused kernel (as SDPBackend.OVERRIDEABLE, FLASH_ATTENTION "
              "or EFFICIENT_ATTENTION); enable one of them.");
  const auto math = static_cast<int64_t>(at::SDPBackend::math);
  const auto fused = static_cast<int64_t>(at::SDPBackend::overrideable);
  if (!fused_enabled) return math;
  // Transforms the fused op has no rule for: vmap (no batching rule) and
  // forward-mode AD (no forward derivative) take the math path, made of ops
  // that have both, as on the CPU.  Inside any torch.func transform (the
  // functorch layer keys are in the thread's dispatch keys) and for tensors
  // with forward gradients.
  if (math_enabled) {
    if (c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerBackMode)) {
      return math;
    }
    for (const at::Tensor* t : {&q, &k, &v}) {
      if (t->_fw_grad(/*level=*/0).defined()) return math;
    }
  }
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return math;
  if (!kernelDType(q.scalar_type()) || k.scalar_type() != q.scalar_type() ||
      v.scalar_type() != q.scalar_type()) {
    return math;
  }
  // Sizes as SymInts: torch.compile traces this choice with symbolic shapes
  // (dynamic=True), where the tests below become guards.
  const auto ne = [](const c10::SymInt& a, const c10::SymInt& b) {
    return a.sym_ne(b).guard_bool(__FILE__, __LINE__);
  };
  if (ne(q.sym_size(0), k.sym_size(0)) || ne(k.sym_size(0), v.sym_size(0)) ||
      ne(k.sym_size(1), v.sym_size(1)) || ne(k.sym_size(2), v.sym_size(2)) ||
      ne(q.sym_size(3), k.sym_size(3))) {
    return math;  // the math path raises PyTorch's shape errors
  }
  if (ne(q.sym_size(1), k.sym_size(1)) &&
      (!enable_gqa || !ne(k.sym_size(1), 0) || ne(q.sym_size(1) % k.sym_size(1), 0))) {
    return math;
  }
  if (mask.has_value() && mask->defined()) {
    if (mask->requires_grad() || mask->dim() > 4) return math;
    if (mask->scalar_type() != at::kBool && !kernelDType(mask->scalar_type())) return math;
  }
  if (q.requires_grad() || k.requires_grad() || v.requires_grad()) {
    if (!ne(q.sym_numel(), 0) || !ne(k.sym_numel(), 0)) return math;
  }
  return fused;
}

namespace {

k::AttentionShape attention_shape(const at::Tensor& q, const at::Tensor& k,
                                  const at::Tensor& v) {
  return {q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
}

// The mask as the kernel reads it: broadcast to [batch, q heads, q, kv] (a
// view; the data stays the mask's).
k::AttentionMask attention_mask(const at::Tensor& mask, const k::AttentionShape& s) {
  k::AttentionMask m;
  if (!mask.defined()) return m;
  const at::Tensor expanded = mask.expand({s.batch, s.q_heads, s.q_len, s.kv_len});
  if (mask.scalar_type() == at::kBool) {
    m.kind = k::MaskKind::kBool;
  } else {
    m.kind = k::MaskKind::kAdditive;
    m.dt = *kernelDType(mask.scalar_type());
  }
  m.data = expanded.const_data_ptr();
  m.strides = strides4(expanded);
  return m;
}

// A result of shape `sizes` laid out like q: empty_like(q) when the shapes
// match (q's strides if q is dense), else q's dimension order (Meta's
// alloc_with_matching_layout).
at::Tensor like_query(const at::Tensor& q, c10::IntArrayRef sizes, c10::DeviceIndex device) {
  if (q.sizes() == sizes) return emptyDeviceLike(q, q.scalar_type());
  std::array<int64_t, 4> order{0, 1, 2, 3};
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return q.stride(a) > q.stride(b); });
  std::array<int64_t, 4> strides{};
  int64_t stride = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    strides[*it] = stride;
    stride *= sizes[*it];
  }
  return emptyDevice(sizes, strides, q.scalar_type(), device);
}

using SdpaOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt,
                               c10::SymInt, at::Tensor, at::Tensor, at::Tensor>;

// ---- selection against ATen's CPU flash attention
//
// Whether ATen's kernel computes what ours does for these arguments.  It has
// no dropout (ours draws from axon's generator), no grouped-query heads, one
// head size for q, k and v, and additive masks of float32 or the query's
// dtype (SDPA converts boolean masks to additive ones before choosing a
// backend; only direct calls of the op pass them); with no keys it divides by
// zero.  Its logsumexp is ours (float32, natural log of the scaled, masked
// scores' exponentials), except for a fully masked row: 0 there, -inf from
// ours; both backwards take either (see flash_lse).
bool flash_selectable(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& mask, double dropout_p) {
  if (dropout_p > 0 || q.size(1) != k.size(1) || q.size(3) != v.size(3)) return false;
  for (int64_t d = 0; d < 4; ++d) {
    if (q.size(d) == 0 || k.size(d) == 0) return false;
  }
  return !mask.defined() || mask.scalar_type() == at::kFloat ||
         mask.scalar_type() == q.scalar_type();
}

kselect::Key attention_key(kselect::Op op, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& mask, bool is_causal) {
  const uint8_t layout =
      (is_causal ? kselect::kCausal : 0) | (mask.defined() ? kselect::kMask : 0);
  return kselect::makeKey(op, q.scalar_type(),
                          {q.size(0) * q.size(1), q.size(2), k.size(2), q.size(3)}, layout);
}

// On the worker, host views.  A [B, H, seq, dim] operand as ATen's kernel
// reads it: unit-stride rows, each seq step at least a row apart (BLAS's
// leading dimension); else a contiguous copy.
at::Tensor flash_rows(const at::Tensor& t) {
  const bool unit = t.size(3) <= 1 || t.stride(3) == 1;
  const bool leading = t.stride(2) >= std::max<int64_t>(t.size(3), 1);
  return unit && leading ? t : t.new_empty(t.sizes()).copy_(t);
}

// The mask broadcast to [B, H, L, S] (ATen's kernel takes 2-d or 4-d masks
// and reads a row's elements at unit stride, or one broadcast element).
std::optional<at::Tensor> flash_mask(const cpu_kernel::DeviceView& m, c10::IntArrayRef q_sizes,
                                     int64_t kv_len) {
  if (!m.defined()) return std::nullopt;
  const std::array<int64_t, 4> sizes{q_sizes[0], q_sizes[1], q_sizes[2], kv_len};
  at::Tensor mask = m.view();
  at::Tensor expanded = mask.expand(sizes);
  if (expanded.stride(3) != 0 && expanded.stride(3) != 1) {
    expanded = mask.contiguous().expand(sizes);
  }
  return expanded;
}

// The logsumexp ATen's backward takes: 0 for the fully masked rows ours marks
// -inf (it computes exp(score - lse), which is exp(-inf - 0) = 0 there; ours
// skips such rows, so either value works for it).
at::Tensor flash_lse(const at::Tensor& lse, bool masked) {
  return masked ? lse.masked_fill(lse.isneginf(), 0.0) : lse;
}

// How a forward allocates its output (the op's Meta kernel decides the
// layout): like the query (overrideable, flash) or [B, L, H, Dv] memory order
// (memory-efficient).
enum class OutLayout { kLikeQuery, kSeqMajor };

at::Tensor seq_major(c10::IntArrayRef sizes, at::ScalarType dtype, c10::DeviceIndex device) {
  const int64_t H = sizes[1], L = sizes[2], D = sizes[3];
  return emptyDevice(sizes, {L * H * D, D, H * D, 1}, dtype, device);
}

// lse_for_callers: the logsumexp goes to the caller (the flash and
// memory-efficient ops; ring attention merges partial results by it), so a
// fully masked row must read -inf, which ATen's kernel (0 there) would not
// give: with a mask, no selection of ATen's kernel.
SdpaOutputs sdpa_forward_impl(const char* name, OutLayout layout, const at::Tensor& q,
                              const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                              double dropout_p, bool is_causal, std::optional<double> scale,
                              bool lse_for_callers = false) {
  const auto device = opDevice(name, q, {&k, &v, &mask});
  const int64_t B = q.size(0), Hq = q.size(1), L = q.size(2), D = q.size(3);
  const int64_t S = k.size(2), Dv = v.size(3);
  // The output follows the query's layout, as the Meta kernel says (for
  // Hugging Face's [B, L, H, D]-ordered queries: [B, L, H, Dv] memory order,
  // so the transpose(1, 2) before the output projection is already contiguous).
  at::Tensor out = layout == OutLayout::kLikeQuery
                       ? like_query(q, {B, Hq, L, Dv}, device)
                       : seq_major({B, Hq, L, Dv}, q.scalar_type(), device);
  at::Tensor lse = emptyDevice({B, Hq, L}, at::kFloat, device);
  // The dropout's counter range.  Eagerly it is known now and travels to the
  // backward in CPU scalars; while a graph captures, each replay fills a slot
  // that the kernel reads when it runs and writes into device scalars, which
  // the backward reads when it runs (as CUDA's graph-safe philox state).
  RawRng rng;
  if (dropout_p > 0) {
    rng = reserveRawRng(device, getDefaultAxonGenerator(device),
                        static_cast<uint64_t>(B * Hq * L * S));
  }
  auto cpu_long = [](uint64_t x) {
    return at::scalar_tensor(static_cast<int64_t>(x), at::TensorOptions().dtype(at::kLong));
  };
  at::Tensor philox_seed, philox_offset;
  if (rng.slot != nullptr) {
    philox_seed = emptyDevice({}, at::kLong, device);
    philox_offset = emptyDevice({}, at::kLong, device);
  } else {
    philox_seed = cpu_long(rng.seed);
    philox_offset = cpu_long(rng.offset);
  }
  const uint64_t seed = rng.seed, offset = rng.offset;
  const double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(D)));
  if (out.numel() > 0) {
    const k::AttentionShape shape = attention_shape(q, k, v);
    k::AttentionParams params{sc, is_causal, dropout_p, seed, offset};
    auto own = [&] {
      return [=, dt = *kernelDType(q.scalar_type()), m = attention_mask(mask, shape),
              qp = q.const_data_ptr(), kp = k.const_data_ptr(), vp = v.const_data_ptr(),
              op = out.data_ptr(), lp = lse.data_ptr<float>(), qs = strides4(q), ks = strides4(k),
              vs = strides4(v), os = strides4(out), slot = rng.slot,
              sp = rng.slot ? philox_seed.data_ptr<int64_t>() : nullptr,
              offp = rng.slot ? philox_offset.data_ptr<int64_t>() : nullptr]() mutable {
        if (slot != nullptr) {  // captured: this replay's range
          params.seed = slot->seed;
          params.offset = slot->offset;
          *sp = static_cast<int64_t>(params.seed);
          *offp = static_cast<int64_t>(params.offset);
        }
        k::attention_forward(dt, shape, params, qp, qs, kp, ks, vp, vs, m, op, os, lp);
      };
    };
    if (!flash_selectable(q, k, v, mask, dropout_p) || (lse_for_callers && mask.defined())) {
      kselect::launchWithThreadPolicy(
          device, name, (q.numel() + k.numel() + v.numel() + out.numel()) * q.itemsize(),
          std::max({q.numel(), k.numel(), v.numel(), out.numel()}), own());
    } else {
      // ATen's results (out in its [B, L, H, D] order, logsumexp a transposed
      // view) are copied into ours.
      kselect::launchSelected(
          device, name, attention_key(kselect::Op::kAttention, q, k, mask, is_causal), own, [&] {
            return [cq = cpu_kernel::capture(q), ck = cpu_kernel::capture(k),
                    cv = cpu_kernel::capture(v), cm = cpu_kernel::capture(mask),
                    co = cpu_kernel::capture(out), cl = cpu_kernel::capture(lse), is_causal, sc,
                    S] {
              const at::Tensor qv = cq.view();
              auto [o, l] = at::cpu::_scaled_dot_product_flash_attention_for_cpu(
                  flash_rows(qv), flash_rows(ck.view()), flash_rows(cv.view()), 0.0, is_causal,
                  flash_mask(cm, qv.sizes(), S), sc);
              co.view().copy_(o);
              cl.view().copy_(l);
              // ATen's kernel gives 0 for a query row with a NaN (its max skips the
              // NaN scores, so the row reads as fully masked); ours and the math
              // path give NaN there, as softmax does.
              const at::Tensor nan_rows = qv.isnan().any(-1);
              if (nan_rows.any().item<bool>()) {
                co.view().masked_fill_(nan_rows.unsqueeze(-1), NAN);
                cl.view().masked_fill_(nan_rows, NAN);
              }
            };
          });
    }
  }
  return {out, lse, at::Tensor(), at::Tensor(), c10::SymInt(L), c10::SymInt(S), philox_seed,
          philox_offset, at::Tensor()};
}

SdpaOutputs sdpa_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask, double dropout_p,
                         bool is_causal, bool /*return_debug_mask*/,
                         std::optional<double> scale) {
  return sdpa_forward_impl("aten::_scaled_dot_product_fused_attention_overrideable",
                           OutLayout::kLikeQuery, q, k, v, mask.value_or(at::Tensor()),
                           dropout_p, is_causal, scale);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sdpa_backward_impl(
    const char* name, OutLayout layout, const at::Tensor& grad_out, const at::Tensor& q,
    const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, bool mask_grad,
    const at::Tensor& out, const at::Tensor& lse_arg, double dropout_p, bool is_causal,
    const at::Tensor& philox_seed, const at::Tensor& philox_offset,
    std::optional<double> scale) {
  const auto device = opDevice(name, q, {&grad_out, &k, &v, &mask, &out, &lse_arg});
  TORCH_CHECK_NOT_IMPLEMENTED(
      !mask_grad || !mask.defined(), name,
      ": axon's attention kernel does not compute the gradient of the mask (attn_bias); "
      "detach it, or use the math backend (torch.nn.attention.sdpa_kernel(SDPBackend.MATH))");
  const int64_t D = q.size(3), L = q.size(2);
  const std::array<int64_t, 4> out_sizes{q.size(0), q.size(1), L, v.size(3)};
  TORCH_CHECK(out.sizes() == c10::IntArrayRef(out_sizes) &&
                  grad_out.sizes() == c10::IntArrayRef(out_sizes),
              name, ": expected out and grad_out of shape ", c10::IntArrayRef(out_sizes),
              " (the attention's output for these query and value), got ", out.sizes(), " and ",
              grad_out.sizes());
  TORCH_CHECK(lse_arg.dim() == 3 && lse_arg.size(0) == q.size(0) && lse_arg.size(1) == q.size(1) &&
                  (lse_arg.size(2) >= L || lse_arg.size(2) == 0) &&
                  lse_arg.scalar_type() == at::kFloat,
              name, ": expected a float32 logsumexp of shape [", q.size(0), ", ", q.size(1), ", ", L,
              "] (or padded past ", L, "), got ", lse_arg.sizes(), " ", lse_arg.scalar_type());
  // The kernel reads the logsumexp as a dense [B, H, L] array (the
  // memory-efficient op pads its last dimension).  The memory-efficient
  // forward without compute_log_sumexp returned none: recompute it (it does
  // not depend on the dropout, so no random numbers are drawn).
  const at::Tensor lse =
      lse_arg.size(2) == 0 && L > 0
          ? std::get<1>(sdpa_forward_impl(name, layout, q, k, v, mask, 0.0, is_causal, scale))
          : lse_arg.narrow(2, 0, L).contiguous();
  // Gradients laid out like their inputs (empty_like, as the Meta kernel), or
  // in [B, L, H, D] memory order (memory-efficient).
  auto grad_like = [&](const at::Tensor& t) {
    return layout == OutLayout::kLikeQuery ? like_query(t, t.sizes(), device)
                                           : seq_major(t.sizes(), t.scalar_type(), device);
  };
  at::Tensor dq = grad_like(q);
  at::Tensor dk = grad_like(k);
  at::Tensor dv = grad_like(v);
  // Device scalars (the forward ran in a graph) are read when the kernel runs.
  const bool rng_on_device = dropout_p > 0 && philox_seed.defined() && !philox_seed.is_cpu();
  const uint64_t seed = philox_seed.defined() && !rng_on_device ? philox_seed.item<int64_t>() : 0;
  const uint64_t offset =
      philox_offset.defined() && !rng_on_device ? philox_offset.item<int64_t>() : 0;
  const int64_t* seed_ptr = rng_on_device ? philox_seed.const_data_ptr<int64_t>() : nullptr;
  const int64_t* offset_ptr = rng_on_device ? philox_offset.const_data_ptr<int64_t>() : nullptr;
  const double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(D)));
  const at::Tensor dout = grad_out.scalar_type() == q.scalar_type() ? grad_out
                                                                      : grad_out.to(q.scalar_type());
  if (dq.numel() + dk.numel() + dv.numel() > 0) {
    const k::AttentionShape shape = attention_shape(q, k, v);
    k::AttentionParams params{sc, is_causal, dropout_p, seed, offset};
    auto own = [&] {
      return [=, dt = *kernelDType(q.scalar_type()), m = attention_mask(mask, shape),
              gp = dout.const_data_ptr(), qp = q.const_data_ptr(), kp = k.const_data_ptr(),
              vp = v.const_data_ptr(), op = out.const_data_ptr(), lp = lse.const_data_ptr<float>(),
              dqp = dq.data_ptr(), dkp = dk.data_ptr(), dvp = dv.data_ptr(), gs = strides4(dout),
              qs = strides4(q), ks = strides4(k), vs = strides4(v), os = strides4(out),
              dqs = strides4(dq), dks = strides4(dk), dvs = strides4(dv)]() mutable {
        if (seed_ptr != nullptr) {
          params.seed = static_cast<uint64_t>(*seed_ptr);
          params.offset = static_cast<uint64_t>(*offset_ptr);
        }
        k::attention_backward(dt, shape, params, gp, gs, qp, qs, kp, ks, vp, vs, m, op, os, lp,
                              dqp, dqs, dkp, dks, dvp, dvs);
      };
    };
    if (!flash_selectable(q, k, v, mask, dropout_p) || lse.scalar_type() != at::kFloat) {
      kselect::launchWithThreadPolicy(
          device, name, (2 * (q.numel() + k.numel() + v.numel()) + out.numel()) * q.itemsize(),
          std::max({q.numel(), k.numel(), v.numel(), out.numel()}), own());
    } else {
      // ATen's gradients (fresh tensors in its [B, L, H, D] order) are copied
      // into ours.
      kselect::launchSelected(
          device, name, attention_key(kselect::Op::kAttentionBackward, q, k, mask, is_causal),
          own, [&] {
            return [cg = cpu_kernel::capture(dout), cq = cpu_kernel::capture(q),
                    ck = cpu_kernel::capture(k), cv = cpu_kernel::capture(v),
                    cm = cpu_kernel::capture(mask), co = cpu_kernel::capture(out),
                    cl = cpu_kernel::capture(lse), cdq = cpu_kernel::capture(dq),
                    cdk = cpu_kernel::capture(dk), cdv = cpu_kernel::capture(dv), is_causal, sc] {
              const at::Tensor qv = cq.view(), kv = ck.view();
              auto [gq, gk, gv] = at::cpu::_scaled_dot_product_flash_attention_for_cpu_backward(
                  flash_rows(cg.view()), flash_rows(qv), flash_rows(kv), flash_rows(cv.view()),
                  flash_rows(co.view()), flash_lse(cl.view(), cm.defined()), 0.0, is_causal,
                  flash_mask(cm, qv.sizes(), kv.size(2)), sc);
              cdq.view().copy_(gq);
              cdk.view().copy_(gk);
              cdv.view().copy_(gv);
            };
          });
    }
  }
  return {dq, dk, dv, at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sdpa_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& mask, std::array<bool, 4> grad_mask, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& /*cum_seq_q*/, const at::Tensor& /*cum_seq_k*/,
    int64_t /*max_q*/, int64_t /*max_k*/, double dropout_p, bool is_causal,
    const at::Tensor& philox_seed, const at::Tensor& philox_offset,
    std::optional<double> scale) {
  return sdpa_backward_impl("aten::_scaled_dot_product_fused_attention_overrideable_backward",
                            OutLayout::kLikeQuery, grad_out, q, k, v, mask, grad_mask[3], out, lse,
                            dropout_p, is_causal, philox_seed, philox_offset, scale);
}

// ---- CUDA's backend ops, called directly by libraries that want the
// logsumexp (ring attention: torch.distributed's context parallelism,
// Diffusers' "_native_flash" / "_native_efficient" backends), on the same
// kernel.  SDPA itself chooses the overrideable op above.

// Arguments the kernel takes: 4-D query, key and value of one float dtype,
// matching batch and head sizes (grouped-query heads allowed: key/value heads
// dividing the query's), key and value of one length.
void check_attention_args(const char* name, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, bool same_head_dim) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, name,
              ": expected 4-D query, key and value ([batch, heads, seq, head_dim]), got ",
              q.dim(), "-D, ", k.dim(), "-D and ", v.dim(), "-D");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), name,
              ": expected query, key and value to have the same dtype, got ", q.scalar_type(),
              ", ", k.scalar_type(), " and ", v.scalar_type());
  TORCH_CHECK(kernelDType(q.scalar_type()).has_value(), name,
              ": axon's attention kernel takes float32, bfloat16 or float16, got ",
              q.scalar_type());
  TORCH_CHECK(q.size(0) == k.size(0) && k.size(0) == v.size(0) && k.size(1) == v.size(1) &&
                  k.size(2) == v.size(2) && q.size(3) == k.size(3),
              name, ": query ", q.sizes(), ", key ", k.sizes(), " and value ", v.sizes(),
              " do not match (batch, key/value heads and length, query/key head_dim)");
  TORCH_CHECK(k.size(1) > 0 ? q.size(1) % k.size(1) == 0 : q.size(1) == 0, name,
              ": the number of key/value heads (", k.size(1),
              ") must divide the number of query heads (", q.size(1), ")");
  TORCH_CHECK(!same_head_dim || v.size(3) == q.size(3), name,
              ": expected query, key and value to have the same head_dim, got ", q.size(3),
              " and ", v.size(3), " (value)");
}

SdpaOutputs flash_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          double dropout_p, bool is_causal, bool return_debug_mask,
                          std::optional<double> scale) {
  const char* name = "aten::_scaled_dot_product_flash_attention";
  check_attention_args(name, q, k, v, /*same_head_dim=*/true);
  TORCH_CHECK_NOT_IMPLEMENTED(!return_debug_mask, name,
                              ": return_debug_mask=True is not supported on axon");
  auto r = sdpa_forward_impl(name, OutLayout::kLikeQuery, q, k, v, at::Tensor(), dropout_p,
                             is_causal, scale, /*lse_for_callers=*/true);
  // CUDA's layout, which the Meta kernel states: rng_state = [seed, offset]
  // (uint64, shape [2]), unused (uint64, shape []).  Stacked where the
  // kernel's seed and offset are: CPU scalars, or device scalars a captured
  // graph fills when it runs (the stack is stream work after the kernel).
  const at::Tensor seed = std::get<6>(r);
  std::get<6>(r) = at::stack({seed, std::get<7>(r)}).view(at::kUInt64);
  std::get<7>(r) = at::empty({}, seed.options().dtype(at::kUInt64));
  std::get<8>(r) = emptyDevice({0}, q.scalar_type(), q.device().index());
  return r;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& /*cum_seq_q*/,
    const at::Tensor& /*cum_seq_k*/, int64_t /*max_q*/, int64_t /*max_k*/, double dropout_p,
    bool is_causal, const at::Tensor& philox_seed, const at::Tensor& philox_offset,
    std::optional<double> scale) {
  const char* name = "aten::_scaled_dot_product_flash_attention_backward";
  check_attention_args(name, q, k, v, /*same_head_dim=*/true);
  // The forward's rng_state, [seed, offset] (philox_offset is its unused
  // output); views, so device scalars are read when the kernel runs.
  at::Tensor seed = philox_seed, offset = philox_offset;
  if (philox_seed.defined() && philox_seed.numel() == 2) {
    const at::Tensor pair = philox_seed.view(at::kLong);
    seed = pair.select(0, 0);
    offset = pair.select(0, 1);
  }
  auto [dq, dk, dv, unused] =
      sdpa_backward_impl(name, OutLayout::kLikeQuery, grad_out, q, k, v, at::Tensor(), false, out,
                         lse, dropout_p, is_causal, seed, offset, scale);
  return {dq, dk, dv};
}

// The memory-efficient op's logsumexp has its last dimension padded to a
// multiple of 32 (CUDA's layout, which its Meta kernel states), or is empty
// without compute_log_sumexp.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> efficient_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& bias, bool compute_log_sumexp, double dropout_p,
    bool is_causal, std::optional<double> scale) {
  const char* name = "aten::_scaled_dot_product_efficient_attention";
  check_attention_args(name, q, k, v, /*same_head_dim=*/false);
  const at::Tensor mask = bias.value_or(at::Tensor());
  auto r = sdpa_forward_impl(name, OutLayout::kSeqMajor, q, k, v, mask, dropout_p, is_causal,
                             scale, /*lse_for_callers=*/true);
  const int64_t L = q.size(2);
  const int64_t padded = compute_log_sumexp ? (L + 31) / 32 * 32 : 0;
  at::Tensor lse = emptyDevice({q.size(0), q.size(1), padded}, at::kFloat, q.device().index());
  if (compute_log_sumexp && lse.numel() > 0) {
    lse.narrow(2, L, padded - L).fill_(0.0);
    lse.narrow(2, 0, L).copy_(std::get<1>(r));
  }
  return {std::get<0>(r), lse, std::get<6>(r), std::get<7>(r)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> efficient_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& bias, const at::Tensor& out, const at::Tensor& lse,
    const at::Tensor& philox_seed, const at::Tensor& philox_offset, double dropout_p,
    std::array<bool, 4> grad_mask, bool is_causal, std::optional<double> scale) {
  const char* name = "aten::_scaled_dot_product_efficient_attention_backward";
  check_attention_args(name, q, k, v, /*same_head_dim=*/false);
  return sdpa_backward_impl(name, OutLayout::kSeqMajor, grad_out, q, k, v, bias, grad_mask[3], out,
                            lse, dropout_p, is_causal, philox_seed, philox_offset, scale);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  OpRegistrar reg(m, "attention");
  reg.impl(Path::kFused, "_scaled_dot_product_fused_attention_overrideable", sdpa_forward);
  reg.impl(Path::kFused, "_scaled_dot_product_fused_attention_overrideable_backward",
           sdpa_backward);
  reg.impl(Path::kFused, "_scaled_dot_product_flash_attention", flash_forward);
  reg.impl(Path::kFused, "_scaled_dot_product_flash_attention_backward", flash_backward);
  reg.impl(Path::kFused, "_scaled_dot_product_efficient_attention", efficient_forward);
  reg.impl(Path::kFused, "_scaled_dot_product_efficient_attention_backward", efficient_backward);
}

}  // namespace at::axon

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &at::axon::fusedSdpChoice)
}  // namespace at::native
