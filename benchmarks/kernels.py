"""Per-kernel throughput at transformer sizes: axon vs cpu eager, same inputs, side by side.

    .venv/bin/python benchmarks/kernels.py [--repeats 5] [--min-time 0.1] [--only sdpa]
    .venv/bin/python benchmarks/kernels.py --quick          # tiny smoke run, seconds
    .venv/bin/python benchmarks/kernels.py --select own,library,auto   # axon's kernel choice side by side

Kernels: F.linear of decoding's few rows (1 and 8 rows by 512 -> 1408, 1 row by 512 -> 32000,
the lm_head) and of a training step's 2048 rows (512 -> 1408: the float32 GEMM), F.rms_norm (with weight), torch.softmax(dim=-1), F.scaled_dot_product_attention
(causal prefill, and a q_len=1 decode step), F.dropout (training, p=0.1; its random
numbers differ between the devices, so the check compares the fraction kept), forward
and forward+backward; ATen's pointwise kernels x + y, gelu(tanh) and silu on dropout's
shape (run as device work on the worker or the compute team, as the thread policy
measured); and one
torch.optim.AdamW step over parameters shaped like the ~56M-parameter Llama of
generate.py / train_step.py (fused=True, foreach=True, and the torch default, which is
the per-tensor for-loop on cpu and foreach on axon).

Each repetition: --warmup calls, then N calls, then torch.axon.synchronize() before the
clock stops; N is chosen once per kernel so that N cpu calls take about --min-time.
Repetitions alternate cpu, axon, cpu, axon, ...; the table shows medians, the speedup
cpu_time / axon_time (> 1: axon faster), the rate (GB/s: minimum bytes an ideal fused
kernel moves; GFLOP/s: matmul flops of attention, causal counts half, backward 2.5x
forward), the max |axon - cpu| of the outputs (gradients for fwd+bwd, parameters after
one step for AdamW) relative to max |cpu|, and the ops that ran through the CPU fallback
during the axon measurement (per call).

--select own,library,auto times axon once per kernel-selection mode (csrc/aten/KernelSelect.h;
a mode may name threads too, e.g. auto/worker:
own = axon's kernels, library = ATen's CPU kernels run as device work, auto = whichever measured
faster on this machine, from the table `python -m torch_axon.tune` prints), one column each;
the default is auto alone.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


@dataclass
class Case:
    kernel: str
    shape: str
    dtype: torch.dtype
    kind: str                         # "fwd", "fwd+bwd", "step"
    make: Callable[[str], Callable[[], object]]   # device -> one call (returns outputs)
    unit: str = ""                    # "GB/s" or "GFLOP/s"
    amount: float = 0.0               # bytes or flops per call
    note: str = ""
    # What the check compares (random kernels: a statistic of the outputs).
    compare: Callable[[object], object] | None = None
    results: dict = field(default_factory=dict)


def _inputs(shapes_dtypes, device: str, seed: int, requires_grad: bool):
    """Random tensors made on cpu from ``seed`` and copied to ``device``: same values on both."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for shape, dtype, grad in shapes_dtypes:
        t = torch.randn(shape, generator=g, dtype=torch.float32).to(dtype).to(device)
        out.append(t.requires_grad_(requires_grad and grad))
    return out


def _fwd_or_bwd(fn, specs, backward: bool, seed: int):
    """make(device) for fn(*inputs): forward only, or forward + autograd.grad of all inputs."""
    def make(device: str):
        xs = _inputs(specs, device, seed, backward)
        if not backward:
            return lambda: fn(*xs)
        with torch.no_grad():
            out = fn(*xs)
        out_shape, out_dtype = out.shape, out.dtype
        del out
        gout = _inputs([(tuple(out_shape), out_dtype, False)], device, seed + 1, False)[0]
        need = [x for x in xs if x.requires_grad]
        return lambda: torch.autograd.grad(fn(*xs), need, gout)
    return make


def _adamw(shapes, mode: str, seed: int):
    kwargs = {"fused": {"fused": True}, "foreach": {"foreach": True}, "default": {}}[mode]

    def make(device: str):
        g = torch.Generator().manual_seed(seed)
        params = []
        for s in shapes:
            p = (torch.randn(s, generator=g) * 0.02).to(device).requires_grad_()
            p.grad = (torch.randn(s, generator=g) * 1e-3).to(device)
            params.append(p)
        opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, **kwargs)

        def step():
            opt.step()
            return params
        return step
    return make


def adamw_dims(a) -> dict:
    """The model the AdamW parameter list mirrors (the one of generate.py / train_step.py)."""
    return C.model_dims(argparse.Namespace(quick=a.quick))


