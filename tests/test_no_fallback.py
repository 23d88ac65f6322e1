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
