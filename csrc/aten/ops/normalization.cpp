// Normalisation: layer_norm, rms_norm, batch_norm, group_norm, weight_norm,
// renorm, and softmax/log_softmax (a normalisation along one dimension).
//   fused kernels (kernels/norm.h, kernels/softmax.h): native_layer_norm,
//     _fused_rms_norm (F.rms_norm reaches it through an AutogradPrivateUse1
//     kernel, as on CUDA), last-dim _softmax/_log_softmax, with backwards;
//     other dtypes and layouts: ATen's CPU kernels as stream work;
//   native stream kernels: the softmax out= overloads (StructuredKernel.h);
//   compositions of axon ops: SyncBatchNorm's batch_norm_stats/_elemt/
//     _gather_stats(_with_counts)/_backward_reduce/_backward_elemt (CUDA-only
//     in ATen);
//   generic stream kernel: batch norm and group norm (with the adjustments
//     below; ATen's composites for other backends fail on channels-last
//     activations or call the CPU kernel directly), weight norm, renorm.
#include <cmath>

#include <ATen/TensorOperators.h>
#include <ATen/native/layer_norm.h>
#include <ATen/ops/_fused_rms_norm.h>
#include <ATen/ops/native_layer_norm_backward_cpu_dispatch.h>
#include <ATen/ops/native_layer_norm_cpu_dispatch.h>
#include <ATen/AccumulateType.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/var_mean.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/ops/rms_norm_ops.h>
#include <ATen/ops/_log_softmax_cpu_dispatch.h>
#include <ATen/ops/_log_softmax_meta.h>
#include <ATen/ops/_log_softmax_backward_data_cpu_dispatch.h>
#include <ATen/ops/_log_softmax_backward_data_meta.h>
#include <ATen/ops/_softmax_cpu_dispatch.h>
#include <ATen/ops/_softmax_meta.h>
#include <ATen/ops/_softmax_backward_data_cpu_dispatch.h>
#include <ATen/ops/_softmax_backward_data_meta.h>
#include <torch/library.h>

#include <axon/kernels/norm.h>
#include <axon/kernels/softmax.h>

#include "../CpuKernel.h"
#include "../GenericKernel.h"
#include "../KernelSelect.h"
#include "../Kernels.h"
#include "../OpDevice.h"
#include "../Registry.h"
#include "../StructuredKernel.h"

namespace at::axon {
namespace {

using namespace structured;
namespace k = ::axon::kernels;

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
  const auto device = opDevice("aten::native_layer_norm", input, {&weight, &bias});
  auto [rows, cols] = at::native::_check_layer_norm_inputs(input, normalized_shape, weight, bias);
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized_shape.size());
  std::vector<int64_t> stat_shape(input.sizes().begin(), input.sizes().begin() + axis);
  stat_shape.resize(input.dim(), 1);

