"""One decoding step on axon, eager, graph replay, compiled, compiled + graph, compiled
reduce-overhead: host and step time.

    .venv/bin/python benchmarks/decode_step.py [--batch 1] [--steps 30] [--repeats 3]

The model of generate.py (56.4M-parameter Llama, random init, fp32) with a StaticCache
of 256 positions (reset and refilled with a 32-token prompt before each run): each step is ``model(input_ids [batch, 1], cache_position,
past_key_values=cache)`` followed by ``logits.argmax(-1).cpu()`` (the synchronisation a
generate loop makes), eagerly and compiled (``torch.compile(step, backend="axon",
dynamic=False)``), each also captured once into a ``torch.axon.AxonGraph`` and replayed
("graph", "compiled+graph": the step's inputs are static tensors the replay reads),
and compiled with ``mode="reduce-overhead"`` ("compiled reduce-overhead": Inductor records
and replays the axon graph itself, copying the non-static inputs into the graph's
buffers at each call), interleaved --repeats times; medians. "host ms" is the time until
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
        reduce_overhead = torch.compile(step, backend="axon", mode="reduce-overhead", dynamic=False)
        t = time.perf_counter()
        reduce_overhead(ids, pos).cpu()
        print(f"first compiled reduce-overhead step (compiles): {time.perf_counter() - t:.1f} s")
        def graphed(fn):
            """The step captured once (after warm-up) and replayed: one launch per step."""
            for _ in range(2):
                fn(ids, pos)
            torch.axon.synchronize()
            g = torch.axon.AxonGraph()
            with torch.axon.graph(g):
                out = fn(ids, pos)

            def replay(input_ids, cache_position):
                g.replay()
                return out

            replay.graph = g
            return replay

        fns = {"eager": step, "graph": graphed(step), "compiled": compiled,
               "compiled+graph": graphed(compiled), "compiled reduce-overhead": reduce_overhead}
        results = C.alternate(measure, args.repeats, devices=tuple(fns))

    rows = []
    for name, runs in results.items():
        rows.append([name, f"{C.median([h for h, _ in runs]):.2f}",
                     f"{C.median([s for _, s in runs]):.2f}"])
    C.print_table(["variant", "host ms/step", "step ms/step"], rows)
    eager = C.median([s for _, s in results["eager"]])
    eager_host = C.median([h for h, _ in results["eager"]])
    print()
    for name in ("graph", "compiled", "compiled+graph", "compiled reduce-overhead"):
        t = C.median([s for _, s in results[name]])
        h = C.median([h for h, _ in results[name]])
        print(f"{name} vs eager: {eager / t:.2f}x step time, host time {h / eager_host:.1%} of eager's")
    print(f"command: {C.command_line()}")


if __name__ == "__main__":
    main()
