// Linear algebra: matrix products (mm, bmm, addmm, baddbmm, dot, addmv ...),
// distances, triangular solves, addr.
//   fused kernel: mm/addmm (and their out=) of up to 8 rows by a transposed
//     weight (F.linear when decoding) run kernels/linear or ATen's GEMM,
//     whichever measured faster on this machine (KernelSelect.h); other float32
//     ones, and float32 bmm, oneDNN's GEMM or ATen's (MKL), measured the same way; other shapes
//     take the structured path (StructuredKernel.h) to ATen's GEMM;
//   native stream kernels: bmm.out, baddbmm (structured); addr.out (device checks,
//     then ATen's composite);
//   compositions of axon ops: the out_dtype forms (mm.dtype ...; CUDA-only in ATen);
//   generic stream kernel: the rest.  LAPACK-based ops stay in the fallback.
#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TypeProperties.h>
#include <ATen/ops/addr_native.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/addmm_meta.h>
#include <ATen/ops/baddbmm_cpu_dispatch.h>
#include <ATen/ops/baddbmm_meta.h>
#include <ATen/ops/bmm_cpu_dispatch.h>
#include <ATen/ops/bmm_meta.h>
#include <ATen/ops/linalg_eig.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <ATen/ops/mm_meta.h>
#include <torch/library.h>

#include <axon/kernels/linear.h>

#include "../CpuKernel.h"
#include "../KernelSelect.h"
#include "../Kernels.h"
#include "../OpDevice.h"
#include "../Registry.h"
#include "../StructuredKernel.h"

namespace at::axon {
namespace {

using namespace structured;

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

bool small_linear(const at::Tensor& a, const at::Tensor& b) {
  return a.dim() == 2 && b.dim() == 2 && kernelDType(a.scalar_type()).has_value() &&
         b.scalar_type() == a.scalar_type() && a.device() == b.device() &&
         a.device().type() == kAxon && a.size(0) >= 1 &&
         a.size(0) <= ::axon::kernels::kLinearMaxRows && a.size(1) == b.size(0) &&
         a.size(1) > 0 && b.size(1) > 0 && a.stride(1) == 1 &&
         (a.size(0) == 1 || a.stride(0) >= a.size(1)) && b.stride(0) == 1 &&
         (b.size(1) == 1 || b.stride(1) >= b.size(0));
}

// kernels/linear or ATen's GEMM (MKL / oneDNN), on the worker or the team,
// chosen per (dtype, m, k, n class, bias, strided rows) by measurement
// (KernelSelect.h).
void launch_small_linear_into(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias,
                              at::Tensor& out, const char* name) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  const bool strided = (m > 1 && (a.stride(0) != k || out.stride(0) != n)) ||
                       (n > 1 && b.stride(1) != k);
  const kselect::Key key = kselect::makeKey(
      kselect::Op::kLinear, a.scalar_type(), {m, k, n},
      (bias.defined() ? kselect::kBias : 0) | (strided ? kselect::kStrided : 0));
  const void* bp = bias.defined() ? bias.const_data_ptr() : nullptr;
  auto own = [&] {
    return [=, dt = *kernelDType(a.scalar_type()), ap = a.const_data_ptr(), lda = a.stride(0),
            wp = b.const_data_ptr(), ldw = b.stride(1), op = out.data_ptr(), ldo = out.stride(0)] {
      ::axon::kernels::linear_small_m(dt, m, n, k, ap, lda, wp, ldw, bp, op, ldo);
    };
  };
  auto library = [&] {
    return [ca = cpu_kernel::capture(a), cb = cpu_kernel::capture(b),
            cbias = cpu_kernel::capture(bias), co = cpu_kernel::capture(out)] {
      at::Tensor o = co.view();
      if (cbias.defined()) {
        at::cpu::addmm_outf(cbias.view(), ca.view(), cb.view(), 1, 1, o);
      } else {
        at::cpu::mm_outf(ca.view(), cb.view(), o);
      }
    };
  };
  kselect::launchSelected(a.device().index(), name, key, own, library);
}

at::Tensor launch_small_linear(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias,
                               const char* name) {
  at::Tensor out = emptyDevice({a.size(0), b.size(1)}, {b.size(1), 1}, a.scalar_type(),
                               a.device().index());
  launch_small_linear_into(a, b, bias, out, name);
  return out;
}

// ------------------------------------------------------------ float32 GEMM

}  // namespace
}  // namespace at::axon

