"""The shipped hub kernels (examples/kernels/axon-*) vs the same modules on axon, side by side.

    .venv/bin/python benchmarks/custom_kernels.py [--repeats 3] [--dtypes float32,bfloat16]
    .venv/bin/python benchmarks/custom_kernels.py --quick       # small shapes, seconds
    .venv/bin/python benchmarks/custom_kernels.py --no-compile  # skip the torch.compile column
    .venv/bin/python benchmarks/custom_kernels.py --overhead-only  # only the per-call table

For each kernel: the module or function it replaces, run eagerly on axon ("eager", the
Transformers/PyTorch code: LlamaRMSNorm, act_fn(gate) * up, apply_rotary_pos_emb, ...),
the same code under torch.compile on axon ("compiled", Inductor's fused C++ for axon; not
for the ViT rows, whose eager block is what the target names), and the kernel ("kernel",
loaded with kernels.get_local_kernel, or the block kernelized with
torch_axon.hub_kernels.kernelize). Times are medians of --repeats rounds that alternate
the variants (each round: --warmup calls, then calls for about --min-time, the device
drained before the clock stops); "x eager" and "x compiled" are eager_time / kernel_time
and compiled_time / kernel_time (> 1: the kernel is faster). Shapes: Llama-7B-like rows
(4096 hidden, 11008 intermediate, 32 heads of 128, 8 kv heads) for --tokens tokens, the
forward of benchmarks/_common.py's Llama (hidden 512, 8 layers, random init) kernelized with
torch_axon.hub_kernels.kernelize, and a ViT-base block from transformers.ViTConfig() (hidden 768, 12 heads, intermediate 3072,
197 tokens) at --vit-batch images.

Then the host time per call of a small kernel through each way of calling it (a native op
registered with lib.op, a torch.library.custom_op in Python, a direct KernelFunction launch)
next to ATen's own x * 2. Last: the JIT build of a small kernel (torch_axon.kernel.load of a one-function source)
into an empty cache (cold: the compiler runs) and again from a new process (warm: found
in the cache), with torch_axon.kernel.build_info's times.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch
import torch.nn.functional as F

# The Hugging Face library, not benchmarks/kernels.py next to this script (the script's
# directory is first on sys.path).
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
import kernels as hf_kernels  # noqa: E402

sys.path.insert(0, _HERE)
from _common import (LLAMA, LLAMA_QUICK, REPO, dtype_name, fmt_time, llama_config,  # noqa: E402
                     make_parser, median, parse_dtype, print_header, print_table, time_per_call)

REPOS = REPO / "examples" / "kernels"
DEV = "axon"


ORIGINAL_ROPE = None  # Transformers' apply_rotary_pos_emb, before hub_kernels replaces it


def per_call(fn, min_time: float, warmup: int) -> float:
    """Seconds per call: n calls in a row, n chosen so that they take about min_time (launches
    are asynchronous: the device is drained before the clock starts and stops)."""
    one = time_per_call(fn, DEV, 1, warmup)
    n = max(3, min(1000, int(min_time / max(one, 1e-6))))
    return time_per_call(fn, DEV, n)


def measure(variants: dict, repeats: int, min_time: float, warmup: int) -> dict:
    out = {k: [] for k in variants}
    with torch.no_grad():
        for _ in range(repeats):
            for k, fn in variants.items():
                out[k].append(per_call(fn, min_time, warmup))
    return {k: median(v) for k, v in out.items()}


def compiled(fn):
    c = torch.compile(fn, backend="inductor", dynamic=False)
    return c


_TILE = []


def tile_rms_norm():
    """LlamaRMSNorm in torch_axon.tile's language (docs/kernels.md), built once."""
    if not _TILE:
        import torch_axon.tile as tl

        @tl.kernel("axon_bench::tile_rms_norm(Tensor x, Tensor w, float eps) -> Tensor")
        def rms_norm(x, w, eps):
            return x * tl.rsqrt(tl.mean(x * x) + eps) * w
        _TILE.append(rms_norm)
    return _TILE[0]


