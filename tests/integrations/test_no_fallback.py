"""The hot path of the tested architectures runs natively: forward, backward,
an AdamW step (default foreach and fused) and generate() (greedy and sampling,
dynamic cache) of tiny random-init models go through no CPU fallback, and the
forward and training step match the same model on the CPU."""

import copy

import pytest
import torch

from conftest import TINY_LM_ARCHS as ARCHS
from conftest import TINY_LM_VOCAB as VOCAB
from conftest import assert_same
from conftest import tiny_causal_lm as tiny_model


def train_step(model, ids, fused):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    loss = model(ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


@pytest.mark.parametrize("arch", list(ARCHS))
def test_hot_path_has_no_fallback(arch):
    cpu = tiny_model(arch)
    ax = copy.deepcopy(cpu).to("axon")
    ids = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    torch.axon.reset_fallback_stats()

    logits = ax(ids.to("axon")).logits
    # Forward matches the CPU (fp32; attention and matmul orders differ slightly).
    assert_same(logits, cpu(ids).logits, accum=True)

    ax.train()
    cpu.train()
    for fused in (False, True):
        loss_ax = train_step(ax, ids.to("axon"), fused)
        loss_cpu = train_step(cpu, ids, fused)
        assert_same(loss_ax, loss_cpu, accum=True)
    # Dropout in training (nn.Dropout modules and SDPA's dropout_p).
    for m in ax.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.1
    train_step(ax, ids.to("axon"), True)
    ax.eval()

    prompt = ids[:, :6].to("axon")
    ax.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    torch.manual_seed(3)
    ax.generate(prompt, max_new_tokens=6, do_sample=True, top_k=20, pad_token_id=0)
    torch.axon.synchronize()
    assert torch.axon.fallback_stats() == {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses_and_group_norm_backward_are_native(reduction, dtype):
    """mse_loss (diffusion training's loss), smooth_l1 and huber, forward and
    backward, and group_norm's backward (UNets) run as stream work, equal to
    the CPU; a broadcasting target warns as on the CPU."""
    import warnings

    import torch.nn.functional as F
    from conftest import make

    x = make((6, 5), dtype, seed=1)
    y = make((6, 5), dtype, seed=2)
    torch.axon.reset_fallback_stats()
    for loss in (F.mse_loss, F.smooth_l1_loss, F.huber_loss):
        xc, xa = x.clone().requires_grad_(), x.axon().requires_grad_()
        lc, la = loss(xc, y, reduction=reduction), loss(xa, y.axon(), reduction=reduction)
        gc, = torch.autograd.grad((lc * 3).sum(), xc)
        ga, = torch.autograd.grad((la * 3).sum(), xa)
        assert_same(la, lc, dtype=dtype, accum=True)
        assert_same(ga, gc, dtype=dtype, accum=True)
    g = make((4, 6, 3), torch.float32, seed=3)
    w, b = make((6,), torch.float32, seed=4), make((6,), torch.float32, seed=5)
    gc, ga = g.clone().requires_grad_(), g.axon().requires_grad_()
    grad_c, = torch.autograd.grad((F.group_norm(gc, 3, w, b) ** 2).sum(), gc)
    grad_a, = torch.autograd.grad((F.group_norm(ga, 3, w.axon(), b.axon()) ** 2).sum(), ga)
    assert_same(grad_a, grad_c, accum=True)
    assert torch.axon.fallback_stats() == {}
    with warnings.catch_warnings(record=True) as wc:
        warnings.simplefilter("always")
        F.mse_loss(x, y[:1])
    with warnings.catch_warnings(record=True) as wa:
        warnings.simplefilter("always")
        F.mse_loss(x.axon(), y[:1].axon())
    assert [str(w.message) for w in wa] == [str(w.message) for w in wc] != []
