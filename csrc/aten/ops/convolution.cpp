// Convolution and the image ops around it: convolution and its backward,
// im2col/col2im, pooling (average, max, adaptive, fractional; 1-D to 3-D),
// padding (reflection, replication), upsampling (nearest, linear, bilinear,
// bicubic, trilinear, antialiased) and grid sampling, with their backwards.
//   generic stream kernel: all of them.  convolution is registered directly:
//     ATen's composite path for other backends ends in
//     convolution_overrideable, which raises.
//   fallback: max_unpool (its index checks stay synchronous).
#include <torch/library.h>

#include "../GenericKernel.h"
#include "../Registry.h"

namespace at::axon {
namespace {

// convolution_backward by the generic kernel, with grad_input and grad_weight
// contiguous: the layout torch.compile's fake convolutions give axon tensors
// (ATen's _conv_determine_backend_memory_format for the Overrideable backend,
// as for the forward's result), which the Meta kernel alone does not (it
// follows channels_last inputs).
void convolution_backward_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  genericStreamKernel(op, stack);
  const size_t first = stack->size() - 3;
  for (size_t r : {first, first + 1}) {
    c10::IValue& v = (*stack)[r];
    if (v.isTensor() && v.toTensor().defined() && !v.toTensor().is_contiguous()) {
      v = v.toTensor().contiguous();
    }
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  OpRegistrar reg(m, "convolution");
  reg.impl(Path::kGeneric, "convolution_backward",
           torch::CppFunction::makeFromBoxedFunction<&convolution_backward_kernel>());
  reg.generic({
      "convolution", "im2col", "col2im", "reflection_pad1d.out",
      "reflection_pad2d.out", "replication_pad1d.out", "replication_pad2d.out",
      "upsample_nearest2d.out", "upsample_bilinear2d.out",
      "upsample_nearest2d_backward.grad_input", "upsample_bilinear2d_backward.grad_input",
      "upsample_bicubic2d.out", "upsample_bicubic2d_backward.grad_input", "avg_pool2d.out",
      "avg_pool2d_backward.grad_input", "max_pool2d_with_indices.out",
      "max_pool2d_with_indices_backward.grad_input", "reflection_pad2d",
      "reflection_pad2d_backward", "replication_pad2d_backward", "grid_sampler_2d",
      "grid_sampler_2d_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward",
      "adaptive_max_pool2d.out", "adaptive_max_pool2d_backward.grad_input",
      "_adaptive_avg_pool3d", "_adaptive_avg_pool3d_backward", "adaptive_max_pool3d.out",
      "avg_pool3d.out", "avg_pool3d_backward.grad_input", "max_pool3d_with_indices",
      "max_pool3d_with_indices_backward", "fractional_max_pool2d.output",
      "fractional_max_pool2d_backward.grad_input", "fractional_max_pool3d.output",
      "upsample_nearest1d.out", "upsample_nearest1d_backward.grad_input",
      "upsample_linear1d.out", "upsample_linear1d_backward.grad_input",
      "upsample_nearest3d.out", "upsample_nearest3d_backward.grad_input",
      "upsample_trilinear3d.out", "upsample_trilinear3d_backward.grad_input",
      "_upsample_bilinear2d_aa.out", "_upsample_bilinear2d_aa_backward.grad_input",
      "_upsample_nearest_exact1d.out", "_upsample_nearest_exact2d.out",
      "_upsample_nearest_exact2d_backward.grad_input", "reflection_pad3d.out",
      "replication_pad3d.out", "reflection_pad3d_backward.grad_input",
      "replication_pad3d_backward", "reflection_pad1d_backward.grad_input",
      "replication_pad1d_backward.grad_input", "grid_sampler_3d", "grid_sampler_3d_backward",
      "_upsample_nearest_exact1d_backward.grad_input",
      "adaptive_max_pool3d_backward.grad_input"
  });
}

}  // namespace at::axon
