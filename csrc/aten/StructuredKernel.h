// Tier 2 for ATen's structured ops (elementwise, reductions, matmul, softmax,
// indexing ...): their out= overloads, which is also where their functional
// and in-place forms arrive (through ATen's CompositeExplicitAutograd-
// NonFunctional kernels, which allocate the result with the op's own meta
// function and call out=).
//
// On the host the op's C++ meta function runs on the axon tensors (it reads
// shapes, strides and dtypes, never data): PyTorch's checks and errors,
// broadcasting, type promotion, and the resize of out= tensors.  Then the
// at::cpu:: kernel is enqueued on the current stream with host views.
#include <type_traits>

#include <ATen/TensorIterator.h>
#include <ATen/native/Resize.h>
#include <torch/library.h>

#include <ATen/ops/_log_softmax_backward_data_cpu_dispatch.h>
#include <ATen/ops/_log_softmax_backward_data_meta.h>
#include <ATen/ops/_log_softmax_cpu_dispatch.h>
#include <ATen/ops/_log_softmax_meta.h>
#include <ATen/ops/_softmax_backward_data_cpu_dispatch.h>
#include <ATen/ops/_softmax_backward_data_meta.h>
#include <ATen/ops/_softmax_cpu_dispatch.h>
#include <ATen/ops/_softmax_meta.h>
#include <ATen/ops/add_cpu_dispatch.h>
#include <ATen/ops/add_meta.h>
#include <ATen/ops/addcdiv_cpu_dispatch.h>
#include <ATen/ops/addcdiv_meta.h>
#include <ATen/ops/addcmul_cpu_dispatch.h>
#include <ATen/ops/addcmul_meta.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/addmm_meta.h>
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
#include <ATen/ops/baddbmm_cpu_dispatch.h>
#include <ATen/ops/baddbmm_meta.h>
#include <ATen/ops/bitwise_and_cpu_dispatch.h>
#include <ATen/ops/bitwise_and_meta.h>
#include <ATen/ops/bitwise_not_cpu_dispatch.h>
#include <ATen/ops/bitwise_not_meta.h>
#include <ATen/ops/bitwise_or_cpu_dispatch.h>
#include <ATen/ops/bitwise_or_meta.h>
#include <ATen/ops/bitwise_xor_cpu_dispatch.h>
#include <ATen/ops/bitwise_xor_meta.h>
#include <ATen/ops/bmm_cpu_dispatch.h>
#include <ATen/ops/bmm_meta.h>
#include <ATen/ops/cat_cpu_dispatch.h>
#include <ATen/ops/cat_meta.h>
#include <ATen/ops/clamp_cpu_dispatch.h>
#include <ATen/ops/clamp_max_cpu_dispatch.h>
#include <ATen/ops/clamp_max_meta.h>
#include <ATen/ops/clamp_meta.h>
#include <ATen/ops/clamp_min_cpu_dispatch.h>
#include <ATen/ops/clamp_min_meta.h>
#include <ATen/ops/cos_cpu_dispatch.h>
#include <ATen/ops/cos_meta.h>
#include <ATen/ops/cumsum_cpu_dispatch.h>
#include <ATen/ops/cumsum_meta.h>
#include <ATen/ops/div_cpu_dispatch.h>
#include <ATen/ops/div_meta.h>
#include <ATen/ops/eq_cpu_dispatch.h>
#include <ATen/ops/eq_meta.h>
#include <ATen/ops/erf_cpu_dispatch.h>
#include <ATen/ops/erf_meta.h>
#include <ATen/ops/exp_cpu_dispatch.h>
#include <ATen/ops/exp_meta.h>
#include <ATen/ops/gather_cpu_dispatch.h>
#include <ATen/ops/gather_meta.h>
#include <ATen/ops/ge_cpu_dispatch.h>
#include <ATen/ops/ge_meta.h>
#include <ATen/ops/gelu_backward_cpu_dispatch.h>
#include <ATen/ops/gelu_backward_meta.h>
#include <ATen/ops/gelu_cpu_dispatch.h>
#include <ATen/ops/gelu_meta.h>
#include <ATen/ops/gt_cpu_dispatch.h>
#include <ATen/ops/gt_meta.h>
#include <ATen/ops/index_add_cpu_dispatch.h>
#include <ATen/ops/index_add_meta.h>
#include <ATen/ops/index_copy_cpu_dispatch.h>
#include <ATen/ops/index_copy_meta.h>
#include <ATen/ops/index_cpu_dispatch.h>
#include <ATen/ops/index_meta.h>
#include <ATen/ops/isin_cpu_dispatch.h>
#include <ATen/ops/isin_meta.h>
#include <ATen/ops/isneginf_cpu_dispatch.h>
#include <ATen/ops/isneginf_meta.h>
#include <ATen/ops/isposinf_cpu_dispatch.h>
#include <ATen/ops/isposinf_meta.h>
#include <ATen/ops/le_cpu_dispatch.h>
#include <ATen/ops/le_meta.h>
#include <ATen/ops/lerp_cpu_dispatch.h>
#include <ATen/ops/lerp_meta.h>
#include <ATen/ops/log1p_cpu_dispatch.h>
#include <ATen/ops/log1p_meta.h>
#include <ATen/ops/log_cpu_dispatch.h>
#include <ATen/ops/log_meta.h>
#include <ATen/ops/lt_cpu_dispatch.h>
#include <ATen/ops/lt_meta.h>
#include <ATen/ops/max_cpu_dispatch.h>
#include <ATen/ops/max_meta.h>
#include <ATen/ops/maximum_cpu_dispatch.h>
#include <ATen/ops/maximum_meta.h>
#include <ATen/ops/mean_cpu_dispatch.h>
#include <ATen/ops/mean_meta.h>
#include <ATen/ops/min_cpu_dispatch.h>
#include <ATen/ops/min_meta.h>
#include <ATen/ops/minimum_cpu_dispatch.h>
#include <ATen/ops/minimum_meta.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <ATen/ops/mm_meta.h>
#include <ATen/ops/mul_cpu_dispatch.h>
#include <ATen/ops/mul_meta.h>
#include <ATen/ops/ne_cpu_dispatch.h>
#include <ATen/ops/ne_meta.h>
#include <ATen/ops/neg_cpu_dispatch.h>
#include <ATen/ops/neg_meta.h>
#include <ATen/ops/nll_loss_backward_cpu_dispatch.h>
#include <ATen/ops/nll_loss_backward_meta.h>
#include <ATen/ops/nll_loss_forward_cpu_dispatch.h>
#include <ATen/ops/nll_loss_forward_meta.h>
#include <ATen/ops/pow_cpu_dispatch.h>
#include <ATen/ops/pow_meta.h>
#include <ATen/ops/reciprocal_cpu_dispatch.h>
#include <ATen/ops/reciprocal_meta.h>
#include <ATen/ops/rsqrt_cpu_dispatch.h>
#include <ATen/ops/rsqrt_meta.h>
#include <ATen/ops/scatter_add_cpu_dispatch.h>
#include <ATen/ops/scatter_add_meta.h>
#include <ATen/ops/scatter_cpu_dispatch.h>
#include <ATen/ops/scatter_meta.h>
#include <ATen/ops/sigmoid_backward_cpu_dispatch.h>
#include <ATen/ops/sigmoid_backward_meta.h>
#include <ATen/ops/sigmoid_cpu_dispatch.h>
#include <ATen/ops/sigmoid_meta.h>
#include <ATen/ops/silu_backward_cpu_dispatch.h>
#include <ATen/ops/silu_backward_meta.h>
#include <ATen/ops/silu_cpu_dispatch.h>
#include <ATen/ops/silu_meta.h>
#include <ATen/ops/sin_cpu_dispatch.h>
#include <ATen/ops/sin_meta.h>
#include <ATen/ops/sort_cpu_dispatch.h>
#include <ATen/ops/sort_meta.h>
#include <ATen/ops/sqrt_cpu_dispatch.h>
#include <ATen/ops/sqrt_meta.h>
#include <ATen/ops/sub_cpu_dispatch.h>
#include <ATen/ops/sub_meta.h>
#include <ATen/ops/sum_cpu_dispatch.h>
#include <ATen/ops/sum_meta.h>
#include <ATen/ops/tanh_backward_cpu_dispatch.h>
#include <ATen/ops/tanh_backward_meta.h>
#include <ATen/ops/tanh_cpu_dispatch.h>
#include <ATen/ops/tanh_meta.h>
#include <ATen/ops/threshold_backward_cpu_dispatch.h>
#include <ATen/ops/threshold_backward_meta.h>
#include <ATen/ops/topk_cpu_dispatch.h>
#include <ATen/ops/topk_meta.h>
#include <ATen/ops/tril_cpu_dispatch.h>
#include <ATen/ops/tril_meta.h>
#include <ATen/ops/triu_cpu_dispatch.h>
#include <ATen/ops/triu_meta.h>