// oneDNN's matmul (aten/src/ATen/native/mkldnn/Matmul.cpp, exported by
// libtorch_cpu, header not installed): result = beta * result + alpha * mat1 @ mat2.
namespace at::native {
TORCH_API void mkldnn_matmul(const at::Tensor& mat1, const at::Tensor& mat2,
                             const at::Tensor& result, float beta, float alpha);
}  // namespace at::native

namespace at::axon {
namespace {

// float32 mm / addmm beyond the small-M kernel, and bmm: oneDNN's GEMM
// (JIT-generated for the machine's ISA; ATen calls it for 16-bit types only)
// or ATen's float32 GEMM (MKL), per (m, k, n, batch class, bias) by
// measurement (Op::kGemm).  On the AMD EPYC development VM oneDNN's runs at
// ~2.3x MKL's (MKL takes its AVX2 path on AMD); on an Intel CPU MKL may win.
// dims 2 (mm / addmm): a [m, k] @ b [k, n]; dims 3 (bmm): a [B, m, k] @ b [B, k, n].
bool gemm_selectable(const at::Tensor& a, const at::Tensor& b, int64_t dims = 2) {
  static const bool onednn = at::hasMKLDNN();
  if (!onednn || !at::globalContext().userEnabledMkldnn() || a.dim() != dims ||
      b.dim() != dims || a.scalar_type() != at::kFloat || b.scalar_type() != at::kFloat ||
      a.device() != b.device() || a.device().type() != kAxon || a.numel() == 0 ||
      b.numel() == 0 || a.is_conj() || b.is_conj() || a.is_neg() || b.is_neg()) {
    return false;
  }
  return dims == 2 ? a.size(1) == b.size(0)
                   : a.size(0) == b.size(0) && a.size(2) == b.size(1);
}

bool gemm_bias(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b) {  // mm
  return bias.defined() && bias.scalar_type() == at::kFloat && bias.device() == a.device() &&
         bias.dim() <= 2 && !bias.is_conj() && !bias.is_neg() &&
         at::is_expandable_to(bias.sizes(), {a.size(0), b.size(1)});
}

// An out= result the GEMM writes as is: float32 [m, n], contiguous, on the
// operands' device, sharing no memory with them (otherwise ATen's out= path).
bool gemm_out(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  return out.scalar_type() == at::kFloat && out.device() == a.device() && out.dim() == 2 &&
         out.size(0) == a.size(0) && out.size(1) == b.size(1) && out.is_contiguous() &&
         !out.is_alias_of(a) && !out.is_alias_of(b);
}

void launch_gemm_into(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias,
                      float beta, float alpha, at::Tensor& out, const char* name) {
  const bool batched = a.dim() == 3;
  const int64_t batch = batched ? a.size(0) : 1;
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const kselect::Key key =
      kselect::makeKey(kselect::Op::kGemm, at::kFloat, {m, k, n, batch},
                       bias.defined() ? kselect::kBias : 0);
  auto own = [&] {
    return [ca = cpu_kernel::capture(a), cb = cpu_kernel::capture(b),
            cbias = cpu_kernel::capture(bias), co = cpu_kernel::capture(out), beta, alpha] {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      at::Tensor o = co.view();
      if (alpha == 0.0f) {
        // oneDNN leaves the result as it was for alpha 0; BLAS (and so the CPU)
        // reads neither operand: beta * bias, or zeros for beta 0 (NaNs too)
        if (cbias.defined() && beta != 0.0f) {
          o.copy_(cbias.view().expand_as(o));
          o.mul_(beta);
        } else {
          o.zero_();
        }
      } else if (cbias.defined() && beta != 0.0f) {
        o.copy_(cbias.view().expand_as(o));
        at::native::mkldnn_matmul(ca.view(), cb.view(), o, beta, alpha);
      } else {
        at::native::mkldnn_matmul(ca.view(), cb.view(), o, 0.0f, alpha);
      }
    };
  };
  auto library = [&] {
    return [ca = cpu_kernel::capture(a), cb = cpu_kernel::capture(b),
            cbias = cpu_kernel::capture(bias), co = cpu_kernel::capture(out), beta, alpha] {
      at::Tensor o = co.view();
      if (cbias.defined()) {
        at::cpu::addmm_outf(cbias.view(), ca.view(), cb.view(), beta, alpha, o);
      } else if (o.dim() == 3) {
        at::cpu::bmm_outf(ca.view(), cb.view(), o);
      } else {
        at::cpu::mm_outf(ca.view(), cb.view(), o);
      }
    };
  };
  kselect::launchSelected(a.device().index(), name, key, own, library);
}

at::Tensor launch_gemm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias,
                       float beta, float alpha, const char* name) {
  const int64_t m = a.size(-2), n = b.size(-1);
  at::Tensor out = a.dim() == 3 ? emptyDevice({a.size(0), m, n}, {m * n, n, 1}, at::kFloat,
                                              a.device().index())
                                : emptyDevice({m, n}, {n, 1}, at::kFloat, a.device().index());
  launch_gemm_into(a, b, bias, beta, alpha, out, name);
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

struct BmmName {
  static const char* value() { return "aten::bmm"; }
};

at::Tensor bmm(const at::Tensor& a, const at::Tensor& b) {
  if (gemm_selectable(a, b, 3)) return launch_gemm(a, b, at::Tensor(), 0.0f, 1.0f, BmmName::value());
  return Functional<at::meta::structured_bmm, 1, BmmName, T(const T&, const T&),
                    &at::cpu::bmm_outf>::run(a, b);
}

at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  if (!small_linear(a, b) && gemm_selectable(a, b)) {
    return launch_gemm(a, b, at::Tensor(), 0.0f, 1.0f, MmName::value());
  }
  if (!small_linear(a, b)) {
    return Functional<at::meta::structured_mm, 1, MmName, T(const T&, const T&),
                      &at::cpu::mm_outf>::run(a, b);
  }
  return launch_small_linear(a, b, at::Tensor(), MmName::value());
}

at::Tensor addmm(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b,
                 const at::Scalar& beta, const at::Scalar& alpha) {
  const bool plain = !beta.isComplex() && !alpha.isComplex() && beta.toDouble() == 1.0 &&
                     alpha.toDouble() == 1.0;
  const bool small = plain && small_linear(a, b) && bias.dim() == 1 &&
                     bias.scalar_type() == a.scalar_type() && bias.device() == a.device() &&
                     bias.size(0) == b.size(1) && bias.stride(0) == 1;
  if (!small && gemm_selectable(a, b) && gemm_bias(bias, a, b) && !beta.isComplex() &&
      !alpha.isComplex()) {
    return launch_gemm(a, b, bias, beta.toFloat(), alpha.toFloat(), AddmmName::value());
  }
  if (!small) {
    return Functional<at::meta::structured_addmm, 1, AddmmName,
                      T(const T&, const T&, const T&, const S&, const S&),
                      &at::cpu::addmm_outf>::run(bias, a, b, beta, alpha);
  }
  return launch_small_linear(a, b, bias, AddmmName::value());
}

// out= forms (what torch.compile's generated code calls: extern_kernels.mm(a, b, out=buf)).
at::Tensor& mm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  if (small_linear(a, b) && small_linear_out(a, b, out)) {
    launch_small_linear_into(a, b, at::Tensor(), out, MmName::value());
    return out;
  }
  if (gemm_selectable(a, b) && gemm_out(a, b, out)) {
    launch_gemm_into(a, b, at::Tensor(), 0.0f, 1.0f, out, MmName::value());
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
    launch_small_linear_into(a, b, bias, out, AddmmName::value());
    return out;
  }
  if (gemm_selectable(a, b) && gemm_out(a, b, out) && gemm_bias(bias, a, b) &&
      !out.is_alias_of(bias) && !beta.isComplex() && !alpha.isComplex()) {
    launch_gemm_into(a, b, bias, beta.toFloat(), alpha.toFloat(), out, AddmmName::value());
    return out;
  }
  return Structured<at::meta::structured_addmm, 1, AddmmName, &at::cpu::addmm_outf>::run(
      bias, a, b, beta, alpha, out);
}

