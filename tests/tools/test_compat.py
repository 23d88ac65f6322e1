"""The causal-LM compatibility harness (tools/compat, a tool of the repository):
a short subset of architectures through its per-architecture function (two of
them with the compiled column: static-cache generate eager vs torch.compile
backend="axon"), plus its config shrinking, report, worker process and command
line. The full run is `python -m tools.compat --output docs/COMPATIBILITY.md
--compiled` (docs/COMPATIBILITY.md). Zero fallbacks are not asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

# tools/ is not installed with torch_axon: import it from the repository root,
# whatever directory pytest runs from.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tools.compat import checks, cli, configs, report  # noqa: E402

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
    r = checks.run_architecture(model_type, dtype=torch.float32, compiled=compiled,
                                timeout=60 + (checks.COMPILE_TIMEOUT if compiled else 0))
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
    r = checks.run_architecture("reformer", compiled_only=True, timeout=60)
    assert r.cpu == "not run" and r.axon == "not run"
    assert r.compiled.startswith("n/a: the model keeps its own cache"), r.compiled
    assert r.compiled_graphs == 0
    assert not r.compiled_applies
    r = checks.run_architecture(next(iter(configs.NOT_STANDALONE)), compiled=True)
    assert r.compiled == "skipped"


def test_tiny_config_shrinks_and_keeps_special_ids_in_vocab():
    config = configs.tiny_config("llama")
    assert config.hidden_size == configs.HIDDEN
    assert config.num_hidden_layers == configs.LAYERS
    assert config.num_attention_heads == configs.HEADS
    assert config.num_key_value_heads == configs.HEADS  # the default is multi-head
    assert config.head_dim == configs.HEAD_DIM
    assert config.intermediate_size == configs.INTERMEDIATE
    assert config.vocab_size == configs.VOCAB
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = getattr(config, k)
        assert v is None or 0 <= v < config.vocab_size


def test_tiny_config_keeps_each_layer_type_and_experts():
    gemma3 = configs.tiny_config("gemma3_text")  # 5 sliding : 1 full by default
    assert set(gemma3.layer_types) == {"sliding_attention", "full_attention"}
    assert gemma3.num_hidden_layers == len(gemma3.layer_types)
    assert gemma3.sliding_window == configs.WINDOW
    mistral = configs.tiny_config("mistral")  # grouped-query by default
    assert mistral.num_key_value_heads == configs.KV_HEADS
    mixtral = configs.tiny_config("mixtral")
    assert mixtral.num_local_experts == configs.EXPERTS
    assert mixtral.num_experts_per_tok == configs.EXPERTS_PER_TOKEN


def test_not_standalone_and_unknown_results_do_not_raise():
    name = next(iter(configs.NOT_STANDALONE))
    r = checks.run_architecture(name)
    assert r.cpu.startswith("n/a") and r.axon == "skipped"
    r = checks.run_architecture("no-such-architecture")
    assert r.cpu.startswith("error(config)") and r.axon == "skipped"


def test_report(tmp_path, capsys):
    out = tmp_path / "COMPAT.md"
    assert cli.main(["--only", "gpt2", "--in-process", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gpt2" in printed and "work on CPU: 1" in printed
    text = out.read_text()
    assert text.startswith("# Causal-LM compatibility of axon")
    assert "python -m tools.compat --only gpt2" in text
    assert f"torch {torch.__version__}" in text
    assert "| gpt2 | GPT2LMHeadModel |" in text
    assert "## Fallback ops across architectures" in text


def test_worker_process_from_another_directory(tmp_path, monkeypatch):
    """Without --in-process the architectures run in a worker process
    (python -m tools.compat --worker) that finds the package from any working
    directory; --save-results and --from-results round-trip the report."""
    monkeypatch.chdir(tmp_path)
    saved = tmp_path / "results.json"
    argv = ["--only", "gpt2", "--no-write", "--save-results", str(saved)]
    assert cli.main(argv) == 0
    assert not list(tmp_path.glob("*.md"))  # --no-write
    data = json.loads(saved.read_text())
    assert data["command"] == " ".join(["python -m tools.compat", *argv])
    (r,) = data["results"]
    assert (r["model_type"], r["cpu"], r["axon"]) == ("gpt2", "ok", "ok"), r
    out = tmp_path / "from.md"
    assert cli.main(["--from-results", str(saved), "--output", str(out)]) == 0
    text = out.read_text()
    assert "Generated by `python -m tools.compat --only gpt2 --no-write" in text
    assert "| gpt2 | GPT2LMHeadModel |" in text


def test_output_is_required(capsys):
    """No default report path: `python -m tools.compat` needs --output (or
    --no-write), and refuses both; a usage error, before anything runs."""
    p = subprocess.run([sys.executable, "-m", "tools.compat", "--only", "gpt2"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr
    assert "python -m tools.compat: error: one of the arguments --output --no-write is " \
           "required" in p.stderr
    assert p.stdout == ""
    with pytest.raises(SystemExit) as e:
        cli.main(["--output", "x.md", "--no-write"])
    assert e.value.code == 2
    assert "error: argument --no-write: not allowed with argument --output" in \
        capsys.readouterr().err


def test_totals_and_census():
    ok = checks.ArchResult("a", cpu="ok", axon="ok", fallback_fwd_bwd={},
                           fallback_generate={"aten::x": 2})
    fb = checks.ArchResult("b", cpu="ok", axon="ok", fallback_fwd_bwd={"aten::x": 1})
    bad = checks.ArchResult("c", cpu="ok", axon="error(forward): boom",
                            fallback_fwd_bwd={"aten::y": 1})
    no_cpu = checks.ArchResult("d", cpu="error(build): nope", axon="skipped")
    t = report.totals([ok, fb, bad, no_cpu])
    assert t == dict(total=4, cpu_ok=3, axon_ok=2, zero_fallback=1, zero_fallback_all=0)
    census = report.fallback_census([ok, fb, bad, no_cpu])
    assert census[0] == ("aten::x", 1, 1)
    assert ("aten::y", 1, 0) in census


def _compiled_results():
    def res(name, status, graphs=None, breaks=None, note="", declared=True):
        return checks.ArchResult(name, cpu="ok", axon="ok", compiled=status,
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
        checks.ArchResult("g", cpu="ok", axon="ok"),  # column not run
    ]


def test_compiled_totals_and_report():
    results = _compiled_results()
    c = report.compiled_totals(results)
    assert c == dict(ran=6, applies=4, ok=2, no_breaks=1, recompile_limit=0, na=1, skipped=1,
                     mismatch=1, error=1)
    (line,) = report.compiled_lines(results)
    assert "2/4 compile with tokens equal to eager; 1 with no graph breaks" in line
    assert report.compiled_lines([checks.ArchResult("g", cpu="ok", axon="ok")]) == []
    text = report.render_markdown(results, command="python -m tools.compat --compiled",
                                  seconds=60.0, dtype=torch.float32, timeout=60,
                                  compile_timeout=checks.COMPILE_TIMEOUT)
    assert f"60 s + {checks.COMPILE_TIMEOUT:g} s for the compiled column" in text
    assert "| compiled (graphs, breaks, s) | s |" in text
    assert "| ok (3 graphs, 2 breaks, 1.5 s) |" in text
    assert "## Compiled generate" in text
    assert "- mismatch [CPU Inductor: ok (1 graphs, 0 breaks)] (1): c" in text
    assert "- b (2 breaks, 3 graphs): data-dependent branch (x2)" in text
    # Without the column the table keeps its columns.
    plain = report.render_markdown(results[-1:], command="python -m tools.compat",
                                   seconds=1.0, dtype=torch.float32, timeout=60)
    assert "compiled" not in plain
