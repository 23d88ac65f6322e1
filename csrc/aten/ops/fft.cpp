// FFTs (ATen's pocketfft kernels).
//   generic stream kernel: all of them.
#include <torch/library.h>

#include "../Registry.h"

namespace at::axon {

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  OpRegistrar reg(m, "fft");
  reg.generic({
      "_fft_r2c", "_fft_c2c", "_fft_c2r"
  });
}

}  // namespace at::axon