  const auto dt = kernelDType(input.scalar_type());
  const auto wdt = kernelDType(param_dtype(input, weight, bias));
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
  // Selected against ATen's CPU kernel, whose results are copied into ours
  // (its statistics may be in the parameters' dtype).
  const kselect::Key key = kselect::makeKey(
      kselect::Op::kLayerNorm, input.scalar_type(), {rows, cols},
      (wc.defined() ? kselect::kWeight : 0) | (bc.defined() ? kselect::kBias : 0));
  kselect::launchSelected(
      device, "aten::native_layer_norm", key,
      [&] {
        return [=, dt = *dt, wdt = *wdt, xp = x.const_data_ptr(), yp = out.data_ptr(),
                mp = mean.data_ptr<float>(), rp = rstd.data_ptr<float>()] {
          k::layer_norm_forward(dt, rows, cols, xp, cols, wdt, w, b, eps, yp, mp, rp);
        };
      },
      [&] {
        return [cx = cpu_kernel::capture(x), cw = cpu_kernel::capture(wc),
                cb = cpu_kernel::capture(bc), co = cpu_kernel::capture(out),
                cm = cpu_kernel::capture(mean), cr = cpu_kernel::capture(rstd),
                shape = normalized_shape.vec(), eps] {
          auto [y, m, r] = at::cpu::native_layer_norm(
              cx.view(), shape, cw.defined() ? std::optional<at::Tensor>(cw.view()) : std::nullopt,
              cb.defined() ? std::optional<at::Tensor>(cb.view()) : std::nullopt, eps);
          co.view().copy_(y);
          cm.view().copy_(m);
          cr.view().copy_(r);
        };
      });
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
  const auto device = opDevice("aten::native_layer_norm_backward", input,
                                     {&grad_out, &mean, &rstd, &weight, &bias});
  auto [rows, cols] = at::native::_check_layer_norm_inputs(input, normalized_shape, weight, bias);
  const auto dt = kernelDType(input.scalar_type());
  const auto wdt = kernelDType(param_dtype(input, weight, bias));
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
  auto own = [&] {
    return [=, dt = *dt, wdt = *wdt, dyp = dy.const_data_ptr(), xp = x.const_data_ptr(),
            mp = mean.const_data_ptr<float>(), rp = rstd.const_data_ptr<float>(),
            wp = w.defined() ? w.const_data_ptr() : nullptr, dxp = ptr(dx),
            dwp = static_cast<float*>(ptr(dw32)), dbp = static_cast<float*>(ptr(db32))] {
      k::layer_norm_backward(dt, rows, cols, dyp, xp, mp, rp, wdt, wp, dxp, dwp, dbp);
    };
  };
  if (rows * cols == 0) {  // nothing to select: zero dweight / dbias at most
    kselect::launchWithThreadPolicy(device, "aten::native_layer_norm_backward", 0, 0, own());
  } else {
    // Selected against ATen's CPU kernel.  It reads the statistics in the
    // parameters' dtype: float32 parameters (its mixed-type path for 16-bit
    // inputs; its float32 path) let it read our float32 statistics, so it gets
    // the weight in float32 (ones for 16-bit inputs without one), and our
    // float32 dbias buffer stands for the bias, of which it reads only the
    // shape and dtype.  Its results are copied into ours.
    const kselect::Key key = kselect::makeKey(
        kselect::Op::kLayerNormBackward, input.scalar_type(), {rows, cols},
        (w.defined() ? kselect::kWeight : 0) | (db32.defined() ? kselect::kBias : 0));
    kselect::launchSelected(device, "aten::native_layer_norm_backward", key, own, [&] {
      return [cdy = cpu_kernel::capture(dy), cx = cpu_kernel::capture(x),
              cm = cpu_kernel::capture(mean), cr = cpu_kernel::capture(rstd),
              cw = cpu_kernel::capture(w), cdx = cpu_kernel::capture(dx),
              cdw = cpu_kernel::capture(dw32), cdb = cpu_kernel::capture(db32),
              shape = normalized_shape.vec()] {
        const at::Tensor xv = cx.view();
        std::optional<at::Tensor> gamma, beta;
        if (cw.defined()) {
          gamma = cw.view().to(at::kFloat);
        } else if (at::isReducedFloatingType(xv.scalar_type())) {
          gamma = at::ones(shape, xv.options().dtype(at::kFloat));
        }
        if (cdb.defined()) beta = cdb.view();
        auto [gx, gw, gb] = at::cpu::native_layer_norm_backward(
            cdy.view(), xv, shape, cm.view().contiguous(), cr.view().contiguous(), gamma, beta,
            {cdx.defined(), cdw.defined(), cdb.defined()});
        if (cdx.defined()) cdx.view().copy_(gx);
        if (cdw.defined()) cdw.view().copy_(gw);
        if (cdb.defined()) cdb.view().copy_(gb);
      };
    });
  }
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

// A contiguous result laid out as `input` (channels_last, ...), as the CPU's
// composite rms_norm (pointwise ops that follow their input) gives it.
at::Tensor like_input_layout(const at::Tensor& result, const at::Tensor& input) {
  if (input.is_contiguous() || !input.is_non_overlapping_and_dense()) return result;
  at::Tensor laid = at::empty_like(input, result.options());
  laid.copy_(result);
  return laid;
}

// rms_norm's result as the CPU's composite lays it out: channels-last inputs
// keep their layout, every other comes out contiguous (ATen's rms_norm makes
// the result contiguous unless input.suggest_memory_format() is channels-last).
at::Tensor rms_norm_result_layout(const at::Tensor& result, const at::Tensor& input) {
  const auto format = input.suggest_memory_format();
  if (format != at::MemoryFormat::ChannelsLast && format != at::MemoryFormat::ChannelsLast3d) {
    return result;
  }
  return like_input_layout(result, input);
}

// rms_norm is composite in ATen; on axon it goes to _fused_rms_norm (which
// has a derivative) whenever our kernel takes the inputs, as on CUDA.
at::Tensor rms_norm_autograd(const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                             const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  // Symbolic sizes (torch.compile with dynamic shapes traces with fake
  // tensors): the composite, which Inductor fuses anyway.
  const auto shape = c10::asIntArrayRefSlowOpt(normalized_shape);
  const bool fused = shape.has_value() && kernelDType(input.scalar_type()).has_value() &&
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
  const auto device = opDevice("aten::_fused_rms_norm", input, {&weight});
  auto [rows, cols] = at::native::_check_layer_norm_inputs(input, normalized_shape, weight, {});
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(input.scalar_type()),
                              "\"rms_norm\" not implemented for '", input.scalar_type(), "'");
  const double e = eps_opt.has_value() ? *eps_opt : default_eps(input.scalar_type());
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized_shape.size());
  std::vector<int64_t> stat_shape(input.sizes().begin(), input.sizes().begin() + axis);
  stat_shape.resize(input.dim(), 1);
  const auto dt = kernelDType(input.scalar_type());
  const auto wdt = weight.defined() ? kernelDType(weight.scalar_type()) : dt;
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
  // Selected against ATen's composite (what the CPU runs for F.rms_norm), in
  // float32 as ATen computes for 16-bit inputs, then written into out and rstd.
  const kselect::Key key =
      kselect::makeKey(kselect::Op::kRmsNorm, input.scalar_type(), {rows, cols},
                       w.defined() ? kselect::kWeight : 0);
  kselect::launchSelected(
      device, "aten::_fused_rms_norm", key,
      [&] {
        return [=, dt = *dt, wdt = *wdt, xp = x.const_data_ptr(),
                wp = w.defined() ? w.const_data_ptr() : nullptr, yp = out.data_ptr(),
                rp = rstd.data_ptr<float>()] {
          k::rms_norm_forward(dt, rows, cols, xp, cols, wdt, wp, e, yp, rp);
        };
      },
      [&] {
        return [cx = cpu_kernel::capture(x), cw = cpu_kernel::capture(w),
                co = cpu_kernel::capture(out), cr = cpu_kernel::capture(rstd), rows, cols, e] {
          const at::Tensor xf = cx.view().reshape({rows, cols}).to(at::kFloat);
          const at::Tensor r = xf.pow(2).mean({1}, /*keepdim=*/true).add(e).rsqrt();
          at::Tensor y = xf * r;
          if (cw.defined()) y = y * cw.view().reshape({cols});
          co.view().view({rows, cols}).copy_(y);
          cr.view().view({rows, 1}).copy_(r);
        };
      });
  return {rms_norm_result_layout(out, input), rstd};
}

