"""Per-op host overhead: a loop of small ops, axon vs cpu, side by side.

    .venv/bin/python benchmarks/op_overhead.py [--iters 3000] [--repeats 7]
    .venv/bin/python benchmarks/op_overhead.py --quick          # 300 ops, 3 repeats: seconds

Each op runs on a 1024-element float32 tensor made on the device. One repetition: 100
untimed calls, then --iters calls timed from a drained device to torch.axon.synchronize()
after the last (so the slower of host and stream sets the pace). Repetitions alternate
cpu, axon, cpu, axon, ...; the table shows the median time per op over --repeats
repetitions and the ratio axon / cpu (< 1: axon faster).
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

CASES = {
    "x + 1 (1K fp32)": lambda x: x + 1,
    "x * x (1K fp32)": lambda x: x * x,
    "x.sum() (1K fp32)": lambda x: x.sum(),
    "x.view(32, 32).t().contiguous()": lambda x: x.view(32, 32).t().contiguous(),
}


def main() -> None:
    p = C.make_parser(__doc__, quick="300 ops per repetition, 3 repetitions: a smoke run")
    p.add_argument("--iters", type=int, default=None, help="timed ops per repetition (3000; quick 300)")
    p.add_argument("--repeats", type=int, default=None, help="repetitions per device (7; quick 3)")
    args = p.parse_args()
    C.resolve_defaults(args, dict(iters=(300, 3000), repeats=(3, 7)))
    C.print_header("op_overhead: per-op host overhead, axon vs cpu", args)

    rows = []
    for name, fn in CASES.items():
        def measure(device: str, r: int) -> float:
            x = torch.randn(1024, device=device)
            return C.time_per_call(lambda: fn(x), device, args.iters, warmup=100)
        # no pause between sides (C.settle): these ops are below OpenMP's grain
        times = C.alternate(measure, args.repeats, settled=False)
        c, a = C.median(times["cpu"]) * 1e6, C.median(times["axon"]) * 1e6
        rows.append([name, f"{c:.2f}", f"{a:.2f}", f"{a / c:.2f}"])
    C.print_table(["op", "cpu us", "axon us", "axon/cpu"], rows)
    print(f"median of {args.repeats} repetitions of {args.iters} ops per device, each timed to a final "
          f"synchronize after 100 untimed ops.")


if __name__ == "__main__":
    main()
