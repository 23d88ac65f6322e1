// Tier 2 with our own kernels (kernels/): layer_norm, rms_norm, softmax,
// scaled_dot_product_attention and the fused Adam/AdamW step, forward and
// backward.  The host checks arguments and allocates results; the kernel runs
// as stream work on raw pointers taken at launch (holding no references:
// stream order protects memory the host frees meanwhile, see CpuKernel.h).  Inputs a kernel cannot
// take (other dtypes, odd layouts) go to the ATen CPU kernels, also as
// stream work.
#include <cmath>

#include <ATen/Parallel.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/native/layer_norm.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/_fused_rms_norm.h>
#include <ATen/ops/_log_softmax_backward_data_cpu_dispatch.h>
#include <ATen/ops/_log_softmax_cpu_dispatch.h>
#include <ATen/ops/_softmax_backward_data_cpu_dispatch.h>
#include <ATen/ops/_softmax_cpu_dispatch.h>
#include <ATen/ops/native_layer_norm_backward_cpu_dispatch.h>
#include <ATen/ops/native_layer_norm_cpu_dispatch.h>
#include <ATen/ops/rms_norm_ops.h>
#include <ATen/ops/scalar_tensor.h>
#include <c10/util/irange.h>
#include <c10/util/strides.h>
#include <torch/library.h>

#include <axon/kernels/attention.h>
#include <axon/kernels/dtype.h>
#include <axon/kernels/norm.h>
#include <axon/kernels/optimizer.h>
#include <axon/kernels/parallel.h>
#include <axon/kernels/softmax.h>

#include "../core/AxonGenerator.h"
#include "CpuKernel.h"

namespace at::axon {
namespace {

namespace k = ::axon::kernels;

std::optional<k::DType> kernel_dtype(c10::ScalarType t) {
  switch (t) {
    case at::kFloat: return k::DType::kFloat32;
    case at::kBFloat16: return k::DType::kBFloat16;
    case at::kHalf: return k::DType::kFloat16;
    default: return std::nullopt;
  }
}

// Kernels split work with ATen's thread pool (OpenMP), from the stream worker.
void aten_parallel_for(int64_t begin, int64_t end, int64_t grain, void* ctx,
                       k::ParallelBody body) {
  at::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) { body(ctx, b, e); });
}
const bool parallel_installed = [] {
  k::set_parallel_backend(&aten_parallel_for);
  return true;
}();

c10::DeviceIndex device_checked(const char* op, const at::Tensor& main,
                                std::initializer_list<const at::Tensor*> others) {
  const c10::DeviceIndex device = axonDevice(op, main);
  for (const at::Tensor* t : others) checkSameDevice(op, device, *t);
  return device;
}

// ------------------------------------------------------------ layer_norm

// The dtype the kernel reads weight and bias in (the kernels take one).
c10::ScalarType param_dtype(const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias) {
  if (weight.defined()) return weight.scalar_type();
  if (bias.defined()) return bias.scalar_type();
  return input.scalar_type();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm(
    const at::Tensor& input, c10::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight_opt, const std::optional<at::Tensor>& bias_opt,
    double eps) {
  const at::Tensor weight = weight_opt.value_or(at::Tensor());
  const at::Tensor bias = bias_opt.value_or(at::Tensor());
  const auto device = device_checked("aten::native_layer_norm", input, {&weight, &bias});
  auto [rows, cols] = at::native::_check_layer_norm_inputs(input, normalized_shape, weight, bias);
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized_shape.size());
  std::vector<int64_t> stat_shape(input.sizes().begin(), input.sizes().begin() + axis);
  stat_shape.resize(input.dim(), 1);

  const auto dt = kernel_dtype(input.scalar_type());
  const auto wdt = kernel_dtype(param_dtype(input, weight, bias));
  const bool same_wb = !weight.defined() || !bias.defined() ||
                       weight.scalar_type() == bias.scalar_type();
  if (!dt || !wdt || !same_wb) {  // e.g. float64: ATen's kernel, statistics in input dtype
    at::Tensor out = emptyDevice(input.sizes(), input.scalar_type(), device);
    at::Tensor mean = emptyDevice(stat_shape, input.scalar_type(), device);
    at::Tensor rstd = emptyDevice(stat_shape, input.scalar_type(), device);
    std::vector<int64_t> shape = normalized_shape.vec();
    launchCpuKernel(device, "aten::native_layer_norm",
                    [shape, eps](const at::Tensor& x, const std::optional<at::Tensor>& w,
                                 const std::optional<at::Tensor>& b, at::Tensor& o, at::Tensor& m,
                                 at::Tensor& r) {
                      auto [o2, m2, r2] = at::cpu::native_layer_norm(x, shape, w, b, eps);
                      o.copy_(o2);
                      m.copy_(m2);
                      r.copy_(r2);
                    },
                    input, weight_opt, bias_opt, out, mean, rstd);
    return {out, mean, rstd};
  }
  // Statistics in float32 for every dtype, as CUDA keeps them.
  const at::Tensor x = input.contiguous();
  at::Tensor out = emptyDevice(input.sizes(), input.scalar_type(), device);
  at::Tensor mean = emptyDevice(stat_shape, at::kFloat, device);
  at::Tensor rstd = emptyDevice(stat_shape, at::kFloat, device);
  if (rows * cols == 0) return {out, mean, rstd};
  // Temporaries stay alive until the kernel is enqueued (after that, stream
  // order protects their memory).
  const at::Tensor wc = weight.defined() ? weight.contiguous() : weight;
  const at::Tensor bc = bias.defined() ? bias.contiguous() : bias;
  const void* w = wc.defined() ? wc.const_data_ptr() : nullptr;
  const void* b = bc.defined() ? bc.const_data_ptr() : nullptr;
  launch(device, "aten::native_layer_norm",
         [=, dt = *dt, wdt = *wdt, xp = x.const_data_ptr(), yp = out.data_ptr(),
          mp = mean.data_ptr<float>(), rp = rstd.data_ptr<float>()] {
           k::layer_norm_forward(dt, rows, cols, xp, cols, wdt, w, b, eps, yp, mp, rp);
         }, kernelThreads(2 * rows * cols));
  return {out, mean, rstd};
}