std::tuple<at::Tensor, at::Tensor> fused_rms_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, c10::IntArrayRef normalized_shape,
    const at::Tensor& rstd, const std::optional<at::Tensor>& weight_opt,
    std::array<bool, 2> mask) {
  const at::Tensor weight = weight_opt.value_or(at::Tensor());
  const auto device = opDevice("aten::_fused_rms_norm_backward", input,
                                     {&grad_out, &rstd, &weight});
  auto [rows, cols] = at::native::_check_layer_norm_inputs(input, normalized_shape, weight, {});
  const auto dt = kernelDType(input.scalar_type());
  const auto wdt = weight.defined() ? kernelDType(weight.scalar_type()) : dt;
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
                        // (no row dimensions: normalized over the whole input,
                        // where sum over an empty dim list would sum everything)
                        const at::Tensor prod = dy * xhat;
                        dw->copy_((rows_dims.empty() ? prod : prod.sum(rows_dims))
                                      .reshape(dw->sizes()));
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
    kselect::launchWithThreadPolicy(device, "aten::_fused_rms_norm_backward",
                                    3 * rows * cols * input.itemsize(), rows * cols,
           [=, dt = *dt, wdt = *wdt, dyp = dy.const_data_ptr(), xp = x.const_data_ptr(),
            wp = w.defined() ? w.const_data_ptr() : nullptr, rp = rstd.const_data_ptr<float>(),
            dxp = ptr(dx), dwp = static_cast<float*>(ptr(dw32))] {
             k::rms_norm_backward(dt, rows, cols, dyp, xp, wdt, wp, rp, dxp, dwp);
           });
  } else if (dw32.defined()) {
    dw32.zero_();
  }
  return {dx.defined() ? like_input_layout(dx, input) : dx,
          dw32.defined() ? as_param_dtype(dw32, weight) : dw32};
}

