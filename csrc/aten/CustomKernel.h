// Native ops of the Axon Kernel Interface (CustomKernel.cpp): a user kernel
// (torch_axon/include/axon/kernel.h) registered as the PrivateUse1 and Meta
// kernel of an operator whose schema Python defined (torch_axon.kernel's
// KernelLibrary.op): a call goes through the dispatcher to C++ only.
#pragma once

#include <cstdint>
#include <string>

namespace at::axon {

// `fn` is the kernel's AxonKernelFn, `shape_fn` its AxonShapeFn or 0 (outputs
// like the first tensor argument); `launch_name` labels launches ("" = qualname).
// Registering a name again replaces the kernel and output rule for later
// calls (calls in flight on other threads finish with the earlier ones); the
// dispatcher's registrations stay for the process.
void registerNativeOp(const std::string& qualname, int64_t fn, int64_t shape_fn,
                      const std::string& launch_name);

}  // namespace at::axon
