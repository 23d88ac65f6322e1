// The native stream kernels of ATen's structured ops (elementwise, reductions,
// matmul, softmax, indexing ...): templates and registration macros used by
// the family files under ops/.  Registered for their out= overloads, which is
// also where their functional and in-place forms arrive (through ATen's
// CompositeExplicitAutogradNonFunctional kernels, which allocate the result
// with the op's own meta function and call out=), and for the functional and
// in-place overloads of the hottest ops directly, so their meta runs once.
//
// On the host the op's C++ meta function runs on the axon tensors (it reads
// shapes, strides and dtypes, never data): PyTorch's checks and errors,
// broadcasting, type promotion, and the resize of out= tensors.  Then the
// at::cpu:: kernel is enqueued on the current stream with host views.
#pragma once

#include <array>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include <ATen/MemoryOverlap.h>
#include <ATen/TensorIterator.h>
#include <ATen/TensorMeta.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_log_softmax_backward_data_meta.h>
#include <ATen/ops/_log_softmax_meta.h>
#include <ATen/ops/_softmax_backward_data_meta.h>
#include <ATen/ops/_softmax_meta.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mean_meta.h>
#include <ATen/ops/sum_meta.h>
#include <c10/core/WrapDimMinimal.h>
#include <torch/library.h>

#include "CpuKernel.h"
#include "OpDevice.h"
#include "Registry.h"

namespace at::axon::structured {

// What ATen's generated out= wrappers do with an output the meta function
// describes: check dtype and device, resize, restride only after a resize.
inline void resize_out(const at::Tensor& out, c10::IntArrayRef sizes, c10::IntArrayRef strides,
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

// Adaptive eager (Fusion.h): which structured ops may run fused.  Every
// TensorIterator op is pointwise; sum and mean are, over the last dimension.
template <typename Meta>
constexpr cpu_kernel::FusionKind fusionKindOf() {
  if constexpr (std::is_base_of_v<at::TensorIteratorBase, Meta>) {
    return cpu_kernel::FusionKind::kPointwise;
  } else if constexpr (std::is_same_v<Meta, at::meta::structured_sum_dim_IntList>) {
    return cpu_kernel::FusionKind::kRowSum;
  } else if constexpr (std::is_same_v<Meta, at::meta::structured_mean_dim>) {
    return cpu_kernel::FusionKind::kRowMean;
  } else {
    return cpu_kernel::FusionKind::kNone;
  }
}

// sum/mean(self, dim, keepdim, dtype, out): over the last dimension only?
inline std::optional<std::optional<c10::ScalarType>> rowReduction(
    const at::Tensor& self, at::OptionalIntArrayRef dim, bool,
    std::optional<c10::ScalarType> dtype, const at::Tensor&) {
  if (self.dim() == 0 || !dim.has_value() || dim->size() != 1) return std::nullopt;
  if (c10::maybe_wrap_dim((*dim)[0], self.dim()) != self.dim() - 1) return std::nullopt;
  return dtype;
}
template <typename... A>
std::optional<std::optional<c10::ScalarType>> rowReduction(const A&...) {
  return std::nullopt;
}

// Structured CPU kernels that write their out= as if it were contiguous,
// whatever its strides (wrong places; past the storage of a non-dense one,
// corrupting the CPU's heap or, on axon, other tensors): an expanded out= is
// refused with TensorIterator's error, another non-contiguous one gets the
// values through a contiguous temporary.
template <typename Meta>
constexpr bool writesDenseOut() {
  return std::is_same_v<Meta, at::meta::structured__softmax> ||
         std::is_same_v<Meta, at::meta::structured__log_softmax> ||
         std::is_same_v<Meta, at::meta::structured__softmax_backward_data> ||
         std::is_same_v<Meta, at::meta::structured__log_softmax_backward_data>;
}

template <typename Meta, size_t N, typename Fn, typename... A>
void launchStructured(c10::DeviceIndex device, const char* name, Fn fn, const A&... a) {
  constexpr cpu_kernel::FusionKind kind =
      N == 1 ? fusionKindOf<Meta>() : cpu_kernel::FusionKind::kNone;
  if constexpr (kind == cpu_kernel::FusionKind::kPointwise) {
    launchFusibleCpuKernel(device, name, kind, std::nullopt, fn, a...);
  } else if constexpr (kind != cpu_kernel::FusionKind::kNone) {
    if (auto dtype = rowReduction(a...)) {
      launchFusibleCpuKernel(device, name, kind, *dtype, fn, a...);
    } else {
      launchCpuKernel<HostChecks::kMeta>(device, name, fn, a...);
    }
  } else {
    launchCpuKernel<HostChecks::kMeta>(device, name, fn, a...);
  }
}

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
    const c10::DeviceIndex device = firstAxonDevice(a...);
    (checkSameDevice(Name::value(), device, a), ...);
    HostWarningScope host_warnings;  // the kernel reruns the meta function
    OutMeta<Meta, N> meta(outs);
    call_meta(meta, args, std::make_index_sequence<sizeof...(A) - N>{});
    if constexpr (writesDenseOut<Meta>()) {
      static_assert(N == 1);
      at::Tensor& out = std::get<sizeof...(A) - 1>(args);
      at::assert_no_internal_overlap(out);
      if (!out.is_contiguous()) {
        // Into a dense temporary, then the values copied to where `out` has
        // them: the CPU writes them in the wrong places (past the storage of
        // a non-dense one).
        at::Tensor dense = at::empty(out.sizes(), out.options());
        run_into(args, dense, std::make_index_sequence<sizeof...(A) - 1>{});
        out.copy_(dense);
        return out;
      }
    }
    launchStructured<Meta, N>(device, Name::value(), Cpu, a...);
    if constexpr (N == 1) {
      return std::get<sizeof...(A) - 1>(args);
    } else {
      return tail_tuple(args, std::make_index_sequence<N>{});
    }
  }

