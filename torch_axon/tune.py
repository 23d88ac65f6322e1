"""The axon device's kernel selection and thread policy tables (csrc/aten/KernelSelect.h).

For ops where axon has a kernel of its own (kernels/) and ATen has a CPU kernel
(MKL, oneDNN), the device runs whichever measured faster on this machine, on the
stream worker alone or on its thread team, per (op, dtype, shape class, layout).  A
shape class is the ceil(log2) bucket of each dimension that matters (linear: m, k, n;
softmax and norms: rows, cols; attention: batch*heads, q, kv, head dim), shown as its
upper bound ("k<=512" holds 257..512).  Every other kernel runs on the worker or the
team as timed trials of its first launches decided, per (kernel, class of bytes).
Both tables live in
``${AXON_CACHE_DIR:-~/.cache/torch_axon}/kernel_select-<machine hash>.json``.

    python -m torch_axon.tune            # print the table
    python -m torch_axon.tune --run      # measure the standard shapes, then print
    python -m torch_axon.tune --clear    # delete this machine's table

``--run`` measures the shapes of the ~56M-parameter Llama of benchmarks/generate.py
(hidden 512, intermediate 1408, vocab 32000, 8 heads of 64): decode at batch 1 and 8
and a 128-token prefill (linear, norms, softmax, attention, forward and backward, and
a few elementwise kernels for the thread policy), in float32, bfloat16 and float16.
AXON_KERNEL_SELECT=own|library|auto (default auto) forces a kernel,
AXON_KERNEL_THREADS=worker|team|auto (default auto) the threads;
AXON_KERNEL_SELECT_CACHE=0 keeps the tables in memory only.  A close call (the
runner-up within 1.5x) with fewer than 3 recorded measurements is measured again by the
next process, which keeps each side's minimum ("measured runs"): a busy machine's one
slow measurement does not decide it for good.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

HIDDEN, INTERMEDIATE, VOCAB, HEADS, HEAD_DIM = 512, 1408, 32000, 8, 64
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
COLUMNS = ("op", "dtype", "shape class", "layout", "choice", "threads", "source",
           "own/worker us", "own/team us", "library/worker us", "library/team us", "own runs",
           "library runs", "measured runs")
THREAD_COLUMNS = ("kernel", "bytes", "threads", "source", "worker us", "team us",
                  "worker runs", "team runs", "measured runs")


def _C():
    import torch_axon  # noqa: F401  (registers the device)
    from torch_axon import _C
    return _C


def table() -> list[tuple]:
    """The rows (op, dtype, shape class, layout, choice, threads, source, own/worker us,
    own/team us, library/worker us, library/team us, own runs, library runs, measurements:
    how many processes measured the times, each keeping the minimum); times are -1 where
    not measured, inf where ATen's kernel failed."""
    return [tuple(r) for r in _C()._kernel_select_table()]


def thread_table() -> list[tuple]:
    """The rows (kernel, class of bytes its tensors hold, threads, source, worker us, team us,
    worker runs, team runs, measurements) of the thread policy."""
    return [tuple(r) for r in _C()._thread_policy_table()]


def path() -> str:
    """This machine's table file ('' when AXON_KERNEL_SELECT_CACHE=0)."""
    _C()
    return torch.ops.axon._kernel_select_path()


def _fmt_us(v: float) -> str:
    if v < 0:
        return "-"
    return "inf" if v == float("inf") else f"{v:.1f}"


def format_table(rows: list[tuple], columns: tuple = COLUMNS) -> str:
    times = {i for i, c in enumerate(columns) if c.endswith(" us")}
    right = times | {i for i, c in enumerate(columns) if c.endswith(" runs")}
    cells = [list(columns)] + [[_fmt_us(v) if i in times else str(v) for i, v in enumerate(r)]
                               for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.rjust(w) if i in right else c.ljust(w)
                               for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _run_standard(device: str = "axon") -> None:
    """One call of each op at the standard shapes; the first launch of each key measures."""
    F = torch.nn.functional
    g = torch.Generator().manual_seed(0)

    def rand(*shape, dtype, grad=False):
        t = torch.randn(shape, generator=g).to(dtype).to(device)
        return t.requires_grad_(grad)

    linears = [(HIDDEN, HIDDEN), (HIDDEN, INTERMEDIATE), (INTERMEDIATE, HIDDEN), (HIDDEN, VOCAB)]
    for dt in DTYPES:
        for batch in (1, 8):
            for k, n in linears:
                x, w = rand(batch, k, dtype=dt), rand(n, k, dtype=dt)
                F.linear(x, w)
                F.linear(x, w, rand(n, dtype=dt))
        # attention: a 128-token prefill (causal) and a decode step over 128 cached tokens,
        # forward and backward
        for batch in (1, 8):
            for q_len, causal in ((128, True), (1, False)):
                q = rand(batch, HEADS, q_len, HEAD_DIM, dtype=dt, grad=True)
                k = rand(batch, HEADS, 128, HEAD_DIM, dtype=dt, grad=True)
                v = rand(batch, HEADS, 128, HEAD_DIM, dtype=dt, grad=True)
                y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                y.backward(torch.ones_like(y))
        for rows in (1, 8, 128):
            x = rand(rows, HIDDEN, dtype=dt, grad=True)
            w = rand(HIDDEN, dtype=dt, grad=True)
            b = rand(HIDDEN, dtype=dt, grad=True)
            for y in (F.rms_norm(x, (HIDDEN,), w, 1e-6),
                      F.layer_norm(x, (HIDDEN,), w, b, 1e-5)):
                y.backward(torch.ones_like(y))
        # sampling over the vocabulary; attention scores of the prefill
        for shape in ((1, VOCAB), (8, VOCAB), (1, HEADS, 128, 128)):
            for fn in (torch.softmax, torch.log_softmax):
                x = rand(*shape, dtype=dt, grad=True)
                y = fn(x, dim=-1)
                y.backward(torch.ones_like(y))
        # elementwise kernels of a prefill (the thread policy's trials: a few launches each)
        for shape in ((128, HIDDEN), (128, INTERMEDIATE), (8, VOCAB)):
            x, y = rand(*shape, dtype=dt), rand(*shape, dtype=dt)
            for _ in range(10):  # the first runs at the call, untimed; a warm-up and 3 a side
                x * y
                x + y
                F.silu(x)
        torch.axon.synchronize()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_axon.tune",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--run", action="store_true", help="measure the standard shapes first")
    p.add_argument("--clear", action="store_true", help="delete this machine's table file")
    a = p.parse_args(argv)
    _C()
    file = path()
    if a.clear:
        if file and os.path.exists(file):
            os.remove(file)
            print(f"removed {file}")
        else:
            print(f"no table file{' at ' + file if file else ''}")
        torch.ops.axon._kernel_select_reset()
        if not a.run:
            return 0
    if a.run:
        for var, values in (("AXON_KERNEL_SELECT", ("own", "library")),
                            ("AXON_KERNEL_THREADS", ("worker", "team"))):
            mode = os.environ.get(var, "").strip().lower()
            if mode in values:
                print(f"{var}={mode}: only what it leaves open is measured", file=sys.stderr)
        _run_standard()
        torch.ops.axon._kernel_select_save()
    print(f"machine: {torch.ops.axon._kernel_select_machine()}")
    print(f"table:   {file or '(in memory only: AXON_KERNEL_SELECT_CACHE=0)'}")
    rows = table()
    print(format_table(rows) if rows else "(empty)")
    threads = thread_table()
    if threads:
        print()
        print("thread policy:")
        print(format_table(threads, THREAD_COLUMNS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
