// Tensors' memory: allocation, views, resizing, copies, fills, factories,
// concatenation and other copies that rearrange elements (flip, roll, tril ...).
//   structural (tier 1): the ops a backend must own (empty, views, resize_,
//     set_, _copy_from, _local_scalar_dense ...) and view ops whose ATen
//     kernels only compute sizes and strides;
//   native stream kernels: fill_, zero_, arange (checks written out), cat,
//     tril, triu (StructuredKernel.h); dtype-converting and strided copies run
//     the CPU copy kernel as stream work;
//   generic stream kernel: eye, linspace, logspace, flip, roll ...
#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ScalarOps.h>
#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <ATen/native/Resize.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/native/RangeUtils.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/arange_cpu_dispatch.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/fill_cpu_dispatch.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/zero_cpu_dispatch.h>
#include <ATen/ops/cat_cpu_dispatch.h>
#include "../GenericKernel.h"
#include <ATen/ops/cat_meta.h>
#include <ATen/ops/tril_cpu_dispatch.h>
#include <ATen/ops/tril_meta.h>
#include <ATen/ops/triu_cpu_dispatch.h>
#include <ATen/ops/triu_meta.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "../../core/AxonRuntime.h"
#include "../../core/AxonStorage.h"
#include "../../core/AxonStream.h"
#include "../../core/CachingAllocator.h"
#include "../../core/SyncDebug.h"
#include "../CpuKernel.h"
#include "../HostView.h"
#include "../OpDevice.h"
#include "../Registry.h"
#include "../StructuredKernel.h"

namespace at::axon {
namespace {

using namespace structured;

constexpr c10::DispatchKeySet kAxonKeys{c10::DispatchKey::PrivateUse1};

c10::DeviceIndex target_index(std::optional<c10::Device> device) {
  c10::DeviceIndex index = device.has_value() ? resolve_index(*device)
                                              : current_device();
  check_device(index);
  return index;
}

// ------------------------------------------------------------ allocation

// torch.use_deterministic_algorithms(True) with
// torch.utils.deterministic.fill_uninitialized_memory (the default): new
// memory is filled with NaN (integers: their maximum), as on CPU and CUDA.
bool fill_uninitialized() {
  const at::Context& ctx = at::globalContext();
  return ctx.deterministicAlgorithms() && ctx.deterministicFillUninitializedMemory();
}

at::Tensor& fill_if_deterministic(at::Tensor& t) {
  if (fill_uninitialized() && t.numel() > 0) at::native::fill_empty_deterministic_(t);
  return t;
}

at::Tensor empty_memory_format(c10::IntArrayRef size,
                               std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout,
                               std::optional<c10::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(!layout.has_value() || *layout == c10::kStrided,
              "axon supports only strided tensors, got layout ", *layout);
  // As CUDA's empty: only host memory can be pinned.
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
  c10::DeviceGuard guard(c10::Device(kAxon, target_index(device)));
  at::Tensor t = at::detail::empty_generic(size, getCachingAllocator(), kAxonKeys,
                                           c10::dtype_or_default(dtype), memory_format);
  return fill_if_deterministic(t);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  TORCH_CHECK(!layout.has_value() || *layout == c10::kStrided,
              "axon supports only strided tensors, got layout ", *layout);
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
  c10::DeviceGuard guard(c10::Device(kAxon, target_index(device)));
  at::Tensor t = at::detail::empty_strided_generic(size, stride, getCachingAllocator(),
                                                   kAxonKeys, c10::dtype_or_default(dtype));
  return fill_if_deterministic(t);
}

// Zero tensors own no memory: their data pointer is null by design.
struct NullAllocator final : c10::Allocator {
  explicit NullAllocator(c10::Device d) : device(d) {}
  c10::DataPtr allocate(size_t) override { return {nullptr, device}; }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void*, const void*, std::size_t) const override {}
  c10::Device device;
};

at::Tensor efficientzerotensor(c10::IntArrayRef size,
                               std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> /*layout*/,
                               std::optional<c10::Device> device,
                               std::optional<bool> /*pin_memory*/) {
  NullAllocator allocator(c10::Device(kAxon, target_index(device)));
  return at::detail::empty_generic(size, &allocator,
                                   kAxonKeys | c10::DispatchKeySet(c10::DispatchKey::ZeroTensor),
                                   c10::dtype_or_default(dtype), std::nullopt);
}

// ------------------------------------------------------------ views

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size,
                      c10::IntArrayRef stride, std::optional<int64_t> offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  return at::native::view(self, size);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size,
                         c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

// ------------------------------------------------------------ resizing

// Gives `self` the geometry (sizes, strides, offset), growing its storage
// when that geometry reaches past it.
void set_geometry(const at::Tensor& self, c10::IntArrayRef size,
                  c10::IntArrayRef stride, int64_t offset) {
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(size, stride, offset);
  size_t needed = at::detail::computeStorageNbytes(size, stride,
                                                   self.dtype().itemsize(), offset);
  if (needed > self.storage().nbytes()) {
    resizeStorageBytes(self.storage().unsafeGetStorageImpl(), needed);
  }
}

std::vector<int64_t> strides_for(c10::IntArrayRef size, c10::MemoryFormat format) {
  switch (format) {
    case c10::MemoryFormat::ChannelsLast:
      return c10::get_channels_last_strides_2d(size);
    case c10::MemoryFormat::ChannelsLast3d:
      return c10::get_channels_last_strides_3d(size);
    default: {
      auto s = c10::contiguous_strides(size);
      return {s.begin(), s.end()};
    }
  }
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  std::vector<int64_t> strides =
      strides_for(size, memory_format.value_or(c10::MemoryFormat::Contiguous));
  if (self.sizes() == size && (!memory_format.has_value() || self.strides() == strides)) {
    return self;
  }
  const int64_t old_nbytes = static_cast<int64_t>(self.storage().nbytes());
  set_geometry(self, size, strides, self.storage_offset());
  if (fill_uninitialized()) at::native::fill_resize_deterministic_(self, old_nbytes);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t offset,
                        c10::IntArrayRef size, c10::IntArrayRef stride) {
  at::native::checkSetStorage(self, source, offset, size, stride);
  std::vector<int64_t> strides = stride.data() != nullptr
                                     ? stride.vec()
                                     : strides_for(size, c10::MemoryFormat::Contiguous);
  set_geometry(self, size, strides, offset);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {n}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) return self;
  return set_storage(self, source.storage(), source.storage_offset(),
                     source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, getCachingAllocator(),
                     /*resizable=*/true);
  return set_storage(self, std::move(empty), 0, {0}, {});
}

