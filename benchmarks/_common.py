"""Shared helpers of the benchmark scripts: machine record, arguments, timing, tables, model.

Not a benchmark itself. Every script prints, before its results, the machine record
(``print_header``: command, date, commit, CPU model and ISA flags, cores, memory and a
copy bandwidth measured in the same run, torch threads), builds its options with
``make_parser``/``resolve_defaults``, times with ``timed``/``time_per_call`` in rounds that
alternate the devices (``alternate``), reports medians (``median``), and prints its results
as markdown tables (``print_table``) that can be pasted into BENCHMARKS.md with the record.
"""

from __future__ import annotations

import argparse
import contextlib
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


def _lscpu() -> dict[str, str]:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    fields = {}
    for line in out.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            fields[k.strip()] = v.strip()
    return fields


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                if fields:
                    break
                continue
            if ":" in line:
                k, v = line.split(":", 1)
                fields.setdefault(k.strip(), v.strip())
    except OSError:
        pass
    return fields


def cpu_model() -> str:
    """Model name, and family/model/stepping when the name alone is generic ("AMD EPYC" in a VM)."""
    info = _cpuinfo()
    name = info.get("model name") or _lscpu().get("Model name") or platform.processor() or platform.machine()
    fms = [info.get(k) for k in ("cpu family", "model", "stepping")]
    if all(fms):
        name += f" (family {fms[0]}, model {fms[1]}, stepping {fms[2]})"
    return name


# The ISA extensions our kernels and the CPU's libraries (oneDNN, MKL) choose between.
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile")


def isa_flags() -> dict[str, bool]:
    flags = set(_cpuinfo().get("flags", "").split())
    return {f: f in flags for f in ISA_FLAGS}


def caches() -> str:
    """'L2 2 MiB (2 instances), L3 32 MiB (1 instance)' from lscpu, or ''."""
    info = _lscpu()
    return ", ".join(f"{k.split()[0]} {info[k]}" for k in ("L2 cache", "L3 cache") if info.get(k))


def mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


# Beyond every cache; and above glibc's 32 MiB ceiling for its dynamic mmap threshold, so
# allocating and freeing it leaves the CPU allocator's behaviour (which the cpu figures of
# train_step.py depend on, see --malloc-reuse) as it was.
BANDWIDTH_BYTES = 256 << 20


def copy_bandwidth(threads: int, nbytes: int = BANDWIDTH_BYTES, reps: int = 5) -> float:
    """Bytes copied per second by ``dst.copy_(src)`` of ``nbytes`` (beyond every cache) on
    ``threads`` torch threads, median of ``reps``: each byte is read once and written once."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        src = torch.ones(nbytes // 4)
        dst = torch.empty_like(src)
        dst.copy_(src)  # the pages exist before the clock starts
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t)
        return nbytes / statistics.median(times)
    finally:
        torch.set_num_threads(saved)


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
        return f"torch_axon._C built {mtime.strftime('%Y-%m-%d %H:%M %Z')}"
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


def machine_record(bandwidth: bool = True) -> dict[str, str]:
    """What a benchmark figure depends on besides the code: the machine record printed at the
    top of every benchmark (and copied into BENCHMARKS.md with its table). One entry a line:

        command:   the exact command line (interpreter, script, arguments)
        date:      local date and time of the run
        commit:    git HEAD (+local changes), and when the loaded extension was built
        cpu:       model name (family/model/stepping), cores usable/online, architecture
        isa:       avx2, avx512f, avx512_bf16, avx512_fp16, amx_tile: yes/no each
        memory:    total; L2/L3 sizes
        bandwidth: torch copy_ of 256 MiB, 1 thread and all threads, measured in this run
        torch:     version, threads, axon device count
    """
    online = os.cpu_count()
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = online
    mem = mem_total_gib()
    rec = {
        "command": command_line(),
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "commit": f"{git_commit()}, {axon_build()}",
        "cpu": (f"{cpu_model()}, {usable} cores"
                + (f" ({online} online)" if usable != online else "")
                + f", {platform.machine()}, {platform.system()}"),
        "isa": ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in isa_flags().items()),
        "memory": ", ".join(x for x in ((f"{mem:.1f} GiB" if mem else ""), caches()) if x),
    }
    if bandwidth:
        threads = torch.get_num_threads()
        one = copy_bandwidth(1)
        text = f"{one / 1e9:.1f} GB/s on 1 thread"
        if threads > 1:
            text += f", {copy_bandwidth(threads) / 1e9:.1f} GB/s on {threads} threads"
        rec["bandwidth"] = (f"{text} (torch copy_ of {BANDWIDTH_BYTES >> 20} MiB, median of 5; "
                            f"bytes copied per second, each read once and written once)")
    rec["torch"] = (f"{torch.__version__}, {torch.get_num_threads()} threads (torch.get_num_threads()), "
                    f"axon: {torch.axon.device_count()} device(s)")
    return rec


def print_header(title: str, args=None) -> None:
    """The title, the machine record (machine_record) and the options, before any result."""
    print(f"# {title}")
    for k, v in machine_record().items():
        print(f"{k + ':':<11}{v}")
    mmap = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    print("malloc:    " + (f"MALLOC_MMAP_THRESHOLD_={mmap} (cpu temporaries reuse the heap)" if mmap else
                           "glibc default (large cpu temporaries are mmapped and page-faulted on every "
                           "call; axon has a caching allocator; --malloc-reuse to level that)"))
    if args is not None:
        print("options:   " + ", ".join(f"{k}={v}" for k, v in sorted(vars(args).items())))
    print(flush=True)


# ---------------------------------------------------------------- arguments


def make_parser(doc: str, quick: str | None = None) -> argparse.ArgumentParser:
    """An ArgumentParser whose description is the script docstring's first line and whose
    --help ends with the whole docstring; ``quick``: the help of a --quick smoke-run option."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc)
    if quick is not None:
        p.add_argument("--quick", action="store_true", help=quick)
    return p


