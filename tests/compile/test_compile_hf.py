"""Compiled Hugging Face generation and training on axon.

* ``generate(cache_implementation="static", compile_config=CompileConfig(backend="axon",
  fullgraph=False, dynamic=False))`` gives the tokens of eager greedy decoding,
  compiles the decoding step once and reuses it for every decoding step.
* Transformers compiles the decoding step by itself on axon, as on CUDA
  (torch_axon.integrations.hf_transformers.generation_auto_compile).
* The inference recipe's prompt handling: prompts left-padded to a multiple of
  the prefill chunk size, chunked prefill, a maximum cache length.
* ``Trainer`` with ``torch_compile=True, torch_compile_backend="axon"`` trains
  with the losses of the eager run.

Tolerances: greedy tokens must be identical; the compiled training losses
must match the eager ones within float32 accumulation tolerance (conftest's
TOL_ACCUM: rtol=atol=1e-4), as Inductor's fused kernels sum in another order.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

transformers = pytest.importorskip("transformers")

from accelerate.state import AcceleratorState  # noqa: E402
from transformers import Trainer, TrainingArguments, default_data_collator  # noqa: E402
from transformers.generation.configuration_utils import CompileConfig  # noqa: E402

from conftest import TINY_LM_VOCAB, tiny_causal_lm, tol  # noqa: E402

GENERATE_ARCHS = ("llama", "qwen3", "mistral", "gemma", "phi3")
NEW_TOKENS = 10
PAD = 0


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def graphs() -> int:
    """Graphs Dynamo compiled since the last counters.clear()."""
    return counters["stats"]["unique_graphs"]


def graph_breaks() -> int:
    return sum(counters["graph_break"].values())


def prompts(batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, TINY_LM_VOCAB, (batch, length),
                        generator=torch.Generator().manual_seed(seed))
    return ids.to("axon"), torch.ones_like(ids).to("axon")


def greedy(model, ids, mask, **kw) -> torch.Tensor:
    out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS,
                         min_new_tokens=NEW_TOKENS, pad_token_id=PAD, **kw)
    return out.cpu()


def compiled_on_cpu(model, ids, mask, config) -> tuple[torch.Tensor, int]:
    """Greedy tokens and graph count of the same generate compiled by Inductor on the CPU."""
    torch._dynamo.reset()
    counters.clear()
    config._compile_all_devices = True  # Transformers' switch to compile off CUDA
    try:
        tokens = greedy(model, ids.cpu(), mask.cpu(), cache_implementation="static",
                        compile_config=config)
    finally:
        del config._compile_all_devices
    n = graphs()
    torch._dynamo.reset()
    counters.clear()
    return tokens, n


@pytest.mark.parametrize("arch", GENERATE_ARCHS)
def test_static_cache_compiled_generate_matches_eager(arch):
    cpu_model = tiny_causal_lm(arch)
    model = tiny_causal_lm(arch).to("axon")
    config = CompileConfig(backend="axon", fullgraph=False, dynamic=False)
    ids, mask = prompts(2, 8, seed=1)
    sliding = getattr(model.config, "sliding_window", None) is not None and \
        getattr(model.config, "use_sliding_window", True)
    if sliding:
        # Transformers' sliding-window cache layers count tokens in a Python
        # int, which Dynamo specialises on: the decoding step recompiles as
        # the count grows, on any device.  axon must compile no more graphs
        # than Inductor on the CPU does.
        cpu_tokens, cpu_graphs = compiled_on_cpu(
            cpu_model, ids, mask, CompileConfig(backend="inductor", fullgraph=False, dynamic=False))

    eager = greedy(model, ids, mask, cache_implementation="static", disable_compile=True)
    assert graphs() == 0
    compiled = greedy(model, ids, mask, cache_implementation="static", compile_config=config)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    assert graph_breaks() == 0
    if sliding:
        assert graphs() == cpu_graphs
        torch.testing.assert_close(compiled, cpu_tokens, rtol=0, atol=0)
        return
    # The prefill runs eagerly; the decoding step compiled once, without graph
    # breaks, and served all NEW_TOKENS - 1 decoding steps.
    assert graphs() == 1

    # Other prompts of the same shape: the compiled step is reused as is.
    ids2, mask2 = prompts(2, 8, seed=2)
    eager2 = greedy(model, ids2, mask2, cache_implementation="static", disable_compile=True)
    compiled2 = greedy(model, ids2, mask2, cache_implementation="static", compile_config=config)
    torch.testing.assert_close(compiled2, eager2, rtol=0, atol=0)
    assert graphs() == 1


def test_generate_compiles_by_itself_on_axon():
    """No compile_config: Transformers compiles the static-cache decoding step on
    axon (it does so for CUDA; on the CPU it stays eager, the control case)."""
    cpu_model = tiny_causal_lm("llama")
    ids, mask = prompts(1, 6, seed=3)
    on_cpu = greedy(cpu_model, ids.cpu(), mask.cpu(), cache_implementation="static")
    assert graphs() == 0, "Transformers compiled on the CPU: the control case no longer holds"

    model = cpu_model.to("axon")
    on_axon = greedy(model, ids, mask, cache_implementation="static")
    assert graphs() == 1
    torch.testing.assert_close(on_axon, on_cpu, rtol=0, atol=0)
    # The patch leaves generation_config untouched.
    assert model.generation_config.compile_config is None


def test_dynamic_cache_generate_warns_nothing_about_compile_config(monkeypatch):
    """Default (dynamic, not compilable) cache and no compile_config: Transformers'
    "You have set `compile_config`" warning would be about the patch's own config,
    so there is none; a config the user gave still gets it (the control)."""
    from transformers.generation import utils as generation_utils

    seen = []
    monkeypatch.setattr(generation_utils.logger, "warning",
                        lambda msg, *a, **k: seen.append(str(msg)))
    type(generation_utils.logger).warning_once.cache_clear()
    model = tiny_causal_lm("llama").to("axon")
    ids, mask = prompts(1, 6, seed=4)
    greedy(model, ids, mask)
    assert not [m for m in seen if "compile_config" in m], seen
    greedy(model, ids, mask, compile_config=CompileConfig(backend="axon"))
    assert [m for m in seen if "compile_config" in m], "control: the user's config warns"


def left_padded(lengths: list[int], chunk: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of the given lengths, left-padded to a common multiple of chunk."""
    width = -(-max(lengths) // chunk) * chunk
    ids = torch.full((len(lengths), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    g = torch.Generator().manual_seed(seed)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = torch.randint(3, TINY_LM_VOCAB, (n,), generator=g)
        mask[row, width - n:] = 1
    return ids.to("axon"), mask.to("axon")


def test_recipe_left_padded_chunked_prefill():
    """Prompts left-padded to a multiple of the prefill chunk, chunked prefill,
    a maximum cache length: tokens equal eager's, and prompts padded to the
    same width reuse the compiled graphs."""
    chunk, max_cache_len = 16, 64
    model = tiny_causal_lm("llama").to("axon")
    config = CompileConfig(backend="axon", fullgraph=False, dynamic=False)
    kw = dict(cache_implementation="static", max_cache_len=max_cache_len, prefill_chunk_size=chunk)

    seen = []
    for seed, lengths in enumerate(([5, 9], [11, 3], [20, 7])):
        ids, mask = left_padded(lengths, chunk, seed)
        eager = greedy(model, ids, mask, disable_compile=True, **kw)
        compiled = greedy(model, ids, mask, compile_config=config, **kw)
        torch.testing.assert_close(compiled, eager, rtol=0, atol=0, msg=f"prompt lengths {lengths}")
        seen.append(graphs())
    assert graph_breaks() == 0
    # First width (one chunk): prefill chunk + decoding step; the second prompt
    # has the same width and compiles nothing; two chunks compile once more
    # (the second chunk attends to a filled cache).
    assert seen[0] >= 1
    assert seen[1] == seen[0]
    assert seen[2] <= seen[1] + 1


def counting_dataset(n: int = 16, seq: int = 16) -> list[dict]:
    starts = torch.randint(0, TINY_LM_VOCAB - 3, (n, 1), generator=torch.Generator().manual_seed(1))
    ids = (starts + torch.arange(seq)) % (TINY_LM_VOCAB - 3) + 3
    return [{"input_ids": row, "labels": row} for row in ids]


def train(tmp_path, **args_kw) -> tuple[list[float], torch.nn.Module]:
    model = tiny_causal_lm("llama").train()
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4,
                             learning_rate=1e-2, logging_steps=1, save_strategy="no",
                             report_to="none", seed=0, disable_tqdm=True, **args_kw)
    trainer = Trainer(model=model, args=args, train_dataset=counting_dataset(),
                      data_collator=default_data_collator)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return losses, trainer.model


def test_trainer_torch_compile_matches_eager(tmp_path, fresh_accelerate):
    eager_losses, _ = train(tmp_path / "eager")
    assert graphs() == 0
    AcceleratorState._reset_state(reset_partial_state=True)
    losses, model = train(tmp_path / "compiled", torch_compile=True, torch_compile_backend="axon")
    assert next(model.parameters()).device.type == "axon"
    assert graphs() >= 1, "the Trainer did not compile"
    assert len(losses) == len(eager_losses) == 4
    assert losses[-1] < losses[0]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(eager_losses),
                               **tol(torch.float32, accum=True))


def test_compiled_attention_takes_grouped_kv_heads_on_axon(monkeypatch):
    """While compiling for axon, Transformers' SDPA path passes enable_gqa=True
    (no repeat_kv copy of the cache); eager code and other devices keep
    upstream's answer (False here: a mask is given)."""
    from transformers.integrations import sdpa_attention

    k = torch.zeros(1, 2, 5, 8)
    mask = torch.zeros(1, 1, 1, 5, dtype=torch.bool)
    assert not sdpa_attention.use_gqa_in_sdpa(mask, k.to("axon"), k.to("axon"))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert sdpa_attention.use_gqa_in_sdpa(mask, k.to("axon"), k.to("axon"))
    assert not sdpa_attention.use_gqa_in_sdpa(mask, k, k)
