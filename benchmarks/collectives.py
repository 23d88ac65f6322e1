"""Collectives: axon (ProcessGroupAxon, axon tensors) vs gloo (CPU tensors), side by side.

    .venv/bin/python benchmarks/collectives.py                 # 2 and 4 ranks, 8 KiB .. 256 MiB
    .venv/bin/python benchmarks/collectives.py --quick         # 2 ranks, 3 sizes, seconds
    .venv/bin/python benchmarks/collectives.py --ranks 2 --sizes 8K,32M --ops all_reduce

For each world size, ranks are spawned processes (rank r on axon:r) in one group
"cpu:gloo,axon:axon", so both backends run in the same processes, alternating
axon, gloo, axon, gloo ... for each (op, dtype, size).  One sample: a gloo
all_reduce of one element to line the ranks up, then the collective and (axon)
torch.axon.synchronize(), 20 times in a row for sizes up to 1 MiB (time / 20)
and once above; the clock is rank 0's.  Reported: the median over --reps
samples.

Size is the nccl-tests convention: the whole buffer (all_reduce, broadcast:
the tensor; all_gather: the output; reduce_scatter and all_to_all (single,
equal splits): the input).  Bus bandwidth (GB/s, 1e9) = size / time x 2(n-1)/n
for all_reduce, x (n-1)/n for all_gather, reduce_scatter and all_to_all, and x 1
for broadcast (from rank 0), so it compares across world sizes.  The physical reference is
the host's single-threaded memcpy bandwidth at the largest size (bytes copied
per second), measured in the same run.

Targets of issue 5: all_reduce at 32 MiB >= 10x gloo's bus bandwidth; the
largest all_reduce >= 50% of memcpy bandwidth; 8 KiB all_reduce latency <= 1/5
of gloo's.
"""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

sys.path.insert(0, str(C.REPO / "tests"))
from dist_util import run_ranks  # noqa: E402

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


def parse_size(s: str) -> int:
    s = s.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s.rstrip("KMG")) * mult)


def fmt_size(n: int) -> str:
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m:
            return f"{n // m} {unit}"
    return f"{n} B"


def bus_factor(op: str, n: int) -> float:
    if op == "broadcast":
        return 1.0
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def data(numel, dtype, device, rank):
    """Random normal values (seeded by rank), as gradients would be: this
    machine moves all-zero buffers measurably faster (256 MiB all_reduce, 2
    ranks: 14 vs 16 ms), so the data is not left to chance.  The in-place SUMs
    grow it by about the world size per call, so the ~300 calls of a small
    size end on infinities; float adds cost the same on them (x86 has no slow
    path for infinities, only for denormals), and large sizes make 6 calls."""
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(numel, generator=g).to(dtype).to(device)