// ------------------------------------------------------------ softmax

// Last-dim softmax: our kernel (or ATen's, as kernel selection measures) on
// contiguous rows, a strided input copied to them first, so that the values
// do not depend on the input's layout; anything else: ATen's.
bool softmax_native(const at::Tensor& self, int64_t dim, bool half_to_float) {
  return !half_to_float && kernelDType(self.scalar_type()).has_value() && self.dim() > 0 &&
         c10::maybe_wrap_dim(dim, self.dim()) == self.dim() - 1;
}

at::Tensor softmax_impl(const at::Tensor& self, int64_t dim, bool half_to_float, bool log) {
  const auto device = opDevice(log ? "aten::_log_softmax" : "aten::_softmax", self, {});
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
  const at::Tensor x = self.contiguous();
  const kselect::Key key = kselect::makeKey(
      log ? kselect::Op::kLogSoftmax : kselect::Op::kSoftmax, self.scalar_type(), {rows, cols});
  kselect::launchSelected(
      device, log ? "aten::_log_softmax" : "aten::_softmax", key,
      [&] {
        return [=, dt = *kernelDType(self.scalar_type()), xp = x.const_data_ptr(),
                yp = out.data_ptr()] { k::softmax_forward(dt, rows, cols, xp, cols, yp, log); };
      },
      [&] {
        return [x = cpu_kernel::capture(x), y = cpu_kernel::capture(out), log] {
          at::Tensor o = y.view();
          if (log) at::cpu::_log_softmax_outf(x.view(), -1, false, o);
          else at::cpu::_softmax_outf(x.view(), -1, false, o);
        };
      });
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
  const auto device = opDevice(name, output, {&grad});
  const bool native = softmax_native(output, dim, false) &&
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
  const at::Tensor grad_c = grad.contiguous();
  const at::Tensor output_c = output.contiguous();
  const kselect::Key key = kselect::makeKey(
      log ? kselect::Op::kLogSoftmaxBackward : kselect::Op::kSoftmaxBackward,
      output.scalar_type(), {rows, cols});
  kselect::launchSelected(
      device, name, key,
      [&] {
        return [=, dt = *kernelDType(output.scalar_type()), gp = grad_c.const_data_ptr(),
                yp = output_c.const_data_ptr(), dxp = dx.data_ptr()] {
          k::softmax_backward(dt, rows, cols, gp, yp, dxp, log);
        };
      },
      [&] {
        return [g = cpu_kernel::capture(grad_c), y = cpu_kernel::capture(output_c),
                d = cpu_kernel::capture(dx), dtype = output.scalar_type(), log] {
          at::Tensor o = d.view();
          if (log) at::cpu::_log_softmax_backward_data_outf(g.view(), y.view(), -1, dtype, o);
          else at::cpu::_softmax_backward_data_outf(g.view(), y.view(), -1, dtype, o);
        };
      });
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

// Group norm by the generic kernel: ATen's composite for other backends
// (math_group_norm) views its input and fails on channels-last activations
// (a Diffusers UNet after an attention block).  Parameters of another dtype
// than the input (bf16 activations, float32 weight and bias), which the CPU
// kernel takes as they are, computing in float32 with float32 mean and rstd:
// here the input is converted to the parameters' dtype instead and the result
// back (the Meta kernel would give mean/rstd the input's dtype, which the CPU
// kernel then refuses next to float32 parameters); the backward likewise.
// native_group_norm(input, weight?, bias?, N, C, HxW, group, eps)
//   -> (out, mean, rstd)
void group_norm_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t base = stack->size() - 8;
  const at::Tensor input = (*stack)[base].toTensor();
  std::optional<c10::ScalarType> param_dtype;
  for (size_t i : {base + 1, base + 2}) {
    const c10::IValue& v = (*stack)[i];
    if (v.isTensor() && v.toTensor().defined() &&
        v.toTensor().scalar_type() != input.scalar_type()) {
      param_dtype = v.toTensor().scalar_type();
    }
  }
  if (param_dtype) (*stack)[base] = input.to(*param_dtype);
  genericStreamKernel(op, stack);
  if (param_dtype) {
    c10::IValue& out = (*stack)[stack->size() - 3];
    out = out.toTensor().to(input.scalar_type());
  }
}

