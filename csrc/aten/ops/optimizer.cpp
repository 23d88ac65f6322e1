// Optimizer steps: the fused Adam/AdamW step (torch.optim's fused=True), and
// GradScaler's unscale-and-check and scale update (fp16 training steps).
//   fused kernel (kernels/optimizer.h): _fused_adam_, _fused_adamw_, selected
//     against ATen's CPU fused kernels by trials (KernelSelect.h);
//   generic stream kernel: the _amp_* ops.
#include <algorithm>
#include <functional>

#include <ATen/Tensor.h>
#include <ATen/ops/_fused_adam_cpu_dispatch.h>
#include <ATen/ops/_fused_adamw_cpu_dispatch.h>
#include <torch/library.h>

#include <axon/kernels/dtype.h>
#include <axon/kernels/optimizer.h>

#include "../CpuKernel.h"
#include "../Fallback.h"
#include "../KernelSelect.h"
#include "../Kernels.h"
#include "../Launch.h"
#include "../OpDevice.h"
#include "../Registry.h"

namespace at::axon {
namespace {

namespace k = ::axon::kernels;

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

// Whether t's elements lie in memory in the same order as p's, densely: a
// flat walk over both pairs them up.  Strides of size-1 dimensions do not
// matter (a gradient's may differ from its parameter's).
bool sameMemoryOrder(const at::Tensor& t, const at::Tensor& p) {
  if (t.is_contiguous() && p.is_contiguous()) return true;
  if (!t.is_non_overlapping_and_dense() || !p.is_non_overlapping_and_dense()) return false;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) != 1 && t.stride(d) != p.stride(d)) return false;
  }
  return true;
}