// ------------------------------------------------------------ out= checks

// addr.out: ATen's kernel for backends other than CPU, CUDA and MPS
// (math_addr_out, CompositeExplicitAutograd) computes addr and copies it into
// out wherever out lives, so a CPU out= was silently written.  Check the
// devices first, as CUDA's kernel does (TensorIterator: CPU scalars only among
// the inputs), then run it.
// The CPU's (and CUDA's) checks of addr's scalars against the result dtype; ATen's
// math_addr has none (a bool beta on floats, or a float alpha on integers, ran).
void checkAddrScalars(c10::ScalarType dtype, const at::Scalar& beta, const at::Scalar& alpha) {
  for (const auto& [s, name] : {std::pair<const at::Scalar&, const char*>{beta, "beta"},
                                std::pair<const at::Scalar&, const char*>{alpha, "alpha"}}) {
    TORCH_CHECK(!s.isBoolean() || dtype == c10::ScalarType::Bool, "Boolean ", name,
                " only supported for Boolean results.");
    TORCH_CHECK(at::isFloatingType(dtype) || at::isComplexType(dtype) || s.isIntegral(true),
                "For integral input tensors, argument ", name,
                " must not be a floating point number.");
  }
}

at::Tensor addr(const at::Tensor& self, const at::Tensor& vec1, const at::Tensor& vec2,
                const at::Scalar& beta, const at::Scalar& alpha) {
  const c10::DeviceIndex device = firstAxonDevice(vec1, vec2, self);
  for (const at::Tensor* t : {&self, &vec1, &vec2}) checkSameDevice("aten::addr", device, *t);
  checkAddrScalars(at::native::result_type({self, vec1, vec2}), beta, alpha);
  return at::native::math_addr(self, vec1, vec2, beta, alpha);
}