def _rank_main(rank, world, ops, dtypes, sizes, reps_small, reps_large):
    import torch.distributed as dist

    dist.init_process_group("cpu:gloo,axon:axon", timeout=datetime.timedelta(minutes=10))
    dev = torch.device("axon", rank)
    results = []
    for op in ops:
        for dtype_name in dtypes:
            dtype = C.DTYPES[dtype_name]
            esize = torch.tensor([], dtype=dtype).element_size()
            for size in sizes:
                numel = max(world, size // esize // world * world)
                reps = reps_small if size <= (1 << 20) else reps_large
                bufs = {}
                for backend, device in (("axon", dev), ("gloo", torch.device("cpu"))):
                    if op in ("all_reduce", "broadcast"):
                        bufs[backend] = (data(numel, dtype, device, rank),)
                    elif op == "all_gather":
                        bufs[backend] = (torch.empty(numel, dtype=dtype, device=device),
                                         data(numel // world, dtype, device, rank))
                    elif op == "all_to_all":
                        bufs[backend] = (torch.empty(numel, dtype=dtype, device=device),
                                         data(numel, dtype, device, rank))
                    else:
                        bufs[backend] = (torch.empty(numel // world, dtype=dtype, device=device),
                                         data(numel, dtype, device, rank))

                def call(backend):
                    b = bufs[backend]
                    if op == "all_reduce":
                        dist.all_reduce(b[0])
                    elif op == "broadcast":
                        dist.broadcast(b[0], src=0)
                    elif op == "all_gather":
                        dist.all_gather_into_tensor(b[0], b[1])
                    elif op == "all_to_all":
                        dist.all_to_all_single(b[0], b[1])
                    else:
                        dist.reduce_scatter_tensor(b[0], b[1])
                    if backend == "axon":
                        torch.axon.synchronize()

                supported = {"axon": True, "gloo": True}
                for backend in ("axon", "gloo"):  # warm-up (and support check)
                    try:
                        call(backend)
                    except (RuntimeError, ValueError):
                        supported[backend] = False
                cpu_flag = torch.zeros(1)
                # Small sizes: one sample is `inner` back-to-back calls (each
                # complete before the next), so the skew the line-up leaves
                # between ranks is not counted as latency.
                inner = 20 if size <= (1 << 20) else 1

                def sample(backend, r):
                    dist.all_reduce(cpu_flag)  # gloo: line the ranks up
                    t = time.perf_counter()
                    for _ in range(inner):
                        call(backend)
                    return (time.perf_counter() - t) / inner
                times = C.alternate(sample, reps, devices=[b for b in ("axon", "gloo") if supported[b]])
                med = {b: C.median(times.get(b, [])) for b in ("axon", "gloo")}
                results.append((op, dtype_name, numel * esize, med["axon"], med["gloo"]))
                del bufs
    memcpy = None
    if rank == 0:
        from torch_axon.distributed import memcpy_bandwidth

        memcpy = memcpy_bandwidth(max(sizes), 5)
    dist.barrier()
    return results, memcpy


def main():
    p = C.make_parser(__doc__, quick="2 ranks, 8K/32M, all_reduce, float32")
    p.add_argument("--ranks", default="2,4", help="world sizes, comma separated")
    p.add_argument("--sizes", default="8K,64K,512K,4M,32M,256M")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--reps", type=int, default=15, help="samples per size up to 1 MiB")
    p.add_argument("--reps-large", type=int, default=5, help="samples per larger size")
    args = p.parse_args()
    if args.quick:
        args.ranks, args.sizes, args.ops, args.dtypes = "2", "8K,32M", "all_reduce", "float32"
        args.reps, args.reps_large = 9, 3
    C.print_header("Collectives: axon (shared memory, axon tensors) vs gloo (CPU tensors)", args)
    ranks = [int(r) for r in args.ranks.split(",")]
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    ops = args.ops.split(",")
    dtypes = args.dtypes.split(",")
    summary = {}
    memcpy_bw = None
    for world in ranks:
        print(f"## {world} ranks", flush=True)
        t0 = time.monotonic()
        out = run_ranks(_rank_main, world, ops, dtypes, sizes, args.reps, args.reps_large,
                        timeout=3600)
        results, memcpy = out[0]
        memcpy_bw = memcpy or memcpy_bw
        rows = []
        for op, dtype_name, nbytes, ta, tg in results:
            f = bus_factor(op, world)
            ba, bg = nbytes / ta * f / 1e9, nbytes / tg * f / 1e9
            rows.append([op, dtype_name, fmt_size(nbytes), C.fmt_time(ta), C.fmt_time(tg),
                         C.fmt_num(ba, 2), C.fmt_num(bg, 2), C.fmt_num(ba / bg if bg == bg else None, 1)])
            summary[(world, op, dtype_name, nbytes)] = (ta, tg, ba, bg)
        C.print_table(["op", "dtype", "size", "axon", "gloo", "axon GB/s", "gloo GB/s",
                       "axon/gloo"], rows)
        print(f"({time.monotonic() - t0:.0f} s)\n", flush=True)
    print(f"memcpy (1 thread, {fmt_size(max(sizes))}): {memcpy_bw / 1e9:.2f} GB/s\n")
    print("## Targets")
    for world in ranks:
        for dtype_name in dtypes:
            key = lambda n: (world, "all_reduce", dtype_name, n)  # noqa: E731
            nb = {k[3] for k in summary if k[:3] == (world, "all_reduce", dtype_name)}
            if not nb:
                continue
            big = max(nb)
            m32 = min(nb, key=lambda n: abs(n - (32 << 20)))
            m8 = min(nb, key=lambda n: abs(n - (8 << 10)))
            ta, tg, ba, bg = summary[key(m32)]
            print(f"{world} ranks {dtype_name}: all_reduce {fmt_size(m32)} bus bandwidth "
                  f"axon/gloo {ba / bg:.1f}x (target >= 10x)")
            ta, tg, ba, bg = summary[key(big)]
            print(f"{world} ranks {dtype_name}: all_reduce {fmt_size(big)} bus bandwidth "
                  f"{ba:.2f} GB/s = {100 * ba * 1e9 / memcpy_bw:.0f}% of memcpy (target >= 50%)")
            ta, tg, ba, bg = summary[key(m8)]
            print(f"{world} ranks {dtype_name}: all_reduce {fmt_size(m8)} latency "
                  f"{C.fmt_time(ta)} vs gloo {C.fmt_time(tg)} = 1/{tg / ta:.1f} (target <= 1/5)")


if __name__ == "__main__":
    main()
