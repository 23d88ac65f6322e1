// Convolution and the image ops around it: convolution and its backward,
// im2col/col2im, pooling (average, max, adaptive, fractional; 1-D to 3-D),
// padding (reflection, replication), upsampling (nearest, linear, bilinear,
// bicubic, trilinear, antialiased) and grid sampling, with their backwards.
//   generic stream kernel: all of them.  convolution is registered directly:
//     ATen's composite path for other backends ends in
//     convolution_overrideable, which raises.  Its results (and its
//     backward's grad_input and grad_weight) take the memory format the
//     CPU's would (convMemoryFormat).
//   fallback: max_unpool (its index checks stay synchronous).
#include <ATen/native/ConvUtils.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/MemoryFormat.h>
#include <c10/util/strides.h>
#include <torch/library.h>

#include "../GenericKernel.h"
#include "../Registry.h"

namespace at::axon {

namespace {

// A CPU tensor with `sizes`, `strides` and `dtype` over memory that is never
// read: ATen's backend choice looks at metadata only (nothing may copy from
// it: a 1-D input, which ATen makes contiguous, is given contiguous).
at::Tensor cpuStandIn(IntArrayRef sizes, IntArrayRef strides, c10::ScalarType dtype) {
  alignas(64) static char never_read[64];
  return at::from_blob(never_read, sizes, strides,
                       at::TensorOptions().dtype(dtype).device(c10::kCPU));
}

}  // namespace

at::MemoryFormat convMemoryFormat(IntArrayRef input_sizes, IntArrayRef input_strides,
                                  IntArrayRef weight_sizes, IntArrayRef weight_strides,
                                  c10::ScalarType dtype, std::optional<IntArrayRef> bias_sizes,
                                  IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                                  bool transposed, IntArrayRef output_padding, int64_t groups) {
  if (input_sizes.size() != weight_sizes.size() || input_sizes.size() < 3 ||
      input_sizes.size() > 5) {
    return at::MemoryFormat::Contiguous;  // the op's own checks reject these
  }
  // A 1-D convolution's input is made contiguous first (by ATen's backend
  // choice too, which would copy from the stand-in): contiguous from the start.
  const auto input_c = c10::contiguous_strides(input_sizes);
  const std::vector<int64_t> contiguous_input(input_c.begin(), input_c.end());
  at::Tensor input = cpuStandIn(
      input_sizes, input_sizes.size() == 3 ? IntArrayRef(contiguous_input) : input_strides,
      dtype);
  at::Tensor weight = cpuStandIn(weight_sizes, weight_strides, dtype);
  const auto sym = [](IntArrayRef a) { return c10::fromIntArrayRefSlow(a); };
  std::optional<std::vector<c10::SymInt>> bias_sym;
  if (bias_sizes.has_value()) {
    bias_sym.emplace();
    for (int64_t b : *bias_sizes) bias_sym->emplace_back(b);
  }
  at::native::ConvBackend backend;
  try {
    backend = at::native::select_conv_backend(
        input, weight, std::nullopt, sym(stride), sym(padding), sym(dilation), transposed,
        sym(output_padding), c10::SymInt(groups),
        bias_sym.has_value() ? at::OptionalSymIntArrayRef(*bias_sym) : std::nullopt);
  } catch (const std::exception&) {
    return at::MemoryFormat::Contiguous;  // invalid arguments: the kernel raises
  }
  if (input.dim() == 3) {  // ATen decides 1-D convolutions' layout as [N, C, 1, L]
    input = input.unsqueeze(2);
    weight = weight.unsqueeze(2);
  }
  return at::native::_determine_backend_memory_format(input, weight, backend);
}

std::vector<int64_t> stridesForFormat(IntArrayRef sizes, at::MemoryFormat format) {
  const size_t n = sizes.size();
  if (format == at::MemoryFormat::ChannelsLast && n == 4) {
    return c10::get_channels_last_strides_2d(sizes);
  }
  if (format == at::MemoryFormat::ChannelsLast3d && n == 5) {
    return c10::get_channels_last_strides_3d(sizes);
  }
  if (format == at::MemoryFormat::ChannelsLast && n == 3) {
    std::vector<int64_t> s = c10::get_channels_last_strides_2d({sizes[0], sizes[1], 1, sizes[2]});
    s.erase(s.begin() + 2);
    return s;
  }
  const auto c = c10::contiguous_strides(sizes);
  return {c.begin(), c.end()};
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  OpRegistrar reg(m, "convolution");
  reg.generic({
      "convolution", "convolution_backward", "im2col", "col2im", "reflection_pad1d.out",
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
      "_upsample_bicubic2d_aa.out", "_upsample_bicubic2d_aa_backward.grad_input",
      "_upsample_nearest_exact1d.out", "_upsample_nearest_exact2d.out",
      "_upsample_nearest_exact2d_backward.grad_input", "reflection_pad3d.out",
      "replication_pad3d.out", "reflection_pad3d_backward.grad_input",
      "replication_pad3d_backward", "reflection_pad1d_backward.grad_input",
      "replication_pad1d_backward.grad_input", "grid_sampler_3d", "grid_sampler_3d_backward",
      "_upsample_nearest_exact1d_backward.grad_input",
      "adaptive_max_pool3d_backward.grad_input",
      // functional forms of structured ops, so that their results take the
      // CPU's memory format (GenericKernel.cpp's cpu_layout)
      "replication_pad2d", "reflection_pad3d", "replication_pad3d", "reflection_pad3d_backward"
  });
}

}  // namespace at::axon
