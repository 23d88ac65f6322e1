// Tier 3: every op without an axon kernel runs its CPU kernel on host views of
// the axon tensors, after the device's current stream has drained.  Counted
// per op for torch.axon.fallback_stats().
#pragma once

#include <cstdint>
#include <map>
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

}  // namespace at::axon