#include <axon/kernels/linear.h>

#include "CpuKernel.h"

namespace at::axon {
namespace {

// What ATen's generated out= wrappers do with an output the meta function
// describes: check dtype and device, resize, restride only after a resize.
void resize_out(const at::Tensor& out, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                const c10::TensorOptions& options) {
  TORCH_CHECK(options.dtype() == out.dtype(), "Expected out tensor to have dtype ",
              options.dtype(), ", but got ", out.dtype(), " instead");
  TORCH_CHECK(options.device() == out.device(), "Expected out tensor to have device ",
              options.device(), ", but got ", out.device(), " instead");
  if (at::native::resize_output(out, sizes)) {
    if (!strides.empty()) {
      const_cast<at::Tensor&>(out).as_strided_(sizes, strides);
    } else if (options.memory_format_opt().has_value()) {
      out.unsafeGetTensorImpl()->empty_tensor_restride(*options.memory_format_opt());
    }
  }
}

// A meta class whose outputs go to Derived::set_output (both of MetaBase's
// entry points), which then hands them on to TensorIterator when Meta is one.
template <typename Meta, typename Derived>
struct BoundMeta : Meta {
  void set_output_strided(int64_t i, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                          c10::TensorOptions options) override {
    static_cast<Derived*>(this)->set_output(i, sizes, strides, options);
    forward(i, sizes, strides, options);
  }
  void set_output_raw_strided(int64_t i, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                              c10::TensorOptions options) override {
    static_cast<Derived*>(this)->set_output(i, sizes, strides, options);
    forward(i, sizes, strides, options);
  }

