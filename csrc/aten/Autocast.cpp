// Autocast for device_type="axon": the same op policies CUDA uses (ATen's
// shared op lists, and CUDA's ban of binary_cross_entropy), registered under
// AutocastPrivateUse1.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace at::axon {
namespace {

// As under CUDA's autocast: binary_cross_entropy is refused in lower precision
// (its log overflows in float16), with CUDA's message.
at::Tensor binaryCrossEntropyBanned(const at::Tensor&, const at::Tensor&,
                                    const std::optional<at::Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
              "autocast.\nMany models use a sigmoid layer right before the binary cross entropy "
              "layer.\nIn this case, combine the two layers using "
              "torch.nn.functional.binary_cross_entropy_with_logits\nor torch.nn.BCEWithLogitsLoss."
              "  binary_cross_entropy_with_logits and BCEWithLogits are\nsafe to autocast.");
}

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
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"), TORCH_FN(binaryCrossEntropyBanned));
}

}  // namespace
}  // namespace at::axon
