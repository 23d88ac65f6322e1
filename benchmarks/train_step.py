"""Training step (forward + backward + AdamW) of a ~56M-parameter Llama: axon vs cpu, side by side.

    .venv/bin/python benchmarks/train_step.py [--steps 1] [--repeats 5] [--dtype bfloat16] [--fused]
    .venv/bin/python benchmarks/train_step.py --quick          # tiny model, seconds
    .venv/bin/python benchmarks/train_step.py --select auto,own,library   # axon's modes side by side

The model of generate.py (LlamaForCausalLM from a LlamaConfig, random init, 56.4M
parameters) on cpu and a copy with the same weights on axon. One step: loss =
model(input_ids, labels=input_ids).loss; loss.backward(); optimizer.step();
optimizer.zero_grad(set_to_none=True). Batches of random token ids, the same sequence
on both devices. --warmup untimed steps per device, then --repeats repetitions of
--steps timed steps, alternating cpu, axon, cpu, axon, ...; each repetition runs from a
drained device to torch.axon.synchronize() after the last step. Both devices run the
same steps from the same init on the same data, so their losses should match closely.

Optimizer: torch.optim.AdamW(lr=1e-3, weight_decay=0.01); --optim default leaves the
implementation to torch (for-loop over tensors on cpu, foreach on axon), foreach forces
foreach=True, fused (or --fused) fused=True. --select trains one axon copy per
kernel-selection mode (a row each; see benchmarks/_common.py SELECT_HELP).
"""

from __future__ import annotations

import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


def make_optimizer(model, optim: str, lr: float) -> torch.optim.Optimizer:
    kwargs = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[optim]
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, **kwargs)


