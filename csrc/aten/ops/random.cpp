// Random ops: dropout, bernoulli, uniform/normal/exponential/... fills,
// multinomial, randperm, rrelu.  Numbers are reserved from the axon generator
// at launch (core/AxonGenerator.h), so results depend on the seed and the
// order of launches only.
//   fused kernels: native_dropout and its backward, bernoulli_ with a number
//     (kernels/dropout.h);
//   native stream kernels: multinomial (checks written out);
//     poisson, binomial, _standard_gamma, _sample_dirichlet and the gradients
//     (ATen's CPU kernel on host views; its checks at a new signature's first
//     launch);
//   generic stream kernel: the rest (a CPU generator derived from the axon
//     generator's counter).
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_dirichlet_grad.h>
#include <ATen/ops/_sample_dirichlet.h>
#include <ATen/ops/_standard_gamma.h>
#include <ATen/ops/_standard_gamma_grad.h>
#include <ATen/ops/binomial.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/poisson.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/multinomial_cpu_dispatch.h>
#include <torch/library.h>

#include <axon/kernels/dropout.h>

#include "../../core/AxonGenerator.h"
#include "../CpuKernel.h"
#include "../KernelSelect.h"
#include "../Kernels.h"
#include "../OpDevice.h"
#include "../Registry.h"

