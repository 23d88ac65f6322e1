"""Losses on axon against the CPU: cross entropy and NLL (ignore_index, label
smoothing, 2-D), MSE, smooth L1, BCE with logits, KL divergence, margin
losses and CTC, forward and backward.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import FLOAT_DTYPES, assert_same, make
from op_util import compare, nn_functional_test, stream_op_test


# name: (input shape, function of the input)
NN = {
    "mse_loss": ((3, 4), lambda x: F.mse_loss(x, x.flip(1))),
    "smooth_l1": ((3, 4), lambda x: F.smooth_l1_loss(x, x.flip(0))),
    "bce_logits": ((3, 4), lambda x: F.binary_cross_entropy_with_logits(x, torch.sigmoid(x.flip(0)))),
    "kl_div": ((3, 4), lambda x: F.kl_div(F.log_softmax(x, 1), F.softmax(x.flip(0), 1), reduction="batchmean")),
}

test_nn_functional = nn_functional_test(NN)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_and_nll(dtype, reduction):
    logits = make((5, 7), dtype, seed=15)
    target = torch.tensor([0, 6, 3, -100, 2])
    fn = lambda x, t: (F.cross_entropy(x, t, reduction=reduction, ignore_index=-100),  # noqa: E731
                       F.cross_entropy(x, t.clamp(min=0), label_smoothing=0.1, reduction=reduction),
                       F.nll_loss(F.log_softmax(x, 1), t.clamp(min=0), reduction=reduction))
    compare(fn, [logits, target], [logits.axon(), target.axon()], accum=True)


def test_ctc_loss_matches_cpu():
    """CTC loss (speech fine-tuning), forward and backward, as stream work
    (the backward has no Meta kernel: its gradient is shaped like log_probs)."""
    log_probs = make((12, 2, 5), torch.float32, seed=7).log_softmax(2)
    targets = torch.tensor([[1, 2, 2, 3], [4, 1, 0, 0]])
    lengths = (torch.tensor([12, 10]), torch.tensor([4, 2]))
    torch.axon.reset_fallback_stats()
    for reduction in ("mean", "sum", "none"):
        lc, la = log_probs.clone().requires_grad_(), log_probs.axon().requires_grad_()
        want = F.ctc_loss(lc, targets, *lengths, reduction=reduction)
        got = F.ctc_loss(la, targets.axon(), *lengths, reduction=reduction)
        assert_same(got, want.detach(), accum=True)
        gc, = torch.autograd.grad(want.sum(), lc)
        ga, = torch.autograd.grad(got.sum(), la)
        assert_same(ga, gc, accum=True)
    assert torch.axon.fallback_stats() == {}


# ---------------------------------------------------------------- the generic stream kernel

# Ops the generic stream kernel runs (found by an OpInfo sweep of the fallback);
# name: (function of the inputs, input shapes, value range, differentiable)
STREAM_OPS = {
    "nll_loss2d": (lambda a: F.nll_loss(F.log_softmax(a, 1), torch.tensor(
        [[[0, 1, 2], [2, 1, 0]]]).expand(2, 2, 3).to(a.device)), [(2, 3, 2, 3)], None, True),
    # ops without Meta kernels (GenericKernel.cpp's without_meta): margin losses' and
    # CTC's backwards, logcumsumexp, cummax/cummin
    "multi_margin_loss": (lambda a: F.multi_margin_loss(a, torch.tensor(
        [1, 0, 3, 2]).to(a.device)), [(4, 6)], None, True),
    "multilabel_margin_loss": (lambda a: F.multilabel_margin_loss(a, torch.tensor(
        [[1, 0, -1, 0, 0, 0]] * 4).to(a.device)), [(4, 6)], None, True),
}


test_stream_op_matches_cpu = stream_op_test(STREAM_OPS)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("batched", [False, True])
def test_multilabel_margin_loss_shapes_match_cpu(reduction, batched):
    """A 1-D input gives a scalar loss whatever the reduction, as on the CPU
    (axon gave reduction='none' the Meta kernel's shape [1]); values and the
    input's gradient too."""
    x = make((2, 4) if batched else (4,), torch.float32)
    t = torch.tensor([[3, 0, -1, 1], [1, 2, -1, 0]] if batched else [3, 0, -1, 1])
    xc, xa = x.clone().requires_grad_(), x.to("axon").requires_grad_()
    lc = F.multilabel_margin_loss(xc, t, reduction=reduction)
    la = F.multilabel_margin_loss(xa, t.to("axon"), reduction=reduction)
    assert la.shape == lc.shape
    lc.sum().backward()
    la.sum().backward()
    assert_same(la, lc.detach())
    assert_same(xa.grad, xc.grad)