def cases(args, dtype, act, ln, rot, vit):
    from transformers import ViTConfig
    from transformers.models.llama import modeling_llama
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.vit.modeling_vit import ViTLayer

    apply_rotary_pos_emb = ORIGINAL_ROPE

    T = args.tokens
    H, I = (1024, 2816) if args.quick else (4096, 11008)
    heads, kv, hd = (8, 2, 128) if args.quick else (32, 8, 128)
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(DEV, dtype)

    # gated activation: act(gate) * up (Llama's MLP between the projections)
    gate, up = rnd(T, I), rnd(T, I)
    yield ("SiLU-and-mul", f"[{T}, {I}] x2", lambda: F.silu(gate) * up,
           lambda: act.silu_mul(gate, up), True)
    x2 = rnd(T, 2 * I)
    out = torch.empty(T, I, device=DEV, dtype=dtype)

    def gelu_and_mul_eager(x=x2):
        return F.gelu(x[:, :I]) * x[:, I:]
    yield ("GELU-and-mul (erf)", f"[{T}, {2 * I}]", gelu_and_mul_eager,
           lambda: (act.gelu_and_mul(out, x2), out)[1], True)
    yield ("GELU-tanh-and-mul", f"[{T}, {2 * I}]",
           lambda: F.gelu(x2[:, :I], approximate="tanh") * x2[:, I:],
           lambda: (act.gelu_tanh_and_mul(out, x2), out)[1], True)

    # RMSNorm (LlamaRMSNorm), and with the residual add before it
    norm = LlamaRMSNorm(H, eps=1e-6).to(DEV, dtype)
    norm.weight.data.normal_()
    x, r = rnd(T, H), rnd(T, H)
    yield ("RMSNorm (LlamaRMSNorm)", f"[{T}, {H}]", lambda: norm(x),
           lambda: ln.rms_norm(x, norm.weight, 1e-6), True)

    yield ("RMSNorm, tile language (torch_axon.tile)", f"[{T}, {H}]", lambda: norm(x),
           lambda: tile_rms_norm()(x, norm.weight, 1e-6), True)
    yield ("RMSNorm, tile language, decode rows", f"[8, {H}]", lambda: norm(x[:8]),
           lambda: tile_rms_norm()(x[:8], norm.weight, 1e-6), True)

    def add_rms(x=x, r=r):
        h = x + r
        return norm(h), h
    yield ("residual add + RMSNorm", f"[{T}, {H}]", add_rms,
           lambda: ln.rms_norm(x, norm.weight, 1e-6, residual=r), True)
    lnorm = torch.nn.LayerNorm(H).to(DEV, dtype)

    def add_ln(x=x, r=r):
        h = x + r
        return lnorm(h), h
    yield ("residual add + LayerNorm", f"[{T}, {H}]", add_ln,
           lambda: ln.layer_norm(x, lnorm.weight, lnorm.bias, 1e-5, residual=r), True)

    # rotary embedding, Llama's layout (q/k transposed views of the projections)
    q = rnd(1, T, heads, hd).transpose(1, 2)
    k = rnd(1, T, kv, hd).transpose(1, 2)
    pos = torch.arange(T, dtype=torch.float32)[:, None] * torch.rand(hd // 2, generator=g)[None]
    emb = torch.cat((pos, pos), -1)[None]
    cos, sin = emb.cos().to(DEV, dtype), emb.sin().to(DEV, dtype)
    yield ("rotary (apply_rotary_pos_emb)", f"q [1, {heads}, {T}, {hd}], k [1, {kv}, {T}, {hd}]",
           lambda: apply_rotary_pos_emb(q, k, cos, sin),
           lambda: rot.apply_rotary_pos_emb(q, k, cos, sin), True)

    # a whole Llama (benchmarks/_common.py's ~56M-parameter model), prefill of --tokens tokens
    import copy

    import torch_axon.hub_kernels as hub_kernels
    from transformers import LlamaForCausalLM
    dims = dict(LLAMA_QUICK if args.quick else LLAMA)
    torch.manual_seed(0)
    llama = LlamaForCausalLM(llama_config(dims)).to(DEV, dtype).eval()
    kllama = hub_kernels.kernelize(copy.deepcopy(llama))
    ids = torch.randint(0, dims["vocab"], (1, args.llama_tokens), generator=g).to(DEV)

    def llama_eager():
        # kernelize made Transformers' rotary function layer (module-global, as with
        # Transformers' own hub integration) the kernel: the unkernelized model gets the
        # original function back for its call
        current = modeling_llama.apply_rotary_pos_emb
        modeling_llama.apply_rotary_pos_emb = ORIGINAL_ROPE
        try:
            return llama(ids).logits
        finally:
            modeling_llama.apply_rotary_pos_emb = current
    yield (f"Llama forward (hidden {dims['hidden']}, {dims['layers']} layers)",
           f"[1, {args.llama_tokens}] tokens", llama_eager, lambda: kllama(ids).logits, False)

    # ViT-base block (transformers.ViTConfig() defaults)
    cfg = ViTConfig()
    cfg._attn_implementation = "eager"
    B = args.vit_batch
    S = (cfg.image_size // cfg.patch_size) ** 2 + 1
    block = ViTLayer(cfg).to(DEV, dtype).eval()
    hs = rnd(B, S, cfg.hidden_size)
    nh, hdim = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    qa, ka, va = (rnd(B, S, nh, hdim) for _ in range(3))
    from transformers.models.vit.modeling_vit import eager_attention_forward
    yield ("ViT attention core (eager_attention_forward)", f"[{B}, {S}, {nh}, {hdim}]",
           lambda: eager_attention_forward(block.attention, qa.transpose(1, 2), ka.transpose(1, 2),
                                           va.transpose(1, 2), None, scaling=hdim ** -0.5)[0],
           lambda: vit.attention(qa, ka, va, hdim ** -0.5), False)
    kblock = copy.deepcopy(block)
    hub_kernels.kernelize(kblock)
    yield ("ViT-base block, eager attention", f"ViTLayer, [{B}, {S}, {cfg.hidden_size}]",
           lambda: block(hs), lambda: kblock(hs), False)
    sblock = copy.deepcopy(block)
    sblock.attention.config = copy.copy(cfg)
    sblock.attention.config._attn_implementation = "sdpa"
    yield ("ViT-base block, sdpa attention", f"ViTLayer, [{B}, {S}, {cfg.hidden_size}]",
           lambda: sblock(hs), lambda: kblock(hs), False)


def jit_times() -> tuple[float, float, float]:
    """(cold load s, cold compile s, warm load s) of a small kernel in an empty cache."""
    src = textwrap.dedent("""
        #include <axon/kernel.h>
        using namespace axon::kernel;
        AXON_KERNEL(axpy) {  // y += a * x, float32
          View<float> x = as<float>(args->tensors[0]), y = as<float>(args->tensors[1]);
          const Vec a = Vec::broadcast(float(args->floats[0]));
          parallel_for(ctx, 0, x.numel(), 4096, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) y.data()[i] += float(args->floats[0]) * x.data()[i];
          });
          (void)a;
        }
    """)
    code = textwrap.dedent("""
        import json, sys, torch, torch_axon.kernel as k
        lib = k.load("bench_axpy", source=sys.argv[1])
        i = k.build_info(lib)
        print(json.dumps([i.cached, i.total_seconds, i.compile_seconds]))
    """)
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, AXON_KERNEL_CACHE=cache)
        import json
        res = []
        for _ in range(2):  # a new process each: the second finds the library in the cache
            out = subprocess.run([sys.executable, "-c", code, src], env=env, capture_output=True,
                                 text=True, check=True)
            res.append(json.loads(out.stdout.strip().splitlines()[-1]))
    (c_cached, c_total, c_compile), (w_cached, w_total, _) = res
    assert not c_cached and w_cached, res
    return c_total, c_compile, w_total




def call_overhead(args) -> list:
    """Host time per call of one small kernel (1024 float32 elements, out = 2 * x) through
    each way of calling it, and ATen's x * 2 for reference."""
    import torch_axon.kernel as K
    # examples/kernel_api/scale.cpp (docs/kernels.md's quick start): out = alpha * x
    lib = K.load("bench_call_overhead", sources=[REPO / "examples" / "kernel_api" / "scale.cpp"])
    native = lib.op("axon_bench::scale_native(Tensor x, float alpha) -> Tensor", kernel="scale")

    @torch.library.custom_op("axon_bench::scale_custom", mutates_args=(), device_types="axon")
    def custom(x: torch.Tensor, alpha: float) -> torch.Tensor:
        out = torch.empty_like(x)
        lib.scale(x, out, floats=(alpha,), written=(1,), name="axon_bench::scale_custom")
        return out

    @custom.register_fake
    def _(x, alpha):
        return torch.empty_like(x)

    def direct(x, alpha):
        out = torch.empty_like(x)
        lib.scale(x, out, floats=(alpha,), written=(1,))
        return out

    x = torch.randn(1024, device=DEV)
    variants = {
        "native op (lib.op, C++ dispatch)": lambda: native(x, 2.0),
        "torch.library.custom_op (Python)": lambda: custom(x, 2.0),
        "direct launch (KernelFunction)": lambda: direct(x, 2.0),
        "ATen x * 2 (reference)": lambda: x * 2.0,
    }
    n = 300 if args.quick else 3000
    times = {k: [] for k in variants}
    for _ in range(args.repeats):
        for k, fn in variants.items():
            times[k].append(time_per_call(fn, DEV, n, args.warmup * 10))
    ref = median(times["ATen x * 2 (reference)"])
    return [[k, fmt_time(median(v)), f"{median(v) / ref:.2f}x"] for k, v in times.items()]


def main() -> None:
    p = make_parser(__doc__, quick="small shapes and short timings (a smoke run)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--min-time", type=float, default=0.2, help="seconds of calls per measurement")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--tokens", type=int, default=None, help="rows of the Llama-sized cases (512)")
    p.add_argument("--vit-batch", type=int, default=1)
    p.add_argument("--llama-tokens", type=int, default=None, help="prompt of the Llama row (128)")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--overhead-only", action="store_true",
                   help="only the per-call table (native op, custom op, direct launch)")
    args = p.parse_args()
    if args.tokens is None:
        args.tokens = 64 if args.quick else 512
    if args.llama_tokens is None:
        args.llama_tokens = 32 if args.quick else 128
    global ORIGINAL_ROPE
    from transformers.models.llama import modeling_llama
    ORIGINAL_ROPE = modeling_llama.apply_rotary_pos_emb  # (nothing has kernelized it yet)
    if args.quick:
        args.repeats, args.min_time, args.warmup = 1, 0.02, 1
    print_header("Shipped hub kernels vs the same modules on axon (eager, torch.compile)", args)

    act = hf_kernels.get_local_kernel(REPOS / "axon-activation")
    ln = hf_kernels.get_local_kernel(REPOS / "axon-layernorm")
    rot = hf_kernels.get_local_kernel(REPOS / "axon-rotary")
    vit = hf_kernels.get_local_kernel(REPOS / "axon-vit")

    rows = []
    for dtype in (parse_dtype(d) for d in ([] if args.overhead_only else args.dtypes.split(","))):
        for name, shape, eager, kernel, compilable in cases(args, dtype, act, ln, rot, vit):
            with torch.no_grad():
                ref, got = eager(), kernel()
            ref = ref[0] if isinstance(ref, tuple) else ref
            got = got[0] if isinstance(got, tuple) else got
            err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()
            variants = {"eager": eager, "kernel": kernel}
            if compilable and not args.no_compile:
                torch._dynamo.reset()
                variants["compiled"] = compiled(eager)
            t = measure(variants, args.repeats, args.min_time, args.warmup)
            tc = t.get("compiled")
            rows.append([name, dtype_name(dtype), shape, fmt_time(t["eager"]),
                         fmt_time(tc) if tc else "-", fmt_time(t["kernel"]),
                         f"{t['eager'] / t['kernel']:.2f}x",
                         f"{tc / t['kernel']:.2f}x" if tc else "-", f"{err:.1e}"])
            print("  " + " | ".join(rows[-1]), flush=True)
    if rows:
        print()
        print_table(["kernel", "dtype", "shape", "eager", "compiled", "kernel", "x eager",
                     "x compiled", "max rel diff"], rows, align=["l", "l", "l"] + ["r"] * 6)

    print_table(["call of a small kernel (1024 fp32)", "per call", "x ATen"],
                call_overhead(args), align=["l", "r", "r"])

    if args.overhead_only:
        return
    cold, compile_s, warm = jit_times()
    print_table(["JIT build of a small kernel", "load() time", "compiler"],
                [["cold (empty cache, new process)", fmt_time(cold), fmt_time(compile_s)],
                 ["warm (cached, new process)", fmt_time(warm), "-"]])


if __name__ == "__main__":
    main()
