// The generic tier-2 kernel (see AsyncOps.cpp): runs an op's ATen CPU kernel
// as stream work, with the op's Meta kernel deciding errors and result shapes.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace at::axon {

void asyncBoxedKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace at::axon
