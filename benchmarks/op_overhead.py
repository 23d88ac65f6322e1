"""Per-op host overhead: a loop of small ops, axon vs cpu, side by side.

    .venv/bin/python benchmarks/op_overhead.py [--iters 3000] [--repeats 7]

Prints the median time per op over several repetitions and the axon/cpu ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

CASES = {
    "x + 1 (1K fp32)": lambda x: x + 1,
    "x * y (1K fp32)": lambda x: x * x,
    "x.sum() (1K fp32)": lambda x: x.sum(),
    "x.view(32, 32).t().contiguous()": lambda x: x.view(32, 32).t().contiguous(),
}


def time_per_op(fn, device: str, iters: int) -> float:
    x = torch.randn(1024, device=device)
    for _ in range(100):
        fn(x)
    sync = torch.axon.synchronize if device == "axon" else (lambda: None)
    sync()
    t = time.perf_counter()
    for _ in range(iters):
        fn(x)
    sync()
    return (time.perf_counter() - t) / iters * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=3000)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    print("command:", " ".join([sys.executable.split("/")[-1], *sys.argv]))
    print(f"{'op':<34}{'cpu us':>10}{'axon us':>10}{'axon/cpu':>10}")
    for name, fn in CASES.items():
        cpu, axon = [], []
        for _ in range(args.repeats):  # interleaved, so noise hits both alike
            cpu.append(time_per_op(fn, "cpu", args.iters))
            axon.append(time_per_op(fn, "axon", args.iters))
        c, a = statistics.median(cpu), statistics.median(axon)
        print(f"{name:<34}{c:>10.2f}{a:>10.2f}{a / c:>10.2f}")


if __name__ == "__main__":
    main()