// native_group_norm_backward(grad_out, input, mean, rstd, weight?, N, C, HxW,
// group, output_mask) -> (grad_input, grad_weight, grad_bias)
void group_norm_backward_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t base = stack->size() - 10;
  const at::Tensor input = (*stack)[base + 1].toTensor();
  const at::Tensor mean = (*stack)[base + 2].toTensor();
  std::optional<c10::ScalarType> param_dtype;
  if (mean.defined() && mean.scalar_type() != input.scalar_type()) {
    param_dtype = mean.scalar_type();  // the forward computed in it
  }
  const c10::IValue& w = (*stack)[base + 4];
  if (w.isTensor() && w.toTensor().defined() && w.toTensor().scalar_type() != input.scalar_type()) {
    param_dtype = w.toTensor().scalar_type();
  }
  if (param_dtype) {
    for (size_t i : {base, base + 1, base + 2, base + 3}) {
      c10::IValue& v = (*stack)[i];
      if (v.isTensor() && v.toTensor().defined()) v = v.toTensor().to(*param_dtype);
    }
  }
  genericStreamKernel(op, stack);
  if (param_dtype) {
    c10::IValue& grad_input = (*stack)[stack->size() - 3];
    if (grad_input.isTensor() && grad_input.toTensor().defined()) {
      grad_input = grad_input.toTensor().to(input.scalar_type());
    }
  }
}

// Batch norm's forms by the generic kernel, with the CPU's saved statistics
// (what eager axon returned through the fallback before, and what
// torch_axon.integrations.torch_compile makes the decompositions say): per
// channel in training, empty in eval mode, in the parameters' dtype when it
// differs from the input's (float32 parameters of 16-bit activations), else
// in the input's.  The Meta kernel, like CUDA's, sizes them per channel in
// float32 whatever the mode; the results are put right after the launch.
void batch_norm_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t base = stack->size() - num_args;
  const at::Tensor input = (*stack)[base].toTensor();
  bool training = schema.name() == "aten::_batch_norm_with_update";
  c10::ScalarType stats = input.scalar_type();
  for (size_t i = 1; i < num_args; ++i) {
    const c10::Argument& arg = schema.arguments()[i];
    const c10::IValue& v = (*stack)[base + i];
    if (arg.name() == "training") training = v.toBool();
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().scalar_type() != stats) {
      stats = v.toTensor().scalar_type();
    }
  }
  genericStreamKernel(op, stack);
  const size_t first = stack->size() - schema.returns().size();
  for (size_t r : {first + 1, first + 2}) {
    at::Tensor t = (*stack)[r].toTensor();
    if (!training) {
      (*stack)[r] = emptyDevice({0}, stats, t.device().index());
    } else if (t.scalar_type() != stats) {
      (*stack)[r] = t.to(stats);
    }
  }
}


// ------------------------------------------------------------ SyncBatchNorm's ops
//
// nn.SyncBatchNorm (torch/nn/modules/_functions.py) runs on devices that have
// these seven ops; ATen has them for CUDA only (no CPU kernel to fall back
// to).  Compositions of axon ops with CUDA's semantics (Normalization.cu):
// statistics per channel (dim 1) in the accumulate type (float32 for 16-bit
// inputs), reductions over every other dim, results in the input's dtype.

c10::ScalarType statsType(c10::ScalarType t) { return at::toAccumulateType(t, /*is_cuda=*/true); }

void checkFloating(const char* op, const at::Tensor& t) {
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(t.scalar_type()), "\"", op,
                              "\" not implemented for '", t.scalar_type(), "'");
}

void checkChannels(const char* op, const at::Tensor& input) {
  TORCH_CHECK(input.dim() >= 2, op, ": expected an input with a channel dimension (at least 2-D), got ",
              input.dim(), "-D");
}