def resolve_defaults(args, defaults: dict[str, tuple]) -> None:
    """Options left at None take defaults[name] = (value with --quick, value without)."""
    quick = getattr(args, "quick", False)
    for k, (q, full) in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, q if quick else full)


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


# ---------------------------------------------------------------- kernel selection modes

SELECT_HELP = ("axon's kernel-selection modes to time side by side, comma-separated, each "
               "KERNEL[/THREADS] with KERNEL own|library|auto and THREADS worker|team|auto "
               "(csrc/aten/KernelSelect.h: own = axon's kernels, library = ATen's CPU kernels as "
               "stream work, worker / team = the stream worker alone / its thread team, auto = "
               "as measured on this machine); default auto")


def add_select_arg(p) -> None:
    p.add_argument("--select", default="auto", help=SELECT_HELP)


def parse_select(p, args) -> None:
    """args.select: the list of modes; p.error on a bad one."""
    modes = [m.strip() for m in str(args.select).split(",") if m.strip()]
    for m in modes:
        kernel, _, threads = m.partition("/")
        if kernel not in ("own", "library", "auto") or threads not in ("", "worker", "team", "auto"):
            p.error(f"--select: expected KERNEL[/THREADS] (own|library|auto, worker|team|auto), "
                    f"got {m!r}")
    args.select = modes or ["auto"]


def select_variants(args) -> list[str]:
    """cpu, then axon once per --select mode ("axon" alone for the default auto)."""
    if args.select == ["auto"]:
        return ["cpu", "axon"]
    return ["cpu"] + [f"axon:{m}" for m in args.select]


def device_of(variant: str) -> str:
    return variant.split(":")[0]


def set_select(variant: str) -> None:
    """Sets variant's kernel-selection mode (axon:own/worker ...); "" (any other variant): the
    environment's. Takes effect for later launches."""
    kernel, _, threads = variant.split(":", 1)[1].partition("/") if ":" in variant else ("", "", "")
    torch.ops.axon._set_kernel_select(kernel)
    torch.ops.axon._set_kernel_threads(threads or ("auto" if kernel else ""))


@contextlib.contextmanager
def selected(variant: str):
    """Runs the body in variant's kernel-selection mode."""
    set_select(variant)
    try:
        yield
    finally:
        set_select("")


# ---------------------------------------------------------------- timing


def sync(device: str) -> None:
    if device.startswith("axon"):
        torch.axon.synchronize(device)


# A pause before each side's measurement: after a CPU op, OpenMP's threads (libgomp's) spin on
# the cores for milliseconds waiting for the next parallel region, and a side measured right
# after another would share the cores with them (measured 2026-12-04 on a 2-core AMD EPYC: axon's
# x + y [8, 256, 768] ran at 0.8x the CPU's right after the CPU's calls, 1.0x after this pause).
# Not for ops below OpenMP's grain (op_overhead.py: no OpenMP thread spins after them): after a
# pause there, axon's x * x took 2.3 instead of 1.4 us per op over 3000 ops, in most runs on the
# same machine (host thread and stream worker on one core, or the idle vCPUs placed elsewhere:
# not understood yet).
SETTLE_S = 0.02


def settle() -> None:
    """Lets the previous measurement's threads (OpenMP's spinning workers, axon's team) go idle."""
    time.sleep(SETTLE_S)


def timed(fn: Callable[[], object], device: str) -> float:
    """Seconds for fn(), with the device drained before the clock starts and stops."""
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def time_per_call(fn: Callable[[], object], device: str, iters: int, warmup: int = 0) -> float:
    """Seconds per call of ``iters`` calls of fn in a row, after ``warmup`` untimed calls; the
    device is drained before the clock starts and before it stops."""
    for _ in range(warmup):
        fn()
    sync(device)
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    sync(device)
    return (time.perf_counter() - t) / iters


def alternate(measure: Callable[[str, int], object], repeats: int, devices: Sequence[str] = DEVICES,
              fallback: FallbackCounter | None = None,
              progress: Callable[[int, dict], None] | None = None,
              settled: bool = True) -> dict[str, list]:
    """``repeats`` rounds of measure(device, round) for each device in turn (cpu, axon, cpu, axon, ...),
    each after ``settle()`` unless not ``settled``, so that a shared machine's drifts hit every
    device alike; the lists of results per device (take their median). ``devices`` may name
    other variants measured in turn (eager and compiled). Axon measurements run inside
    ``fallback`` when given, which counts the ops that ran through the CPU fallback;
    progress(round, results) after each round."""
    out: dict[str, list] = {d: [] for d in devices}
    for r in range(repeats):
        for d in devices:
            if settled:
                settle()
            with fallback if (fallback is not None and device_of(d) == "axon") else contextlib.nullcontext():
                out[d].append(measure(d, r))
        if progress is not None:
            progress(r, out)
    return out


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
