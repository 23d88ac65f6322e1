// Indexing: index/index_put, gather/scatter, index_select/index_add/
// index_copy/index_fill, masked_select/masked_scatter, nonzero, embeddings'
// backward.
//   native stream kernels: ATen's structured ops (StructuredKernel.h) and
//     index_select (checks written out); nonzero and masked_select have
//     data-dependent result shapes and synchronise, as on CUDA;
//   generic stream kernel: the rest.  take, put_ and index_reduce stay in the
//     fallback: their errors on bad index values stay synchronous.
#include <ATen/MemoryOverlap.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/index_select_cpu_dispatch.h>
#include <ATen/ops/masked_select_cpu_dispatch.h>
#include <ATen/ops/nonzero_cpu_dispatch.h>
#include <ATen/ops/gather_cpu_dispatch.h>
#include <ATen/ops/gather_meta.h>
#include <ATen/ops/index_cpu_dispatch.h>
#include <ATen/ops/index_meta.h>
#include <ATen/ops/index_add_cpu_dispatch.h>
#include <ATen/ops/index_add_meta.h>
#include <ATen/ops/index_copy_cpu_dispatch.h>
#include <ATen/ops/index_copy_meta.h>
#include <ATen/ops/scatter_cpu_dispatch.h>
#include <ATen/ops/scatter_meta.h>
#include <ATen/ops/scatter_add_cpu_dispatch.h>
#include <ATen/ops/scatter_add_meta.h>
#include <torch/library.h>

#include "../../core/SyncDebug.h"
#include "../CpuKernel.h"
#include "../HostView.h"
#include "../OpDevice.h"
#include "../Registry.h"
#include "../StructuredKernel.h"

namespace at::axon {
namespace {

using namespace structured;

at::Tensor& index_select_out(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                             at::Tensor& out) {
  const auto device = opDevice("index_select", out);
  checkSameDevice("aten::index_select.out", device, self);
  checkSameDevice("aten::index_select.out", device, index);
  // The CPU kernel's checks, in its order (out is resized below).
  dim = c10::maybe_wrap_dim(dim, self.dim());
  TORCH_CHECK_INDEX(index.dim() <= 1, "index_select(): Index is supposed to be a vector");
  TORCH_CHECK(!(self.dim() == 0 && index.numel() != 1),
              "index_select(): Index to scalar can have only 1 value, got ", index.numel(),
              " value(s)");
  TORCH_CHECK(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
              "index_select(): Expected dtype int32 or int64 for index");
  TORCH_CHECK(self.scalar_type() == out.scalar_type(),
              "index_select(): self and result must have the same scalar type");
  at::assert_no_internal_overlap(out);
  at::assert_no_overlap(out, self);
  at::assert_no_overlap(out, index);
  std::vector<int64_t> sizes = self.sizes().vec();
  if (self.dim() > 0) sizes[dim] = index.numel();
  at::native::resize_output(out, sizes);
  launchCpuKernel(device, "aten::index_select.out", &at::cpu::index_select_outf, self, dim,
                  index, out);
  return out;
}

at::Tensor index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  at::Tensor out = emptyDevice({0}, {1}, self.scalar_type(), opDevice("index_select", self));
  return index_select_out(self, dim, index, out);
}

// ------------------------------------------------------------ data-dependent

// nonzero and masked_select: the size of the result depends on the data, so
// these synchronise (wait for the stream, run the CPU kernel on host views,
// copy the result to the device), as they do on CUDA.
at::Tensor nonzero(const at::Tensor& self) {
  const auto device = opDevice("nonzero", self);
  warnOrErrorOnSync();
  syncCurrentStream(device);
  return copyToDevice(at::cpu::nonzero(hostView(self)), device);
}

at::Tensor masked_select(const at::Tensor& self, const at::Tensor& mask) {
  const auto device = opDevice("masked_select", self);
  checkSameDevice("aten::masked_select", device, mask);
  warnOrErrorOnSync();
  syncCurrentStream(device);
  const at::Tensor m = mask.device().type() == kAxon ? hostView(mask) : mask;
  return copyToDevice(at::cpu::masked_select(hostView(self), m), device);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  OpRegistrar reg(m, "indexing");
  OUT("index.Tensor_out", 1, index_Tensor, index_outf);
  // Directly, so that its meta function (and its uint8 deprecation warning)
  // runs once per call.
  FUNC("index.Tensor", 1, index_Tensor, T(const T&, const c10::List<std::optional<T>>&),
       index_outf);
  OUT("gather.out", 1, gather, gather_outf);
  OUT_SIG("scatter.src_out", 1, scatter_src, scatter_outf,
          T& (*)(const T&, int64_t, const T&, const T&, T&));
  OUT_SIG("scatter.value_out", 1, scatter_value, scatter_outf,
          T& (*)(const T&, int64_t, const T&, const S&, T&));
  OUT("scatter_add.out", 1, scatter_add, scatter_add_outf);
  OUT("index_add.out", 1, index_add, index_add_outf);
  // A static KV cache's update (Transformers: keys.index_copy_(2, positions, new)).
  // Without these, index_copy_ takes ATen's composite path: an index_put into a
  // copy of the whole cache and a copy back (2 x the cache per call).
  OUT("index_copy.out", 1, index_copy, index_copy_outf);
  FUNC("index_copy", 1, index_copy, T(const T&, int64_t, const T&, const T&), index_copy_outf);
  INPLACE("index_copy_", index_copy, T&(T&, int64_t, const T&, const T&), index_copy_outf);

  reg.impl(Path::kNative, "index_select", index_select);
  reg.impl(Path::kNative, "index_select.out", index_select_out);
  reg.impl(Path::kSync, "nonzero", nonzero);
  reg.impl(Path::kSync, "masked_select", masked_select);
  reg.generic({
      "embedding_dense_backward", "_index_put_impl_", "index_put_", "index_fill_.int_Scalar",
      "index_fill_.int_Tensor", "masked_scatter_", "scatter_reduce.two_out",
      "scatter.reduce_out", "scatter.value_reduce_out", "nonzero_static", "embedding_renorm_"
  });
}

}  // namespace at::axon