// dweight / dbias come out of the kernels in float32; results take the
// parameter's dtype.
at::Tensor param_grad_buffer(const at::Tensor& param, c10::DeviceIndex device) {
  return emptyDevice(param.sizes(), at::kFloat, device);
}
at::Tensor as_param_dtype(const at::Tensor& grad, const at::Tensor& param) {
  return param.scalar_type() == at::kFloat ? grad : grad.to(param.scalar_type());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, c10::IntArrayRef normalized_shape,
    const at::Tensor& mean, const at::Tensor& rstd, const std::optional<at::Tensor>& weight_opt,
    const std::optional<at::Tensor>& bias_opt, std::array<bool, 3> mask) {
  const at::Tensor weight = weight_opt.value_or(at::Tensor());
  const at::Tensor bias = bias_opt.value_or(at::Tensor());
  const auto device = device_checked("aten::native_layer_norm_backward", input,
                                     {&grad_out, &mean, &rstd, &weight, &bias});
  auto [rows, cols] = at::native::_check_layer_norm_inputs(input, normalized_shape, weight, bias);
  const auto dt = kernel_dtype(input.scalar_type());
  const auto wdt = kernel_dtype(param_dtype(input, weight, bias));
  const bool same_wb = !weight.defined() || !bias.defined() ||
                       weight.scalar_type() == bias.scalar_type();
  if (!dt || !wdt || !same_wb || mean.scalar_type() != at::kFloat || rstd.scalar_type() != at::kFloat ||
      grad_out.scalar_type() != input.scalar_type()) {
    at::Tensor dx = mask[0] ? emptyDevice(input.sizes(), input.scalar_type(), device) : at::Tensor();
    at::Tensor dw = mask[1] && weight.defined()
                        ? emptyDevice(weight.sizes(), weight.scalar_type(), device) : at::Tensor();
    at::Tensor db = mask[2] && bias.defined()
                        ? emptyDevice(bias.sizes(), bias.scalar_type(), device) : at::Tensor();
    std::vector<int64_t> shape = normalized_shape.vec();
    launchCpuKernel(device, "aten::native_layer_norm_backward",
                    [shape, mask](const at::Tensor& g, const at::Tensor& x, const at::Tensor& m,
                                  const at::Tensor& r, const std::optional<at::Tensor>& w,
                                  const std::optional<at::Tensor>& b,
                                  std::optional<at::Tensor>& dx, std::optional<at::Tensor>& dw,
                                  std::optional<at::Tensor>& db) {
                      auto [dx2, dw2, db2] =
                          at::cpu::native_layer_norm_backward(g, x, shape, m, r, w, b, mask);
                      if (dx.has_value() && dx->defined()) dx->copy_(dx2);
                      if (dw.has_value() && dw->defined()) dw->copy_(dw2);
                      if (db.has_value() && db->defined()) db->copy_(db2);
                    },
                    grad_out, input, mean, rstd, weight_opt, bias_opt, std::optional<at::Tensor>(dx),
                    std::optional<at::Tensor>(dw), std::optional<at::Tensor>(db));
    return {dx, dw, db};
  }
  const at::Tensor x = input.contiguous();
  const at::Tensor dy = grad_out.contiguous();
  at::Tensor dx = mask[0] ? emptyDevice(input.sizes(), input.scalar_type(), device) : at::Tensor();
  at::Tensor dw32 = mask[1] && weight.defined() ? param_grad_buffer(weight, device) : at::Tensor();
  at::Tensor db32 = mask[2] && bias.defined() ? param_grad_buffer(bias, device) : at::Tensor();
  const at::Tensor w = weight.defined() ? weight.contiguous() : weight;
  auto ptr = [](const at::Tensor& t) -> void* { return t.defined() ? t.data_ptr() : nullptr; };
  launch(device, "aten::native_layer_norm_backward",
         [=, dt = *dt, wdt = *wdt, dyp = dy.const_data_ptr(), xp = x.const_data_ptr(),
          mp = mean.const_data_ptr<float>(), rp = rstd.const_data_ptr<float>(),
          wp = w.defined() ? w.const_data_ptr() : nullptr, dxp = ptr(dx),
          dwp = static_cast<float*>(ptr(dw32)), dbp = static_cast<float*>(ptr(db32))] {
           k::layer_norm_backward(dt, rows, cols, dyp, xp, mp, rp, wdt, wp, dxp, dwp, dbp);
         }, kernelThreads(3 * rows * cols));
  return {dx, dw32.defined() ? as_param_dtype(dw32, weight) : dw32,
          db32.defined() ? as_param_dtype(db32, bias) : db32};
}

