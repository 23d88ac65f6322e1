"""Shared helpers of the benchmark scripts: machine header, timing, tables, model config.

Not a benchmark itself. Every script prints, before its results, the exact command,
the machine, the thread count and the date (``print_header``), and its results as a
markdown table (``print_table``) that can be pasted into BENCHMARKS.md.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch

REPO = Path(__file__).resolve().parent.parent
DEVICES = ("cpu", "axon")


# ---------------------------------------------------------------- environment


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.strip().startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or platform.machine()


def mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + (" (+local changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def axon_build() -> str:
    """When the loaded axon extension was built (the working tree may be ahead of the commit)."""
    try:
        import torch_axon._C as ext
        mtime = datetime.datetime.fromtimestamp(os.path.getmtime(ext.__file__)).astimezone()
        return f"torch_axon._C built {mtime.strftime('%Y-%m-%d %H:%M')}"
    except (ImportError, OSError, AttributeError):
        return "torch_axon._C build time unknown"


def command_line() -> str:
    exe = sys.executable
    try:
        exe = os.path.relpath(exe, Path.cwd()) if exe.startswith(str(Path.cwd())) else exe
    except ValueError:
        pass
    script = sys.argv[0]
    try:
        script = os.path.relpath(script) if not os.path.relpath(script).startswith("..") else script
    except ValueError:
        pass
    return " ".join(shlex.quote(a) for a in [exe, script, *sys.argv[1:]])


def print_header(title: str, args=None) -> None:
    mem = mem_total_gib()
    print(f"# {title}")
    print(f"command:  {command_line()}")
    print(f"date:     {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"machine:  {cpu_model()}, {os.cpu_count()} cores"
          + (f", {mem:.0f} GiB" if mem else "") + f", {platform.machine()}, {platform.system()}")
    print(f"torch:    {torch.__version__}, {torch.get_num_threads()} threads "
          f"(torch.get_num_threads()), axon: {torch.axon.device_count()} device(s), "
          f"commit {git_commit()}, {axon_build()}")
    mmap = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    print("malloc:   " + (f"MALLOC_MMAP_THRESHOLD_={mmap} (cpu temporaries reuse the heap)" if mmap else
                          "glibc default (large cpu temporaries are mmapped and page-faulted on every "
                          "call; axon has a caching allocator; --malloc-reuse to level that)"))
    if args is not None:
        print("options:  " + ", ".join(f"{k}={v}" for k, v in sorted(vars(args).items())))
    print(flush=True)


MALLOC_REUSE_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**32), "MALLOC_TRIM_THRESHOLD_": str(2**36)}


def add_common_args(p) -> None:
    p.add_argument("--malloc-reuse", action="store_true",
                   help="restart with glibc malloc never mmapping/trimming, so cpu eager reuses "
                        "freed memory like axon's caching allocator (no page faults per call)")


def apply_malloc_reuse(args) -> None:
    """--malloc-reuse: re-exec this process with MALLOC_REUSE_ENV (read by glibc at start)."""
    if getattr(args, "malloc_reuse", False) and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC_REUSE_ENV})


# ---------------------------------------------------------------- timing


def sync(device: str) -> None:
    if device == "axon":
        torch.axon.synchronize()


def timed(fn: Callable[[], object], device: str) -> float:
    """Seconds for fn(), with the device drained before the clock starts and stops."""
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


class FallbackCounter:
    """Accumulates torch.axon.fallback_stats() over several measured windows."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def __enter__(self):
        torch.axon.reset_fallback_stats()
        return self

    def __exit__(self, *exc):
        self.counts.update(torch.axon.fallback_stats())
        torch.axon.reset_fallback_stats()

    def summary(self, per: float = 1.0, limit: int | None = None) -> str:
        """'op xN, op xM' with the counts divided by ``per`` (e.g. calls per step)."""
        if not self.counts:
            return "none (all native)"
        items = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))
        shown = items if limit is None else items[:limit]

        def fmt(n: float) -> str:
            v = n / per
            return f"{v:.0f}" if abs(v - round(v)) < 0.05 else f"{v:.1f}"
        text = ", ".join(f"{k.removeprefix('aten::')} x{fmt(v)}" for k, v in shown)
        if limit is not None and len(items) > limit:
            text += f", ... ({len(items) - limit} more)"
        return text