// mean and invstd: one value per channel of input.
void checkStats(const char* op, const at::Tensor& input, const at::Tensor& mean,
                const at::Tensor& invstd) {
  TORCH_CHECK(mean.dim() == 1 && mean.numel() == input.size(1) && invstd.sizes() == mean.sizes(),
              op, ": expected mean and invstd of shape [", input.size(1),
              "] (one per channel of the input), got ", mean.sizes(), " and ", invstd.sizes());
}

// The backward ops' arguments, as CUDA's checks them (and the shapes).
void checkBackwardArgs(const char* op, const at::Tensor& grad_out, const at::Tensor& input,
                       const at::Tensor& mean, const at::Tensor& invstd) {
  checkChannels(op, input);
  checkFloating(op, grad_out);
  TORCH_CHECK(mean.scalar_type() == invstd.scalar_type(),
              "mean and invstd need to have the same data types");
  TORCH_CHECK(grad_out.sizes() == input.sizes(), op, ": grad_out of shape ", grad_out.sizes(),
              " does not match the input's ", input.sizes());
  checkStats(op, input, mean, invstd);
}

std::vector<int64_t> nonChannelDims(const at::Tensor& t) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < t.dim(); ++d) dims.push_back(d);
  return dims;
}

// A per-channel vector as a tensor that broadcasts against t ([1, C, 1, ...]).
at::Tensor perChannel(const at::Tensor& v, const at::Tensor& t) {
  std::vector<int64_t> shape(t.dim(), 1);
  shape[1] = v.numel();
  return v.reshape(shape);
}

std::tuple<at::Tensor, at::Tensor> sync_batch_norm_stats(const at::Tensor& input, double eps) {
  opDevice("batch_norm_stats", input);
  checkChannels("batch_norm_stats", input);
  checkFloating("batch_norm_stats", input);
  const at::Tensor x = input.to(statsType(input.scalar_type()));
  auto [var, mean] = at::var_mean(x, nonChannelDims(x), /*correction=*/0, /*keepdim=*/false);
  at::Tensor invstd = (var + eps).rsqrt();
  // CUDA's InvStd: 0, not inf, for a constant channel without epsilon.
  if (eps == 0) invstd = at::where(var == 0, at::zeros_like(invstd), invstd);
  return {mean, invstd};
}

std::tuple<at::Tensor, at::Tensor> sync_batch_norm_gather_stats_with_counts(
    const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& running_mean_opt,
    const std::optional<at::Tensor>& running_var_opt, double momentum, double eps,
    const at::Tensor& counts) {
  const char* op = "batch_norm_gather_stats_with_counts";
  const c10::DeviceIndex device =
      opDevice(op, input, {&mean, &invstd, &counts});
  checkSameDevice(op, device, running_mean_opt);
  checkSameDevice(op, device, running_var_opt);
  const at::Tensor running_mean = running_mean_opt.value_or(at::Tensor());
  const at::Tensor running_var = running_var_opt.value_or(at::Tensor());
  checkFloating(op, running_mean.defined() ? running_mean : input);
  TORCH_CHECK(mean.dim() == 2 && invstd.sizes() == mean.sizes(), op,
              ": expected mean and invstd of shape [world size, channels], got ", mean.sizes(),
              " and ", invstd.sizes());
  TORCH_CHECK(counts.dim() == 1 && counts.size(0) == mean.size(0), op,
              ": expected one count per row of mean (", mean.size(0), "), got counts of shape ",
              counts.sizes());
  const c10::ScalarType acc = statsType(mean.scalar_type());
  const at::Tensor m = mean.to(acc);
  const at::Tensor n_i = counts.to(acc).unsqueeze(1);
  // Each row's biased variance times its count, then merged with the
  // spread of the row means around the overall mean (Chan et al.).
  const at::Tensor v = invstd.to(acc).reciprocal();
  const at::Tensor n = n_i.sum(0);
  const at::Tensor avg = (m * n_i).sum(0) / n;
  const at::Tensor var_n = ((v * v - eps) * n_i + (m - avg).square() * n_i).sum(0);
  at::Tensor out_invstd = (var_n / n + eps).rsqrt();
  if (running_mean.defined()) {
    running_mean.copy_(running_mean.to(acc) * (1 - momentum) + avg * momentum);
  }
  if (running_var.defined()) {
    running_var.copy_(running_var.to(acc) * (1 - momentum) + var_n / (n - 1) * momentum);
  }
  return {avg, out_invstd};
}