// ------------------------------------------------------------ rms_norm

// rms_norm's default eps, as ATen's: the epsilon of the type it computes in
// (float32 for half types, float64 for float64).
double default_eps(c10::ScalarType t) {
  return t == at::kDouble ? std::numeric_limits<double>::epsilon()
                          : std::numeric_limits<float>::epsilon();
}

// rms_norm is composite in ATen; on axon it goes to _fused_rms_norm (which
// has a derivative) whenever our kernel takes the inputs, as on CUDA.
at::Tensor rms_norm_autograd(const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                             const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  // Symbolic sizes (torch.compile with dynamic shapes traces with fake
  // tensors): the composite, which Inductor fuses anyway.
  const auto shape = c10::asIntArrayRefSlowOpt(normalized_shape);
  const bool fused = shape.has_value() && kernel_dtype(input.scalar_type()).has_value() &&
                     (!weight.has_value() || !weight->defined() ||
                      weight->scalar_type() == input.scalar_type());
  if (!fused) {  // ATen's composite (its kernel for the PrivateUse1 key), with autograd
    return at::_ops::rms_norm::redispatch(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                          input, normalized_shape, weight, eps);
  }
  return std::get<0>(at::_fused_rms_norm(input, *shape, weight, eps));
}

std::tuple<at::Tensor, at::Tensor> fused_rms_norm(const at::Tensor& input,
                                                  c10::IntArrayRef normalized_shape,
                                                  const std::optional<at::Tensor>& weight_opt,
                                                  std::optional<double> eps_opt) {
  const at::Tensor weight = weight_opt.value_or(at::Tensor());
  const auto device = device_checked("aten::_fused_rms_norm", input, {&weight});
  auto [rows, cols] = at::native::_check_layer_norm_inputs(input, normalized_shape, weight, {});
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(input.scalar_type()),
                              "\"rms_norm\" not implemented for '", input.scalar_type(), "'");
  const double e = eps_opt.has_value() ? *eps_opt : default_eps(input.scalar_type());
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized_shape.size());
  std::vector<int64_t> stat_shape(input.sizes().begin(), input.sizes().begin() + axis);
  stat_shape.resize(input.dim(), 1);
  const auto dt = kernel_dtype(input.scalar_type());
  const auto wdt = weight.defined() ? kernel_dtype(weight.scalar_type()) : dt;
  if (!dt || !wdt) {  // e.g. float64: ATen's CPU ops as stream work
    at::Tensor out = emptyDevice(input.sizes(), input.scalar_type(), device);
    at::Tensor rstd = emptyDevice(stat_shape, input.scalar_type(), device);
    std::vector<int64_t> dims;
    for (int64_t d = axis; d < input.dim(); ++d) dims.push_back(d);
    launchCpuKernel(device, "aten::_fused_rms_norm",
                    [dims, e](const at::Tensor& x, const std::optional<at::Tensor>& w,
                              at::Tensor& o, at::Tensor& r) {
                      r.copy_(x.pow(2).mean(dims, /*keepdim=*/true).add(e).rsqrt());
                      at::Tensor y = x * r;
                      o.copy_(w.has_value() && w->defined() ? y * *w : y);
                    },
                    input, weight_opt, out, rstd);
    return {out, rstd};
  }
  const at::Tensor x = input.contiguous();
  at::Tensor out = emptyDevice(input.sizes(), input.scalar_type(), device);
  at::Tensor rstd = emptyDevice(stat_shape, at::kFloat, device);
  if (rows * cols == 0) return {out, rstd};
  const at::Tensor w = weight.defined() ? weight.contiguous() : weight;
  launch(device, "aten::_fused_rms_norm",
         [=, dt = *dt, wdt = *wdt, xp = x.const_data_ptr(),
          wp = w.defined() ? w.const_data_ptr() : nullptr, yp = out.data_ptr(),
          rp = rstd.data_ptr<float>()] {
           k::rms_norm_forward(dt, rows, cols, xp, cols, wdt, wp, e, yp, rp);
         }, kernelThreads(2 * rows * cols));
  return {out, rstd};
}

