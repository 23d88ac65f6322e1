"""Compiled text generation on axon: the static-cache recipe.

    .venv/bin/python examples/generate_compiled.py [--new-tokens 64] [--batch 4]

A Llama-architecture model (random init from a config: nothing is downloaded)
on axon generates greedily from prompts of different lengths:

* prompts left-padded to a multiple of the prefill chunk size (as a tokenizer
  does with ``padding_side="left", pad_to_multiple_of=CHUNK``), so that prompts
  of similar lengths share one compiled shape;
* a static KV cache of a fixed maximum length (``max_cache_len``), so the
  decoding step keeps one shape and compiles once;
* chunked prefill (``prefill_chunk_size``);
* ``CompileConfig(backend="axon", fullgraph=False, dynamic=False)`` (with no
  compile_config at all, Transformers compiles on axon by itself, with
  Inductor, the default backend, which is the same compiler).

It prints the compile count, graph breaks, eager and compiled decoding speed,
and checks that the compiled tokens are those of eager decoding.  Exits
non-zero if they differ.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch  # loads torch_axon
from torch._dynamo.utils import counters
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.configuration_utils import CompileConfig

CHUNK = 32          # prefill chunk size (the recipe uses 512 on bigger models)
MAX_CACHE_LEN = 256
PAD = 0


def left_pad(prompts: list[list[int]], multiple: int) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask, left-padded to a multiple of `multiple`."""
    width = -(-max(len(p) for p in prompts) // multiple) * multiple
    ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p)
        mask[row, width - len(p):] = 1
    return ids, mask


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    args = p.parse_args()

    config = LlamaConfig(vocab_size=8000, hidden_size=256, intermediate_size=704,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=MAX_CACHE_LEN, pad_token_id=PAD,
                         bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval().to("axon")
    print(f"model: Llama, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"on {model.device}")

    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, config.vocab_size, (n,), generator=g).tolist()
               for n in torch.randint(5, 2 * CHUNK, (args.batch,), generator=g).tolist()]
    ids, mask = left_pad(prompts, CHUNK)
    ids, mask = ids.to("axon"), mask.to("axon")
    print(f"prompts: lengths {[len(q) for q in prompts]}, left-padded to {ids.shape[1]} "
          f"(multiple of {CHUNK})")

    generate_kw = dict(attention_mask=mask, do_sample=False, max_new_tokens=args.new_tokens,
                       min_new_tokens=args.new_tokens, pad_token_id=PAD,
                       cache_implementation="static", max_cache_len=MAX_CACHE_LEN,
                       prefill_chunk_size=CHUNK)
    compile_config = CompileConfig(backend="axon", fullgraph=False, dynamic=False)

    def timed(**kw) -> tuple[torch.Tensor, float]:
        torch.axon.synchronize()
        t = time.perf_counter()
        out = model.generate(ids, **generate_kw, **kw)
        torch.axon.synchronize()
        return out.cpu(), time.perf_counter() - t

    eager, eager_s = timed(disable_compile=True)
    counters.clear()
    first, first_s = timed(compile_config=compile_config)
    compiled, compiled_s = timed(compile_config=compile_config)
    graphs = counters["stats"]["unique_graphs"]
    breaks = sum(counters["graph_break"].values())

    tokens = args.batch * args.new_tokens
    print(f"eager:    {eager_s:6.2f} s  {tokens / eager_s:7.1f} tokens/s")
    print(f"compiled: {first_s:6.2f} s  first call (includes compiling {graphs} graphs, "
          f"{breaks} graph breaks)")
    print(f"compiled: {compiled_s:6.2f} s  {tokens / compiled_s:7.1f} tokens/s "
          f"({eager_s / compiled_s:.2f}x eager)")
    same = torch.equal(first, eager) and torch.equal(compiled, eager)
    print(f"tokens identical to eager decoding: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