at::Tensor& addr_out(const at::Tensor& self, const at::Tensor& vec1, const at::Tensor& vec2,
                     const at::Scalar& beta, const at::Scalar& alpha, at::Tensor& out) {
  static constexpr const char* op = "aten::addr.out";
  const c10::DeviceIndex device = firstAxonDevice(vec1, vec2, self, out);
  for (const at::Tensor* t : {&self, &vec1, &vec2}) checkSameDevice(op, device, *t);
  TORCH_CHECK(out.device() == c10::Device(kAxon, device),
              "Expected all tensors to be on the same device, but found at least two devices, ",
              c10::Device(kAxon, device), " and ", out.device(),
              "! (when checking arguments for ", op, ")");
  checkAddrScalars(out.scalar_type(), beta, alpha);
  return at::native::math_addr_out(self, vec1, vec2, beta, alpha, out);
}


// ------------------------------------------------------------ out_dtype forms
//
// mm/bmm/addmm/baddbmm with out_dtype (torch.mm(a, b, out_dtype=torch.float32)):
// ATen has them for CUDA only.  CUDA's checks, then the product of the inputs
// in out_dtype: float32 results of 16-bit inputs are not rounded to 16 bits
// (cuBLAS accumulates and writes them in float32).

void checkOutDtype(c10::ScalarType in, c10::ScalarType out_dtype) {
  TORCH_CHECK(out_dtype == in || (out_dtype == c10::ScalarType::Float &&
                                  (in == c10::ScalarType::Half || in == c10::ScalarType::BFloat16)),
              "out_dtype must be the same as input dtype or fp32 for fp16/bf16 inputs");
}

void checkOutTensorDtype(c10::ScalarType out_dtype, const at::Tensor& out) {
  TORCH_CHECK(out_dtype == out.scalar_type(),
              "out_dtype must be the same as the dtype of the provided out tensor");
}

void checkMmDtype(const at::Tensor& a, const at::Tensor& b, c10::ScalarType out_dtype) {
  TORCH_CHECK(a.dim() == 2, "self must be a matrix, got ", a.dim(), "-D tensor");
  TORCH_CHECK(b.dim() == 2, "mat2 must be a matrix, got ", b.dim(), "-D tensor");
  TORCH_CHECK(a.size(1) == b.size(0), "mat1 and mat2 shapes cannot be multiplied (", a.size(0),
              "x", a.size(1), " and ", b.size(0), "x", b.size(1), ")");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "input dtypes must be the same");
  checkOutDtype(a.scalar_type(), out_dtype);
}

void checkBmmDtype(const at::Tensor& b1, const at::Tensor& b2, c10::ScalarType out_dtype,
                   const at::Tensor* self) {
  TORCH_CHECK(b1.dim() == 3, "batch1 must be a 3D tensor");
  TORCH_CHECK(b2.dim() == 3, "batch2 must be a 3D tensor");
  TORCH_CHECK(b2.size(0) == b1.size(0) && b2.size(1) == b1.size(2),
              "Expected size for first two dimensions of batch2 tensor to be: [", b1.size(0), ", ",
              b1.size(2), "] but got: [", b2.size(0), ", ", b2.size(1), "].");
  TORCH_CHECK(b1.scalar_type() == b2.scalar_type(), "batch1 and batch2 must have the same dtype");
  checkOutDtype(b1.scalar_type(), out_dtype);
  if (self != nullptr) {
    TORCH_CHECK(self->dim() == 3, "self must be a 3D tensor");
    TORCH_CHECK(self->sizes() == c10::IntArrayRef({b1.size(0), b1.size(1), b2.size(2)}),
                "self must have the same shape as the output");
  }
}