std::tuple<at::Tensor, at::Tensor> fused_rms_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, c10::IntArrayRef normalized_shape,
    const at::Tensor& rstd, const std::optional<at::Tensor>& weight_opt,
    std::array<bool, 2> mask) {
  const at::Tensor weight = weight_opt.value_or(at::Tensor());
  const auto device = device_checked("aten::_fused_rms_norm_backward", input,
                                     {&grad_out, &rstd, &weight});
  auto [rows, cols] = at::native::_check_layer_norm_inputs(input, normalized_shape, weight, {});
  const auto dt = kernel_dtype(input.scalar_type());
  const auto wdt = weight.defined() ? kernel_dtype(weight.scalar_type()) : dt;
  if (!dt || !wdt || rstd.scalar_type() != at::kFloat) {  // ATen's CPU ops as stream work
    const int64_t axis = input.dim() - static_cast<int64_t>(normalized_shape.size());
    std::vector<int64_t> dims, rows_dims;
    for (int64_t d = 0; d < input.dim(); ++d) (d < axis ? rows_dims : dims).push_back(d);
    at::Tensor dx =
        mask[0] ? emptyDevice(input.sizes(), input.scalar_type(), device) : at::Tensor();
    at::Tensor dw = mask[1] && weight.defined()
                        ? emptyDevice(weight.sizes(), weight.scalar_type(), device)
                        : at::Tensor();
    launchCpuKernel(device, "aten::_fused_rms_norm_backward",
                    [dims, rows_dims](const at::Tensor& dy, const at::Tensor& x,
                                      const at::Tensor& r, const std::optional<at::Tensor>& w,
                                      std::optional<at::Tensor>& dx,
                                      std::optional<at::Tensor>& dw) {
                      const at::Tensor xhat = x * r;
                      const at::Tensor g = w.has_value() && w->defined() ? dy * *w : dy;
                      if (dx.has_value() && dx->defined()) {
                        dx->copy_(r * (g - xhat * (g * xhat).mean(dims, true)));
                      }
                      if (dw.has_value() && dw->defined()) {
                        dw->copy_((dy * xhat).sum(rows_dims).reshape(dw->sizes()));
                      }
                    },
                    grad_out, input, rstd, weight_opt, std::optional<at::Tensor>(dx),
                    std::optional<at::Tensor>(dw));
    return {dx, dw};
  }
  const at::Tensor x = input.contiguous();
  const at::Tensor dy = grad_out.to(input.scalar_type()).contiguous();
  const at::Tensor w = weight.defined() ? weight.contiguous() : weight;
  at::Tensor dx = mask[0] ? emptyDevice(input.sizes(), input.scalar_type(), device) : at::Tensor();
  at::Tensor dw32 = mask[1] && weight.defined() ? param_grad_buffer(weight, device) : at::Tensor();
  auto ptr = [](const at::Tensor& t) -> void* { return t.defined() ? t.data_ptr() : nullptr; };
  if (rows * cols > 0) {
    launch(device, "aten::_fused_rms_norm_backward",
           [=, dt = *dt, wdt = *wdt, dyp = dy.const_data_ptr(), xp = x.const_data_ptr(),
            wp = w.defined() ? w.const_data_ptr() : nullptr, rp = rstd.const_data_ptr<float>(),
            dxp = ptr(dx), dwp = static_cast<float*>(ptr(dw32))] {
             k::rms_norm_backward(dt, rows, cols, dyp, xp, wdt, wp, rp, dxp, dwp);
           }, kernelThreads(3 * rows * cols));
  } else if (dw32.defined()) {
    dw32.zero_();
  }
  return {dx, dw32.defined() ? as_param_dtype(dw32, weight) : dw32};
}

// ------------------------------------------------------------ softmax

