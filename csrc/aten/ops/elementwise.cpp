// Elementwise ops: arithmetic, unary functions, activations and their
// backward ops, comparisons and logic, special functions, where/masked_fill.
//   native stream kernels: ATen's structured ops (StructuredKernel.h) and
//     where, masked_fill_, relu (checks written out, CpuKernel.h);
//   generic stream kernel: the less frequent ones (GenericKernel.h).
#include <limits>

#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/TensorIterator.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TypeProperties.h>
#include <ATen/ops/clamp_min_cpu_dispatch.h>
#include <ATen/ops/masked_fill_cpu_dispatch.h>
#include <ATen/ops/gcd.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/remainder.h>
#include <ATen/ops/where.h>
#include <ATen/ops/where_cpu_dispatch.h>
#include <ATen/ops/add_cpu_dispatch.h>
#include <ATen/ops/add_meta.h>
#include <ATen/ops/addcdiv_cpu_dispatch.h>
#include <ATen/ops/addcdiv_meta.h>
#include <ATen/ops/addcmul_cpu_dispatch.h>
#include <ATen/ops/addcmul_meta.h>
#include <ATen/ops/bitwise_and_cpu_dispatch.h>
#include <ATen/ops/bitwise_and_meta.h>
#include <ATen/ops/bitwise_not_cpu_dispatch.h>
#include <ATen/ops/bitwise_not_meta.h>
#include <ATen/ops/bitwise_or_cpu_dispatch.h>
#include <ATen/ops/bitwise_or_meta.h>
#include <ATen/ops/bitwise_xor_cpu_dispatch.h>
#include <ATen/ops/bitwise_xor_meta.h>
#include <ATen/ops/clamp_cpu_dispatch.h>
#include <ATen/ops/clamp_meta.h>
#include <ATen/ops/clamp_max_cpu_dispatch.h>
#include <ATen/ops/clamp_max_meta.h>
#include <ATen/ops/clamp_min_cpu_dispatch.h>
#include <ATen/ops/clamp_min_meta.h>
#include <ATen/ops/cos_cpu_dispatch.h>
#include <ATen/ops/cos_meta.h>
#include <ATen/ops/div_cpu_dispatch.h>
#include <ATen/ops/div_meta.h>
#include <ATen/ops/eq_cpu_dispatch.h>
#include <ATen/ops/eq_meta.h>
#include <ATen/ops/erf_cpu_dispatch.h>
#include <ATen/ops/erf_meta.h>
#include <ATen/ops/exp_cpu_dispatch.h>
#include <ATen/ops/exp_meta.h>
#include <ATen/ops/ge_cpu_dispatch.h>
#include <ATen/ops/ge_meta.h>
#include <ATen/ops/gelu_cpu_dispatch.h>
#include <ATen/ops/gelu_meta.h>
#include <ATen/ops/gelu_backward_cpu_dispatch.h>
#include <ATen/ops/gelu_backward_meta.h>
#include <ATen/ops/gt_cpu_dispatch.h>
#include <ATen/ops/gt_meta.h>
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
#include <ATen/ops/log_cpu_dispatch.h>
#include <ATen/ops/log_meta.h>
#include <ATen/ops/log1p_cpu_dispatch.h>
#include <ATen/ops/log1p_meta.h>
#include <ATen/ops/lt_cpu_dispatch.h>
#include <ATen/ops/lt_meta.h>
#include <ATen/ops/maximum_cpu_dispatch.h>
#include <ATen/ops/maximum_meta.h>
#include <ATen/ops/minimum_cpu_dispatch.h>
#include <ATen/ops/minimum_meta.h>
#include <ATen/ops/mul_cpu_dispatch.h>
#include <ATen/ops/mul_meta.h>
#include <ATen/ops/ne_cpu_dispatch.h>
#include <ATen/ops/ne_meta.h>
#include <ATen/ops/neg_cpu_dispatch.h>
#include <ATen/ops/neg_meta.h>
#include <ATen/ops/lcm_cpu_dispatch.h>
#include <ATen/ops/lcm_meta.h>
#include <ATen/ops/pow_cpu_dispatch.h>
#include <ATen/ops/pow_meta.h>
#include <ATen/ops/reciprocal_cpu_dispatch.h>
#include <ATen/ops/reciprocal_meta.h>
#include <ATen/ops/round_cpu_dispatch.h>
#include <ATen/ops/round_meta.h>
#include <ATen/ops/rsqrt_cpu_dispatch.h>
#include <ATen/ops/rsqrt_meta.h>
#include <ATen/ops/sigmoid_cpu_dispatch.h>
#include <ATen/ops/sigmoid_meta.h>
#include <ATen/ops/sigmoid_backward_cpu_dispatch.h>
#include <ATen/ops/sigmoid_backward_meta.h>
#include <ATen/ops/silu_cpu_dispatch.h>
#include <ATen/ops/silu_meta.h>
#include <ATen/ops/silu_backward_cpu_dispatch.h>
#include <ATen/ops/silu_backward_meta.h>
#include <ATen/ops/sin_cpu_dispatch.h>
#include <ATen/ops/sin_meta.h>
#include <ATen/ops/sqrt_cpu_dispatch.h>
#include <ATen/ops/sqrt_meta.h>
#include <ATen/ops/sub_cpu_dispatch.h>
#include <ATen/ops/sub_meta.h>
#include <ATen/ops/tanh_cpu_dispatch.h>
#include <ATen/ops/tanh_meta.h>
#include <ATen/ops/tanh_backward_cpu_dispatch.h>
#include <ATen/ops/tanh_backward_meta.h>
#include <ATen/ops/threshold_backward_cpu_dispatch.h>
#include <ATen/ops/threshold_backward_meta.h>
#include <torch/library.h>

