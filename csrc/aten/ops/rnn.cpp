// Recurrent cells: the fused LSTM and GRU cells (path: fused kernel, here a
// composition of axon ops, each stream work).  ATen's lstm_cell / gru_cell
// (and so nn.LSTM, nn.GRU and their cells) call _thnn_fused_lstm_cell / _thnn_fused_gru_cell
// on CUDA, XPU and PrivateUse1 devices; only CUDA has kernels for them, so on
// axon every RNN raised "Could not run 'aten::_thnn_fused_lstm_cell' with
// arguments from the 'CPU' backend" (the fallback's CPU redispatch).  Here
// they are compositions of axon ops (each stream work), with the workspace
// layouts the backwards below read:
//   LSTM: workspace = [i, f, g, o], the activated gates, [batch, 4 * hidden];
//   GRU:  workspace = [r, z, n, hn, hx], [batch, 5 * hidden] (hn: the hidden
//         state's n-gate part, with its bias).
// Autograd's formulas (derivatives.yaml) call the backwards when no double
// backward is needed, and differentiable compositions of their own otherwise.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "../Registry.h"

namespace at::axon {
namespace {

at::Tensor with_bias(const at::Tensor& gates, const std::optional<at::Tensor>& bias) {
  return bias.has_value() && bias->defined() ? gates + *bias : gates;
}

void check_cell(const char* op, const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                const at::Tensor& state, int64_t gates) {
  TORCH_CHECK(input_gates.dim() == 2 && input_gates.sizes() == hidden_gates.sizes(), op,
              ": input_gates and hidden_gates must be 2-D tensors of the same shape, got ",
              input_gates.sizes(), " and ", hidden_gates.sizes());
  TORCH_CHECK(state.dim() == 2 && state.size(0) == input_gates.size(0) &&
                  state.size(1) * gates == input_gates.size(1),
              op, ": the state must be [batch, hidden] = [", input_gates.size(0), ", ",
              input_gates.size(1) / gates, "], got ", state.sizes());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  check_cell("_thnn_fused_lstm_cell", input_gates, hidden_gates, cx, 4);
  c10::DeviceGuard guard(input_gates.device());
  const at::Tensor gates =
      with_bias(with_bias(input_gates + hidden_gates, input_bias), hidden_bias);
  auto chunks = gates.chunk(4, 1);
  const at::Tensor i = chunks[0].sigmoid(), f = chunks[1].sigmoid(), g = chunks[2].tanh(),
                   o = chunks[3].sigmoid();
  at::Tensor cy = f * cx + i * g;
  at::Tensor hy = o * cy.tanh();
  return {std::move(hy), std::move(cy), at::cat({i, f, g, o}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward(
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy,
    const at::Tensor& cx, const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  const bool ghy = grad_hy.has_value() && grad_hy->defined();
  const bool gcy = grad_cy.has_value() && grad_cy->defined();
  if (!ghy && !gcy) return {at::Tensor(), at::Tensor(), at::Tensor()};
  c10::DeviceGuard guard(workspace.device());
  auto w = workspace.chunk(4, 1);
  const at::Tensor &i = w[0], &f = w[1], &g = w[2], &o = w[3];
  const at::Tensor tanh_cy = cy.tanh();
  // d(cy): from grad_cy and through hy = o * tanh(cy).
  at::Tensor dc = gcy ? grad_cy->clone() : at::zeros_like(cy);
  at::Tensor go;
  if (ghy) {
    dc = dc + *grad_hy * o * (1 - tanh_cy * tanh_cy);
    go = *grad_hy * tanh_cy * o * (1 - o);
  } else {
    go = at::zeros_like(o);
  }
  const at::Tensor gi = dc * g * i * (1 - i);
  const at::Tensor gf = dc * cx * f * (1 - f);
  const at::Tensor gg = dc * i * (1 - g * g);
  at::Tensor grad_gates = at::cat({gi, gf, gg, go}, 1);
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {std::move(grad_gates), dc * f, std::move(grad_bias)};
}

std::tuple<at::Tensor, at::Tensor> fused_gru_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& hx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  check_cell("_thnn_fused_gru_cell", input_gates, hidden_gates, hx, 3);
  c10::DeviceGuard guard(input_gates.device());
  auto in = with_bias(input_gates, input_bias).chunk(3, 1);
  auto hid = with_bias(hidden_gates, hidden_bias).chunk(3, 1);
  const at::Tensor r = (in[0] + hid[0]).sigmoid();
  const at::Tensor z = (in[1] + hid[1]).sigmoid();
  const at::Tensor n = (in[2] + r * hid[2]).tanh();
  at::Tensor hy = n + z * (hx - n);
  return {std::move(hy), at::cat({r, z, n, hid[2], hx}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  c10::DeviceGuard guard(workspace.device());
  auto w = workspace.chunk(5, 1);
  const at::Tensor &r = w[0], &z = w[1], &n = w[2], &hn = w[3], &hx = w[4];
  // hy = (1 - z) * n + z * hx, n = tanh(in + r * hn).
  at::Tensor grad_hx = grad_hy * z;
  const at::Tensor dz = grad_hy * (hx - n) * z * (1 - z);
  const at::Tensor dn = grad_hy * (1 - z) * (1 - n * n);
  const at::Tensor dr = dn * hn * r * (1 - r);
  at::Tensor grad_input_gates = at::cat({dr, dz, dn}, 1);
  at::Tensor grad_hidden_gates = at::cat({dr, dz, dn * r}, 1);
  at::Tensor grad_input_bias = has_bias ? grad_input_gates.sum(0) : at::Tensor();
  at::Tensor grad_hidden_bias = has_bias ? grad_hidden_gates.sum(0) : at::Tensor();
  return {std::move(grad_input_gates), std::move(grad_hidden_gates), std::move(grad_hx),
          std::move(grad_input_bias), std::move(grad_hidden_bias)};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  OpRegistrar reg(m, "rnn");
  reg.impl(Path::kFused, "_thnn_fused_lstm_cell", &fused_lstm_cell);
  reg.impl(Path::kFused, "_thnn_fused_lstm_cell_backward_impl", &fused_lstm_cell_backward);
  reg.impl(Path::kFused, "_thnn_fused_gru_cell", &fused_gru_cell);
  reg.impl(Path::kFused, "_thnn_fused_gru_cell_backward", &fused_gru_cell_backward);
}

}  // namespace at::axon
