// Empty tensors launch too: the CPU kernel checks what it takes whatever the
// size (index values of index_select into an empty result, dtypes).
//
// Tier 2 for hot ops that ATen does not structure (no meta function to
// borrow): the host does PyTorch's argument checks and works out the result's
// shape itself, then enqueues the at::cpu:: kernel.  Where those checks are
// complete the launch says HostChecks::kMeta; elsewhere the CPU kernel checks
// each new signature at the call (Launch.h).  Random ops reserve their
// numbers from the axon generator at launch, so results do not depend on when
// the stream runs them.
#include <cmath>

#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/TensorIterator.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TypeProperties.h>
#include <ATen/ops/addr_native.h>
#include <ATen/ops/arange_cpu_dispatch.h>
#include <ATen/ops/clamp_min_cpu_dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/fill_cpu_dispatch.h>
#include <ATen/ops/histc.h>
#include <ATen/ops/index_select_cpu_dispatch.h>
#include <ATen/ops/masked_fill_cpu_dispatch.h>
#include <ATen/ops/max_cpu_dispatch.h>
#include <ATen/ops/min_cpu_dispatch.h>
#include <ATen/ops/mode.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/multinomial_cpu_dispatch.h>
#include <ATen/ops/where_cpu_dispatch.h>
#include <ATen/ops/masked_select_cpu_dispatch.h>
#include <ATen/ops/nonzero_cpu_dispatch.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/zero_cpu_dispatch.h>
#include <torch/library.h>

#include "../core/AxonGenerator.h"
#include "CpuKernel.h"