 private:
  // run() with `out` in place of the last argument.
  template <typename Tuple, size_t... I>
  static void run_into(Tuple& args, at::Tensor& out, std::index_sequence<I...>) {
    run(std::get<I>(args)..., out);
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
    const c10::DeviceIndex device = firstAxonDevice(a...);
    (checkSameDevice(Name::value(), device, a), ...);
    HostWarningScope host_warnings;
    FunctionalMeta<Meta, N> meta;
    meta.meta(meta_arg(a)...);
    launch_with_outputs(device, meta.outs, std::make_index_sequence<N>{}, a...);
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
    launchStructured<Meta, N>(device, Name::value(), Outf, a..., outs[I]...);
  }
};

// The in-place overload's kernel (self first, then the other inputs).
template <typename Meta, typename Name, typename Sig, auto Outf>
struct Inplace;

template <typename Meta, typename Name, typename... A, auto Outf>
struct Inplace<Meta, Name, at::Tensor&(at::Tensor&, A...), Outf> {
  static at::Tensor& run(at::Tensor& self, A... a) {
    const c10::DeviceIndex device = firstAxonDevice(self, a...);
    checkSameDevice(Name::value(), device, self);
    (checkSameDevice(Name::value(), device, a), ...);
    HostWarningScope host_warnings;
    InplaceMeta<Meta> meta(self);
    meta.meta(self, meta_arg(a)...);
    launchStructured<Meta, 1>(device, Name::value(), Outf, self, a..., self);
    return self;
  }
};

using T = at::Tensor;
using S = at::Scalar;
using OptS = std::optional<at::Scalar>;
using OptT = std::optional<at::Tensor>;

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

}  // namespace at::axon::structured

// Registration macros, used inside a TORCH_LIBRARY_IMPL block with an
// OpRegistrar named `reg` in scope (path: native stream kernel).
//
// OUT(schema, outputs, meta class suffix, at::cpu function): for an at::cpu
// function with one out= overload; OUT_SIG names the overload by signature.
#define AXON_OUT_IMPL(schema, n, cls, fnptr)                                  \
  {                                                                           \
    struct Name {                                                             \
      static const char* value() { return "aten::" schema; }                  \
    };                                                                        \
    reg.impl(::at::axon::Path::kNative, schema,                               \
             TORCH_FN((::at::axon::structured::Structured<                    \
                       at::meta::structured_##cls, n, Name, fnptr>::run)));   \
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
    reg.impl(::at::axon::Path::kNative, schema,                  \
             TORCH_FN((::at::axon::structured::__VA_ARGS__::run))); \
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