def profile_axon(fn: Callable[[], object], title: str, rows: int = 15, calls: int = 3) -> None:
    """torch.profiler over ``calls`` calls of fn on axon: top ops by self CPU time."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    sync("axon")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        sync("axon")
    print(f"\n## profile (axon): {title}, {calls} call(s), top {rows} ops by self CPU time")
    print("(host-side view. An op that runs through the fallback appears twice: the axon op, whose "
          "self time is the fallback's overhead, and the CPU kernel it calls. Ops that run "
          "asynchronously on the axon stream show only their launch cost; their run time lands "
          "where the host waits: aten::_local_scalar_dense (.item()), copies to cpu, synchronize.)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


# ---------------------------------------------------------------- output


def print_table(headers: Sequence[str], rows: Iterable[Sequence[object]],
                align: Sequence[str] | None = None) -> None:
    """A markdown table; align: one of 'l'/'r' per column (default: first l, rest r)."""
    rows = [[str(c) for c in r] for r in rows]
    align = align or ["l"] + ["r"] * (len(headers) - 1)
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) if a == "l" else c.rjust(w)
                                 for c, w, a in zip(cells, widths, align)) + " |"
    print(line(headers))
    print("| " + " | ".join(("-" * (w - 1) + ":") if a == "r" else "-" * w
                            for w, a in zip(widths, align)) + " |")
    for r in rows:
        print(line(r))
    print(flush=True)


def fmt_time(seconds: float) -> str:
    """Time per call in the most readable unit."""
    if seconds != seconds:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_num(x: float | None, digits: int = 1) -> str:
    if x is None or x != x:
        return "-"
    return f"{x:,.{digits}f}"


DTYPES = {"float32": torch.float32, "fp32": torch.float32,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise SystemExit(f"unknown dtype {name!r}; one of {', '.join(DTYPES)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


# ---------------------------------------------------------------- the model

# A ~56M-parameter Llama: hidden 512, 8 layers, 8 heads (head_dim 64), 4 kv heads,
# SwiGLU 1408, vocab 32000, untied embeddings (2 x 16.4M of the 56M).
LLAMA = dict(hidden=512, layers=8, heads=8, kv_heads=4, intermediate=1408, vocab=32000)
LLAMA_QUICK = dict(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=352, vocab=1024)


def add_model_args(p, defaults: dict = LLAMA) -> None:
    g = p.add_argument_group("model (LlamaConfig, random init)")
    g.add_argument("--hidden", type=int, default=None, help=f"hidden size ({defaults['hidden']})")
    g.add_argument("--layers", type=int, default=None, help=f"decoder layers ({defaults['layers']})")
    g.add_argument("--heads", type=int, default=None, help=f"attention heads ({defaults['heads']})")
    g.add_argument("--kv-heads", type=int, default=None, help=f"key/value heads ({defaults['kv_heads']})")
    g.add_argument("--intermediate", type=int, default=None,
                   help=f"MLP intermediate size ({defaults['intermediate']})")
    g.add_argument("--vocab", type=int, default=None, help=f"vocabulary ({defaults['vocab']})")


def model_dims(args) -> dict:
    """The model sizes: --quick picks LLAMA_QUICK, explicit options override."""
    dims = dict(LLAMA_QUICK if getattr(args, "quick", False) else LLAMA)
    for k in dims:
        v = getattr(args, k, None)
        if v is not None:
            dims[k] = v
    return dims


def llama_param_shapes(hidden: int, layers: int, heads: int, kv_heads: int,
                       intermediate: int, vocab: int) -> list[tuple[int, ...]]:
    """Parameter shapes of LlamaForCausalLM (untied), without importing transformers."""
    head_dim = hidden // heads
    shapes: list[tuple[int, ...]] = [(vocab, hidden)]
    for _ in range(layers):
        shapes += [(heads * head_dim, hidden), (kv_heads * head_dim, hidden),
                   (kv_heads * head_dim, hidden), (hidden, heads * head_dim),
                   (intermediate, hidden), (intermediate, hidden), (hidden, intermediate),
                   (hidden,), (hidden,)]
    shapes += [(hidden,), (vocab, hidden)]
    return shapes


def llama_config(dims: dict, max_positions: int = 2048):
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=dims["vocab"], hidden_size=dims["hidden"],
                       intermediate_size=dims["intermediate"], num_hidden_layers=dims["layers"],
                       num_attention_heads=dims["heads"], num_key_value_heads=dims["kv_heads"],
                       max_position_embeddings=max_positions, tie_word_embeddings=False,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0)


def describe_dims(dims: dict) -> str:
    return (f"Llama hidden {dims['hidden']}, {dims['layers']} layers, {dims['heads']} heads, "
            f"{dims['kv_heads']} kv heads, intermediate {dims['intermediate']}, vocab {dims['vocab']}")


def build_models(dims: dict, dtype: torch.dtype, seed: int, max_positions: int = 2048):
    """The same randomly initialised LlamaForCausalLM on cpu and on axon."""
    import copy

    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    cpu_model = LlamaForCausalLM(llama_config(dims, max_positions)).to(dtype)
    axon_model = copy.deepcopy(cpu_model).to("axon")
    return {"cpu": cpu_model, "axon": axon_model}
