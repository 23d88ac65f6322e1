"""The causal-LM compatibility harness (torch_axon.compat): a short subset of
architectures through its per-architecture function, plus its config shrinking
and report. The full run is `python -m torch_axon.compat` (docs/COMPATIBILITY.md).
Zero fallbacks are not asserted here."""

from __future__ import annotations

import pytest
import torch

from torch_axon import compat

# Fast architectures covering the common families: llama-style (RoPE, GQA,
# SwiGLU), GPT-2 (learned positions, fused QKV, tied embeddings), qwen3 (q/k
# norm), mistral (sliding window), gemma2 (sliding + full layers, soft-capping),
# mamba (state-space recurrence).
SUBSET = ["llama", "gpt2", "qwen3", "mistral", "gemma2", "mamba"]


@pytest.mark.parametrize("model_type", SUBSET)
def test_architecture_matches_cpu(model_type):
    r = compat.run_architecture(model_type, dtype=torch.float32, timeout=60)
    assert r.cpu == "ok", r.cpu
    assert r.axon == "ok", f"{r.axon} (fallback ops: {sorted(r.fallback_fwd_bwd)})"
    # "ok" means the harness compared logits, loss and gradients within its tolerance.
    assert r.logits_err is not None and r.grads_ok is True
    assert r.tokens_equal is True
    assert 0 < r.params < 2_000_000


def test_tiny_config_shrinks_and_keeps_special_ids_in_vocab():
    config = compat.tiny_config("llama")
    assert config.hidden_size == compat.HIDDEN
    assert config.num_hidden_layers == compat.LAYERS
    assert config.num_attention_heads == compat.HEADS
    assert config.num_key_value_heads == compat.HEADS  # the default is multi-head
    assert config.head_dim == compat.HEAD_DIM
    assert config.intermediate_size == compat.INTERMEDIATE
    assert config.vocab_size == compat.VOCAB
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = getattr(config, k)
        assert v is None or 0 <= v < config.vocab_size


def test_tiny_config_keeps_each_layer_type_and_experts():
    gemma3 = compat.tiny_config("gemma3_text")  # 5 sliding : 1 full by default
    assert set(gemma3.layer_types) == {"sliding_attention", "full_attention"}
    assert gemma3.num_hidden_layers == len(gemma3.layer_types)
    assert gemma3.sliding_window == compat.WINDOW
    mistral = compat.tiny_config("mistral")  # grouped-query by default
    assert mistral.num_key_value_heads == compat.KV_HEADS
    mixtral = compat.tiny_config("mixtral")
    assert mixtral.num_local_experts == compat.EXPERTS
    assert mixtral.num_experts_per_tok == compat.EXPERTS_PER_TOKEN


def test_not_standalone_and_unknown_results_do_not_raise():
    name = next(iter(compat.NOT_STANDALONE))
    r = compat.run_architecture(name)
    assert r.cpu.startswith("n/a") and r.axon == "skipped"
    r = compat.run_architecture("no-such-architecture")
    assert r.cpu.startswith("error(config)") and r.axon == "skipped"


def test_report(tmp_path, capsys):
    out = tmp_path / "COMPAT.md"
    assert compat.main(["--only", "gpt2", "--in-process", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gpt2" in printed and "work on CPU: 1" in printed
    text = out.read_text()
    assert text.startswith("# Causal-LM compatibility of axon")
    assert "python -m torch_axon.compat --only gpt2" in text
    assert f"torch {torch.__version__}" in text
    assert "| gpt2 | GPT2LMHeadModel |" in text
    assert "## Fallback ops across architectures" in text


def test_totals_and_census():
    ok = compat.ArchResult("a", cpu="ok", axon="ok", fallback_fwd_bwd={},
                           fallback_generate={"aten::x": 2})
    fb = compat.ArchResult("b", cpu="ok", axon="ok", fallback_fwd_bwd={"aten::x": 1})
    bad = compat.ArchResult("c", cpu="ok", axon="error(forward): boom",
                            fallback_fwd_bwd={"aten::y": 1})
    no_cpu = compat.ArchResult("d", cpu="error(build): nope", axon="skipped")
    t = compat.totals([ok, fb, bad, no_cpu])
    assert t == dict(total=4, cpu_ok=3, axon_ok=2, zero_fallback=1, zero_fallback_all=0)
    census = compat.fallback_census([ok, fb, bad, no_cpu])
    assert census[0] == ("aten::x", 1, 1)
    assert ("aten::y", 1, 0) in census