// ATen's CPU fused Adam/AdamW as stream work on host views of the lists: the
// `library` side of the selection, and the whole step for dtypes our kernel
// lacks (float64).  `lr_t`, `scale`, `inf`: device tensors (or none).
std::function<void()> atenFusedAdam(at::TensorList params, at::TensorList grads,
                                    at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                                    at::TensorList max_exp_avg_sqs, at::TensorList steps,
                                    double lr, const at::Tensor& lr_t,
                                    const std::optional<at::Tensor>& scale,
                                    const std::optional<at::Tensor>& inf, double beta1,
                                    double beta2, double weight_decay, double eps, bool amsgrad,
                                    bool maximize, bool decoupled) {
  using cpu_kernel::DeviceView;
  auto views = [](at::TensorList list) {
    std::vector<DeviceView> v;
    v.reserve(list.size());
    for (const at::Tensor& t : list) v.push_back(cpu_kernel::capture(t));
    return v;
  };
  auto one = [](const std::optional<at::Tensor>& t) -> std::optional<DeviceView> {
    if (!t.has_value() || !t->defined()) return std::nullopt;
    return cpu_kernel::capture(*t);
  };
  return [p = views(params), g = views(grads), m = views(exp_avgs), v = views(exp_avg_sqs),
          vmax = views(amsgrad ? max_exp_avg_sqs : at::TensorList()), st = views(steps),
          lr_v = one(lr_t.defined() ? std::optional<at::Tensor>(lr_t) : std::nullopt),
          scale_v = one(scale), inf_v = one(inf), lr, beta1, beta2, weight_decay, eps, amsgrad,
          maximize, decoupled] {
    auto host = [](const std::vector<DeviceView>& list) {
      std::vector<at::Tensor> t;
      t.reserve(list.size());
      for (const DeviceView& d : list) t.push_back(d.view());
      return t;
    };
    auto opt = [](const std::optional<DeviceView>& d) {
      return d.has_value() ? std::optional<at::Tensor>(d->view()) : std::nullopt;
    };
    const auto hp = host(p), hg = host(g), hm = host(m), hv = host(v), hvmax = host(vmax),
               hst = host(st);
    const auto hs = opt(scale_v), hi = opt(inf_v);
    if (lr_v.has_value()) {
      const at::Tensor hlr = lr_v->view();
      if (decoupled) {
        at::cpu::_fused_adamw_(hp, hg, hm, hv, hvmax, hst, hlr, beta1, beta2, weight_decay, eps,
                               amsgrad, maximize, hs, hi);
      } else {
        at::cpu::_fused_adam_(hp, hg, hm, hv, hvmax, hst, hlr, beta1, beta2, weight_decay, eps,
                              amsgrad, maximize, hs, hi);
      }
    } else if (decoupled) {
      at::cpu::_fused_adamw_(hp, hg, hm, hv, hvmax, hst, lr, beta1, beta2, weight_decay, eps,
                             amsgrad, maximize, hs, hi);
    } else {
      at::cpu::_fused_adam_(hp, hg, hm, hv, hvmax, hst, lr, beta1, beta2, weight_decay, eps,
                            amsgrad, maximize, hs, hi);
    }
  };
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
  const auto device = opDevice(name, params[0], {});
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
  // The kernel walks each tensor's memory flat: it takes a group (parameter,
  // gradient, states) as it is when all of them lie in the parameter's memory
  // order (sameMemoryOrder: contiguous, channels_last, ...); otherwise it
  // works on contiguous copies, written back after the step (stream-ordered).
  bool flat = true;
  for (size_t i = 0; i < n; ++i) {
    std::vector<const at::Tensor*> group = {&params[i], &grads[i], &exp_avgs[i], &exp_avg_sqs[i]};
    if (amsgrad) group.push_back(&max_exp_avg_sqs[i]);
    for (const at::Tensor* t : group) {
      same_device(*t);
      TORCH_CHECK(t->scalar_type() == params[i].scalar_type() && t->sizes() == params[i].sizes(),
                  name, ": parameters, gradients and states must have one dtype and size, got ",
                  t->scalar_type(), " ", t->sizes(), " for a parameter of ",
                  params[i].scalar_type(), " ", params[i].sizes());
      flat = flat && sameMemoryOrder(*t, params[i]);
    }
  }
  if (!flat) {
    thread_local bool retrying = false;  // the copies below always walk flat
    TORCH_INTERNAL_ASSERT(!retrying, name, ": contiguous copies did not walk flat");
    // Contiguous tensors walk flat in their logical order: the same order for
    // all of them, so the call below takes the flat path (sameMemoryOrder).
    auto dense = [](at::TensorList list) {
      std::vector<at::Tensor> out;
      out.reserve(list.size());
      for (const at::Tensor& t : list) {
        out.push_back(t.is_contiguous() ? t : t.contiguous());
      }
      return out;
    };
    const std::vector<at::Tensor> p = dense(params), g = dense(grads), m = dense(exp_avgs),
                                  v = dense(exp_avg_sqs),
                                  vmax = dense(amsgrad ? max_exp_avg_sqs : at::TensorList());
    retrying = true;
    try {
      fused_adam_impl(name, p, g, m, v, vmax, steps, lr, lr_tensor, beta1, beta2, weight_decay,
                      eps, amsgrad, maximize, grad_scale, found_inf, decoupled);
    } catch (...) {
      retrying = false;
      throw;
    }
    retrying = false;
    auto write_back = [](at::TensorList to, const std::vector<at::Tensor>& from) {
      for (size_t i = 0; i < from.size(); ++i) {
        if (!from[i].is_same(to[i])) to[i].copy_(from[i]);
      }
    };
    write_back(params, p);
    write_back(exp_avgs, m);
    write_back(exp_avg_sqs, v);
    if (amsgrad) write_back(max_exp_avg_sqs, vmax);
    if (grad_scale.has_value() && grad_scale->defined()) write_back(grads, g);  // unscaled
    return;
  }
  // Dtypes our kernel lacks (float64): ATen's CPU fused Adam as stream work, on
  // host views (its own checks run there; float16/bfloat16/float32/float64).
  bool own_dtypes = true;
  for (size_t i = 0; i < n; ++i) own_dtypes = own_dtypes && kernelDType(params[i].scalar_type());
  if (!own_dtypes) {
    for (size_t i = 0; i < n; ++i) {
      TORCH_CHECK(at::isFloatingType(params[i].scalar_type()), name, ": unsupported dtype ",
                  params[i].scalar_type());
      same_device(steps[i]);
    }
    auto on_device = [&](const std::optional<at::Tensor>& t) -> std::optional<at::Tensor> {
      if (!t.has_value() || !t->defined()) return std::nullopt;
      checkSameDevice(name, device, *t);
      return t->is_cpu() ? t->to(c10::Device(kAxon, device)) : *t;
    };
    int64_t bytes = 0, largest = 0;
    for (size_t i = 0; i < n; ++i) {
      bytes += 4 * params[i].nbytes();
      largest = std::max(largest, params[i].numel());
    }
    const std::optional<at::Tensor> lr_dev =
        on_device(lr_tensor.defined() ? std::optional<at::Tensor>(lr_tensor) : std::nullopt);
    kselect::launchWithThreadPolicy(
        device, name, bytes, largest,
        atenFusedAdam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr,
                      lr_dev.has_value() ? *lr_dev : at::Tensor(), on_device(grad_scale),
                      on_device(found_inf), beta1, beta2, weight_decay, eps, amsgrad, maximize,
                      decoupled));
    return;
  }
  std::vector<Item> items;
  int64_t elements = 0, largest = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto dt = kernelDType(params[i].scalar_type());
    TORCH_CHECK(dt.has_value(), name, ": unsupported dtype ", params[i].scalar_type());
    same_device(steps[i]);
    TORCH_CHECK(steps[i].numel() == 1 && steps[i].scalar_type() == at::kFloat, name,
                ": state_steps must be float32 scalars");
    void* vmax = nullptr;
    if (amsgrad) {
      vmax = max_exp_avg_sqs[i].data_ptr();
    }
    elements += params[i].numel();
    largest = std::max(largest, params[i].numel());
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
  auto own = [&] {
    return [items = std::move(items), ap, scale, inf, lr_ptr]() mutable {
      if (lr_ptr != nullptr) ap.lr = *lr_ptr;
      for (const Item& it : items) {
        k::adam_step(it.dt, it.numel, it.p, it.g, it.m, it.v, it.vmax, *it.step, ap, scale, inf);
      }
      // As ATen's fused kernels, leave the gradients unscaled (grad / grad_scale)
      // when the step was taken.
      if (scale != nullptr && (inf == nullptr || *inf == 0.0f)) {
        for (const Item& it : items) unscale(it.dt, it.numel, const_cast<void*>(it.g), *scale);
      }
    };
  };
  // Selected against ATen's CPU fused Adam (by trials: the step updates its
  // inputs) when the learning rate is a number and there is no gradient
  // scaling; otherwise ours on the threads the thread policy picks.
  if (lr_tensor.defined() || scale != nullptr || inf != nullptr) {
    return kselect::launchWithThreadPolicy(device, name, 4 * elements * params[0].itemsize(),
                                           largest, own());
  }
  const kselect::Key key = kselect::makeKey(kselect::Op::kAdam, params[0].scalar_type(),
                                            {elements, static_cast<int64_t>(n)},
                                            amsgrad ? kselect::kAmsgrad : 0);
  kselect::launchSelectedInPlace(device, name, key, own, [&] {
    return atenFusedAdam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr,
                         at::Tensor(), std::nullopt, std::nullopt, beta1, beta2, weight_decay,
                         eps, amsgrad, maximize, decoupled);
  });
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