 private:
  void forward(int64_t i, c10::IntArrayRef sizes, c10::IntArrayRef strides,
               c10::TensorOptions options) {
    if constexpr (std::is_base_of_v<at::TensorIteratorBase, Meta>) {
      Meta::set_output_raw_strided(i, sizes, strides, options);
    }
  }
};

// The op's meta class with its outputs bound to the given axon tensors.
template <typename Meta, size_t N>
struct OutMeta final : BoundMeta<Meta, OutMeta<Meta, N>> {
  explicit OutMeta(std::array<const at::Tensor*, N> outs) : outs_(outs) {}
  const at::Tensor& maybe_get_output(int64_t i) override { return *outs_[i]; }
  void set_output(int64_t i, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                  c10::TensorOptions options) {
    resize_out(*outs_[i], sizes, strides, options);
  }

 private:
  std::array<const at::Tensor*, N> outs_;
};

template <typename Tuple, size_t... I>
auto tail_refs(Tuple& args, std::index_sequence<I...>) {
  constexpr size_t offset = std::tuple_size_v<Tuple> - sizeof...(I);
  return std::array<const at::Tensor*, sizeof...(I)>{&std::get<offset + I>(args)...};
}

template <typename Tuple, size_t... I>
auto tail_tuple(Tuple& args, std::index_sequence<I...>) {
  constexpr size_t offset = std::tuple_size_v<Tuple> - sizeof...(I);
  return std::forward_as_tuple(std::get<offset + I>(args)...);
}

// Meta functions take some optionals as OptionalTensorRef / OptionalScalarRef
// where the op takes std::optional: this passes as either.
template <typename V, typename Ref>
struct OptionalArg {
  const std::optional<V>& v;
  operator const std::optional<V>&() const { return v; }
  operator Ref() const { return v.has_value() ? Ref(*v) : Ref(); }
};
inline OptionalArg<at::Tensor, at::OptionalTensorRef> meta_arg(const std::optional<at::Tensor>& v) {
  return {v};
}
inline OptionalArg<at::Scalar, at::OptionalScalarRef> meta_arg(const std::optional<at::Scalar>& v) {
  return {v};
}
template <typename V>
const V& meta_arg(const V& v) {
  return v;
}

template <typename M, typename Tuple, size_t... I>
void call_meta(M& meta, Tuple& args, std::index_sequence<I...>) {
  meta.meta(meta_arg(std::get<I>(args))...);
}

struct FindDevice {
  c10::DeviceIndex index = -1;
  void operator()(const at::Tensor& t) {
    if (index < 0 && t.defined() && t.device().type() == kAxon) index = t.device().index();
  }
  void operator()(const std::optional<at::Tensor>& t) {
    if (t.has_value()) (*this)(*t);
  }
  void operator()(const at::ITensorListRef& list) {
    for (const at::Tensor& t : list) (*this)(t);
  }
  template <typename V>
  void operator()(const V&) {}
};

// The kernel registered for an out= overload: Cpu is its at::cpu:: *_outf
// function (inputs..., outputs...), Meta the structured meta class, N the
// number of outputs, Name a holder of the op's name.
template <typename Meta, size_t N, typename Name, auto Cpu>
struct Structured;

template <typename Meta, size_t N, typename Name, typename R, typename... A, R (*Cpu)(A...)>
struct Structured<Meta, N, Name, Cpu> {
  static R run(A... a) {
    auto args = std::forward_as_tuple(a...);
    auto outs = tail_refs(args, std::make_index_sequence<N>{});
    FindDevice find;
    (find(a), ...);
    const c10::DeviceIndex device = find.index;
    (checkSameDevice(Name::value(), device, a), ...);
    HostWarningScope host_warnings;  // the kernel reruns the meta function
    OutMeta<Meta, N> meta(outs);
    call_meta(meta, args, std::make_index_sequence<sizeof...(A) - N>{});
    launchCpuKernel<HostChecks::kMeta>(device, Name::value(), Cpu, a...);
    if constexpr (N == 1) {
      return std::get<sizeof...(A) - 1>(args);
    } else {
      return tail_tuple(args, std::make_index_sequence<N>{});
    }
  }
};

// The functional form: outputs are allocated as the meta function describes.
template <typename Meta, size_t N>
struct FunctionalMeta final : BoundMeta<Meta, FunctionalMeta<Meta, N>> {
  const at::Tensor& maybe_get_output(int64_t i) override { return outs[i]; }
  std::array<at::Tensor, N> outs;