std::tuple<at::Tensor, at::Tensor> sync_batch_norm_gather_stats(
    const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    double momentum, double eps, int64_t count) {
  opDevice("batch_norm_gather_stats", input, {&mean});
  const bool has_running = running_mean.has_value() && running_mean->defined();
  const at::Tensor counts = at::full({mean.dim() > 0 ? mean.size(0) : 0}, count,
                                     input.options().dtype(has_running ? running_mean->scalar_type()
                                                                       : input.scalar_type()));
  return sync_batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var,
                                             momentum, eps, counts);
}

at::Tensor& sync_batch_norm_elemt_out(
    const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& invstd,
    double /*eps: CUDA's ignores it*/, at::Tensor& out) {
  const char* op = "batch_norm_elemt";
  const c10::DeviceIndex device = opDevice(op, input, {&mean, &invstd, &out});
  checkSameDevice(op, device, weight);
  checkSameDevice(op, device, bias);
  checkChannels(op, input);
  checkFloating(op, input);
  TORCH_CHECK(out.scalar_type() == input.scalar_type(), op, ": expected out of dtype ",
              input.scalar_type(), " (the input's), got ", out.scalar_type());
  checkStats(op, input, mean, invstd);
  const c10::ScalarType acc = statsType(input.scalar_type());
  at::Tensor y = (input.to(acc) - perChannel(mean.to(acc), input)) * perChannel(invstd.to(acc), input);
  if (weight.has_value() && weight->defined()) y = y * perChannel(weight->to(acc), input);
  if (bias.has_value() && bias->defined()) y = y + perChannel(bias->to(acc), input);
  at::native::resize_output(out, input.sizes());
  out.copy_(y);
  return out;
}