// Last-dim softmax on contiguous rows: our kernel; anything else: ATen's.
bool softmax_native(const at::Tensor& self, int64_t dim, bool half_to_float) {
  return !half_to_float && kernel_dtype(self.scalar_type()).has_value() && self.dim() > 0 &&
         c10::maybe_wrap_dim(dim, self.dim()) == self.dim() - 1 && self.is_contiguous();
}

at::Tensor softmax_impl(const at::Tensor& self, int64_t dim, bool half_to_float, bool log) {
  const auto device = device_checked(log ? "aten::_log_softmax" : "aten::_softmax", self, {});
  if (!softmax_native(self, dim, half_to_float)) {
    at::Tensor out = emptyDevice(self.sizes(),
                                  half_to_float ? at::kFloat : self.scalar_type(), device);
    launchCpuKernel(device, log ? "aten::_log_softmax" : "aten::_softmax",
                    log ? &at::cpu::_log_softmax_outf : &at::cpu::_softmax_outf, self, dim,
                    half_to_float, out);
    return out;
  }
  at::Tensor out = emptyDevice(self.sizes(), self.scalar_type(), device);
  const int64_t cols = self.size(-1);
  const int64_t rows = cols == 0 ? 0 : self.numel() / cols;
  if (rows == 0) return out;
  launch(device, log ? "aten::_log_softmax" : "aten::_softmax",
         [=, dt = *kernel_dtype(self.scalar_type()), xp = self.const_data_ptr(),
          yp = out.data_ptr()] {
           k::softmax_forward(dt, rows, cols, xp, cols, yp, log);
         }, kernelThreads(2 * rows * cols));
  return out;
}

at::Tensor softmax(const at::Tensor& self, int64_t dim, bool half_to_float) {
  return softmax_impl(self, dim, half_to_float, false);
}
at::Tensor log_softmax(const at::Tensor& self, int64_t dim, bool half_to_float) {
  return softmax_impl(self, dim, half_to_float, true);
}

at::Tensor softmax_backward_impl(const at::Tensor& grad, const at::Tensor& output, int64_t dim,
                                 c10::ScalarType input_dtype, bool log) {
  const char* name = log ? "aten::_log_softmax_backward_data" : "aten::_softmax_backward_data";
  const auto device = device_checked(name, output, {&grad});
  const bool native = softmax_native(output, dim, false) && grad.is_contiguous() &&
                      grad.scalar_type() == output.scalar_type() &&
                      input_dtype == output.scalar_type() && grad.sizes() == output.sizes();
  if (!native) {
    at::Tensor out = emptyDevice(output.sizes(), input_dtype, device);
    launchCpuKernel(device, name,
                    log ? &at::cpu::_log_softmax_backward_data_outf
                        : &at::cpu::_softmax_backward_data_outf,
                    grad, output, dim, input_dtype, out);
    return out;
  }
  at::Tensor dx = emptyDevice(output.sizes(), output.scalar_type(), device);
  const int64_t cols = output.size(-1);
  const int64_t rows = cols == 0 ? 0 : output.numel() / cols;
  if (rows == 0) return dx;
  launch(device, name,
         [=, dt = *kernel_dtype(output.scalar_type()), gp = grad.const_data_ptr(),
          yp = output.const_data_ptr(), dxp = dx.data_ptr()] {
           k::softmax_backward(dt, rows, cols, gp, yp, dxp, log);
         }, kernelThreads(3 * rows * cols));
  return dx;
}

at::Tensor softmax_backward(const at::Tensor& grad, const at::Tensor& output, int64_t dim,
                            c10::ScalarType input_dtype) {
  return softmax_backward_impl(grad, output, dim, input_dtype, false);
}
at::Tensor log_softmax_backward(const at::Tensor& grad, const at::Tensor& output, int64_t dim,
                                c10::ScalarType input_dtype) {
  return softmax_backward_impl(grad, output, dim, input_dtype, true);
}

// ------------------------------------------------------------ attention

k::Strides4 strides4(const at::Tensor& t) {
  return {{t.stride(0), t.stride(1), t.stride(2), t.stride(3)}};
}

// SDPA's backend choice for axon tensors (registered as the PrivateUse1
// kernel of _fused_sdp_choice_stub): our fused kernel for 4-d inputs of
// one kernel dtype, with an additive mask or none (boolean masks arrive
// converted to additive ones); else PyTorch's math path.
}  // namespace