namespace at::axon {
namespace {

c10::DeviceIndex device_of(const at::Tensor& t, const char* op) { return axonDevice(op, t); }

// ------------------------------------------------------------ fills

at::Tensor& fill_scalar(at::Tensor& self, const at::Scalar& value) {
  const auto device = device_of(self, "fill_");
  launchCpuKernel<HostChecks::kMeta>(device, "aten::fill_.Scalar",
                  static_cast<at::Tensor& (*)(at::Tensor&, const at::Scalar&)>(&at::cpu::fill_),
                  self, value);
  return self;
}

at::Tensor& fill_tensor(at::Tensor& self, const at::Tensor& value) {
  TORCH_CHECK(value.dim() == 0,
              "fill_ only supports 0-dimension value tensor but got tensor with ",
              value.dim(), " dimensions.");
  const auto device = device_of(self, "fill_");
  checkSameDevice("aten::fill_.Tensor", device, value);
  launchCpuKernel<HostChecks::kMeta>(device, "aten::fill_.Tensor",
                  static_cast<at::Tensor& (*)(at::Tensor&, const at::Tensor&)>(&at::cpu::fill_),
                  self, value);
  return self;
}

at::Tensor& zero_(at::Tensor& self) {
  const auto device = device_of(self, "zero_");
  launchCpuKernel<HostChecks::kMeta>(device, "aten::zero_", &at::cpu::zero_, self);
  return self;
}

void check_mask(const char* op, const at::Tensor& self, const at::Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, op,
              " only supports boolean masks, but got mask with dtype ", mask.scalar_type());
  TORCH_CHECK(at::infer_size(self.sizes(), mask.sizes()) == self.sizes(), op,
              ": the shape of the mask ", mask.sizes(),
              " must be broadcastable to the shape of self ", self.sizes());
}

at::Tensor& masked_fill_scalar(at::Tensor& self, const at::Tensor& mask,
                               const at::Scalar& value) {
  const auto device = device_of(self, "masked_fill_");
  checkSameDevice("aten::masked_fill_.Scalar", device, mask);
  check_mask("masked_fill_", self, mask);
  launchCpuKernel(device, "aten::masked_fill_.Scalar",
                  static_cast<at::Tensor& (*)(at::Tensor&, const at::Tensor&, const at::Scalar&)>(
                      &at::cpu::masked_fill_),
                  self, mask, value);
  return self;
}

at::Tensor& masked_fill_tensor(at::Tensor& self, const at::Tensor& mask,
                               const at::Tensor& value) {
  TORCH_CHECK(value.dim() == 0,
              "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with ",
              value.dim(), " dimension(s).");
  const auto device = device_of(self, "masked_fill_");
  checkSameDevice("aten::masked_fill_.Tensor", device, mask);
  checkSameDevice("aten::masked_fill_.Tensor", device, value);
  check_mask("masked_fill_", self, mask);
  launchCpuKernel(device, "aten::masked_fill_.Tensor",
                  static_cast<at::Tensor& (*)(at::Tensor&, const at::Tensor&, const at::Tensor&)>(
                      &at::cpu::masked_fill_),
                  self, mask, value);
  return self;
}

// ------------------------------------------------------------ selection

at::Tensor& where_out(const at::Tensor& cond, const at::Tensor& self, const at::Tensor& other,
                      at::Tensor& out) {
  const auto device = device_of(out, "where");
  for (const at::Tensor* t : {&cond, &self, &other}) checkSameDevice("aten::where.self_out", device, *t);
  TORCH_CHECK(cond.scalar_type() == at::kBool || cond.scalar_type() == at::kByte,
              "where expected condition to be a boolean tensor, but got a tensor with dtype ",
              cond.scalar_type());
  const auto result_type = at::native::result_type(self, other);
  TORCH_CHECK(out.scalar_type() == result_type, "Expected out type to be ", result_type,
              " but got ", out.scalar_type());
  const auto sizes = at::infer_size(cond.sizes(), at::infer_size(self.sizes(), other.sizes()));
  // As the CPU's TensorIterator, before resizing out.
  at::assert_no_internal_overlap(out);
  for (const at::Tensor* t : {&cond, &self, &other}) at::assert_no_partial_overlap(out, *t);
  at::native::resize_output(out, sizes);
  launchCpuKernel(device, "aten::where.self_out", &at::cpu::where_outf, cond, self, other, out);
  return out;
}

at::Tensor where(const at::Tensor& cond, const at::Tensor& self, const at::Tensor& other) {
  c10::DeviceIndex device = -1;
  for (const at::Tensor* t : {&cond, &self, &other}) {
    if (t->device().type() == kAxon) device = t->device().index();
  }
  TORCH_CHECK(device >= 0, "where: expected an axon tensor");
  // The result laid out as the CPU's TensorIterator lays it out (a
  // transposed input gives a transposed result), so that later views and
  // reshapes behave as on the CPU.
  at::Tensor out;
  if (cond.device() == self.device() && self.device() == other.device()) {
    at::Tensor undefined;
    at::TensorIteratorConfig config;
    config.check_all_same_dtype(false)
        .declare_static_dtype_and_device(at::result_type(self, other), c10::Device(kAxon, device))
        .add_output(undefined)
        .add_const_input(cond)
        .add_const_input(self)
        .add_const_input(other);
    out = config.build().output();
  } else {
    out = emptyDevice({0}, {1}, at::result_type(self, other), device);
  }
  return where_out(cond, self, other, out);
}

at::Tensor& index_select_out(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                             at::Tensor& out) {
  const auto device = device_of(out, "index_select");
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
  at::Tensor out = emptyDevice({0}, {1}, self.scalar_type(), device_of(self, "index_select"));
  return index_select_out(self, dim, index, out);
}

// ------------------------------------------------------------ factories

at::Tensor& arange_out(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step,
                       at::Tensor& out) {
  const auto device = device_of(out, "arange");
  // ATen works in the output's accumulate type: int64 for integral outputs.
  const bool integral = c10::isIntegralType(out.scalar_type(), /*includeBool=*/true);
  auto acc = [&](const at::Scalar& v) {
    return integral ? static_cast<double>(v.toLong()) : v.toDouble();
  };
  const double xstart = acc(start), xend = acc(end), xstep = acc(step);
  TORCH_CHECK_VALUE(xstep > 0 || xstep < 0, "step must be nonzero");
  TORCH_CHECK(std::isfinite(xstart) && std::isfinite(xend), "unsupported range: ", xstart,
              " -> ", xend);
  TORCH_CHECK(((xstep > 0) && (xend >= xstart)) || ((xstep < 0) && (xend <= xstart)),
              "upper bound and larger bound inconsistent with step sign");
  double size_d;
  if (out.scalar_type() == at::kLong) {
    const int64_t s = start.toLong(), e = end.toLong(), st = step.toLong();
    const int64_t sgn = (st > 0) - (st < 0);
    size_d = static_cast<double>((e - s + st - sgn) / st);  // integer division, as ATen
  } else {
    size_d = std::ceil((end.toDouble() - start.toDouble()) / step.toDouble());
  }
  TORCH_CHECK(size_d >= 0 && size_d <= static_cast<double>(std::numeric_limits<int64_t>::max()),
              "invalid size, possible overflow?");
  const int64_t size = static_cast<int64_t>(size_d);
  if (out.numel() != size) out.resize_({size});
  if (size > 0) {
    launchCpuKernel<HostChecks::kMeta>(device, "aten::arange.start_out", &at::cpu::arange_outf,
                                       start, end, step, out);
  }
  return out;
}

// ------------------------------------------------------------ activations

at::Tensor relu(const at::Tensor& self) {
  TORCH_CHECK(self.scalar_type() != at::kBool, "Boolean inputs not supported for relu");
  const auto device = device_of(self, "relu");
  at::Tensor out = emptyDeviceLike(self, self.scalar_type());
  launchCpuKernel<HostChecks::kMeta>(device, "aten::relu",
                  static_cast<at::Tensor& (*)(const at::Tensor&, const at::Scalar&, at::Tensor&)>(
                      &at::cpu::clamp_min_outf),
                  self, at::Scalar(0), out);
  return out;
}

at::Tensor& relu_(at::Tensor& self) {
  TORCH_CHECK(self.scalar_type() != at::kBool, "Boolean inputs not supported for relu");
  const auto device = device_of(self, "relu_");
  at::assert_no_internal_overlap(self);
  launchCpuKernel<HostChecks::kMeta>(device, "aten::relu_",
                  static_cast<at::Tensor& (*)(const at::Tensor&, const at::Scalar&, at::Tensor&)>(
                      &at::cpu::clamp_min_outf),
                  self, at::Scalar(0), self);
  return self;
}

// ------------------------------------------------------------ reductions

template <at::Tensor& (*Fn)(const at::Tensor&, at::Tensor&)>
at::Tensor reduce_all(const at::Tensor& self, const char* name, const char* op) {
  TORCH_CHECK(self.numel() > 0, name,
              "(): Expected reduction dim to be specified for input.numel() == 0. "
              "Specify the reduction dim with the 'dim' argument.");
  const auto device = device_of(self, name);
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
  const auto device = device_of(self, "histc");
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

// ------------------------------------------------------------ random

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p,
                                                  std::optional<bool> train) {
  const auto device = device_of(input, "native_dropout");
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
  const auto device = device_of(self, "multinomial");
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

// ------------------------------------------------------------ data-dependent

// nonzero and masked_select: the size of the result depends on the data, so
// these synchronise (wait for the stream, run the CPU kernel on host views,
// copy the result to the device), as they do on CUDA.
at::Tensor nonzero(const at::Tensor& self) {
  const auto device = device_of(self, "nonzero");
  syncCurrentStream(device);
  return copyToDevice(at::cpu::nonzero(hostView(self)), device);
}

at::Tensor masked_select(const at::Tensor& self, const at::Tensor& mask) {
  const auto device = device_of(self, "masked_select");
  checkSameDevice("aten::masked_select", device, mask);
  syncCurrentStream(device);
  const at::Tensor m = mask.device().type() == kAxon ? hostView(mask) : mask;
  return copyToDevice(at::cpu::masked_select(hostView(self), m), device);
}

// ------------------------------------------------------------ out= checks

// addr.out: ATen's kernel for backends other than CPU, CUDA and MPS
// (math_addr_out, CompositeExplicitAutograd) computes addr and copies it into
// out wherever out lives, so a CPU out= was silently written.  Check the
// devices first, as CUDA's kernel does (TensorIterator: CPU scalars only among
// the inputs), then run it.
at::Tensor& addr_out(const at::Tensor& self, const at::Tensor& vec1, const at::Tensor& vec2,
                     const at::Scalar& beta, const at::Scalar& alpha, at::Tensor& out) {
  static constexpr const char* op = "aten::addr.out";
  c10::DeviceIndex device = -1;
  const std::initializer_list<const at::Tensor*> all = {&vec1, &vec2, &self, &out};
  for (const at::Tensor* t : all) {
    if (device < 0 && t->device().type() == kAxon) device = t->device().index();
  }
  for (const at::Tensor* t : {&self, &vec1, &vec2}) checkSameDevice(op, device, *t);
  TORCH_CHECK(out.device() == c10::Device(kAxon, device),
              "Expected all tensors to be on the same device, but found at least two devices, ",
              c10::Device(kAxon, device), " and ", out.device(),
              "! (when checking arguments for ", op, ")");
  return at::native::math_addr_out(self, vec1, vec2, beta, alpha, out);
}

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

// ------------------------------------------------------------ views

// View ops whose ATen kernels only compute sizes and strides (registered for
// CPU and CUDA, so not reaching axon by themselves).
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("nonzero", nonzero);
  m.impl("masked_select", masked_select);
  m.impl("fill_.Scalar", fill_scalar);
  m.impl("fill_.Tensor", fill_tensor);
  m.impl("zero_", zero_);
  m.impl("masked_fill_.Scalar", masked_fill_scalar);
  m.impl("masked_fill_.Tensor", masked_fill_tensor);
  m.impl("where.self", where);
  m.impl("where.self_out", where_out);
  m.impl("index_select", index_select);
  m.impl("index_select.out", index_select_out);
  m.impl("arange.start_out", arange_out);
  m.impl("relu", relu);
  m.impl("relu_", relu_);
  m.impl("max", max_all);
  m.impl("min", min_all);
  m.impl("histc", histc);
  m.impl("native_dropout", native_dropout);
  m.impl("multinomial", multinomial);
  m.impl("addr.out", addr_out);
  m.impl("mode.values", mode_out);
}

}  // namespace
}  // namespace at::axon