  void set_output(int64_t i, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                  c10::TensorOptions options) {
    TORCH_INTERNAL_ASSERT(options.device().type() == kAxon);
    if (strides.empty()) {
      outs[i] = emptyDevice(sizes, c10::contiguous_strides(sizes),
                            options.dtype().toScalarType(), options.device().index());
      if (options.memory_format_opt().has_value()) {
        outs[i].unsafeGetTensorImpl()->empty_tensor_restride(*options.memory_format_opt());
      }
    } else {
      outs[i] = emptyDevice(sizes, strides, options.dtype().toScalarType(),
                            options.device().index());
    }
  }
};

// The in-place form: the output is `self`, which must not need resizing.
template <typename Meta>
struct InplaceMeta final : BoundMeta<Meta, InplaceMeta<Meta>> {
  explicit InplaceMeta(const at::Tensor& self) : self_(self) {}
  const at::Tensor& maybe_get_output(int64_t) override { return self_; }
  void set_output(int64_t, c10::IntArrayRef sizes, c10::IntArrayRef,
                  c10::TensorOptions options) {
    TORCH_CHECK(options.dtype() == self_.dtype(), "Bad in-place call: input tensor dtype ",
                self_.dtype(), " and output tensor dtype ", options.dtype(),
                " should match");
    TORCH_CHECK(sizes == self_.sizes(), "output with shape ", self_.sizes(),
                " doesn't match the broadcast shape ", sizes);
  }

 private:
  const at::Tensor& self_;
};


// The functional overload's kernel: Sig is its signature (inputs only), Outf
// the at::cpu:: out= function that computes it.
template <typename Meta, size_t N, typename Name, typename Sig, auto Outf>
struct Functional;

template <typename Meta, size_t N, typename Name, typename R, typename... A, auto Outf>
struct Functional<Meta, N, Name, R(A...), Outf> {
  static R run(A... a) {
    FindDevice find;
    (find(a), ...);
    (checkSameDevice(Name::value(), find.index, a), ...);
    HostWarningScope host_warnings;
    FunctionalMeta<Meta, N> meta;
    meta.meta(meta_arg(a)...);
    launch_with_outputs(find.index, meta.outs, std::make_index_sequence<N>{}, a...);
    if constexpr (N == 1) {
      return std::move(meta.outs[0]);
    } else {
      return std::apply([](auto&... o) { return R(o...); }, meta.outs);
    }
  }

 private:
  template <size_t... I>
  static void launch_with_outputs(c10::DeviceIndex device, std::array<at::Tensor, N>& outs,
                                  std::index_sequence<I...>, A... a) {
    // Empty results too: the CPU kernel checks what it takes (silu of an
    // empty int64 tensor raises on the CPU).
    launchCpuKernel<HostChecks::kMeta>(device, Name::value(), Outf, a..., outs[I]...);
  }
};

// The in-place overload's kernel (self first, then the other inputs).
template <typename Meta, typename Name, typename Sig, auto Outf>
struct Inplace;

template <typename Meta, typename Name, typename... A, auto Outf>
struct Inplace<Meta, Name, at::Tensor&(at::Tensor&, A...), Outf> {
  static at::Tensor& run(at::Tensor& self, A... a) {
    FindDevice find;
    find(self);
    (find(a), ...);
    const c10::DeviceIndex device = find.index;
    checkSameDevice(Name::value(), device, self);
    (checkSameDevice(Name::value(), device, a), ...);
    HostWarningScope host_warnings;
    InplaceMeta<Meta> meta(self);
    meta.meta(self, meta_arg(a)...);
    launchCpuKernel<HostChecks::kMeta>(device, Name::value(), Outf, self, a..., self);
    return self;
  }
};

using T = at::Tensor;
using S = at::Scalar;
using OptS = std::optional<at::Scalar>;
using OptT = std::optional<at::Tensor>;

// ------------------------------------------------------------ linear layers

// mm / addmm of a few rows by a transposed weight (x @ W^T, what F.linear
// gives for decoding), float32, bfloat16 or float16: kernels/linear.h, which
// reads the weight at memory speed.  Everything else: ATen's kernel (MKL,
// oneDNN).
struct MmName {
  static const char* value() { return "aten::mm"; }
};
struct AddmmName {
  static const char* value() { return "aten::addmm"; }
};

std::optional<::axon::kernels::DType> small_linear_dtype(c10::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return ::axon::kernels::DType::kFloat32;
    case at::kBFloat16:
      return ::axon::kernels::DType::kBFloat16;
    case at::kHalf:
      return ::axon::kernels::DType::kFloat16;
    default:
      return std::nullopt;
  }
}

bool small_linear(const at::Tensor& a, const at::Tensor& b) {
  return a.dim() == 2 && b.dim() == 2 && small_linear_dtype(a.scalar_type()).has_value() &&
         b.scalar_type() == a.scalar_type() && a.device() == b.device() &&
         a.device().type() == kAxon && a.size(0) >= 1 &&
         a.size(0) <= ::axon::kernels::kLinearMaxRows && a.size(1) == b.size(0) &&
         a.size(1) > 0 && b.size(1) > 0 && a.stride(1) == 1 &&
         (a.size(0) == 1 || a.stride(0) >= a.size(1)) && b.stride(0) == 1 &&
         (b.size(1) == 1 || b.stride(1) >= b.size(0));
}

constexpr int64_t kParallelLinearElements = int64_t{4} << 20;

void launch_small_linear_into(const at::Tensor& a, const at::Tensor& b, const void* bias,
                              at::Tensor& out, const char* name) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  launch(a.device().index(), name,
         [=, dt = *small_linear_dtype(a.scalar_type()), ap = a.const_data_ptr(),
          lda = a.stride(0), wp = b.const_data_ptr(), ldw = b.stride(1), op = out.data_ptr(),
          ldo = out.stride(0)] {
           ::axon::kernels::linear_small_m(dt, m, n, k, ap, lda, wp, ldw, bias, op, ldo);
         },
         // Memory-bound: one thread reads the weight at ~30 GB/s here and
         // leaves the other core to the host dispatching the next ops.  A
         // weight of 4M elements or more (16 MiB in float32, 8 MiB in 16-bit
         // types; an output projection: 0.5 ms and up) is worth waking the
         // team for: two threads read ~60 GB/s, and the
         // host has nothing left to dispatch for that long (decode step of a
         // 56M Llama, 65 MB lm_head: eager 9.0 -> 8.3 ms, compiled 7.3 -> 6.3
         // ms; every linear on the team was slower, 9.7 / 8.0 ms).
         /*threads=*/n * k >= kParallelLinearElements ? 0 : 1);
}