at::Tensor& axon_mm_dtype_out(const at::Tensor& a, const at::Tensor& b, c10::ScalarType out_dtype,
                              at::Tensor& out) {
  opDevice("aten::mm.dtype_out", a, {&b, &out});
  checkMmDtype(a, b, out_dtype);
  checkOutTensorDtype(out_dtype, out);
  return at::mm_out(out, a.to(out_dtype), b.to(out_dtype));
}

at::Tensor axon_mm_dtype(const at::Tensor& a, const at::Tensor& b, c10::ScalarType out_dtype) {
  opDevice("aten::mm.dtype", a, {&b});
  checkMmDtype(a, b, out_dtype);
  return at::mm(a.to(out_dtype), b.to(out_dtype));
}

at::Tensor& axon_bmm_dtype_out(const at::Tensor& a, const at::Tensor& b, c10::ScalarType out_dtype,
                               at::Tensor& out) {
  opDevice("aten::bmm.dtype_out", a, {&b, &out});
  checkBmmDtype(a, b, out_dtype, nullptr);
  checkOutTensorDtype(out_dtype, out);
  return at::bmm_out(out, a.to(out_dtype), b.to(out_dtype));
}

at::Tensor axon_bmm_dtype(const at::Tensor& a, const at::Tensor& b, c10::ScalarType out_dtype) {
  opDevice("aten::bmm.dtype", a, {&b});
  checkBmmDtype(a, b, out_dtype, nullptr);
  return at::bmm(a.to(out_dtype), b.to(out_dtype));
}

void checkAddmmDtype(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b,
                     c10::ScalarType out_dtype) {
  TORCH_CHECK(self.scalar_type() == b.scalar_type(), "self and mat2 must have the same dtype, but got ",
              self.scalar_type(), " and ", b.scalar_type());
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "mat1 and mat2 must have the same dtype, but got ",
              a.scalar_type(), " and ", b.scalar_type());
  TORCH_CHECK(a.dim() == 2, "mat1 must be a matrix, got ", a.dim(), "-D tensor");
  TORCH_CHECK(b.dim() == 2, "mat2 must be a matrix, got ", b.dim(), "-D tensor");
  TORCH_CHECK(a.size(1) == b.size(0), "mat1 and mat2 shapes cannot be multiplied (", a.size(0),
              "x", a.size(1), " and ", b.size(0), "x", b.size(1), ")");
  checkOutDtype(self.scalar_type(), out_dtype);
}

at::Tensor& axon_addmm_dtype_out(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b,
                                 c10::ScalarType out_dtype, const at::Scalar& beta,
                                 const at::Scalar& alpha, at::Tensor& out) {
  opDevice("aten::addmm.dtype_out", a, {&b, &self, &out});
  checkAddmmDtype(self, a, b, out_dtype);
  checkOutTensorDtype(out_dtype, out);
  return at::addmm_out(out, self.to(out_dtype), a.to(out_dtype), b.to(out_dtype), beta, alpha);
}

at::Tensor axon_addmm_dtype(
    const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, c10::ScalarType out_dtype,
    const at::Scalar& beta, const at::Scalar& alpha) {
  opDevice("aten::addmm.dtype", a, {&b, &self});
  checkAddmmDtype(self, a, b, out_dtype);
  return at::addmm(self.to(out_dtype), a.to(out_dtype), b.to(out_dtype), beta, alpha);
}

at::Tensor& axon_baddbmm_dtype_out(
    const at::Tensor& self, const at::Tensor& b1, const at::Tensor& b2, c10::ScalarType out_dtype,
    const at::Scalar& beta, const at::Scalar& alpha, at::Tensor& out) {
  opDevice("aten::baddbmm.dtype_out", b1, {&b2, &self, &out});
  checkBmmDtype(b1, b2, out_dtype, &self);
  checkOutTensorDtype(out_dtype, out);
  return at::baddbmm_out(out, self.to(out_dtype), b1.to(out_dtype), b2.to(out_dtype), beta, alpha);
}

