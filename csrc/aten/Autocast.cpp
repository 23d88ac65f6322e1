// Autocast for device_type="axon": the same op policies CUDA uses (ATen's
// shared op lists), registered under AutocastPrivateUse1.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace at::axon {
namespace {

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define AXON_LOWER_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define AXON_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define AXON_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define AXON_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(AXON_LOWER_PRECISION)
  AT_FORALL_FP32(AXON_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(AXON_FP32_SET_OPT_DTYPE)
  AT_FORALL_PROMOTE(AXON_PROMOTE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(
      KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
#undef AXON_LOWER_PRECISION
#undef AXON_FP32
#undef AXON_FP32_SET_OPT_DTYPE
#undef AXON_PROMOTE
}

}  // namespace
}  // namespace at::axon