namespace at::axon {
namespace {

namespace k = ::axon::kernels;

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p,
                                                  std::optional<bool> train) {
  const auto device = opDevice("native_dropout", input);
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  at::Tensor out = emptyDeviceLike(input, input.scalar_type());
  at::Tensor mask = emptyDeviceLike(input, at::kBool);
  if (input.numel() == 0) return {out, mask};
  if (train.has_value() && !*train) {
    out.copy_(input);
    mask.fill_(true);
    return {out, mask};
  }
  const std::optional<k::DType> dt = kernelDType(input.scalar_type());
  if (!dt.has_value()) {  // float64 and other dtypes: ATen's Bernoulli draws
    at::Generator gen = cpuGeneratorFor(std::nullopt, device);
    launchCpuKernel<HostChecks::kMeta>(device, "aten::native_dropout",
                    [p, gen](const at::Tensor& in, at::Tensor& o, at::Tensor& m) {
                      const double keep = 1 - p;
                      at::Tensor noise = at::empty(in.sizes(), in.options()).bernoulli_(keep, gen);
                      m.copy_(noise);
                      at::mul_out(o, in, noise);
                      if (keep > 0) o.mul_(1.0 / keep);
                    },
                    input, out, mask);
    return {out, mask};
  }
  // Our kernel (kernels/dropout.h): element i of out's memory order is kept by
  // the counter rule at the generator's offset + i, so a graph replay, a
  // recomputation or any split over threads draws the same.  out and mask are
  // dense with the same strides; an input that is not dense is copied into
  // that layout first.
  at::Tensor src = input;
  if (!input.is_non_overlapping_and_dense()) {
    src = emptyDeviceLike(input, input.scalar_type());
    src.copy_(input);
  }
  TORCH_INTERNAL_ASSERT(src.strides() == out.strides() && mask.strides() == out.strides());
  const RawRng rng = reserveRawRng(device, getDefaultAxonGenerator(device),
                                   static_cast<uint64_t>(out.numel()));
  kselect::launchWithThreadPolicy(
      device, "aten::native_dropout", out.numel() * (2 * out.element_size() + 1), out.numel(),
      [dt = *dt, n = out.numel(), x = src.const_data_ptr(), y = out.data_ptr(),
       m = static_cast<uint8_t*>(mask.data_ptr()), p, seed = rng.seed, offset = rng.offset,
       slot = rng.slot]() {
        // In a graph capture: the counter range of this replay.
        const uint64_t s = slot ? slot->seed : seed, o = slot ? slot->offset : offset;
        k::dropout_forward(dt, n, x, y, m, s, o, p);
      });
  return {out, mask};
}

// dy * mask * scale as ATen computes it (a mask of another dtype, other
// shapes or layouts: that composition of axon ops); our kernel when grad and a
// boolean mask are dense with the same strides, as autograd's are.
at::Tensor native_dropout_backward(const at::Tensor& grad, const at::Tensor& mask, double scale) {
  const auto device = opDevice("native_dropout_backward", grad, {&mask});
  const std::optional<k::DType> dt = kernelDType(grad.scalar_type());
  if (!dt.has_value() || mask.scalar_type() != at::kBool || grad.sizes() != mask.sizes() ||
      !grad.is_non_overlapping_and_dense() || grad.strides() != mask.strides()) {
    // ATen's composition, operator for operator.
    return grad * mask * scale;
  }
  at::Tensor out = emptyDeviceLike(grad, grad.scalar_type());
  if (out.numel() == 0) return out;
  kselect::launchWithThreadPolicy(
      device, "aten::native_dropout_backward", out.numel() * (2 * out.element_size() + 1),
      out.numel(),
      [dt = *dt, n = out.numel(), dy = grad.const_data_ptr(),
       m = static_cast<const uint8_t*>(mask.const_data_ptr()), scale, dx = out.data_ptr()]() {
        k::dropout_backward(dt, n, dy, m, scale, dx);
      });
  return out;
}

// bernoulli_(p) with a number p: counter-based draws (kernels/dropout.h's
// bernoulli_mask, 32-bit resolution as CUDA's), so element i of self's memory
// order (of a dense copy when self is not dense) is 1 with probability p, drawn
// from the generator's offset + i: any split over threads draws the same, and
// it runs as fast on every CPU (ATen's CPU kernel draws one number at a time
// from a Mersenne twister except on Intel CPUs, where it uses MKL).
at::Tensor& bernoulli_float_(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  const auto device = opDevice("bernoulli_", self);
  TORCH_CHECK(0 <= p && p <= 1, "bernoulli_ expects p to be in [0, 1], but got p=", p);
  at::Generator g = gen.has_value() && gen->defined() ? *gen : getDefaultAxonGenerator(device);
  TORCH_CHECK(g.device().type() == kAxon, "Expected a 'axon' device type for generator but found '",
              g.device().type(), "'");
  const c10::ScalarType t = self.scalar_type();
  // ATen's CPU and CUDA kernels' dtypes (AT_DISPATCH_ALL_TYPES_AND3(Bool, BFloat16, Half)).
  TORCH_CHECK(at::isFloatingType(t) ? t != at::kFloat8_e4m3fn && t != at::kFloat8_e5m2 &&
                                          t != at::kFloat8_e4m3fnuz && t != at::kFloat8_e5m2fnuz &&
                                          t != at::kFloat8_e8m0fnu
                                    : (t == at::kBool || t == at::kByte || t == at::kChar ||
                                       t == at::kShort || t == at::kInt || t == at::kLong),
              "\"bernoulli_scalar_axon_\" not implemented for '", t, "'");
  if (self.numel() == 0) return self;
  at::assert_no_internal_overlap(self);
  const bool direct = (self.scalar_type() == at::kBool || self.scalar_type() == at::kByte) &&
                      self.is_non_overlapping_and_dense();
  at::Tensor mask = direct ? self : emptyDeviceLike(self, at::kBool);
  const RawRng rng = reserveRawRng(device, g, static_cast<uint64_t>(mask.numel()));
  kselect::launchWithThreadPolicy(
      device, "aten::bernoulli_.float", mask.numel(), mask.numel(),
      [n = mask.numel(), m = static_cast<uint8_t*>(mask.data_ptr()), p, seed = rng.seed,
       offset = rng.offset, slot = rng.slot]() {
        const uint64_t s = slot ? slot->seed : seed, o = slot ? slot->offset : offset;
        k::bernoulli_mask(n, m, s, o, p);
      });
  if (!direct) self.copy_(mask);
  return self;
}

at::Tensor multinomial(const at::Tensor& self, int64_t n, bool replacement,
                       std::optional<at::Generator> gen) {
  const auto device = opDevice("multinomial", self);
  TORCH_CHECK(self.dim() > 0 && self.dim() <= 2, "prob_dist must be 1 or 2 dim");
  TORCH_CHECK(at::isFloatingType(self.scalar_type()),
              "multinomial only supports floating-point dtypes for input, got: ",
              self.scalar_type());
  TORCH_CHECK(n > 0, "cannot sample n_sample <= 0 samples");
  const int64_t categories = self.size(-1);
  TORCH_CHECK(replacement || n <= categories,
              "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
  std::vector<int64_t> sizes = self.sizes().vec();
  sizes.back() = n;
  at::Tensor out = emptyDevice(sizes, at::kLong, device);
  at::Generator cpu_gen = cpuGeneratorFor(gen, device);
  launchCpuKernel(device, "aten::multinomial", &at::cpu::multinomial_outf, self, n, replacement,
                  std::optional<at::Generator>(cpu_gen), out);
  return out;
}

// Samplers without a Meta kernel or a stream kernel before (poisson, binomial,
// the gamma and Dirichlet samplers and their gradients; torch.distributions'
// Gamma, Beta, Dirichlet, Poisson, Binomial, StudentT): ATen's CPU kernel as
// stream work with a CPU generator from the axon generator's counter, so they
// run asynchronously and can be captured in a graph.  Results are laid out as
// the CPU's: contiguous, of the first input's sizes (binomial: broadcast with
// prob's).
template <typename Fn>
at::Tensor sampleInto(const char* name, at::Tensor out, const std::optional<at::Generator>& gen,
                      c10::DeviceIndex device, Fn fn, const at::Tensor& a,
                      const at::Tensor& b = at::Tensor()) {
  if (out.numel() == 0) return out;
  at::Generator cpu_gen = cpuGeneratorFor(gen, device);
  launchCpuKernel(device, name,
                  [fn, cpu_gen](const at::Tensor& x, const at::Tensor& y, at::Tensor& o) {
                    o.copy_(fn(x, y, cpu_gen));
                  },
                  a, b, out);
  return out;
}

// A sampler of one tensor argument (its result has the argument's shape).
template <at::Tensor (*Sample)(const at::Tensor&, std::optional<at::Generator>)>
at::Tensor sampleOne(const char* op, const char* name, const at::Tensor& x,
                     std::optional<at::Generator> gen) {
  const auto device = opDevice(op, x);
  return sampleInto(name, emptyDevice(x.sizes(), x.scalar_type(), device), gen, device,
                    [](const at::Tensor& a, const at::Tensor&, const at::Generator& g) {
                      return Sample(a, g);
                    }, x);
}

at::Tensor poisson(const at::Tensor& rates, std::optional<at::Generator> gen) {
  return sampleOne<&at::poisson>("poisson", "aten::poisson", rates, gen);
}

at::Tensor standard_gamma(const at::Tensor& alpha, std::optional<at::Generator> gen) {
  return sampleOne<&at::_standard_gamma>("_standard_gamma", "aten::_standard_gamma", alpha, gen);
}

at::Tensor sample_dirichlet(const at::Tensor& alpha, std::optional<at::Generator> gen) {
  return sampleOne<&at::_sample_dirichlet>("_sample_dirichlet", "aten::_sample_dirichlet", alpha,
                                           gen);
}

at::Tensor binomial(const at::Tensor& count, const at::Tensor& prob,
                    std::optional<at::Generator> gen) {
  const auto device = opDevice("binomial", count, {&prob});
  // The CPU's result has count's shape, resized (with resize_output's
  // deprecation warning) to the broadcast of count and prob.
  const std::vector<int64_t> shape = at::infer_size(count.sizes(), prob.sizes());
  at::Tensor out = emptyDevice(count.sizes(), count.scalar_type(), device);
  at::native::resize_output(out, shape);  // the warning, when the shapes differ
  return sampleInto("aten::binomial", out, gen, device,
                    [](const at::Tensor& c, const at::Tensor& p, const at::Generator& g) {
                      // ATen's sampler never ends for a NaN or infinite count
                      // with a probability in (0, 1) (its inversion loop waits
                      // for a sum to exceed the count): the stream would hang.
                      // Such elements are NaN (count NaN) or inf; the others,
                      // NaN probabilities included, are the CPU's.
                      const at::Tensor inside = p.gt(0).logical_and_(p.lt(1));
                      const at::Tensor nan = at::isnan(c).logical_and_(inside);
                      const at::Tensor inf = at::isposinf(c).logical_and_(inside);
                      const at::Tensor bad = nan.logical_or(inf);
                      if (!bad.any().item<bool>()) return at::binomial(c, p, g);
                      at::Tensor r = at::binomial(c.masked_fill(bad, 0), p, g);
                      r.masked_fill_(inf, INFINITY);
                      return r.masked_fill_(nan, NAN);
                    }, count.expand(shape), prob.expand(shape));
}

// The samplers' gradients (deterministic; no generator).
at::Tensor standard_gamma_grad(const at::Tensor& self, const at::Tensor& output) {
  const auto device = opDevice("_standard_gamma_grad", self, {&output});
  at::Tensor out = emptyDevice(self.sizes(), self.scalar_type(), device);
  if (out.numel() == 0) return out;
  launchCpuKernel(device, "aten::_standard_gamma_grad",
                  [](const at::Tensor& s, const at::Tensor& o, at::Tensor& r) {
                    r.copy_(at::_standard_gamma_grad(s, o));
                  },
                  self, output, out);
  return out;
}

at::Tensor dirichlet_grad(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& total) {
  const auto device = opDevice("_dirichlet_grad", x, {&alpha, &total});
  at::Tensor out = emptyDevice(x.sizes(), x.scalar_type(), device);
  if (out.numel() == 0) return out;
  launchCpuKernel(device, "aten::_dirichlet_grad",
                  [](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, at::Tensor& r) {
                    r.copy_(at::_dirichlet_grad(a, b, c));
                  },
                  x, alpha, total, out);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  OpRegistrar reg(m, "random");
  reg.impl(Path::kFused, "native_dropout", native_dropout);
  reg.impl(Path::kFused, "native_dropout_backward", TORCH_FN(native_dropout_backward));
  reg.impl(Path::kFused, "bernoulli_.float", TORCH_FN(bernoulli_float_));
  reg.impl(Path::kNative, "multinomial", multinomial);
  reg.impl(Path::kNative, "poisson", TORCH_FN(poisson));
  reg.impl(Path::kNative, "binomial", TORCH_FN(binomial));
  reg.impl(Path::kNative, "_standard_gamma", TORCH_FN(standard_gamma));
  reg.impl(Path::kNative, "_sample_dirichlet", TORCH_FN(sample_dirichlet));
  reg.impl(Path::kNative, "_standard_gamma_grad", TORCH_FN(standard_gamma_grad));
  reg.impl(Path::kNative, "_dirichlet_grad", TORCH_FN(dirichlet_grad));
  reg.generic({
      "exponential_", "cauchy_", "log_normal_", "geometric_",
      "rrelu_with_noise", "bernoulli_.Tensor", "bernoulli.out", "uniform_",
      "normal_", "normal.Tensor_float", "normal.float_Tensor", "normal.Tensor_Tensor",
      "random_", "random_.from", "random_.to", "randperm.generator_out"
  });
}

}  // namespace at::axon