// ------------------------------------------------------------ copies

// When the bytes of one can simply be copied into the other.
bool same_dense_layout(const at::Tensor& a, const at::Tensor& b) {
  return a.dtype() == b.dtype() && a.strides() == b.strides() &&
         a.is_conj() == b.is_conj() && a.is_neg() == b.is_neg() &&
         !a._is_zerotensor() && a.is_non_overlapping_and_dense() &&
         b.is_non_overlapping_and_dense();
}

// Cross-device copies run on the destination's stream; later work on the
// source device (overwriting or freeing the source) must wait for them.
void order_source_after_copy(c10::DeviceIndex src_device, rt::Stream dst_stream) {
  rt_call([&] {
    rt::Event* done = rt::event_create(dst_stream.device);
    rt::event_record(done, dst_stream);
    rt::stream_wait_event(current_rt_stream(src_device), done);
    rt::event_destroy(done);
  });
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  // self is the source.  copy_ only redispatches here when a device is axon.
  const bool src_axon = self.device().type() == kAxon;
  const bool dst_axon = dst.device().type() == kAxon;
  TORCH_CHECK((src_axon || self.is_cpu()) && (dst_axon || dst.is_cpu()),
              "axon cannot copy between ", self.device(), " and ", dst.device());
  // The CPU's copy_ checks (its TensorIterator's, in its order); ATen's copy_
  // hands axon copies here before any.  No element of dst written twice, no
  // partial overlap of source and destination (x[1:].copy_(x[:-1]), also
  // through a view of another dtype: overlap is by bytes), then the shapes.
  if (src_axon && dst_axon) {
    at::assert_no_internal_overlap(dst);
    at::assert_no_partial_overlap(dst, self);
  }
  if (self.sizes() != dst.sizes()) {
    const auto shape = at::infer_size(dst.sizes(), self.sizes());
    TORCH_CHECK(c10::IntArrayRef(shape) == dst.sizes(), "output with shape ", dst.sizes(),
                " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
  }
  if (dst.numel() == 0) return dst;
  if (!non_blocking && (self.is_cpu() || dst.is_cpu())) warnOrErrorOnSync();
  at::Tensor src = self.sizes() == dst.sizes() ? self : self.expand(dst.sizes());
  c10::DeviceIndex stream_device = dst_axon ? dst.device().index() : src.device().index();
  if (src_axon && dst_axon && src.device() != dst.device()) {
    syncCurrentStream(src.device().index());  // the producer's work first
  }
  if (same_dense_layout(src, dst)) {
    rt::Stream s = current_rt_stream(stream_device);
    rt_call([&] {
      rt::memcpy(dst.data_ptr(), src.const_data_ptr(), dst.nbytes(), s);
      // A blocking host copy means the host buffer may be reused on return.
      if (!non_blocking && (src.is_cpu() || dst.is_cpu())) rt::stream_synchronize(s);
    });
    if (src_axon && dst_axon && src.device() != dst.device()) {
      order_source_after_copy(src.device().index(), s);
    }
    return dst;
  }
  // Dtype conversion or a strided layout: the CPU copy kernel over host views,
  // as stream work within one device.
  if (src_axon && dst_axon && src.device() == dst.device()) {
    if (dst.numel() == 0) return dst;
    if (src._is_zerotensor()) {
      launchCpuKernel<HostChecks::kMeta>(stream_device, "aten::zero_", &at::cpu::zero_, dst);
    } else {
      // Fusible (adaptive eager): the destination is the last argument.
      launchFusibleCpuKernel(stream_device, "aten::copy_", cpu_kernel::FusionKind::kPointwise,
                             std::nullopt,
                             [](const at::Tensor& s, at::Tensor& d) { d.copy_(s); }, src, dst);
    }
    return dst;
  }
  if (src_axon) syncCurrentStream(src.device().index());
  if (dst_axon) syncCurrentStream(dst.device().index());
  at::Tensor d = dst_axon ? hostView(dst) : dst;
  if (src._is_zerotensor()) {
    d.zero_();
  } else {
    d.copy_(src_axon ? hostView(src) : src);
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.device().type() == kAxon) {
    resize_(dst, self.sizes(), std::nullopt);
  } else {
    dst.resize_(self.sizes());
  }
  return copy_from(self, dst, false);
}

// param.data = tensor (and so Module.to(), which keeps tied Parameters tied)
// needs CPU and axon dense tensors to be interchangeable, as CPU and CUDA are.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && !t.is_quantized() &&
           (t.is_cpu() || t.device().type() == kAxon);
  };
  return (dense(self) && dense(from)) ||
         self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