int64_t fusedSdpChoice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask, double /*dropout_p*/,
                         bool /*is_causal*/, std::optional<double> /*scale*/, bool enable_gqa) {
  const auto math = static_cast<int64_t>(at::SDPBackend::math);
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return math;
  if (!kernel_dtype(q.scalar_type()) || k.scalar_type() != q.scalar_type() ||
      v.scalar_type() != q.scalar_type()) {
    return math;
  }
  if (q.size(0) != k.size(0) || k.size(0) != v.size(0) || k.size(1) != v.size(1) ||
      k.size(2) != v.size(2) || q.size(3) != k.size(3)) {
    return math;  // the math path raises PyTorch's shape errors
  }
  if (q.size(1) != k.size(1) && (!enable_gqa || k.size(1) == 0 || q.size(1) % k.size(1) != 0)) {
    return math;
  }
  if (mask.has_value() && mask->defined()) {
    if (mask->requires_grad() || mask->dim() > 4) return math;
    if (mask->scalar_type() != at::kBool && !kernel_dtype(mask->scalar_type())) return math;
  }
  if (q.requires_grad() || k.requires_grad() || v.requires_grad()) {
    if (q.numel() == 0 || k.numel() == 0) return math;
  }
  return static_cast<int64_t>(at::SDPBackend::overrideable);
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
    m.dt = *kernel_dtype(mask.scalar_type());
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

SdpaOutputs sdpa_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask_opt, double dropout_p,
                         bool is_causal, bool /*return_debug_mask*/,
                         std::optional<double> scale) {
  const at::Tensor mask = mask_opt.value_or(at::Tensor());
  const auto device = device_checked("aten::_scaled_dot_product_fused_attention_overrideable",
                                     q, {&k, &v, &mask});
  const int64_t B = q.size(0), Hq = q.size(1), L = q.size(2), D = q.size(3);
  const int64_t S = k.size(2), Dv = v.size(3);
  // The output follows the query's layout, as the Meta kernel says (for
  // Hugging Face's [B, L, H, D]-ordered queries: [B, L, H, Dv] memory order,
  // so the transpose(1, 2) before the output projection is already contiguous).
  at::Tensor out = like_query(q, {B, Hq, L, Dv}, device);
  at::Tensor lse = emptyDevice({B, Hq, L}, at::kFloat, device);
  uint64_t seed = 0, offset = 0;
  if (dropout_p > 0) {
    at::Generator gen = getDefaultAxonGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    std::tie(seed, offset) = gen.get<AxonGeneratorImpl>()->reserve(
        static_cast<uint64_t>(B * Hq * L * S));
  }
  auto cpu_long = [](uint64_t x) {
    return at::scalar_tensor(static_cast<int64_t>(x), at::TensorOptions().dtype(at::kLong));
  };
  at::Tensor philox_seed = cpu_long(seed), philox_offset = cpu_long(offset);
  const double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(D)));
  if (out.numel() > 0) {
    const k::AttentionShape shape = attention_shape(q, k, v);
    k::AttentionParams params{sc, is_causal, dropout_p, seed, offset};
    launch(device, "aten::_scaled_dot_product_fused_attention_overrideable",
           [=, dt = *kernel_dtype(q.scalar_type()), m = attention_mask(mask, shape),
            qp = q.const_data_ptr(), kp = k.const_data_ptr(), vp = v.const_data_ptr(),
            op = out.data_ptr(), lp = lse.data_ptr<float>(), qs = strides4(q), ks = strides4(k),
            vs = strides4(v), os = strides4(out)] {
             k::attention_forward(dt, shape, params, qp, qs, kp, ks, vp, vs, m, op, os, lp);
           }, kernelThreads(q.numel() + k.numel() + v.numel() + out.numel()));
  }
  return {out, lse, at::Tensor(), at::Tensor(), c10::SymInt(L), c10::SymInt(S), philox_seed,
          philox_offset, at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sdpa_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& mask, std::array<bool, 4> grad_mask, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& /*cum_seq_q*/, const at::Tensor& /*cum_seq_k*/,
    int64_t /*max_q*/, int64_t /*max_k*/, double dropout_p, bool is_causal,
    const at::Tensor& philox_seed, const at::Tensor& philox_offset,
    std::optional<double> scale) {
  const auto device = device_checked(
      "aten::_scaled_dot_product_fused_attention_overrideable_backward", q,
      {&grad_out, &k, &v, &mask, &out, &lse});
  TORCH_CHECK(!grad_mask[3] || !mask.defined(),
              "axon: the fused attention kernel does not compute the mask's gradient");
  const int64_t D = q.size(3);
  // Gradients laid out like their inputs (empty_like, as the Meta kernel).
  at::Tensor dq = like_query(q, q.sizes(), device);
  at::Tensor dk = like_query(k, k.sizes(), device);
  at::Tensor dv = like_query(v, v.sizes(), device);
  const uint64_t seed = philox_seed.defined() ? philox_seed.item<int64_t>() : 0;
  const uint64_t offset = philox_offset.defined() ? philox_offset.item<int64_t>() : 0;
  const double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(D)));
  const at::Tensor dout = grad_out.scalar_type() == q.scalar_type() ? grad_out
                                                                      : grad_out.to(q.scalar_type());
  if (dq.numel() + dk.numel() + dv.numel() > 0) {
    const k::AttentionShape shape = attention_shape(q, k, v);
    k::AttentionParams params{sc, is_causal, dropout_p, seed, offset};
    launch(device, "aten::_scaled_dot_product_fused_attention_overrideable_backward",
           [=, dt = *kernel_dtype(q.scalar_type()), m = attention_mask(mask, shape),
            gp = dout.const_data_ptr(), qp = q.const_data_ptr(), kp = k.const_data_ptr(),
            vp = v.const_data_ptr(), op = out.const_data_ptr(), lp = lse.const_data_ptr<float>(),
            dqp = dq.data_ptr(), dkp = dk.data_ptr(), dvp = dv.data_ptr(), gs = strides4(dout),
            qs = strides4(q), ks = strides4(k), vs = strides4(v), os = strides4(out),
            dqs = strides4(dq), dks = strides4(dk), dvs = strides4(dv)] {
             k::attention_backward(dt, shape, params, gp, gs, qp, qs, kp, ks, vp, vs, m, op, os,
                                   lp, dqp, dqs, dkp, dks, dvp, dvs);
           }, kernelThreads(2 * (q.numel() + k.numel() + v.numel()) + out.numel()));
  }
  return {dq, dk, dv, at::Tensor()};
}

