#include <cmath>
#include <vector>

#include "axon/kernels/optimizer.h"
#include "test_util.h"

namespace axon::kernels {
namespace {

using testing::Buffer;
using testing::expect_close;
using testing::random_floats;
using testing::rounded;

struct State {
  std::vector<float> param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq;
};

State random_state(DType dt, int64_t n) {
  return {rounded(dt, random_floats(n, 1)), rounded(dt, random_floats(n, 2)),
          rounded(dt, random_floats(n, 3, -0.1f, 0.1f)),
          rounded(dt, random_floats(n, 4, 0.0f, 0.01f)),
          rounded(dt, random_floats(n, 5, 0.0f, 0.02f))};
}

// torch/optim/adam.py _single_tensor_adam, in double.
struct Reference {
  std::vector<double> param, exp_avg, exp_avg_sq, max_exp_avg_sq;
};

Reference reference_step(const State& s, double step, const AdamParams& hp, double grad_scale) {
  const size_t n = s.param.size();
  Reference r{{}, {}, {}, {}};
  const double bias_correction1 = 1 - std::pow(hp.beta1, step);
  const double bias_correction2 = 1 - std::pow(hp.beta2, step);
  for (size_t i = 0; i < n; ++i) {
    double p = s.param[i], g = s.grad[i] / grad_scale, m = s.exp_avg[i], v = s.exp_avg_sq[i];
    if (hp.maximize) g = -g;
    if (hp.weight_decay != 0) {
      if (hp.decoupled_weight_decay) {
        p *= 1 - hp.lr * hp.weight_decay;
      } else {
        g += hp.weight_decay * p;
      }
    }
    m += (1 - hp.beta1) * (g - m);
    v = hp.beta2 * v + (1 - hp.beta2) * g * g;
    double v_hat = v;
    if (hp.amsgrad) {
      v_hat = std::max<double>(s.max_exp_avg_sq[i], v);
      r.max_exp_avg_sq.push_back(v_hat);
    }
    const double denom = std::sqrt(v_hat) / std::sqrt(bias_correction2) + hp.eps;
    r.param.push_back(p - hp.lr / bias_correction1 * m / denom);
    r.exp_avg.push_back(m);
    r.exp_avg_sq.push_back(v);
  }
  return r;
}

struct Buffers {
  Buffers(DType dt, const State& s)
      : param(dt, s.param), grad(dt, s.grad), exp_avg(dt, s.exp_avg),
        exp_avg_sq(dt, s.exp_avg_sq), max_exp_avg_sq(dt, s.max_exp_avg_sq) {}
  void step(double step, const AdamParams& hp, const float* grad_scale, const float* found_inf) {
    adam_step(param.dt, param.size(), param.data(), grad.data(), exp_avg.data(),
              exp_avg_sq.data(), hp.amsgrad ? max_exp_avg_sq.data() : nullptr, step, hp,
              grad_scale, found_inf);
  }
  Buffer param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq;
};

class Adam : public testing::KernelTest {};

TEST_P(Adam, MatchesTorchSemantics) {
  // 5003 elements: two full segments of the kernel, a partial one, and a scalar tail.
  const int64_t n = 5003;
  const State s = random_state(dt(), n);
  for (bool decoupled : {false, true}) {
    for (bool amsgrad : {false, true}) {
      for (bool maximize : {false, true}) {
        for (double weight_decay : {0.0, 0.1}) {
          for (bool scaled : {false, true}) {
            for (double step : {1.0, 7.0}) {
              SCOPED_TRACE(::testing::Message()
                           << "adamw " << decoupled << " amsgrad " << amsgrad << " maximize "
                           << maximize << " wd " << weight_decay << " scaled " << scaled
                           << " step " << step);
              const AdamParams hp{1e-2, 0.9, 0.999, weight_decay, 1e-8,
                                  amsgrad, maximize, decoupled};
              const float scale = 4.0f;
              Buffers b(dt(), s);
              b.step(step, hp, scaled ? &scale : nullptr, nullptr);
              const Reference r = reference_step(s, step, hp, scaled ? scale : 1.0);
              expect_close(b.param.floats(), r.param, tol(), "param");
              expect_close(b.exp_avg.floats(), r.exp_avg, tol(), "exp_avg");
              expect_close(b.exp_avg_sq.floats(), r.exp_avg_sq, tol(), "exp_avg_sq");
              if (amsgrad) expect_close(b.max_exp_avg_sq.floats(), r.max_exp_avg_sq, tol(), "max");
              EXPECT_EQ(b.grad.floats(), s.grad);  // the gradient is left alone
            }
          }
        }
      }
    }
  }
}

TEST_P(Adam, FoundInfSkipsTheStep) {
  const State s = random_state(dt(), 100);
  const AdamParams hp{1e-2, 0.9, 0.999, 0.1, 1e-8, true, false, true};
  Buffers b(dt(), s);
  const Buffers before = b;
  const float inf_found = 1.0f, none_found = 0.0f;
  b.step(1.0, hp, nullptr, &inf_found);
  EXPECT_TRUE(testing::same_bytes(b.param, before.param));
  EXPECT_TRUE(testing::same_bytes(b.exp_avg, before.exp_avg));
  EXPECT_TRUE(testing::same_bytes(b.exp_avg_sq, before.exp_avg_sq));
  EXPECT_TRUE(testing::same_bytes(b.max_exp_avg_sq, before.max_exp_avg_sq));
  b.step(1.0, hp, nullptr, &none_found);
  EXPECT_FALSE(testing::same_bytes(b.param, before.param));
}

TEST_P(Adam, EmptyInputIsNoOp) {
  const AdamParams hp{1e-2, 0.9, 0.999, 0.0, 1e-8, false, false, false};
  adam_step(dt(), 0, nullptr, nullptr, nullptr, nullptr, nullptr, 1.0, hp, nullptr, nullptr);
}

INSTANTIATE_TEST_SUITE_P(All, Adam, ::testing::ValuesIn(testing::all_configs()),
                         testing::config_name);

}  // namespace
}  // namespace axon::kernels
