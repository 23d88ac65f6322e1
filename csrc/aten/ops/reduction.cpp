// Reductions and scans: sum, mean, amax/amin, argmax/argmin, any/all,
// max/min, var/std, norms, logsumexp, prod, cumsum/cumprod, histc ...
//   native stream kernels: ATen's structured ops (StructuredKernel.h) and the
//     full max/min and histc (checks written out);
//   generic stream kernel: the rest, with _logcumsumexp's dimension checked on
//     the host first.
#include <cmath>

#include <ATen/ops/histc.h>
#include <ATen/ops/all_cpu_dispatch.h>
#include <ATen/ops/all_meta.h>
#include <ATen/ops/amax_cpu_dispatch.h>
#include <ATen/ops/amax_meta.h>
#include <ATen/ops/amin_cpu_dispatch.h>
#include <ATen/ops/amin_meta.h>
#include <ATen/ops/any_cpu_dispatch.h>
#include <ATen/ops/any_meta.h>
#include <ATen/ops/argmax_cpu_dispatch.h>
#include <ATen/ops/argmax_meta.h>
#include <ATen/ops/argmin_cpu_dispatch.h>
#include <ATen/ops/argmin_meta.h>
#include <ATen/ops/cumsum_cpu_dispatch.h>
#include <ATen/ops/cumsum_meta.h>
#include <ATen/ops/max_cpu_dispatch.h>
#include <ATen/ops/max_meta.h>
#include <ATen/ops/mean_cpu_dispatch.h>
#include <ATen/ops/mean_meta.h>
#include <ATen/ops/min_cpu_dispatch.h>
#include <ATen/ops/min_meta.h>
#include <ATen/ops/sum_cpu_dispatch.h>
#include <ATen/ops/sum_meta.h>
#include <torch/library.h>

#include "../CpuKernel.h"
#include "../GenericKernel.h"
#include "../OpDevice.h"
#include "../Registry.h"
#include "../StructuredKernel.h"

namespace at::axon {
namespace {

using namespace structured;

// ------------------------------------------------------------ reductions

template <at::Tensor& (*Fn)(const at::Tensor&, at::Tensor&)>
at::Tensor reduce_all(const at::Tensor& self, const char* name, const char* op) {
  TORCH_CHECK(self.numel() > 0, name,
              "(): Expected reduction dim to be specified for input.numel() == 0. "
              "Specify the reduction dim with the 'dim' argument.");
  const auto device = opDevice(name, self);
  at::Tensor out = emptyDevice({}, {}, self.scalar_type(), device);
  launchCpuKernel<HostChecks::kMeta>(device, op, Fn, self, out);
  return out;
}

at::Tensor max_all(const at::Tensor& self) {
  return reduce_all<&at::cpu::max_outf>(self, "max", "aten::max");
}
at::Tensor min_all(const at::Tensor& self) {
  return reduce_all<&at::cpu::min_outf>(self, "min", "aten::min");
}

// histc: integer inputs too, as on CUDA (ATen's CPU kernel takes floating
// types only; integers are counted through float32, exact below 2^24).
at::Tensor histc(const at::Tensor& self, int64_t bins, const at::Scalar& min,
                 const at::Scalar& max) {
  const auto device = opDevice("histc", self);
  TORCH_CHECK(bins > 0, "torch.histogram(): bins must be > 0, but got ", bins, " for dimension 0");
  const double lo = min.toDouble(), hi = max.toDouble();
  TORCH_CHECK(std::isfinite(lo) && std::isfinite(hi), "torch.histc: range of [", lo, ", ", hi,
              "] is not finite");
  TORCH_CHECK(lo <= hi, "torch.histc: max must be larger than min");
  at::Tensor out = emptyDevice({bins}, self.scalar_type(), device);
  launchCpuKernel<HostChecks::kMeta>(device, "aten::histc",
                  [bins](const at::Tensor& in, const at::Scalar& lo, const at::Scalar& hi,
                         at::Tensor& o) {
                    const bool integral = c10::isIntegralType(in.scalar_type(), true);
                    at::Tensor x = integral ? in.to(at::kFloat) : in;
                    o.copy_(at::histc(x, bins, lo, hi));
                  },
                  self, min, max, out);
  return out;
}

// _logcumsumexp(self, dim): its dimension checked on the host (the op has no
// Meta kernel to do it), with PyTorch's error.
void logcumsumexp_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t base = stack->size() - 2;
  c10::maybe_wrap_dim((*stack)[base + 1].toInt(), (*stack)[base].toTensor().dim());
  genericStreamKernel(op, stack);
}

// nansum(self, dim, ...): the CPU kernel reduces every dimension for an
// empty `dim` list (as for None), the Meta kernel none; None for both.
void nansum_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  c10::IValue& dim = (*stack)[stack->size() - op.schema().arguments().size() + 1];
  if (dim.isList() && dim.toListRef().empty()) dim = c10::IValue();
  genericStreamKernel(op, stack);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  OpRegistrar reg(m, "reduction");
  // reductions
  OUT("sum.IntList_out", 1, sum_dim_IntList, sum_outf);
  OUT("mean.out", 1, mean_dim, mean_outf);
  OUT("amax.out", 1, amax, amax_outf);
  OUT("amin.out", 1, amin, amin_outf);
  OUT("argmax.out", 1, argmax, argmax_outf);
  OUT("argmin.out", 1, argmin, argmin_outf);
  OUT_SIG("any.out", 1, any_dim, any_outf, T& (*)(const T&, int64_t, bool, T&));
  OUT_SIG("any.all_out", 1, any, any_outf, Unary);
  OUT_SIG("all.out", 1, all_dim, all_outf, T& (*)(const T&, int64_t, bool, T&));
  OUT_SIG("all.all_out", 1, all, all_outf, Unary);
  OUT_SIG("max.dim_max", 2, max_dim, max_outf,
DimMinMax);
  OUT_SIG("min.dim_min", 2, min_dim, min_outf, DimMinMax);
  OUT("cumsum.out", 1, cumsum, cumsum_outf);
  FUNC("mean.dim", 1, mean_dim,
       T(const T&, at::OptionalIntArrayRef, bool, std::optional<c10::ScalarType>), mean_outf);
  FUNC("sum.dim_IntList", 1, sum_dim_IntList,
       T(const T&, at::OptionalIntArrayRef, bool, std::optional<c10::ScalarType>), sum_outf);
  reg.impl(Path::kNative, "max", max_all);
  reg.impl(Path::kNative, "min", min_all);
  reg.impl(Path::kNative, "histc", histc);
  reg.impl(Path::kGeneric, "_logcumsumexp",
           torch::CppFunction::makeFromBoxedFunction<&logcumsumexp_kernel>());
  for (const char* name : {"nansum", "nansum.out"}) {
    reg.impl(Path::kGeneric, name, torch::CppFunction::makeFromBoxedFunction<&nansum_kernel>());
  }
  // var/std, norms, products, scans (cummax/cummin's helpers have no Meta kernel:
  // GenericKernel.cpp's without_meta)
  reg.generic({
      "var.correction", "var.correction_out", "std.correction", "std.correction_out",
      "var_mean.correction", "std_mean.correction", "linalg_vector_norm.out", "norm.out",
      "logsumexp.out", "prod.int_out", "prod", "cumprod.out", "histc.out",
      "aminmax.out", "aminmax", "cumsum", "count_nonzero.dim_IntList",
      "_cummax_helper", "_cummin_helper"
  });
}

}  // namespace at::axon
