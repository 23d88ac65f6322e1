// The bridge to our kernels (kernels/, library axonkernels): the dtypes they
// take, and the thread backend they split work with.
#pragma once

#include <optional>

#include <c10/core/ScalarType.h>

#include <axon/kernels/dtype.h>

namespace at::axon {

// The kernels' dtype for a PyTorch dtype (float32, bfloat16, float16), or
// none: such inputs go to ATen's CPU kernel instead.
inline std::optional<::axon::kernels::DType> kernelDType(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return ::axon::kernels::DType::kFloat32;
    case c10::kBFloat16: return ::axon::kernels::DType::kBFloat16;
    case c10::kHalf: return ::axon::kernels::DType::kFloat16;
    default: return std::nullopt;
  }
}

// Points the kernels' parallel-for at ATen's thread pool (OpenMP), which the
// stream worker's team runs (kernels/parallel.h; without it they run
// serially).  Called once when torch_axon._C is imported (python/Module.cpp).
void installKernelParallelBackend();

}  // namespace at::axon
