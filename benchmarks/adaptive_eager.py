"""Adaptive eager (fusion of queued eager ops on axon's streams): on vs off, side by side.

    .venv/bin/python benchmarks/adaptive_eager.py [--repeats 5] [--only rmsnorm,decode,train]
    .venv/bin/python benchmarks/adaptive_eager.py --quick      # small shapes, seconds

Four measurements, each alternating fusion off and on in one process
(torch.axon._C._set_adaptive_eager), medians of --repeats rounds:
- chain: ((x * 2.0) + 1.0).neg() on [2048, 512] float32, an elementwise chain the
  engine runs entirely in its own loops: time per call over a loop of calls;
- rmsnorm: transformers' LlamaRMSNorm module (Python ops) on [8, 256, 512], float32 and
  bfloat16: time per call over a loop of calls (the device drained before and after);
  the CPU's time for reference.
- decode: greedy generate of the ~56M Llama (benchmarks/_common.py LLAMA), batch 1 and 8,
  float32: tokens/s; the greedy tokens of both modes are compared.
- train: one training step of the same Llama (batch 4 x 128 tokens, AdamW default):
  seconds per step; losses of both modes compared.
fusion_stats() of the last "on" round is printed for each (ops fused, bytes of
intermediates not written).
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

MODES = ("off", "on")


def set_mode(mode: str) -> None:
    torch.axon.synchronize()
    torch.axon._C._set_adaptive_eager(1 if mode == "on" else 0)


def alternate_modes(args, cpu_fn, axon_fn, iters: int):
    """Medians of time per call (cpu, axon off, axon on) over --repeats rounds, the axon
    outputs of each mode, and fusion_stats() of the last "on" round."""
    times = {"cpu": [], "off": [], "on": []}
    outs = {}
    for _ in range(args.repeats):
        times["cpu"].append(C.time_per_call(cpu_fn, "cpu", iters, 3))
        for m in MODES:
            set_mode(m)
            torch.axon.reset_fusion_stats()
            times[m].append(C.time_per_call(axon_fn, "axon", iters, 3))
            outs[m] = axon_fn().cpu()
    return {k: C.median(v) for k, v in times.items()}, outs, torch.axon.fusion_stats()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    view = {torch.float32: torch.int32}.get(a.dtype, torch.int16)
    return torch.equal(a.view(view), b.view(view))


def add_row(rows: list, name: str, shape, dtype, t: dict, outs: dict, stats: dict) -> None:
    rows.append([name, str(list(shape)), C.dtype_name(dtype), C.fmt_time(t["cpu"]),
                 C.fmt_time(t["off"]), C.fmt_time(t["on"]), f"{t['off'] / t['on']:.2f}x",
                 "yes" if same_bits(outs["on"], outs["off"]) else "NO", stats["ops_fused"],
                 f"{stats['intermediate_bytes_not_written'] / 2**20:.0f} MiB"])
    print(rows[-1], flush=True)


def bench_rmsnorm(args, rows: list) -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    shape = (2, 64, 256) if args.quick else (8, 256, 512)
    for dtype in (torch.float32, torch.bfloat16):
        cpu_mod = LlamaRMSNorm(shape[-1]).to(dtype)
        with torch.no_grad():
            cpu_mod.weight.normal_()
        ax_mod = LlamaRMSNorm(shape[-1]).to(dtype).to("axon")
        ax_mod.load_state_dict(cpu_mod.state_dict())
        x_cpu = torch.randn(shape, dtype=dtype)
        x = x_cpu.to("axon")
        with torch.no_grad():
            t, outs, stats = alternate_modes(args, lambda: cpu_mod(x_cpu), lambda: ax_mod(x),
                                             20 if args.quick else 100)
        add_row(rows, "LlamaRMSNorm", shape, dtype, t, outs, stats)


def bench_chain(args, rows: list) -> None:
    shape = (256, 128) if args.quick else (2048, 512)
    x_cpu = torch.randn(shape)
    x = x_cpu.to("axon")

    def chain(t):
        return ((t * 2.0) + 1.0).neg()

    t, outs, stats = alternate_modes(args, lambda: chain(x_cpu), lambda: chain(x),
                                     20 if args.quick else 100)
    add_row(rows, "((x * 2) + 1).neg()", shape, torch.float32, t, outs, stats)


def bench_decode(args, rows: list) -> None:
    from generate import generate

    dims = C.model_dims(args)
    model = C.build_models(dims, torch.float32, 0)["axon"]
    new = 8 if args.quick else 64
    for batch in ([1, 2] if args.quick else [1, 8]):
        prompts = torch.randint(3, dims["vocab"], (batch, 8 if args.quick else 32),
                                generator=torch.Generator().manual_seed(batch))
        set_mode("off")
        generate(model, prompts, "axon", new)  # warm-up: signatures, thread policy
        secs = {m: [] for m in MODES}
        toks = {}
        for _ in range(args.repeats):
            for m in MODES:
                set_mode(m)
                torch.axon.reset_fusion_stats()
                toks[m], s = generate(model, prompts, "axon", new)
                secs[m].append(s)
        stats = torch.axon.fusion_stats()
        off, on = batch * new / C.median(secs["off"]), batch * new / C.median(secs["on"])
        rows.append(["decode (generate)", f"batch {batch}, {new} tokens", "fp32", "",
                     f"{off:.1f} tok/s", f"{on:.1f} tok/s", f"{on / off:.2f}x",
                     "yes" if torch.equal(toks["on"], toks["off"]) else "NO", stats["ops_fused"],
                     f"{stats['intermediate_bytes_not_written'] / 2**20:.0f} MiB"])
        print(rows[-1], flush=True)


def bench_train(args, rows: list) -> None:
    import copy

    dims = C.model_dims(args)
    base = C.build_models(dims, torch.float32, 0)["axon"].train()
    batch, seq = (2, 32) if args.quick else (4, 128)
    ids = torch.randint(3, dims["vocab"], (batch, seq), generator=torch.Generator().manual_seed(0)).to("axon")
    models = {m: copy.deepcopy(base) for m in MODES}
    opts = {m: torch.optim.AdamW(models[m].parameters(), lr=1e-3, weight_decay=0.01) for m in MODES}
    losses = {m: [] for m in MODES}

    def step(m):
        loss = models[m](ids, labels=ids).loss
        loss.backward()
        opts[m].step()
        opts[m].zero_grad(set_to_none=True)
        losses[m].append(loss.detach())

    secs = {m: [] for m in MODES}
    for m in MODES:
        set_mode("off")
        step(m)  # warm-up
    for _ in range(args.repeats):
        for m in MODES:
            set_mode(m)
            torch.axon.reset_fusion_stats()
            secs[m].append(C.timed(lambda: step(m), "axon"))
    stats = torch.axon.fusion_stats()
    same = torch.equal(torch.stack(losses["on"]).cpu(), torch.stack(losses["off"]).cpu())
    off, on = C.median(secs["off"]), C.median(secs["on"])
    rows.append(["training step", f"{batch} x {seq}", "fp32", "", C.fmt_time(off), C.fmt_time(on),
                 f"{off / on:.2f}x", "yes" if same else "NO", stats["ops_fused"],
                 f"{stats['intermediate_bytes_not_written'] / 2**20:.0f} MiB"])
    print(rows[-1], flush=True)


def main() -> None:
    p = C.make_parser(__doc__, quick="small shapes and model: a smoke run")
    p.add_argument("--repeats", type=int, default=None, help="rounds (5; quick 2)")
    p.add_argument("--only", default="chain,rmsnorm,decode,train")
    args = p.parse_args()
    if args.repeats is None:
        args.repeats = 2 if args.quick else 5
    C.print_header("adaptive eager: fusion off vs on", args)
    rows: list = []
    parts = args.only.split(",")
    try:
        if "chain" in parts:
            bench_chain(args, rows)
        if "rmsnorm" in parts:
            bench_rmsnorm(args, rows)
        if "decode" in parts:
            bench_decode(args, rows)
        if "train" in parts:
            bench_train(args, rows)
    finally:
        torch.axon._C._set_adaptive_eager(-1)
    print()
    C.print_table(["measurement", "shape", "dtype", "cpu", "axon off", "axon on", "on/off speed",
                   "bitwise equal", "ops fused", "not written"], rows)


if __name__ == "__main__":
    main()
