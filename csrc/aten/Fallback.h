// Tier 3: every op without an axon kernel runs its CPU kernel on host views of
// the axon tensors, after the device's current stream has drained.  Counted
// per op for torch.axon.fallback_stats().
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace at::axon {

// The boxed fallback kernel (also used by native kernels for cases they leave
// to it).
void axonFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

std::map<std::string, int64_t> fallbackStats();
void resetFallbackStats();

// "aten::add.Tensor"
std::string op_name(const c10::FunctionSchema& schema);

// The axon device an op's arguments (the top of the stack) live on.  Raises
// PyTorch's mixed-device error for tensors on other devices, except CPU
// scalars (0-dim) and, for indexing ops, CPU index tensors, among the inputs:
// arguments the op writes (out=, in-place) must be on the op's device.
class OpDevice {
 public:
  explicit OpDevice(const c10::FunctionSchema& schema);
  c10::DeviceIndex scan(const torch::jit::Stack& stack);

 private:
  void note_device(const at::Tensor& t, bool index_arg, bool written);
  void find_device(const c10::IValue& v, bool written);
  [[noreturn]] void mixed_devices(c10::Device a, c10::Device b);

  const c10::FunctionSchema& schema_;
  const bool cpu_indices_ok_;
  c10::DeviceIndex device_ = -1;
  std::optional<c10::Device> foreign_;
};

}  // namespace at::axon