void record_stream(at::Tensor& self, c10::Stream stream) {
  getCachingAllocator()->recordStream(self.storage().data_ptr(), stream);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  warnOrErrorOnSync();
  syncCurrentStream(self.device().index());
  return hostView(self).item();
}

// ------------------------------------------------------------ fills

at::Tensor& fill_scalar(at::Tensor& self, const at::Scalar& value) {
  const auto device = opDevice("fill_", self);
  launchCpuKernel<HostChecks::kMeta>(device, "aten::fill_.Scalar",
                  static_cast<at::Tensor& (*)(at::Tensor&, const at::Scalar&)>(&at::cpu::fill_),
                  self, value);
  return self;
}

at::Tensor& fill_tensor(at::Tensor& self, const at::Tensor& value) {
  TORCH_CHECK(value.dim() == 0,
              "fill_ only supports 0-dimension value tensor but got tensor with ",
              value.dim(), " dimensions.");
  const auto device = opDevice("fill_", self);
  checkSameDevice("aten::fill_.Tensor", device, value);
  launchCpuKernel<HostChecks::kMeta>(device, "aten::fill_.Tensor",
                  static_cast<at::Tensor& (*)(at::Tensor&, const at::Tensor&)>(&at::cpu::fill_),
                  self, value);
  return self;
}

at::Tensor& zero_(at::Tensor& self) {
  const auto device = opDevice("zero_", self);
  launchCpuKernel<HostChecks::kMeta>(device, "aten::zero_", &at::cpu::zero_, self);
  return self;
}

// ------------------------------------------------------------ factories

