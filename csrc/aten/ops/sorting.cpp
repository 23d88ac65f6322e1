// Sorting and order statistics: sort, topk, kthvalue, median, mode,
// searchsorted, bucketize.
//   native stream kernels: sort and topk's out= (StructuredKernel.h);
//   mode.values: the device checks of ATen's mode_out, then the functional op;
//   generic stream kernel: the rest.
#include <ATen/native/Resize.h>
#include <ATen/ops/mode.h>
#include <ATen/ops/sort_cpu_dispatch.h>
#include <ATen/ops/sort_meta.h>
#include <ATen/ops/topk_cpu_dispatch.h>
#include <ATen/ops/topk_meta.h>
#include <torch/library.h>

#include "../OpDevice.h"
#include "../Registry.h"
#include "../StructuredKernel.h"

namespace at::axon {
namespace {

using namespace structured;

// mode.values: ATen's mode_out (CompositeExplicitAutograd) accepts only CPU,
// CUDA and XPU tensors ("mode only supports CPU, CUDA and XPU device type"), so
// torch.mode(..., out=) raised on axon while torch.mode worked.  Same checks
// and messages, then the functional axon kernel and a copy into the outputs.
std::tuple<at::Tensor&, at::Tensor&> mode_out(const at::Tensor& self, int64_t dim,
                                              bool keepdim, at::Tensor& values,
                                              at::Tensor& indices) {
  TORCH_CHECK(self.layout() == c10::Layout::Strided,
              "mode only supports strided layout, got: ", self.layout());
  TORCH_CHECK(self.device() == values.device(), "expected device '", self.device(),
              "' but got '", values.device(), "' for values output");
  TORCH_CHECK(self.device() == indices.device(), "expected device '", self.device(),
              "' but got '", indices.device(), "' for indices output");
  TORCH_CHECK(self.scalar_type() == values.scalar_type(), "expected scalar type '",
              self.scalar_type(), "' but got '", values.scalar_type(), "' for values output");
  TORCH_CHECK(indices.scalar_type() == at::kLong, "expected scalar type '", at::kLong,
              "' but got '", indices.scalar_type(), "' for indices output");
  auto [v, i] = at::mode(self, dim, keepdim);
  at::native::resize_output(values, v.sizes());
  at::native::resize_output(indices, i.sizes());
  values.copy_(v);
  indices.copy_(i);
  return {values, indices};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  OpRegistrar reg(m, "sorting");
  OUT("topk.values", 2, topk, topk_outf);
  OUT("sort.values_stable", 2, sort_stable, sort_outf);
  reg.impl(Path::kNative, "mode.values", mode_out);
  reg.generic({
      "sort.stable", "topk", "kthvalue.values", "mode", "median.dim_values",
      "searchsorted.Tensor", "searchsorted.Tensor_out", "bucketize.Tensor",
      "bucketize.Tensor_out", "median", "nanmedian", "nanmedian.dim_values"
  });
}

}  // namespace at::axon