// _fused_sgd_.tensor_lr and _fused_adagrad_.tensor_lr run through the fallback
// (Fallback.h), whose device check takes CPU scalars of 0 dims only; torch.optim
// passes a CPU lr as the user made it (shape (1,) too), which CUDA's kernels read
// on the host.  A CPU lr of one element moves to the parameters' device first.
void fusedTensorLrFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t base = stack->size() - args.size();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name() != "lr") continue;
    c10::IValue& lr = (*stack)[base + i];
    const std::vector<at::Tensor> params = (*stack)[base].toTensorList().vec();
    if (lr.isTensor() && lr.toTensor().is_cpu() && lr.toTensor().numel() == 1 &&
        !params.empty() && params[0].device().type() == kAxon) {
      lr = lr.toTensor().to(params[0].device());
    }
  }
  axonFallback(op, stack);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  OpRegistrar reg(m, "optimizer");
  reg.impl(Path::kSync, "_fused_sgd_.tensor_lr",
           torch::CppFunction::makeFromBoxedFunction<&fusedTensorLrFallback>());
  reg.impl(Path::kSync, "_fused_adagrad_.tensor_lr",
           torch::CppFunction::makeFromBoxedFunction<&fusedTensorLrFallback>());
  reg.impl(Path::kFused, "_fused_adamw_", fused_adam_double_lr<true>);
  reg.impl(Path::kFused, "_fused_adamw_.tensor_lr", fused_adam_tensor_lr<true>);
  reg.impl(Path::kFused, "_fused_adam_", fused_adam_double_lr<false>);
  reg.impl(Path::kFused, "_fused_adam_.tensor_lr", fused_adam_tensor_lr<false>);
  reg.generic({
      "_amp_foreach_non_finite_check_and_unscale_", "_amp_update_scale_"
  });
}

}  // namespace at::axon