def train_step(model, opt, ids: torch.Tensor) -> torch.Tensor:
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def main() -> None:
    p = C.make_parser(__doc__, quick="tiny model and batch: a smoke run")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (8; quick 2)")
    p.add_argument("--seq", type=int, default=None, help="tokens per sequence (256; quick 32)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per repetition (1; quick 2)")
    p.add_argument("--repeats", type=int, default=None, help="repetitions per device (5; quick 1)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per device before timing")
    p.add_argument("--dtype", default="float32", help="float32 or bfloat16 (parameters and compute)")
    p.add_argument("--optim", choices=["default", "foreach", "fused"], default="default",
                   help="AdamW implementation (default: torch's choice per device)")
    p.add_argument("--fused", action="store_true", help="same as --optim fused")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", action="store_true",
                   help="torch.profiler over one extra axon step: top ops by self CPU time")
    p.add_argument("--profile-rows", type=int, default=25)
    C.add_model_args(p)
    C.add_select_arg(p)
    C.add_common_args(p)
    a = p.parse_args()
    C.parse_select(p, a)
    C.apply_malloc_reuse(a)
    C.resolve_defaults(a, dict(batch=(2, 8), seq=(32, 256), steps=(2, 1), repeats=(1, 5)))
    if a.fused:
        a.optim = "fused"
    dtype = C.parse_dtype(a.dtype)
    dims = C.model_dims(a)
    torch.manual_seed(a.seed)

    C.print_header("train_step: forward + backward + AdamW step, axon vs cpu", a)
    models = C.build_models(dims, dtype, a.seed, max_positions=max(2048, a.seq))
    variants = C.select_variants(a)
    # each axon mode (--select) trains its own copy of the model from the same init, on a
    # device of its own (one device's memory holds one training run)
    devices = {"cpu": "cpu", **{v: "axon" if v == "axon" else f"axon:{i}"
                                for i, v in enumerate(variants[1:])}}
    if variants[1:] != ["axon"]:
        del models["axon"]
        for v in variants[1:]:
            models[v] = copy.deepcopy(models["cpu"]).to(devices[v])
    opts = {}
    for d, m in models.items():
        m.train()
        opts[d] = make_optimizer(m, a.optim, a.lr)
    n_params = sum(p.numel() for p in models["cpu"].parameters())
    impl = {"default": "torch default (cpu: for-loop, axon: foreach)", "foreach": "foreach=True",
            "fused": "fused=True"}[a.optim]
    print(f"model: {C.describe_dims(dims)}: {n_params / 1e6:.1f}M parameters, {C.dtype_name(dtype)}, "
          f"attention {models['cpu'].config._attn_implementation}; batch {a.batch} x {a.seq} tokens, "
          f"AdamW {impl}\n", flush=True)

    g = torch.Generator().manual_seed(a.seed)
    n_batches = a.warmup + a.repeats * a.steps
    batches = [torch.randint(3, dims["vocab"], (a.batch, a.seq), generator=g) for _ in range(n_batches)]
    losses: dict[str, list[torch.Tensor]] = {v: [] for v in variants}
    dev = devices.__getitem__

    for v in variants:  # warmup steps: part of the training run, not timed (auto measures here)
        with C.selected(v):
            for i in range(a.warmup):
                losses[v].append(train_step(models[v], opts[v], batches[i].to(dev(v))))
            C.sync(dev(v))

    def measure(v: str, r: int) -> float:
        """Repetition r: --steps steps on their own batches, copied before the clock starts."""
        inputs = [b.to(dev(v)) for b in batches[a.warmup + r * a.steps: a.warmup + (r + 1) * a.steps]]

        def run() -> None:
            for ids in inputs:
                losses[v].append(train_step(models[v], opts[v], ids))
        with C.selected(v):
            return C.timed(run, dev(v))

    def progress(r: int, times: dict) -> None:
        print(f"  repetition {r + 1}/{a.repeats}: " + ", ".join(
            f"{v} {times[v][-1] / a.steps * 1e3:.0f} ms/step" for v in variants),
            file=sys.stderr, flush=True)
    fallback = C.FallbackCounter()
    times = C.alternate(measure, a.repeats, devices=variants, fallback=fallback, progress=progress)

    tokens = a.batch * a.seq
    c = C.median(times["cpu"]) / a.steps
    rows = []
    for v in variants[1:]:
        x = C.median(times[v]) / a.steps
        best = min(times["cpu"]) / min(times[v])
        rows.append([f"{a.batch} x {a.seq}", C.dtype_name(dtype), a.optim, v.partition(":")[2] or "auto",
                     f"{c * 1e3:,.0f}", f"{x * 1e3:,.0f}", f"{tokens / c:,.0f}", f"{tokens / x:,.0f}",
                     f"{c / x:.2f}x", f"{best:.2f}x"])
    print()
    C.print_table(["batch x seq", "dtype", "AdamW", "axon mode", "cpu ms/step", "axon ms/step",
                   "cpu tokens/s", "axon tokens/s", "axon/cpu tokens/s", "axon/cpu (best runs)"],
                  rows, align=["l", "l", "l", "l"] + ["r"] * 6)
    print(f"median over {a.repeats} repetitions of {a.steps} steps per device (and axon mode, "
          f"--select), after {a.warmup} warmup step(s); tokens/s = batch x seq / (seconds per step); "
          f"best runs: fastest repetition of each.")

    lc = [float(x) for x in losses["cpu"]]
    print("losses per step, cpu:  " + " ".join(f"{x:.4f}" for x in lc))
    for v in variants[1:]:
        la = [float(x) for x in losses[v]]
        diffs = [abs(u - w) for u, w in zip(lc, la)]
        worst = max(range(len(diffs)), key=diffs.__getitem__)
        print(f"{v}: loss after {len(lc)} steps from the same init on the same data: cpu {lc[-1]:.6f}, "
              f"axon {la[-1]:.6f}, |diff| {diffs[-1]:.2e} (relative {diffs[-1] / abs(lc[-1]):.1e}); "
              f"first step: cpu {lc[0]:.6f}, axon {la[0]:.6f}; largest |diff| {diffs[worst]:.2e} at "
              f"step {worst + 1}")
        print(f"losses per step, {v}: " + " ".join(f"{x:.4f}" for x in la))
    print(f"\nfallback ops during the timed axon steps (calls per step): "
          f"{fallback.summary(per=a.repeats * a.steps * (len(variants) - 1), limit=30)}")
    if a.profile:
        ids = batches[0].to("axon")
        C.profile_axon(lambda: train_step(models["axon"], opts["axon"], ids), "one training step",
                       rows=a.profile_rows, calls=1)


if __name__ == "__main__":
    main()