// ------------------------------------------------------------ Adam / AdamW

// g /= scale in place, any kernel dtype (in float32 chunks for half types).
void unscale(k::DType dt, int64_t n, void* g, float scale) {
  if (dt == k::DType::kFloat32) {
    float* f = static_cast<float*>(g);
    for (int64_t i = 0; i < n; ++i) f[i] /= scale;
    return;
  }
  constexpr int64_t kChunk = 4096;
  float buf[kChunk];
  char* bytes = static_cast<char*>(g);
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = std::min(kChunk, n - i);
    void* at = bytes + i * 2;  // bfloat16 / float16: 2 bytes
    k::convert_to_float(dt, at, len, buf);
    for (int64_t j = 0; j < len; ++j) buf[j] /= scale;
    k::convert_from_float(dt, buf, len, at);
  }
}

void fused_adam_impl(const char* name, at::TensorList params, at::TensorList grads,
                     at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                     at::TensorList max_exp_avg_sqs, at::TensorList steps, double lr,
                     const at::Tensor& lr_tensor, double beta1, double beta2,
                     double weight_decay, double eps, bool amsgrad, bool maximize,
                     const std::optional<at::Tensor>& grad_scale,
                     const std::optional<at::Tensor>& found_inf, bool decoupled) {
  const size_t n = params.size();
  TORCH_CHECK(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n &&
                  steps.size() == n && (!amsgrad || max_exp_avg_sqs.size() == n),
              name, ": tensor lists must have the same length");
  if (n == 0) return;
  const auto device = device_checked(name, params[0], {});
  // Every list element on the parameters' device (CPU scalars are not taken
  // here, unlike in elementwise ops).
  auto same_device = [&](const at::Tensor& t) {
    TORCH_CHECK(t.device() == params[0].device(),
                "Expected all tensors to be on the same device, but found at least two devices, ",
                params[0].device(), " and ", t.device(), "! (when checking arguments for ", name,
                ")");
  };
  struct Item {
    k::DType dt;
    int64_t numel;
    void* p;
    const void* g;
    void* m;
    void* v;
    void* vmax;
    const float* step;
  };
  std::vector<Item> items;
  int64_t elements = 0;
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor* group[] = {&params[i], &grads[i], &exp_avgs[i], &exp_avg_sqs[i]};
    for (const at::Tensor* t : group) {
      same_device(*t);
      TORCH_CHECK(t->is_contiguous() && t->scalar_type() == params[i].scalar_type() &&
                      t->numel() == params[i].numel(),
                  name, ": parameters, gradients and states must be contiguous, of one dtype "
                  "and size");
    }
    const auto dt = kernel_dtype(params[i].scalar_type());
    TORCH_CHECK(dt.has_value(), name, ": unsupported dtype ", params[i].scalar_type());
    same_device(steps[i]);
    TORCH_CHECK(steps[i].numel() == 1 && steps[i].scalar_type() == at::kFloat, name,
                ": state_steps must be float32 scalars");
    void* vmax = nullptr;
    if (amsgrad) {
      const at::Tensor& v = max_exp_avg_sqs[i];
      same_device(v);
      TORCH_CHECK(v.is_contiguous() &&
                      v.scalar_type() == params[i].scalar_type() && v.numel() == params[i].numel(),
                  name, ": max_exp_avg_sqs must match the parameters");
      vmax = max_exp_avg_sqs[i].data_ptr();
    }
    elements += params[i].numel();
    items.push_back({*dt, params[i].numel(), params[i].data_ptr(), grads[i].const_data_ptr(),
                     exp_avgs[i].data_ptr(), exp_avg_sqs[i].data_ptr(), vmax,
                     steps[i].const_data_ptr<float>()});
  }
  // Scalars given as CPU tensors are copied to the device now (the kernel
  // reads them later); the copies live until the launch below.
  std::vector<at::Tensor> scalars;
  auto float_ptr = [&](const std::optional<at::Tensor>& t, const char* what) -> const float* {
    if (!t.has_value() || !t->defined()) return nullptr;
    checkSameDevice(name, device, *t);
    TORCH_CHECK(t->numel() == 1 && t->scalar_type() == at::kFloat, name, ": ", what,
                " must be a float32 scalar");
    scalars.push_back(t->is_cpu() ? t->to(c10::Device(kAxon, device)) : *t);
    return scalars.back().const_data_ptr<float>();
  };
  const float* scale = float_ptr(grad_scale, "grad_scale");
  const float* inf = float_ptr(found_inf, "found_inf");
  const float* lr_ptr = float_ptr(lr_tensor.defined() ? std::optional<at::Tensor>(lr_tensor)
                                                      : std::nullopt, "lr");
  k::AdamParams ap{lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, decoupled};
  launch(device, name, [items = std::move(items), ap, scale, inf,
                        lr_ptr]() mutable {
    if (lr_ptr != nullptr) ap.lr = *lr_ptr;
    for (const Item& it : items) {
      k::adam_step(it.dt, it.numel, it.p, it.g, it.m, it.v, it.vmax, *it.step, ap, scale, inf);
    }
    // As ATen's fused kernels, leave the gradients unscaled (grad / grad_scale)
    // when the step was taken.
    if (scale != nullptr && (inf == nullptr || *inf == 0.0f)) {
      for (const Item& it : items) unscale(it.dt, it.numel, const_cast<void*>(it.g), *scale);
    }
  }, kernelThreads(4 * elements));
}