at::Tensor launch_small_linear(const at::Tensor& a, const at::Tensor& b, const void* bias,
                               const char* name) {
  at::Tensor out = emptyDevice({a.size(0), b.size(1)}, {b.size(1), 1}, a.scalar_type(),
                               a.device().index());
  launch_small_linear_into(a, b, bias, out, name);
  return out;
}

// An out= result the small-M kernel can write as is: rows of a's dtype and the
// right shape, unit column stride, sharing no memory with the operands
// (otherwise ATen's out= path: resize, overlap checks, MKL).
bool small_linear_out(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  return out.scalar_type() == a.scalar_type() && out.device() == a.device() && out.dim() == 2 &&
         out.size(0) == a.size(0) && out.size(1) == b.size(1) && out.stride(1) == 1 &&
         (out.size(0) == 1 || out.stride(0) >= out.size(1)) && !out.is_alias_of(a) &&
         !out.is_alias_of(b);
}

at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  if (!small_linear(a, b)) {
    return Functional<at::meta::structured_mm, 1, MmName, T(const T&, const T&),
                      &at::cpu::mm_outf>::run(a, b);
  }
  return launch_small_linear(a, b, nullptr, MmName::value());
}

at::Tensor addmm(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b,
                 const at::Scalar& beta, const at::Scalar& alpha) {
  const bool plain = !beta.isComplex() && !alpha.isComplex() && beta.toDouble() == 1.0 &&
                     alpha.toDouble() == 1.0;
  if (!plain || !small_linear(a, b) || bias.dim() != 1 || bias.scalar_type() != a.scalar_type() ||
      bias.device() != a.device() || bias.size(0) != b.size(1) || bias.stride(0) != 1) {
    return Functional<at::meta::structured_addmm, 1, AddmmName,
                      T(const T&, const T&, const T&, const S&, const S&),
                      &at::cpu::addmm_outf>::run(bias, a, b, beta, alpha);
  }
  return launch_small_linear(a, b, bias.const_data_ptr(), AddmmName::value());
}

// out= forms (what torch.compile's generated code calls: extern_kernels.mm(a, b, out=buf)).
at::Tensor& mm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  if (small_linear(a, b) && small_linear_out(a, b, out)) {
    launch_small_linear_into(a, b, nullptr, out, MmName::value());
    return out;
  }
  return Structured<at::meta::structured_mm, 1, MmName, &at::cpu::mm_outf>::run(a, b, out);
}

