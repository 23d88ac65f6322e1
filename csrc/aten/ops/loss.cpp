// Losses: nll_loss, binary cross-entropy, mse/smooth_l1/huber, margin losses,
// CTC, with their backwards.
//   native stream kernels: nll_loss's forward and backward (StructuredKernel.h);
//   generic stream kernel: the rest, functional forms included (their
//     composites pass a placeholder out= that the CPU kernel resizes with a
//     warning).  CTC's and the margin losses' backwards have no Meta kernel:
//     GenericKernel.cpp's without_meta.
#include <ATen/ops/nll_loss_backward_cpu_dispatch.h>
#include <ATen/ops/nll_loss_backward_meta.h>
#include <ATen/ops/nll_loss_forward_cpu_dispatch.h>
#include <ATen/ops/nll_loss_forward_meta.h>
#include <torch/library.h>

#include "../GenericKernel.h"
#include "../Registry.h"
#include "../StructuredKernel.h"

namespace at::axon {
namespace {

// multilabel_margin_loss_forward(self, target, reduction) -> (output,
// is_target): for an input of at most one dimension the CPU's output is a
// scalar whatever the reduction; the Meta kernel (a decomposition) gives
// reduction='none' the shape [1].
void multilabel_margin_loss_forward_kernel(const c10::OperatorHandle& op,
                                           torch::jit::Stack* stack) {
  const int64_t dim = (*stack)[stack->size() - 3].toTensor().dim();
  genericStreamKernel(op, stack);
  c10::IValue& output = (*stack)[stack->size() - 2];
  if (dim <= 1 && output.toTensor().dim() != 0) output = output.toTensor().view(at::IntArrayRef{});  // not view(ScalarType)
}

// multi_margin_loss(self, target, p, margin, weight?, reduction): with a 0-dim
// target the CPU's output is a scalar whatever the reduction; the Meta
// kernel gives reduction='none' the shape [1].
void multi_margin_loss_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const int64_t target_dim = (*stack)[stack->size() - 5].toTensor().dim();
  genericStreamKernel(op, stack);
  c10::IValue& output = stack->back();
  if (target_dim == 0 && output.toTensor().dim() != 0) {
    output = output.toTensor().view(at::IntArrayRef{});  // not view(ScalarType)
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  OpRegistrar reg(m, "loss");
  OUT("nll_loss_forward.output", 2, nll_loss_forward, nll_loss_forward_outf);
  OUT("nll_loss_backward.grad_input", 1, nll_loss_backward, nll_loss_backward_outf);
  reg.impl(Path::kGeneric, "multi_margin_loss",
           torch::CppFunction::makeFromBoxedFunction<&multi_margin_loss_kernel>());
  reg.impl(Path::kGeneric, "multilabel_margin_loss_forward",
           torch::CppFunction::makeFromBoxedFunction<&multilabel_margin_loss_forward_kernel>());
  reg.generic({
      "binary_cross_entropy", "binary_cross_entropy_backward", "mse_loss.out",
      "mse_loss_backward.grad_input", "smooth_l1_loss.out", "huber_loss.out", "mse_loss",
      "mse_loss_backward", "smooth_l1_loss", "smooth_l1_loss_backward.grad_input",
      "huber_loss", "huber_loss_backward.out", "nll_loss2d_forward.output",
      "nll_loss2d_backward.grad_input",
      "nll_loss2d_forward", "nll_loss2d_backward", "_ctc_loss", "_ctc_loss_backward",
      "multi_margin_loss_backward", "multilabel_margin_loss_backward"
  });
}

}  // namespace at::axon