def build_cases(a) -> list[Case]:
    cases: list[Case] = []
    dtypes = [C.parse_dtype(d) for d in a.dtypes.split(",")]
    for rows_, k, n in a.linear_shapes:
        for dt in dtypes:
            esz = torch.finfo(dt).bits // 8
            cases.append(Case(
                "linear", f"x[{rows_}, {k}] W[{n}, {k}]", dt, "fwd",
                _fwd_or_bwd(lambda x, w: F.linear(x, w), [((rows_, k), dt, False), ((n, k), dt, False)],
                            False, a.seed),
                "GB/s", (n * k + rows_ * (k + n)) * esz))
    rows = a.batch * a.seq
    for hidden in a.norm_dims:
        for dt in dtypes:
            for bwd in (False, True):
                esz = torch.finfo(dt).bits // 8
                x_bytes, w_bytes = rows * hidden * esz, hidden * esz
                cases.append(Case(
                    "rms_norm", f"[{rows}, {hidden}] w[{hidden}]", dt, "fwd+bwd" if bwd else "fwd",
                    _fwd_or_bwd(lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6),
                                [((rows, hidden), dt, True), ((hidden,), dt, True)], bwd, a.seed),
                    "GB/s", (5 * x_bytes + 3 * w_bytes) if bwd else (2 * x_bytes + w_bytes)))
    s_shape = (a.batch, a.heads, a.seq, a.seq)
    for dt in dtypes:
        for bwd in (False, True):
            x_bytes = math.prod(s_shape) * (torch.finfo(dt).bits // 8)
            cases.append(Case(
                "softmax(dim=-1)", str(list(s_shape)), dt, "fwd+bwd" if bwd else "fwd",
                _fwd_or_bwd(lambda x: torch.softmax(x, dim=-1), [(s_shape, dt, True)], bwd, a.seed),
                "GB/s", (5 if bwd else 2) * x_bytes))
    q_shape = (a.batch, a.heads, a.seq, a.head_dim)
    fwd_flops = 4 * a.batch * a.heads * a.seq * a.seq * a.head_dim * 0.5  # causal
    for dt in dtypes:
        for bwd in (False, True):
            cases.append(Case(
                "sdpa causal", f"q,k,v {list(q_shape)}", dt, "fwd+bwd" if bwd else "fwd",
                _fwd_or_bwd(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                            [(q_shape, dt, True)] * 3, bwd, a.seed),
                "GFLOP/s", fwd_flops * (3.5 if bwd else 1.0)))
    dq = (a.batch, a.heads, 1, a.head_dim)
    dkv = (a.batch, a.heads, a.kv_len, a.head_dim)
    for dt in dtypes:
        esz = torch.finfo(dt).bits // 8
        cases.append(Case(
            "sdpa decode", f"q {list(dq)} kv {list(dkv)}", dt, "fwd",
            _fwd_or_bwd(lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
                        [(dq, dt, False), (dkv, dt, False), (dkv, dt, False)], False, a.seed),
            "GB/s", (2 * math.prod(dkv) + 2 * math.prod(dq)) * esz))
    d_shape = (a.batch, a.seq, a.dropout_dim)
    for dt in dtypes:
        for bwd in (False, True):
            x_bytes = math.prod(d_shape) * (torch.finfo(dt).bits // 8)
            numel = math.prod(d_shape)
            cases.append(Case(
                "dropout(p=0.1)", str(list(d_shape)), dt, "fwd+bwd" if bwd else "fwd",
                _fwd_or_bwd(lambda x: F.dropout(x, 0.1, training=True), [(d_shape, dt, True)], bwd,
                            a.seed),
                # out and mask written; the backward reads grad and mask, writes grad
                "GB/s", (2 * x_bytes + numel) + ((2 * x_bytes + numel) if bwd else 0),
                compare=lambda out: torch.stack([(t != 0).double().mean() for t in _flat(out)])))
    # ATen's pointwise kernels (no kernel of ours: the thread policy decides between the
    # stream worker and the compute team), on the dropout input's shape.
    for dt in dtypes:
        x_bytes = math.prod(d_shape) * (torch.finfo(dt).bits // 8)
        cases.append(Case(
            "x + y (ATen)", str(list(d_shape)), dt, "fwd",
            _fwd_or_bwd(lambda x, y: x + y, [(d_shape, dt, False)] * 2, False, a.seed),
            "GB/s", 3 * x_bytes))
        for name, fn in (("gelu(tanh) (ATen)", lambda x: F.gelu(x, approximate="tanh")),
                         ("silu (ATen)", F.silu)):
            for bwd in (False, True):
                cases.append(Case(
                    name, str(list(d_shape)), dt, "fwd+bwd" if bwd else "fwd",
                    _fwd_or_bwd(fn, [(d_shape, dt, True)], bwd, a.seed),
                    "GB/s", (5 if bwd else 2) * x_bytes))
    shapes = C.llama_param_shapes(**adamw_dims(a))
    numel = sum(math.prod(s) for s in shapes)
    for mode in ("fused", "foreach", "default"):
        note = " (cpu: for-loop, axon: foreach)" if mode == "default" else ""
        label = {"fused": "fused=True", "foreach": "foreach=True", "default": "default"}[mode]
        cases.append(Case(
            f"AdamW {label}{note}", f"{len(shapes)} tensors, {numel / 1e6:.1f}M",
            torch.float32, "step", _adamw(shapes, mode, a.seed), "GB/s", 7 * 4 * numel))
    if a.only:
        keys = [k.strip().lower() for k in a.only.split(",")]
        cases = [c for c in cases if any(k in f"{c.kernel} {c.kind} {C.dtype_name(c.dtype)}".lower()
                                         for k in keys)]
    return cases


def _flat(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _flat(o)]


def rel_diff(a_out, c_out) -> float:
    worst = 0.0
    for a, c in zip(_flat(a_out), _flat(c_out)):
        c32, a32 = c.detach().float(), a.detach().cpu().float()
        scale = c32.abs().max().item() or 1.0
        worst = max(worst, (a32 - c32).abs().max().item() / scale)
    return worst


def variants(a) -> list[str]:
    return C.select_variants(a)


_DEVICES: dict[str, str] = {}


def _device(v: str) -> str:
    """The device of variant v: each axon mode (--select) on a device of its own, so that one
    device's memory holds one variant's state (AdamW's rows: 0.9 GB per variant)."""
    if v == "cpu" or v == "axon":
        return v
    return _DEVICES.setdefault(v, f"axon:{len(_DEVICES) % torch.axon.device_count()}")


def _with_mode(v: str, fn):
    """fn under v's kernel-selection mode (axon:own ...); plain fn otherwise."""
    if ":" not in v:
        return fn

    def call():
        C.set_select(v)
        return fn()
    return call


def run_case(case: Case, a) -> None:
    vs = variants(a)
    # Fresh state for the check: the same first call on both devices.
    outs = {}
    for v in vs:
        out = _with_mode(v, case.make(_device(v)))()
        outs[v] = case.compare(out) if case.compare else out
        C.sync(_device(v))
    case.results["diff"] = max(rel_diff(outs[v], outs["cpu"]) for v in vs[1:])
    del outs

    calls = {v: _with_mode(v, case.make(_device(v))) for v in vs}
    for v in vs:  # first calls (lazy state such as AdamW's, auto's measurement) outside the counts
        C.settle()
        for _ in range(max(1, a.warmup)):
            calls[v]()
        C.sync(_device(v))
    # N from the median cpu time of single calls, timed until 1/5 of --min-time (at least 3).
    one: list[float] = []
    while len(one) < 3 or (sum(one) < a.min_time / 5 and len(one) < a.max_iters):
        one.append(C.timed(calls["cpu"], "cpu"))
    iters = a.iters or max(1, min(a.max_iters, math.ceil(a.min_time / C.median(one))))

    fallback = C.FallbackCounter()

    def measure(v, r):
        with fallback if _device(v).startswith("axon") else contextlib.nullcontext():
            return C.time_per_call(calls[v], _device(v), iters, warmup=a.warmup)
    times = C.alternate(measure, a.repeats, devices=vs)
    case.results.update(iters=iters, fallback=fallback,
                        calls=a.repeats * (a.warmup + iters) * (len(vs) - 1))
    case.results.update({v: C.median(times[v]) for v in vs})
    if a.profile:
        C.profile_axon(calls[vs[1]], f"{case.kernel} {case.shape} {C.dtype_name(case.dtype)} {case.kind}",
                       rows=a.profile_rows, calls=min(iters, 5))
    del calls
    C.set_select("")


def main() -> None:
    p = C.make_parser(__doc__, quick="tiny shapes, 2 repeats: a smoke run")
    p.add_argument("--repeats", type=int, default=None, help="repetitions per device (5; quick 2)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls before each repetition")
    p.add_argument("--min-time", type=float, default=None,
                   help="seconds of cpu calls per repetition, picks N (0.1; quick 0.01)")
    p.add_argument("--iters", type=int, default=0, help="fixed N calls per repetition (0: from --min-time)")
    p.add_argument("--max-iters", type=int, default=1000)
    p.add_argument("--only", default="",
                   help="comma-separated substrings of 'kernel pass dtype', e.g. "
                        "sdpa,softmax,rms,adamw,bf16,fwd+bwd")
    p.add_argument("--dtypes", default="fp32,bf16", help="dtypes of the norm/softmax/attention kernels")
    p.add_argument("--batch", type=int, default=None, help="batch (8; quick 2)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (256; quick 64)")
    p.add_argument("--heads", type=int, default=None, help="attention heads (8; quick 4)")
    p.add_argument("--head-dim", type=int, default=None, help="head dim (64; quick 32)")
    p.add_argument("--kv-len", type=int, default=None, help="kv length of the decode step (512; quick 128)")
    p.add_argument("--norm-dims", default=None, help="rms_norm widths (512,2048; quick 128,512)")
    p.add_argument("--dropout-dim", type=int, default=None,
                   help="last dim of the dropout input [batch, seq, dim] (768; quick 128)")
    p.add_argument("--linear", default=None,
                   help="F.linear shapes rows x in x out, comma-separated, '' for none "
                        "(1x512x1408,8x512x1408,1x512x32000; quick 1x64x96,4x64x128)")
    C.add_select_arg(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", action="store_true", help="torch.profiler top ops on axon, per kernel")
    p.add_argument("--profile-rows", type=int, default=12)
    C.add_common_args(p)
    a = p.parse_args()
    C.apply_malloc_reuse(a)
    C.resolve_defaults(a, dict(repeats=(2, 5), min_time=(0.01, 0.1), batch=(2, 8), seq=(64, 256),
                               heads=(4, 8), head_dim=(32, 64), kv_len=(128, 512),
                               norm_dims=("128,512", "512,2048"), dropout_dim=(128, 768),
                               linear=("1x64x96,4x64x128,64x64x96",
                                       "1x512x1408,8x512x1408,1x512x32000,2048x512x1408")))
    a.norm_dims = [int(x) for x in str(a.norm_dims).split(",")]
    a.linear_shapes = [tuple(int(v) for v in x.split("x")) for x in a.linear.split(",") if x]
    C.parse_select(p, a)
    torch.manual_seed(a.seed)

    C.print_header("kernels: per-kernel throughput, axon vs cpu eager", a)
    print(f"AdamW parameters: {C.describe_dims(adamw_dims(a))}")
    cases = build_cases(a)
    vs = variants(a)
    axon = vs[1:]
    if len(axon) == 1:
        headers = ["kernel", "shape", "dtype", "pass", "N", "cpu", "axon", "speedup cpu/axon",
                   "unit", "cpu rate", "axon rate", "rel diff", "fallback ops"]
    else:
        headers = (["kernel", "shape", "dtype", "pass", "N", "cpu"] + axon
                   + [f"cpu/{v}" for v in axon] + ["rel diff", "fallback ops"])
    rows = []
    for case in cases:
        run_case(case, a)
        r = case.results
        n_fallback = len(r["fallback"].counts)
        fb = "native" if n_fallback == 0 else f"{n_fallback} ops"
        head = [case.kernel, case.shape, C.dtype_name(case.dtype), case.kind, r["iters"],
                C.fmt_time(r["cpu"])]
        if len(axon) == 1:
            v = axon[0]
            row = head + [C.fmt_time(r[v]), f"{r['cpu'] / r[v]:.2f}x", case.unit,
                          C.fmt_num(case.amount / r["cpu"] / 1e9), C.fmt_num(case.amount / r[v] / 1e9),
                          f"{r['diff']:.1e}", fb]
        else:
            row = (head + [C.fmt_time(r[v]) for v in axon] + [f"{r['cpu'] / r[v]:.2f}x" for v in axon]
                   + [f"{r['diff']:.1e}", fb])
        rows.append(row)
        print(f"[{len(rows)}/{len(cases)}] {' '.join(str(c) for c in row[:6 + len(axon)])}",
              file=sys.stderr, flush=True)  # progress
    print()
    C.print_table(headers, rows, align=["l", "l", "l", "l"] + ["r"] * (len(headers) - 5) + ["l"])
    print("fallback ops during the axon measurement (calls per kernel call):")
    for case in cases:
        r = case.results
        print(f"- {case.kernel} {case.shape} {C.dtype_name(case.dtype)} {case.kind}: "
              f"{r['fallback'].summary(per=r['calls'])}")


if __name__ == "__main__":
    main()