at::Tensor& addmm_out(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b,
                      const at::Scalar& beta, const at::Scalar& alpha, at::Tensor& out) {
  const bool plain = !beta.isComplex() && !alpha.isComplex() && beta.toDouble() == 1.0 &&
                     alpha.toDouble() == 1.0;
  if (plain && small_linear(a, b) && small_linear_out(a, b, out) && bias.dim() == 1 &&
      bias.scalar_type() == a.scalar_type() && bias.device() == a.device() &&
      bias.size(0) == b.size(1) && bias.stride(0) == 1 && !out.is_alias_of(bias)) {
    launch_small_linear_into(a, b, bias.const_data_ptr(), out, AddmmName::value());
    return out;
  }
  return Structured<at::meta::structured_addmm, 1, AddmmName, &at::cpu::addmm_outf>::run(
      bias, a, b, beta, alpha, out);
}

// OUT(schema, outputs, meta class suffix, at::cpu function): for an at::cpu
// function with one out= overload; OUT_SIG names the overload by signature.
#define AXON_OUT_IMPL(schema, n, cls, fnptr)                                  \
  {                                                                           \
    struct Name {                                                             \
      static const char* value() { return "aten::" schema; }                  \
    };                                                                        \
    m.impl(schema, TORCH_FN((Structured<at::meta::structured_##cls, n, Name,  \
                                        fnptr>::run)));                       \
  }
#define OUT(schema, n, cls, fn) AXON_OUT_IMPL(schema, n, cls, &at::cpu::fn)
#define OUT_SIG(schema, n, cls, fn, sig) \
  AXON_OUT_IMPL(schema, n, cls, static_cast<sig>(&at::cpu::fn))

// FUNC / INPLACE: the functional and in-place overloads of an op whose out=
// function is `outf` (cast to `sig` when overloaded), with their signatures.
#define AXON_NAMED(schema, ...)                                  \
  {                                                              \
    struct Name {                                                \
      static const char* value() { return "aten::" schema; }     \
    };                                                           \
    m.impl(schema, TORCH_FN((__VA_ARGS__::run)));                \
  }