at::Tensor sync_batch_norm_elemt(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                 const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                                 const at::Tensor& invstd, double eps) {
  at::Tensor out = at::empty_like(input, input.suggest_memory_format());
  return sync_batch_norm_elemt_out(input, weight, bias, mean, invstd, eps, out);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sync_batch_norm_backward_reduce(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
    const at::Tensor& invstd, const std::optional<at::Tensor>& weight_opt, bool input_g,
    bool weight_g, bool bias_g) {
  const char* op = "batch_norm_backward_reduce";
  const c10::DeviceIndex device = opDevice(op, grad_out, {&input, &mean, &invstd});
  checkSameDevice(op, device, weight_opt);
  checkBackwardArgs(op, grad_out, input, mean, invstd);
  const at::Tensor weight = weight_opt.value_or(at::Tensor());
  const c10::ScalarType acc = statsType(mean.scalar_type());
  const std::vector<int64_t> dims = nonChannelDims(input);
  const at::Tensor dy = grad_out.to(acc);
  const at::Tensor sum_dy = dy.sum(dims);
  const at::Tensor sum_dy_xmu = (dy * (input.to(acc) - perChannel(mean.to(acc), input))).sum(dims);
  const c10::ScalarType param = weight.defined() ? weight.scalar_type() : mean.scalar_type();
  at::Tensor grad_weight, grad_bias, out_sum_dy, out_sum_dy_xmu;
  if (input_g) {
    out_sum_dy = sum_dy.to(mean.scalar_type());
    out_sum_dy_xmu = sum_dy_xmu.to(mean.scalar_type());
  }
  if (weight_g) grad_weight = (sum_dy_xmu * invstd.to(acc)).to(param);
  if (bias_g) grad_bias = sum_dy.to(param);
  return {out_sum_dy, out_sum_dy_xmu, grad_weight, grad_bias};
}

at::Tensor sync_batch_norm_backward_elemt(const at::Tensor& grad_out, const at::Tensor& input,
                                          const at::Tensor& mean, const at::Tensor& invstd,
                                          const std::optional<at::Tensor>& weight,
                                          const at::Tensor& sum_dy, const at::Tensor& sum_dy_xmu,
                                          const at::Tensor& count) {
  const char* op = "batch_norm_backward_elemt";
  const c10::DeviceIndex device =
      opDevice(op, grad_out, {&input, &mean, &invstd, &sum_dy, &sum_dy_xmu, &count});
  checkSameDevice(op, device, weight);
  checkBackwardArgs(op, grad_out, input, mean, invstd);
  const c10::ScalarType acc = statsType(mean.scalar_type());
  // The reduction size over every rank: the sum of the ranks' counts.
  const at::Tensor norm = count.to(acc).sum().reciprocal();
  const at::Tensor is = perChannel(invstd.to(acc), input);
  const at::Tensor mean_dy = perChannel(sum_dy.to(acc), input) * norm;
  const at::Tensor mean_dy_xmu = perChannel(sum_dy_xmu.to(acc), input) * norm;
  at::Tensor g = (grad_out.to(acc) - mean_dy -
                  (input.to(acc) - perChannel(mean.to(acc), input)) * is * is * mean_dy_xmu) * is;
  if (weight.has_value() && weight->defined()) g = g * perChannel(weight->to(acc), input);
  at::Tensor grad_input = at::empty_like(grad_out, grad_out.suggest_memory_format());
  grad_input.copy_(g);
  return grad_input;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  OpRegistrar reg(m, "normalization");
  reg.impl(Path::kFused, "native_layer_norm", native_layer_norm);
  reg.impl(Path::kFused, "native_layer_norm_backward", native_layer_norm_backward);
  reg.impl(Path::kFused, "_fused_rms_norm", fused_rms_norm);
  reg.impl(Path::kFused, "_fused_rms_norm_backward", fused_rms_norm_backward);
  reg.impl(Path::kFused, "_softmax", softmax);
  reg.impl(Path::kFused, "_log_softmax", log_softmax);
  reg.impl(Path::kFused, "_softmax_backward_data", softmax_backward);
  reg.impl(Path::kFused, "_log_softmax_backward_data", log_softmax_backward);
  OUT("_softmax.out", 1, _softmax, _softmax_outf);
  OUT("_log_softmax.out", 1, _log_softmax, _log_softmax_outf);
  OUT("_softmax_backward_data.out", 1, _softmax_backward_data, _softmax_backward_data_outf);
  OUT("_log_softmax_backward_data.out", 1, _log_softmax_backward_data,
      _log_softmax_backward_data_outf);
  // batch norm's forms (their backwards: the generic list below)
  for (const char* op : {"native_batch_norm", "_native_batch_norm_legit",
                         "_native_batch_norm_legit.no_stats", "_native_batch_norm_legit_no_training",
                         "_batch_norm_with_update", "_batch_norm_no_update"}) {
    reg.impl(Path::kGeneric, op, torch::CppFunction::makeFromBoxedFunction<&batch_norm_kernel>());
  }
  // SyncBatchNorm's (CUDA-only in ATen): compositions of axon ops
  reg.impl(Path::kFused, "batch_norm_stats", TORCH_FN(sync_batch_norm_stats));
  reg.impl(Path::kFused, "batch_norm_gather_stats", TORCH_FN(sync_batch_norm_gather_stats));
  reg.impl(Path::kFused, "batch_norm_gather_stats_with_counts",
           TORCH_FN(sync_batch_norm_gather_stats_with_counts));
  reg.impl(Path::kFused, "batch_norm_elemt", TORCH_FN(sync_batch_norm_elemt));
  reg.impl(Path::kFused, "batch_norm_elemt.out", TORCH_FN(sync_batch_norm_elemt_out));
  reg.impl(Path::kFused, "batch_norm_backward_reduce", TORCH_FN(sync_batch_norm_backward_reduce));
  reg.impl(Path::kFused, "batch_norm_backward_elemt", TORCH_FN(sync_batch_norm_backward_elemt));
  reg.impl(Path::kGeneric, "native_group_norm",
           torch::CppFunction::makeFromBoxedFunction<&group_norm_kernel>());
  reg.impl(Path::kGeneric, "native_group_norm_backward",
           torch::CppFunction::makeFromBoxedFunction<&group_norm_backward_kernel>());
  // batch norm's backwards, weight norm (Wav2Vec2's positional convolution), renorm
  reg.generic({
      "native_batch_norm_backward", "batch_norm_backward", "renorm.out",
      "_weight_norm_interface", "_weight_norm_interface_backward"
  });
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  OpRegistrar reg(m, "normalization", c10::DispatchKey::AutogradPrivateUse1);
  reg.impl(Path::kFused, "rms_norm", rms_norm_autograd);
}

}  // namespace at::axon
