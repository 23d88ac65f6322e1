"""The causal-LM compatibility harness (torch_axon.compat): a short subset of
architectures through its per-architecture function (two of them with the
compiled column: static-cache generate eager vs torch.compile backend="axon"),
plus its config shrinking and report. The full run is
`python -m torch_axon.compat --compiled` (docs/COMPATIBILITY.md). Zero
fallbacks are not asserted here."""

from __future__ import annotations

import pytest
import torch

from torch_axon import compat

# Fast architectures covering the common families: llama-style (RoPE, GQA,
# SwiGLU), GPT-2 (learned positions, fused QKV, tied embeddings), qwen3 (q/k
# norm), mistral (sliding window), gemma2 (sliding + full layers, soft-capping),
# mamba (state-space recurrence).
SUBSET = ["llama", "gpt2", "qwen3", "mistral", "gemma2", "mamba"]
# Also the compiled column (a compilation each: ~5-30 s on 2 cores).
COMPILED = {"llama", "gpt2"}


@pytest.mark.parametrize("model_type", SUBSET)
def test_architecture_matches_cpu(model_type):
    compiled = model_type in COMPILED
    r = compat.run_architecture(model_type, dtype=torch.float32, compiled=compiled,
                                timeout=60 + (compat.COMPILE_TIMEOUT if compiled else 0))
    assert r.cpu == "ok", r.cpu
    assert r.axon == "ok", f"{r.axon} (fallback ops: {sorted(r.fallback_fwd_bwd)})"
    # "ok" means the harness compared logits, loss and gradients within its tolerance.
    assert r.logits_err is not None and r.grads_ok is True
    assert r.tokens_equal is True
    assert 0 < r.params < 2_000_000
    if not compiled:
        assert r.compiled == "not run"
        return
    # Static-cache generate compiled by the axon backend gives the eager tokens;
    # the decoding step compiled once, without graph breaks.
    assert r.compiled == "ok", f"{r.compiled} {r.compiled_note}"
    assert r.compiled_graphs == 1 and r.compiled_breaks == 0, r.compiled_break_reasons
    assert r.compiled_seconds > 0 and r.fullgraph_declared is True


def test_compiled_only_not_applicable():
    """--compiled-only skips the CPU checks; a model that keeps its own cache
    (reformer ignores cache_implementation) is n/a, and compiles nothing."""
    r = compat.run_architecture("reformer", compiled_only=True, timeout=60)
    assert r.cpu == "not run" and r.axon == "not run"
    assert r.compiled.startswith("n/a: the model keeps its own cache"), r.compiled
    assert r.compiled_graphs == 0
    assert not r.compiled_applies
    r = compat.run_architecture(next(iter(compat.NOT_STANDALONE)), compiled=True)
    assert r.compiled == "skipped"


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


def _compiled_results():
    def res(name, status, graphs=None, breaks=None, note="", declared=True):
        return compat.ArchResult(name, cpu="ok", axon="ok", compiled=status,
                                 compiled_graphs=graphs, compiled_breaks=breaks,
                                 compiled_seconds=None if graphs is None else 1.5,
                                 compiled_note=note, fullgraph_declared=declared,
                                 compiled_break_reasons={"data-dependent branch": breaks}
                                 if breaks else {})
    return [
        res("a", "ok", 1, 0),
        res("b", "ok", 3, 2, declared=False),
        res("c", "mismatch", 1, 0, note="CPU Inductor: ok (1 graphs, 0 breaks)"),
        res("d", "error(compile): BackendCompilerFailed: boom", 0, 0,
            note="CPU Inductor: error: BackendCompilerFailed: boom"),
        res("e", "n/a: generate used DynamicCache, not a compilable cache", 0, 0),
        res("f", "skipped"),
        compat.ArchResult("g", cpu="ok", axon="ok"),  # column not run
    ]


def test_compiled_totals_and_report():
    results = _compiled_results()
    c = compat.compiled_totals(results)
    assert c == dict(ran=6, applies=4, ok=2, no_breaks=1, recompile_limit=0, na=1, skipped=1,
                     mismatch=1, error=1)
    (line,) = compat.compiled_lines(results)
    assert "2/4 compile with tokens equal to eager; 1 with no graph breaks" in line
    assert compat.compiled_lines([compat.ArchResult("g", cpu="ok", axon="ok")]) == []
    text = compat.render_markdown(results, command="python -m torch_axon.compat --compiled",
                                  seconds=60.0, dtype=torch.float32, timeout=60,
                                  compile_timeout=compat.COMPILE_TIMEOUT)
    assert f"60 s + {compat.COMPILE_TIMEOUT:g} s for the compiled column" in text
    assert "| compiled (graphs, breaks, s) | s |" in text
    assert "| ok (3 graphs, 2 breaks, 1.5 s) |" in text
    assert "## Compiled generate" in text
    assert "- mismatch [CPU Inductor: ok (1 graphs, 0 breaks)] (1): c" in text
    assert "- b (2 breaks, 3 graphs): data-dependent branch (x2)" in text
    # Without the column the table keeps its columns.
    plain = compat.render_markdown(results[-1:], command="python -m torch_axon.compat",
                                   seconds=1.0, dtype=torch.float32, timeout=60)
    assert "compiled" not in plain
