"""Recurrent layers on axon against the CPU: nn.LSTM, nn.GRU and their cells
(the fused cell ops), forward and backward, double backward and errors.
"""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import assert_same, make


# RNNs: ATen's lstm_cell / gru_cell call the fused cell ops on every device but
# the CPU, and only CUDA had kernels for them: nn.LSTM, nn.GRU and their cells
# raised on axon (csrc/aten/ops/rnn.cpp).

RNNS = {
    "lstm": lambda: torch.nn.LSTM(5, 7, num_layers=2, bidirectional=True, batch_first=True),
    "lstm_proj_nobias": lambda: torch.nn.LSTM(5, 7, proj_size=3, bias=False),
    "gru": lambda: torch.nn.GRU(5, 7, num_layers=2, dropout=0.0),
    "gru_bidir_nobias": lambda: torch.nn.GRU(5, 7, bidirectional=True, bias=False),
    "lstm_cell": lambda: torch.nn.LSTMCell(5, 7),
    "gru_cell": lambda: torch.nn.GRUCell(5, 7),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(RNNS))
def test_rnn_modules_match_cpu(name, dtype):
    torch.manual_seed(0)
    cpu = RNNS[name]().to(dtype)
    ax = copy.deepcopy(cpu).to("axon")
    cell = name.endswith("cell")
    x = make((3, 5) if cell else (3, 4, 5), dtype, seed=1)
    h0 = make((3, 7), dtype, seed=2) if cell else None
    torch.axon.reset_fallback_stats()
    results = []
    for dev, mod in (("cpu", cpu), ("axon", ax)):
        xd = x.to(dev).requires_grad_()
        hd = h0.to(dev).requires_grad_() if h0 is not None else None
        out = mod(xd, hd) if cell and name == "gru_cell" else \
            mod(xd, (hd, hd.clone())) if cell else mod(xd)
        outs = [t for t in (out if isinstance(out, tuple) else (out,))]
        flat = [t for o in outs for t in (o if isinstance(o, tuple) else (o,))]
        loss = sum((t.float() ** 2).sum() for t in flat)
        leaves = [xd] + ([hd] if hd is not None else []) + list(mod.parameters())
        grads = torch.autograd.grad(loss, leaves)
        results.append((flat, grads))
    for got, want in zip(results[1][0] + list(results[1][1]), results[0][0] + list(results[0][1])):
        assert_same(got, want, dtype=dtype, accum=True)
    assert torch.axon.fallback_stats() == {}


def test_rnn_cells_double_backward_and_errors():
    """create_graph=True takes autograd's differentiable composition; bad state
    shapes raise PyTorch's errors."""
    torch.manual_seed(0)
    cpu = torch.nn.LSTMCell(4, 3)
    ax = copy.deepcopy(cpu).to("axon")
    x = make((2, 4), torch.float32, seed=3)
    res = []
    for dev, mod in (("cpu", cpu), ("axon", ax)):
        xd = x.to(dev).requires_grad_()
        h, c = mod(xd)
        g, = torch.autograd.grad((h * c).sum(), xd, create_graph=True)
        gg, = torch.autograd.grad((g ** 2).sum(), xd)
        res.append((g, gg))
    assert_same(res[1][0], res[0][0], accum=True)
    assert_same(res[1][1], res[0][1], accum=True)
    with pytest.raises(RuntimeError, match="hidden"):
        torch.nn.GRUCell(4, 3).to("axon")(x.axon(), torch.zeros(2, 5, device="axon"))
    with pytest.raises(RuntimeError, match="_thnn_fused_gru_cell: input_gates and hidden_gates "
                       "must be 2-D tensors of the same shape"):
        torch.ops.aten._thnn_fused_gru_cell(torch.zeros(2, 9, device="axon"),
                                            torch.zeros(2, 6, device="axon"),
                                            torch.zeros(2, 3, device="axon"))
    with pytest.raises(RuntimeError, match="_thnn_fused_lstm_cell: the state must be"):
        torch.ops.aten._thnn_fused_lstm_cell(torch.zeros(2, 12, device="axon"),
                                             torch.zeros(2, 12, device="axon"),
                                             torch.zeros(2, 4, device="axon"))
