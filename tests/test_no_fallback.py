"""The hot path of the tested architectures runs natively: forward, backward,
an AdamW step (default foreach and fused) and generate() (greedy and sampling,
dynamic cache) of tiny random-init models go through no CPU fallback, and the
forward and training step match the same model on the CPU."""

import copy

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from conftest import assert_same

VOCAB = 128
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
             max_position_embeddings=128)
ARCHS = {
    "llama": SMALL,
    "qwen3": dict(SMALL, head_dim=16),
    "mistral": SMALL,
    "gemma": dict(SMALL, head_dim=16),
    "phi3": dict(SMALL, pad_token_id=0),
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=128),
    "gpt_neox": dict(SMALL),
    "opt": dict(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                vocab_size=VOCAB, max_position_embeddings=128, word_embed_proj_dim=64),
    "falcon": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB),
    "mixtral": dict(SMALL, num_local_experts=4, num_experts_per_tok=2),
}


def tiny_model(arch):
    cfg = AutoConfig.for_model(arch, **ARCHS[arch])
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value >= VOCAB:
            setattr(cfg, name, 0)
    # No dropout, so that training steps compare with the CPU's (dropout draws
    # from each device's own generator); the test switches it on separately.
    for name, value in cfg.to_dict().items():
        if isinstance(value, float) and ("dropout" in name or "pdrop" in name):
            setattr(cfg, name, 0.0)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()


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
