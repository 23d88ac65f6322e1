// Fused optimizer steps: one kernel updates a parameter and its states in place.
#pragma once

#include <cstdint>

#include "axon/kernels/dtype.h"

namespace axon::kernels {

struct AdamParams {
  double lr, beta1, beta2, weight_decay, eps;
  bool amsgrad, maximize, decoupled_weight_decay /* true = AdamW */;
};

// One Adam/AdamW step on one tensor, with torch.optim semantics (as PyTorch's fused
// CPU/CUDA Adam(W)). param, grad, exp_avg, exp_avg_sq and max_exp_avg_sq (nullable
// unless amsgrad) are contiguous [n] of dtype dt; math in float32, each state
// rounded to dt once per step. step: the step count, already incremented.
// grad_scale (nullable): grads are divided by *grad_scale. found_inf (nullable):
// if *found_inf != 0 nothing is updated.
void adam_step(DType dt, int64_t n, void* param, const void* grad, void* exp_avg,
               void* exp_avg_sq, void* max_exp_avg_sq, double step, const AdamParams& params,
               const float* grad_scale, const float* found_inf);

}  // namespace axon::kernels