#include "../CpuKernel.h"
#include "../OpDevice.h"
#include "../Registry.h"
#include "../StructuredKernel.h"

namespace at::axon {
namespace {

using namespace structured;

// ------------------------------------------------------------ masked_fill

void check_mask(const char* op, const at::Tensor& self, const at::Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, op,
              " only supports boolean masks, but got mask with dtype ", mask.scalar_type());
  TORCH_CHECK(at::infer_size(self.sizes(), mask.sizes()) == self.sizes(), op,
              ": the shape of the mask ", mask.sizes(),
              " must be broadcastable to the shape of self ", self.sizes());
}

at::Tensor& masked_fill_scalar(at::Tensor& self, const at::Tensor& mask,
                               const at::Scalar& value) {
  const auto device = opDevice("masked_fill_", self);
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
  const auto device = opDevice("masked_fill_", self);
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
  const auto device = opDevice("where", out);
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

// ------------------------------------------------------------ activations

at::Tensor relu(const at::Tensor& self) {
  TORCH_CHECK(self.scalar_type() != at::kBool, "Boolean inputs not supported for relu");
  const auto device = opDevice("relu", self);
  at::Tensor out = emptyDeviceLike(self, self.scalar_type());
  launchCpuKernel<HostChecks::kMeta>(device, "aten::relu",
                  static_cast<at::Tensor& (*)(const at::Tensor&, const at::Scalar&, at::Tensor&)>(
                      &at::cpu::clamp_min_outf),
                  self, at::Scalar(0), out);
  return out;
}

at::Tensor& relu_(at::Tensor& self) {
  TORCH_CHECK(self.scalar_type() != at::kBool, "Boolean inputs not supported for relu");
  const auto device = opDevice("relu_", self);
  at::assert_no_internal_overlap(self);
  launchCpuKernel<HostChecks::kMeta>(device, "aten::relu_",
                  static_cast<at::Tensor& (*)(const at::Tensor&, const at::Scalar&, at::Tensor&)>(
                      &at::cpu::clamp_min_outf),
                  self, at::Scalar(0), self);
  return self;
}

// The minimum of int32 or int64 (t), the dividend whose quotient by -1 traps.
at::Scalar intMinimum(c10::ScalarType t) {
  return t == at::kInt ? at::Scalar(std::numeric_limits<int32_t>::min())
                       : at::Scalar(std::numeric_limits<int64_t>::min());
}

// div.out_mode's kernel on host views.  Rounding toward zero, the int32 or
// int64 minimum divided by -1 overflows, and the CPU's kernel traps (SIGFPE),
// which would kill the process from the stream worker.  A device does not
// trap: those quotients are the minimum (the wrapped -minimum), as CUDA's,
// by dividing by 1 there instead.  (Floor rounding and remainders ATen
// guards itself.)
at::Tensor& div_out_mode_no_trap(const at::Tensor& a, const at::Tensor& b,
                                 std::optional<c10::string_view> mode, at::Tensor& out) {
  if (mode.has_value() && *mode == "trunc") {
    const c10::ScalarType t = at::result_type(a, b);
    if (t == at::kInt || t == at::kLong) {
      const at::Scalar lowest = intMinimum(t);
      // Compare in the type the kernel computes in: a wrapped 2**31 or an int64
      // operand may become the minimum only after the cast, and a uint8 255 is
      // not -1 there.
      const at::Tensor a_t = a.to(t), b_t = b.to(t);
      const at::Tensor overflow = at::logical_and(a_t.eq(lowest), b_t.eq(-1));
      if (overflow.any().item<bool>()) {
        return at::cpu::div_outf(a_t, at::where(overflow, at::ones_like(b_t), b_t), mode, out);
      }
    }
  }
  return at::cpu::div_outf(a, b, mode, out);
}

// lcm.out's kernel on host views.  ATen's lcm is |a / gcd(a, b) * b|, and its
// gcd of the int32/int64 minimum and an odd number can be -1 (|minimum|
// wraps), so the minimum / -1 traps as above.  A device gives the wrapped
// value there, as CUDA's: |minimum * b|, the minimum for odd b, else 0.
at::Tensor& lcm_out_no_trap(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  const c10::ScalarType t = at::result_type(a, b);
  if (t == at::kInt || t == at::kLong) {
    const at::Scalar lowest = intMinimum(t);
    const at::Tensor a_t = a.to(t), b_t = b.to(t);
    const at::Tensor is_lowest = a_t.eq(lowest);
    if (is_lowest.any().item<bool>()) {
      const at::Tensor trap = at::logical_and(is_lowest, at::gcd(a_t, b_t).eq(-1));
      if (trap.any().item<bool>()) {
        // In the computation's dtype, then cast into out as the kernel would.
        at::Tensor r = at::cpu::lcm(at::where(trap, at::ones_like(a_t), a_t), b_t);
        const at::Tensor odd = b_t.remainder(2).ne(0);
        r.masked_fill_(at::logical_and(trap, odd), lowest);
        r.masked_fill_(at::logical_and(trap, odd.logical_not()), 0);
        return out.copy_(r);
      }
    }
  }
  return at::cpu::lcm_outf(a, b, out);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  OpRegistrar reg(m, "elementwise");
  // elementwise arithmetic
  OUT("add.out", 1, add_Tensor, add_outf);
  OUT("sub.out", 1, sub_Tensor, sub_outf);
  OUT("mul.out", 1, mul_Tensor, mul_outf);
  OUT_SIG("div.out", 1, div_Tensor, div_outf, BinaryT);
  AXON_OUT_IMPL("div.out_mode", 1, div_Tensor_mode, &div_out_mode_no_trap);
  AXON_OUT_IMPL("lcm.out", 1, lcm, &lcm_out_no_trap);
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
  // round with decimals: ATen's meta in C++ (the Python decomposition's 10**decimals
  // is a Python integer: decimals=10**7 would take minutes before the kernel ran)
  using RoundDecimals = T& (*)(const T&, int64_t, T&);
  OUT_SIG("round.decimals_out", 1, round_decimals, round_outf, RoundDecimals);
  FUNC_SIG("round.decimals", 1, round_decimals, T(const T&, int64_t), round_outf,
           RoundDecimals);
  INPLACE_SIG("round_.decimals", round_decimals, T&(T&, int64_t), round_outf, RoundDecimals);
  // functional and in-place overloads of the hottest ops, registered directly
  // so their meta function runs once
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
  INPLACE("add_.Tensor", add_Tensor, IBinaryAlpha, add_outf);
  INPLACE("sub_.Tensor", sub_Tensor, IBinaryAlpha, sub_outf);
  INPLACE("mul_.Tensor", mul_Tensor, IBinaryT, mul_outf);
  INPLACE_SIG("div_.Tensor", div_Tensor, IBinaryT, div_outf, BinaryT);
  INPLACE("addcmul_", addcmul, T&(T&, const T&, const T&, const S&), addcmul_outf);
  INPLACE("addcdiv_", addcdiv, T&(T&, const T&, const T&, const S&), addcdiv_outf);
  INPLACE_SIG("lerp_.Scalar", lerp_Scalar, T&(T&, const T&, const S&), lerp_outf,
              T& (*)(const T&, const T&, const S&, T&));
  reg.impl(Path::kNative, "masked_fill_.Scalar", masked_fill_scalar);
  reg.impl(Path::kNative, "masked_fill_.Tensor", masked_fill_tensor);
  reg.impl(Path::kNative, "where.self", where);
  reg.impl(Path::kNative, "where.self_out", where_out);
  reg.impl(Path::kNative, "relu", relu);
  reg.impl(Path::kNative, "relu_", relu_);
  // off the hot path (their functional forms too: ATen's composites for other
  // backends allocate a contiguous result where the CPU's follows the input's layout),
  // activations and their backwards, special functions; several found by an OpInfo
  // sweep of the ops still in the fallback (2026-11-30)
  reg.generic({
      "log_sigmoid_forward", "log_sigmoid_backward", "logical_not.out", "logical_and.out",
      "logical_or.out", "logical_xor.out", "logical_not", "logical_and", "logical_or",
      "logical_xor", "abs.out", "abs", "sign.out", "floor.out", "ceil.out", "round.out",
      "trunc.out", "fmod.Tensor_out", "fmod.Scalar_out", "remainder.Tensor_out",
      "remainder.Scalar_out", "atan2.out", "expm1.out", "log2.out", "log10.out", "exp2.out",
      "erfinv.out", "hardtanh.out", "hardtanh_backward.grad_input", "leaky_relu.out",
      "leaky_relu_backward.grad_input", "softplus.out", "softplus_backward.grad_input",
      "elu.out", "elu_backward.grad_input", "mish.out", "hardsigmoid.out", "hardswish.out",
      "glu.out", "glu_backward.grad_input", "logit.out", "xlogy.OutTensor", "nan_to_num.out",
      "isnan", "isinf", "bitwise_left_shift.Tensor_out", "bitwise_right_shift.Tensor_out",
      "floor_divide", "floor_divide.out", "floor_divide_.Tensor", "sgn.out", "frac.out",
      "heaviside.out", "hypot.out", "copysign.out", "signbit.out", "lgamma.out", "digamma.out",
      "sinh.out", "cosh.out", "asin.out", "acos.out", "atan.out", "tan.out", "asinh.out",
      "acosh.out", "atanh.out", "hardswish", "hardswish_", "hardswish_backward", "glu_backward", "polar.out",
      "complex.out", "rsub.Tensor", "rsub.Scalar", "hardtanh", "hardtanh_", "logit",
      "logit_backward.grad_input", "erfc.out", "sinc.out", "threshold.out",
      "logaddexp.out", "logaddexp2.out", "fmax.out", "fmin.out",
      "hardshrink.out", "hardshrink_backward.grad_input", "softshrink.out",
      "softshrink_backward.grad_input", "frexp.Tensor_out", "i0.out", "nextafter.out",
      "igamma.out", "igammac.out", "polygamma.out", "_prelu_kernel", "_prelu_kernel_backward",
      "angle", "hardtanh_backward", "hardsigmoid_backward.grad_input", "special_i1.out",
      "special_i0e.out", "special_i1e.out", "special_entr.out", "special_erfcx.out",
      "special_log_ndtr.out", "special_ndtri.out", "special_xlog1py.out", "special_zeta.out",
      "special_airy_ai.out", "special_bessel_j0.out", "special_bessel_j1.out",
      "special_bessel_y0.out", "special_bessel_y1.out", "special_modified_bessel_i0.out",
      "special_modified_bessel_i1.out", "special_modified_bessel_k0.out",
      "special_modified_bessel_k1.out", "special_scaled_modified_bessel_k0.out",
      "special_scaled_modified_bessel_k1.out", "special_spherical_bessel_j0.out",
      "special_chebyshev_polynomial_t.out", "special_chebyshev_polynomial_u.out",
      "special_chebyshev_polynomial_v.out", "special_chebyshev_polynomial_w.out",
      "special_shifted_chebyshev_polynomial_t.out",
      "special_shifted_chebyshev_polynomial_u.out",
      "special_shifted_chebyshev_polynomial_v.out",
      "special_shifted_chebyshev_polynomial_w.out", "special_hermite_polynomial_h.out",
      "special_hermite_polynomial_he.out", "special_laguerre_polynomial_l.out",
      "special_legendre_polynomial_p.out", "gcd.out", "conj_physical.out",
      "conj_physical_"
  });
}

}  // namespace at::axon