#define FUNC(schema, n, cls, fsig, outf) \
  AXON_NAMED(schema, Functional<at::meta::structured_##cls, n, Name, fsig, &at::cpu::outf>)
#define FUNC_SIG(schema, n, cls, fsig, outf, sig)                                      \
  AXON_NAMED(schema, Functional<at::meta::structured_##cls, n, Name, fsig,             \
                                static_cast<sig>(&at::cpu::outf)>)
#define INPLACE(schema, cls, isig, outf) \
  AXON_NAMED(schema, Inplace<at::meta::structured_##cls, Name, isig, &at::cpu::outf>)
#define INPLACE_SIG(schema, cls, isig, outf, sig) \
  AXON_NAMED(schema, Inplace<at::meta::structured_##cls, Name, isig, static_cast<sig>(&at::cpu::outf)>)

using FUnary = T(const T&);
using FBinaryT = T(const T&, const T&);
using FBinaryS = T(const T&, const S&);
using FBinaryAlpha = T(const T&, const T&, const S&);
using IBinaryT = T&(T&, const T&);
using IBinaryAlpha = T&(T&, const T&, const S&);
using Unary = T& (*)(const T&, T&);
using DimMinMax = std::tuple<T&, T&> (*)(const T&, int64_t, bool, T&, T&);
using BinaryT = T& (*)(const T&, const T&, T&);
using BinaryS = T& (*)(const T&, const S&, T&);


TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  // elementwise arithmetic
  OUT("add.out", 1, add_Tensor, add_outf);
  OUT("sub.out", 1, sub_Tensor, sub_outf);
  OUT("mul.out", 1, mul_Tensor, mul_outf);
  OUT_SIG("div.out", 1, div_Tensor, div_outf, BinaryT);
  OUT_SIG("div.out_mode", 1, div_Tensor_mode, div_outf,
          T& (*)(const T&, const T&, std::optional<c10::string_view>, T&));
  OUT_SIG("pow.Tensor_Tensor_out", 1, pow_Tensor_Tensor, pow_outf, BinaryT);
  OUT_SIG("pow.Tensor_Scalar_out", 1, pow_Tensor_Scalar, pow_outf, BinaryS);
  OUT_SIG("pow.Scalar_out", 1, pow_Scalar, pow_outf, T& (*)(const S&, const T&, T&));
  OUT("maximum.out", 1, maximum, maximum_outf);
  OUT("minimum.out", 1, minimum, minimum_outf);
  OUT("addcmul.out", 1, addcmul, addcmul_outf);
  OUT("addcdiv.out", 1, addcdiv, addcdiv_outf);
  OUT_SIG("lerp.Scalar_out", 1, lerp_Scalar, lerp_outf, T& (*)(const T&, const T&, const S&, T&));
  OUT_SIG("lerp.Tensor_out", 1, lerp_Tensor, lerp_outf, T& (*)(const T&, const T&, const T&, T&));
  OUT_SIG("clamp.out", 1, clamp, clamp_outf, T& (*)(const T&, const OptS&, const OptS&, T&));
  OUT_SIG("clamp.Tensor_out", 1, clamp_Tensor, clamp_outf,
          T& (*)(const T&, const OptT&, const OptT&, T&));
  OUT_SIG("clamp_min.out", 1, clamp_min, clamp_min_outf, BinaryS);
  OUT_SIG("clamp_min.Tensor_out", 1, clamp_min_Tensor, clamp_min_outf, BinaryT);
  OUT_SIG("clamp_max.out", 1, clamp_max, clamp_max_outf, BinaryS);
  OUT_SIG("clamp_max.Tensor_out", 1, clamp_max_Tensor, clamp_max_outf, BinaryT);
  // unary
  OUT("neg.out", 1, neg, neg_outf);
  OUT("exp.out", 1, exp, exp_outf);
  OUT("log.out", 1, log, log_outf);
  OUT("log1p.out", 1, log1p, log1p_outf);
  OUT("sqrt.out", 1, sqrt, sqrt_outf);
  OUT("rsqrt.out", 1, rsqrt, rsqrt_outf);
  OUT("reciprocal.out", 1, reciprocal, reciprocal_outf);
  OUT("sin.out", 1, sin, sin_outf);
  OUT("cos.out", 1, cos, cos_outf);
  OUT("tanh.out", 1, tanh, tanh_outf);
  OUT("sigmoid.out", 1, sigmoid, sigmoid_outf);
  OUT("erf.out", 1, erf, erf_outf);
  OUT("isneginf.out", 1, isneginf, isneginf_outf);
  OUT("isposinf.out", 1, isposinf, isposinf_outf);
  OUT("bitwise_not.out", 1, bitwise_not, bitwise_not_outf);
  // activations and their backward ops
  OUT("silu.out", 1, silu, silu_outf);
  OUT("silu_backward.grad_input", 1, silu_backward, silu_backward_outf);
  OUT("gelu.out", 1, gelu, gelu_outf);
  OUT("gelu_backward.grad_input", 1, gelu_backward, gelu_backward_outf);
  OUT("tanh_backward.grad_input", 1, tanh_backward, tanh_backward_outf);
  OUT("sigmoid_backward.grad_input", 1, sigmoid_backward, sigmoid_backward_outf);
  OUT("threshold_backward.grad_input", 1, threshold_backward, threshold_backward_outf);
  // comparisons and logic
  OUT_SIG("eq.Scalar_out", 1, eq_Scalar, eq_outf, BinaryS);
  OUT_SIG("eq.Tensor_out", 1, eq_Tensor, eq_outf, BinaryT);
  OUT_SIG("ne.Scalar_out", 1, ne_Scalar, ne_outf, BinaryS);
  OUT_SIG("ne.Tensor_out", 1, ne_Tensor, ne_outf, BinaryT);
  OUT_SIG("lt.Scalar_out", 1, lt_Scalar, lt_outf, BinaryS);
  OUT_SIG("lt.Tensor_out", 1, lt_Tensor, lt_outf, BinaryT);
  OUT_SIG("le.Scalar_out", 1, le_Scalar, le_outf, BinaryS);
  OUT_SIG("le.Tensor_out", 1, le_Tensor, le_outf, BinaryT);
  OUT_SIG("gt.Scalar_out", 1, gt_Scalar, gt_outf, BinaryS);
  OUT_SIG("gt.Tensor_out", 1, gt_Tensor, gt_outf, BinaryT);
  OUT_SIG("ge.Scalar_out", 1, ge_Scalar, ge_outf, BinaryS);
  OUT_SIG("ge.Tensor_out", 1, ge_Tensor, ge_outf, BinaryT);
  OUT_SIG("bitwise_and.Tensor_out", 1, bitwise_and_Tensor, bitwise_and_outf, BinaryT);
  OUT_SIG("bitwise_or.Tensor_out", 1, bitwise_or_Tensor, bitwise_or_outf, BinaryT);
  OUT_SIG("bitwise_xor.Tensor_out", 1, bitwise_xor_Tensor, bitwise_xor_outf, BinaryT);
  OUT_SIG("isin.Tensor_Tensor_out", 1, isin_Tensor_Tensor, isin_outf,
          T& (*)(const T&, const T&, bool, bool, T&));
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
  // matmul
  m.impl("mm.out", TORCH_FN(mm_out));
  OUT("bmm.out", 1, bmm, bmm_outf);
  m.impl("addmm.out", TORCH_FN(addmm_out));
  OUT("baddbmm.out", 1, baddbmm, baddbmm_outf);
  // softmax and losses
  OUT("_softmax.out", 1, _softmax, _softmax_outf);
  OUT("_log_softmax.out", 1, _log_softmax, _log_softmax_outf);
  OUT("_softmax_backward_data.out", 1, _softmax_backward_data, _softmax_backward_data_outf);
  OUT("_log_softmax_backward_data.out", 1, _log_softmax_backward_data,
      _log_softmax_backward_data_outf);
  OUT("nll_loss_forward.output", 2, nll_loss_forward, nll_loss_forward_outf);
  OUT("nll_loss_backward.grad_input", 1, nll_loss_backward, nll_loss_backward_outf);
  // shape and indexing
  OUT("cat.out", 1, cat, cat_outf);
  OUT("tril.out", 1, tril, tril_outf);
  OUT("triu.out", 1, triu, triu_outf);
  OUT("topk.values", 2, topk, topk_outf);
  OUT("sort.values_stable", 2, sort_stable, sort_outf);
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

  // Functional and in-place overloads of the hottest ops, registered directly
  // so their meta function runs once.
  FUNC("add.Tensor", 1, add_Tensor, FBinaryAlpha, add_outf);
  FUNC("sub.Tensor", 1, sub_Tensor, FBinaryAlpha, sub_outf);
  FUNC("mul.Tensor", 1, mul_Tensor, FBinaryT, mul_outf);
  FUNC_SIG("div.Tensor", 1, div_Tensor, FBinaryT, div_outf, BinaryT);
  FUNC_SIG("pow.Tensor_Scalar", 1, pow_Tensor_Scalar, FBinaryS, pow_outf, BinaryS);
  FUNC("neg", 1, neg, FUnary, neg_outf);
  FUNC("exp", 1, exp, FUnary, exp_outf);
  FUNC("sqrt", 1, sqrt, FUnary, sqrt_outf);
  FUNC("rsqrt", 1, rsqrt, FUnary, rsqrt_outf);
  FUNC("tanh", 1, tanh, FUnary, tanh_outf);
  FUNC("sigmoid", 1, sigmoid, FUnary, sigmoid_outf);
  FUNC("silu", 1, silu, FUnary, silu_outf);
  FUNC("cos", 1, cos, FUnary, cos_outf);
  FUNC("sin", 1, sin, FUnary, sin_outf);
  FUNC("gelu", 1, gelu, T(const T&, c10::string_view), gelu_outf);
  FUNC("silu_backward", 1, silu_backward, FBinaryT, silu_backward_outf);
  FUNC_SIG("eq.Scalar", 1, eq_Scalar, FBinaryS, eq_outf, BinaryS);
  FUNC_SIG("eq.Tensor", 1, eq_Tensor, FBinaryT, eq_outf, BinaryT);
  FUNC_SIG("ne.Scalar", 1, ne_Scalar, FBinaryS, ne_outf, BinaryS);
  FUNC_SIG("lt.Scalar", 1, lt_Scalar, FBinaryS, lt_outf, BinaryS);
  FUNC_SIG("gt.Scalar", 1, gt_Scalar, FBinaryS, gt_outf, BinaryS);
  FUNC_SIG("bitwise_and.Tensor", 1, bitwise_and_Tensor, FBinaryT, bitwise_and_outf, BinaryT);
  FUNC_SIG("bitwise_or.Tensor", 1, bitwise_or_Tensor, FBinaryT, bitwise_or_outf, BinaryT);
  FUNC("mean.dim", 1, mean_dim,
       T(const T&, at::OptionalIntArrayRef, bool, std::optional<c10::ScalarType>), mean_outf);
  FUNC("sum.dim_IntList", 1, sum_dim_IntList,
       T(const T&, at::OptionalIntArrayRef, bool, std::optional<c10::ScalarType>), sum_outf);
  m.impl("mm", TORCH_FN(mm));
  FUNC("bmm", 1, bmm, FBinaryT, bmm_outf);
  m.impl("addmm", TORCH_FN(addmm));
  FUNC("cat", 1, cat, T(const at::ITensorListRef&, int64_t), cat_outf);
  INPLACE("add_.Tensor", add_Tensor, IBinaryAlpha, add_outf);
  INPLACE("sub_.Tensor", sub_Tensor, IBinaryAlpha, sub_outf);
  INPLACE("mul_.Tensor", mul_Tensor, IBinaryT, mul_outf);
  INPLACE_SIG("div_.Tensor", div_Tensor, IBinaryT, div_outf, BinaryT);
  INPLACE("addcmul_", addcmul, T&(T&, const T&, const T&, const S&), addcmul_outf);
  INPLACE("addcdiv_", addcdiv, T&(T&, const T&, const T&, const S&), addcdiv_outf);
  INPLACE_SIG("lerp_.Scalar", lerp_Scalar, T&(T&, const T&, const S&), lerp_outf,
              T& (*)(const T&, const T&, const S&, T&));
}

}  // namespace

void checkSameDevice(const char* op, c10::DeviceIndex device, const at::Tensor& t) {
  if (!t.defined()) return;
  TORCH_CHECK(device >= 0, op, ": expected an axon tensor among the arguments");
  const c10::Device d = t.device();
  if (d.type() == kAxon && d.index() == device) return;
  if (d.is_cpu() && t.dim() == 0) return;
  TORCH_CHECK(false,
              "Expected all tensors to be on the same device, but found at "
              "least two devices, ", c10::Device(kAxon, device), " and ", d,
              "! (when checking arguments for ", op, ")");
}

}  // namespace at::axon