at::Tensor& arange_out(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step,
                       at::Tensor& out) {
  const auto device = opDevice("arange", out);
  // The CPU kernel's own checks and size (RangeFactories.cpp): bounds in
  // double precision, the size in the output's type.
  int64_t size = 0;
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "arange_cpu", [&] {
    size = at::native::compute_arange_size<scalar_t>(start, end, step);
  });
  if (out.numel() != size) {
    if (out.numel() > 0) {  // the CPU's warning (RangeFactories.cpp)
      TORCH_WARN("The number of elements in the out tensor of shape ", out.sizes(), " is ",
                 out.numel(), " which does not match the computed number of elements ", size,
                 ". Note that this may occur as a result of rounding error. "
                 "The out tensor will be resized to a tensor of shape (", size, ",).");
    }
    out.resize_({size});
  }
  if (size > 0) {
    launchCpuKernel<HostChecks::kMeta>(device, "aten::arange.start_out", &at::cpu::arange_outf,
                                       start, end, step, out);
  }
  return out;
}

// linspace.out / logspace.out: the CPU kernel keeps `out`'s shape (and its
// strides) when it has `steps` elements, filling it in index order, where the
// Meta kernel resizes it to [steps] (with a deprecation warning).  Such an
// out is filled through a [steps] temporary, as the CPU does internally.
void space_out_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  const size_t begin = stack->size() - n;
  const at::Tensor out = (*stack)[begin + n - 1].toTensor();
  const int64_t steps = (*stack)[begin + 2].toInt();
  if (steps < 0 || out.numel() != steps || (out.dim() == 1 && out.is_contiguous()) ||
      out.device().type() != kAxon) {
    return genericStreamKernel(op, stack);
  }
  const at::Tensor flat = at::empty({steps}, out.options());
  (*stack)[begin + n - 1] = flat;
  genericStreamKernel(op, stack);
  out.copy_(flat.view(out.sizes()));
  stack->back() = out;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  OpRegistrar reg(m, "copy_view_factory");
  reg.impl(Path::kStructural, "empty.memory_format", empty_memory_format);
  reg.impl(Path::kStructural, "empty_strided", empty_strided);
  reg.impl(Path::kStructural, "_efficientzerotensor", efficientzerotensor);
  reg.impl(Path::kStructural, "as_strided", as_strided);
  reg.impl(Path::kStructural, "view", view);
  reg.impl(Path::kStructural, "_reshape_alias", reshape_alias);
  reg.impl(Path::kStructural, "resize_", resize_);
  reg.impl(Path::kStructural, "set_.source_Storage_storage_offset", set_storage);
  reg.impl(Path::kStructural, "set_.source_Storage", set_source_storage);
  reg.impl(Path::kStructural, "set_.source_Tensor", set_source_tensor);
  reg.impl(Path::kStructural, "set_", set_empty);
  reg.impl(Path::kStructural, "_copy_from", copy_from);
  reg.impl(Path::kStructural, "_copy_from_and_resize", copy_from_and_resize);
  reg.impl(Path::kStructural, "_local_scalar_dense", local_scalar_dense);
  reg.impl(Path::kStructural, "record_stream", record_stream);
  reg.impl(Path::kStructural, "_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  // view ops whose ATen kernels only compute sizes and strides (registered for
  // CPU and CUDA, so not reaching axon by themselves)
  reg.impl(Path::kStructural, "unfold", TORCH_FN(at::native::unfold));
  reg.impl(Path::kStructural, "view_as_real", TORCH_FN(at::native::view_as_real));
  reg.impl(Path::kStructural, "view_as_complex", TORCH_FN(at::native::view_as_complex));
  reg.impl(Path::kNative, "fill_.Scalar", fill_scalar);
  reg.impl(Path::kNative, "fill_.Tensor", fill_tensor);
  reg.impl(Path::kNative, "zero_", zero_);
  reg.impl(Path::kNative, "arange.start_out", arange_out);
  for (const char* name : {"linspace.out", "logspace.out"}) {
    reg.impl(Path::kGeneric, name, torch::CppFunction::makeFromBoxedFunction<&space_out_kernel>());
  }
  OUT("cat.out", 1, cat, cat_outf);
  OUT("tril.out", 1, tril, tril_outf);
  OUT("triu.out", 1, triu, triu_outf);
  FUNC("cat", 1, cat, T(const at::ITensorListRef&, int64_t), cat_outf);
  reg.generic({
      "eye.out", "eye.m_out", "flip", "roll",
      "unfold_backward", "channel_shuffle"
  });
}

// copy_ hands axon copies to _copy_from, which handles the conjugate and
// negative bits itself (host views keep them); materialising them first would
// recurse through clone() -> copy_ -> _copy_from.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
}

}  // namespace at::axon