// The four registered forms: Adam or AdamW (Decoupled), lr a double or a
// tensor (a CPU tensor is read now; a device one by the kernel).
template <bool Decoupled>
void fused_adam_double_lr(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                          at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
                          at::TensorList steps, double lr, double beta1, double beta2,
                          double weight_decay, double eps, bool amsgrad, bool maximize,
                          const std::optional<at::Tensor>& grad_scale,
                          const std::optional<at::Tensor>& found_inf) {
  fused_adam_impl(Decoupled ? "aten::_fused_adamw_" : "aten::_fused_adam_", params, grads,
                  exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, {}, beta1, beta2,
                  weight_decay, eps, amsgrad, maximize, grad_scale, found_inf, Decoupled);
}

template <bool Decoupled>
void fused_adam_tensor_lr(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                          at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
                          at::TensorList steps, const at::Tensor& lr, double beta1, double beta2,
                          double weight_decay, double eps, bool amsgrad, bool maximize,
                          const std::optional<at::Tensor>& grad_scale,
                          const std::optional<at::Tensor>& found_inf) {
  const bool on_host = lr.is_cpu();
  fused_adam_impl(Decoupled ? "aten::_fused_adamw_" : "aten::_fused_adam_", params, grads,
                  exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps,
                  on_host ? lr.item<double>() : 0.0, on_host ? at::Tensor() : lr, beta1, beta2,
                  weight_decay, eps, amsgrad, maximize, grad_scale, found_inf, Decoupled);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_layer_norm", native_layer_norm);
  m.impl("native_layer_norm_backward", native_layer_norm_backward);
  m.impl("_fused_rms_norm", fused_rms_norm);
  m.impl("_fused_rms_norm_backward", fused_rms_norm_backward);
  m.impl("_softmax", softmax);
  m.impl("_log_softmax", log_softmax);
  m.impl("_softmax_backward_data", softmax_backward);
  m.impl("_log_softmax_backward_data", log_softmax_backward);
  m.impl("_scaled_dot_product_fused_attention_overrideable", sdpa_forward);
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward", sdpa_backward);
  m.impl("_fused_adamw_", fused_adam_double_lr<true>);
  m.impl("_fused_adamw_.tensor_lr", fused_adam_tensor_lr<true>);
  m.impl("_fused_adam_", fused_adam_double_lr<false>);
  m.impl("_fused_adam_.tensor_lr", fused_adam_tensor_lr<false>);
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("rms_norm", rms_norm_autograd);
}

}  // namespace
}  // namespace at::axon

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &at::axon::fusedSdpChoice)
}  // namespace at::native
