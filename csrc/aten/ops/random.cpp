// Random ops: dropout, bernoulli, uniform/normal/exponential/... fills,
// multinomial, randperm, rrelu.  Numbers are reserved from the axon generator
// at launch (core/AxonGenerator.h), so results depend on the seed and the
// order of launches only.
//   native stream kernels: native_dropout, multinomial (checks written out);
//   generic stream kernel: the rest (a CPU generator derived from the axon
//     generator's counter).
#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/multinomial_cpu_dispatch.h>
#include <torch/library.h>

#include "../../core/AxonGenerator.h"
#include "../CpuKernel.h"
#include "../OpDevice.h"
#include "../Registry.h"

namespace at::axon {
namespace {

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

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  OpRegistrar reg(m, "random");
  reg.impl(Path::kNative, "native_dropout", native_dropout);
  reg.impl(Path::kNative, "multinomial", multinomial);
  reg.generic({
      "native_dropout_backward", "exponential_", "cauchy_", "log_normal_", "geometric_",
      "rrelu_with_noise", "bernoulli_.float", "bernoulli_.Tensor", "bernoulli.out", "uniform_",
      "normal_", "normal.Tensor_float", "normal.float_Tensor", "normal.Tensor_Tensor",
      "random_", "random_.from", "random_.to", "randperm.generator_out"
  });
}

}  // namespace at::axon