at::Tensor axon_baddbmm_dtype(
    const at::Tensor& self, const at::Tensor& b1, const at::Tensor& b2, c10::ScalarType out_dtype,
    const at::Scalar& beta, const at::Scalar& alpha) {
  opDevice("aten::baddbmm.dtype", b1, {&b2, &self});
  checkBmmDtype(b1, b2, out_dtype, &self);
  return at::baddbmm(self.to(out_dtype), b1.to(out_dtype), b2.to(out_dtype), beta, alpha);
}

// linalg.eigvals without gradients: the eigenvalues of linalg_eig (the
// fallback).  ATen's CPU _linalg_eigvals skips linalg_eig's check for
// infinities and NaNs, and LAPACK then crashes the process (a segmentation
// fault) on such an input; this way it gets linalg_eig's error instead.
at::Tensor axon_linalg_eigvals(const at::Tensor& input) {
  return std::get<0>(at::linalg_eig(input));
}

// linalg.eigvals(out=): the same eigenvalues, into out (ATen's CPU out= form
// skips that check too).
at::Tensor& axon_linalg_eigvals_out(const at::Tensor& input, at::Tensor& out) {
  // ATen's checks of out first (before the decomposition); linalg_eig checks the input.
  const c10::ScalarType t = input.scalar_type();
  if (at::isFloatingType(t) || at::isComplexType(t)) {
    TORCH_CHECK(c10::canCast(c10::toComplexType(t), out.scalar_type()),
                "torch.linalg.eigvals: Expected eigenvalues to be safely castable from ",
                c10::toComplexType(t), " dtype, but got eigenvalues with dtype ",
                out.scalar_type());
  }
  TORCH_CHECK(out.device() == input.device(),
              "torch.linalg.eigvals: Expected eigenvalues and input to be on the same device, "
              "but found eigenvalues on ", out.device(), " and input on ", input.device(),
              " instead.");
  at::Tensor values = std::get<0>(at::linalg_eig(input));
  at::native::resize_output(out, values.sizes());
  return out.copy_(values);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  OpRegistrar reg(m, "linalg");
  reg.impl(Path::kSync, "_linalg_eigvals", TORCH_FN(axon_linalg_eigvals));
  reg.impl(Path::kSync, "linalg_eigvals.out", TORCH_FN(axon_linalg_eigvals_out));
  reg.impl(Path::kFused, "mm.out", TORCH_FN(mm_out));
  OUT("bmm.out", 1, bmm, bmm_outf);
  reg.impl(Path::kFused, "addmm.out", TORCH_FN(addmm_out));
  OUT("baddbmm.out", 1, baddbmm, baddbmm_outf);
  reg.impl(Path::kFused, "mm", TORCH_FN(mm));
  reg.impl(Path::kFused, "bmm", TORCH_FN(bmm));
  reg.impl(Path::kFused, "addmm", TORCH_FN(addmm));
  // out_dtype forms (CUDA-only in ATen): compositions of axon ops
  reg.impl(Path::kFused, "mm.dtype", TORCH_FN(axon_mm_dtype));
  reg.impl(Path::kFused, "mm.dtype_out", TORCH_FN(axon_mm_dtype_out));
  reg.impl(Path::kFused, "bmm.dtype", TORCH_FN(axon_bmm_dtype));
  reg.impl(Path::kFused, "bmm.dtype_out", TORCH_FN(axon_bmm_dtype_out));
  reg.impl(Path::kFused, "addmm.dtype", TORCH_FN(axon_addmm_dtype));
  reg.impl(Path::kFused, "addmm.dtype_out", TORCH_FN(axon_addmm_dtype_out));
  reg.impl(Path::kFused, "baddbmm.dtype", TORCH_FN(axon_baddbmm_dtype));
  reg.impl(Path::kFused, "baddbmm.dtype_out", TORCH_FN(axon_baddbmm_dtype_out));
  reg.impl(Path::kNative, "addr.out", addr_out);
  reg.impl(Path::kNative, "addr", addr);
  reg.generic({
      "linalg_solve_triangular", "linalg_solve_triangular.out", "_cdist_forward",
      "_cdist_backward", "linalg_cross.out", "dot", "vdot", "trace", "addmv.out", "addbmm",
      "addbmm.out", "_pdist_forward", "_pdist_backward",
      // linalg.solve: the functional form registered too (without it, ATen's
      // structured wrapper met A and B on two devices with an internal assert)
      "_linalg_solve_ex", "_linalg_solve_ex.result", "linalg_cholesky_ex.L"
  });
}

}  // namespace at::axon
