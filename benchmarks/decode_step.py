"""One decoding step, eager vs compiled on axon: where the time goes (host or stream).

    .venv/bin/python benchmarks/decode_step.py [--batch 1] [--steps 30] [--repeats 3]

The model of generate.py (56.4M-parameter Llama, random init, fp32) with a StaticCache
of 256 positions (reset and refilled with a 32-token prompt before each run): each step is ``model(input_ids [batch, 1], cache_position,
past_key_values=cache)`` followed by ``logits.argmax(-1).cpu()`` (the synchronisation a
generate loop makes), eagerly and compiled (``torch.compile(step, backend="axon",
dynamic=False)``), interleaved --repeats times; medians. "host ms" is the time until
the step call returns (the host's work: dispatch, or the compiled wrapper's launches);
"step ms" is the whole step to the argmax on the CPU. When host ms is well below
step ms, the stream (the device) sets the pace and removing host work cannot help.
"""

from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


def main() -> None:
    p = C.make_parser(__doc__, quick="tiny model: a smoke run")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=30, help="timed steps per repetition (<= 200)")
    p.add_argument("--repeats", type=int, default=3)
    C.add_model_args(p)
    args = p.parse_args()
    if args.steps > 200:
        p.error("--steps must be at most 200 (the cache holds 256 positions)")
    C.print_header("decode step: eager vs compiled on axon", args)

    from transformers import StaticCache

    dims = C.model_dims(args)
    model = C.build_models(dims, torch.float32, seed=0)["axon"].eval()
    config = model.config
    cache = StaticCache(config=config, max_cache_len=256)
    prompt = torch.randint(3, dims["vocab"], (args.batch, 32), device="axon")
    ids = torch.randint(3, dims["vocab"], (args.batch, 1), device="axon")
    pos = torch.tensor([40], device="axon")
    print(f"model: {C.describe_dims(dims)}; batch {args.batch}; StaticCache(256)")

    def step(input_ids, cache_position):
        return model(input_ids=input_ids, cache_position=cache_position, past_key_values=cache,
                     use_cache=True).logits

    def measure(name: str, r: int) -> tuple[float, float]:
        """(host ms, step ms) per step of one run of --steps steps from the prompt's cache."""
        fn = fns[name]
        # Each step appends to the cache: start every run from the prompt.
        cache.reset()
        step(prompt, torch.arange(32, device="axon"))
        for _ in range(3):
            fn(ids, pos).argmax(-1).cpu()
        host = 0.0
        t = time.perf_counter()
        for _ in range(args.steps):
            t0 = time.perf_counter()
            logits = fn(ids, pos)
            host += time.perf_counter() - t0
            logits.argmax(-1).cpu()
        total = time.perf_counter() - t
        return host / args.steps * 1e3, total / args.steps * 1e3

    with torch.no_grad():
        step(prompt, torch.arange(32, device="axon"))  # fill the cache
        compiled = torch.compile(step, backend="axon", dynamic=False)
        t = time.perf_counter()
        compiled(ids, pos).cpu()
        print(f"first compiled step (compiles): {time.perf_counter() - t:.1f} s")
        fns = {"eager": step, "compiled": compiled}
        results = C.alternate(measure, args.repeats, devices=tuple(fns))

    rows = []
    for name, runs in results.items():
        rows.append([name, f"{C.median([h for h, _ in runs]):.2f}",
                     f"{C.median([s for _, s in runs]):.2f}"])
    C.print_table(["variant", "host ms/step", "step ms/step"], rows)
    eager = C.median([s for _, s in results["eager"]])
    comp = C.median([s for _, s in results["compiled"]])
    print(f"\ncompiled vs eager: {eager / comp:.2f}x (step time ratio)")
    print(f"command: {C.command_line()}")


if __name__ == "__main__":
    main()
