// The quick start of docs/kernels.md: scale(x, out; floats: alpha) computes out = alpha * x
// for contiguous float32 tensors.  Its build times: python -m torch_axon.kernel examples/kernel_api/scale.cpp
#include <axon/kernel.h>

using namespace axon::kernel;

AXON_KERNEL(scale) {
  AXON_CHECK(ctx, args->num_tensors == 2 && args->num_floats == 1, "scale(x, out; alpha)");
  const AxonTensor &xt = args->tensors[0], &ot = args->tensors[1];
  AXON_CHECK(ctx, is<float>(xt) && is<float>(ot), "scale: float32 tensors expected");
  View<float> x = as<float>(xt), out = as<float>(ot);
  AXON_CHECK(ctx, x.numel() == out.numel() && x.is_contiguous() && out.is_contiguous(),
             "scale: x and out must be contiguous, with as many elements");
  const Vec a = Vec::broadcast(float(args->floats[0]));
  parallel_for(ctx, 0, x.numel(), 1 << 14, [&](int64_t b, int64_t e) {
    int64_t i = b;
    for (; i + Vec::kLanes <= e; i += Vec::kLanes) (Vec::load(x.data() + i) * a).store(out.data() + i);
    if (i < e) (Vec::load_partial(x.data() + i, e - i) * a).store_partial(out.data() + i, e - i);
  });
}
