// The generic stream kernel (tier 2 for ops whose work is an ATen CPU
// kernel): one boxed kernel that runs any such op asynchronously.
//
// On the host, the op's Meta kernel runs on meta stand-ins of the arguments:
// it raises PyTorch's own errors for bad input (synchronously, like CUDA's
// launch-time checks) and gives the shapes, strides and dtypes of the results.
// The results are allocated on the device, and the CPU kernel is enqueued on
// the current stream with host views of the arguments: the functional kernel,
// whose results are copied into the device results (converting dtype where
// the Meta kernel follows CUDA's conventions rather than the CPU's, as for
// layer_norm's statistics).  Mutating ops (in-place and out=) run the same kernel on
// host views of the mutated tensors, after the host has resized out=
// arguments the way the Meta kernel did.
//
// An op is eligible when it returns tensors only and its returns are either
// new tensors or the tensors it mutates (views stay with tier 1); an op with
// new results may also write arguments it does not return (batch norm's
// running statistics), in place through their host views.  Ops are
// registered one by one (OpRegistrar::generic in the family files under
// ops/), so each is a deliberate choice; an op whose Meta kernel is missing
// falls back to tier 3.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace at::axon {

// Registered as a boxed kernel (OpRegistrar::generic); family files wrap it
// for ops that need their arguments or results adjusted (batch norm, group
// norm, _logcumsumexp).
void genericStreamKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// While alive, Meta kernels run on this thread for an axon op: the Python
// ones ask torch._meta_registrations.device_hint which device's layout to
// give, and, for meta tensors, get "axon" (the answer a FakeTensor on axon
// gets under torch.compile) instead of its default "cuda"
// (torch_axon/integrations/torch_meta.py).
struct MetaForAxon {
  MetaForAxon();
  ~MetaForAxon();
  MetaForAxon(const MetaForAxon&) = delete;
  MetaForAxon& operator=(const MetaForAxon&) = delete;
};
bool metaForAxon();

// The memory format ATen's CPU convolution gives its result (and
// convolution_backward its grad_input and grad_weight) for arguments of these
// sizes, strides and dtypes on this machine: channels_last where the backend
// the CPU picks (oneDNN, the slow 2-D kernels) follows a channels_last input
// or weight.  From metadata only (ops/convolution.cpp); the generic kernel
// lays axon's results out so, and torch.compile's fake convolutions on axon
// follow it (integrations/torch_compile.py).
at::MemoryFormat convMemoryFormat(IntArrayRef input_sizes, IntArrayRef input_strides,
                                  IntArrayRef weight_sizes, IntArrayRef weight_strides,
                                  c10::ScalarType dtype, std::optional<IntArrayRef> bias_sizes,
                                  IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                                  bool transposed, IntArrayRef output_padding, int64_t groups);

// Strides of a tensor of `sizes` in `format` (channels_last of a 3-D tensor:
// as a [N, C, 1, L] one's, the way ATen's convolution lays out 1-D results).
// Contiguous strides where the format does not apply to the dimension count.
std::vector<int64_t> stridesForFormat(IntArrayRef sizes, at::MemoryFormat format);

}  // namespace at::axon
