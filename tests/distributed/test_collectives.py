"""The c10d backend "axon" (ProcessGroupAxon) on 2 and 4 ranks.

Every rank builds every rank's input from (rank, dtype, shape) with a seeded
CPU generator, so each rank computes the expected result of a collective on
the CPU itself (torch ops on the stacked inputs) and compares it with what
the collective returned on axon.  Tolerances: exact for data movement and
integers; for float reductions conftest's accumulation tolerances (axon
accumulates bfloat16/float16 in float32, the CPU reference sums in float32 and
rounds once, so they agree to the last bit or one unit).  Ranks must also agree
bit for bit with each other (checked by gathering results to every rank).

Each spawned run groups many checks: starting a process costs seconds.
"""

from __future__ import annotations

import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist

from conftest import tol
from dist_util import RankFailed, run_ranks

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
INTS = (torch.int32, torch.int64, torch.uint8)


def make(rank: int, dtype: torch.dtype, shape, salt: int = 0) -> torch.Tensor:
    """Rank `rank`'s input, on the CPU (deterministic, different per rank)."""
    g = torch.Generator().manual_seed(1000 * rank + 17 * salt + 1)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    hi = 7 if dtype == torch.uint8 else 1000
    return torch.randint(1 if dtype == torch.uint8 else -hi, hi, shape, generator=g).to(dtype)


def expected_reduce(inputs, op, dtype):
    """CPU reference of a reduction over ranks (float32 accumulation)."""
    acc_dtype = torch.float32 if dtype.is_floating_point else dtype
    x = torch.stack([t.to(acc_dtype) for t in inputs])
    if op == dist.ReduceOp.SUM:
        r = x.sum(0, dtype=acc_dtype)
    elif op == dist.ReduceOp.AVG:
        r = x.sum(0) / len(inputs)
    elif op == dist.ReduceOp.PRODUCT:
        r = x.prod(0, dtype=acc_dtype)
    elif op == dist.ReduceOp.MIN:
        r = x.min(0).values
    elif op == dist.ReduceOp.MAX:
        r = x.max(0).values
    elif op == dist.ReduceOp.BAND:
        r = inputs[0].clone()
        for t in inputs[1:]:
            r &= t
    elif op == dist.ReduceOp.BOR:
        r = inputs[0].clone()
        for t in inputs[1:]:
            r |= t
    elif op == dist.ReduceOp.BXOR:
        r = inputs[0].clone()
        for t in inputs[1:]:
            r ^= t
    else:
        raise AssertionError(op)
    return r.to(dtype)


def check(actual: torch.Tensor, expected: torch.Tensor, what: str, accum: bool = True):
    torch.testing.assert_close(actual.cpu(), expected, **tol(expected.dtype, accum),
                               msg=lambda m: f"{what}: {m}")


def same_on_all_ranks(t: torch.Tensor, what: str):
    world = dist.get_world_size()
    copies = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(copies, t)
    for r, c in enumerate(copies):
        assert torch.equal(c.cpu(), t.cpu()), f"{what}: rank {r} got different bits"


# ---------------------------------------------------------------- collectives


def _collectives(rank, world):
    dist.init_process_group(timeout=datetime.timedelta(seconds=60))
    assert dist.get_backend_config() in ("axon:axon", "axon")  # picked by PyTorch for axon
    dev = torch.device("axon", rank)
    n = world
    ran = []
    # Sizes: empty, small path, large path (reduce-scatter + all-gather over
    # several 4 MiB steps with a tail).
    sizes = [(0,), (5, 3), (1_300_007,)]

    # all_reduce: every op for every dtype.
    for dtype in FLOATS + INTS:
        ops = ([dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN,
                dist.ReduceOp.MAX] if dtype.is_floating_point else
               [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.BAND,
                dist.ReduceOp.BOR, dist.ReduceOp.BXOR])
        for shape in sizes:
            for i, op in enumerate(ops):
                if shape[0] > 1000 and op not in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
                    continue  # big sizes: two ops are enough (the same loop code)
                inputs = [make(r, dtype, shape, i) for r in range(n)]
                if op == dist.ReduceOp.PRODUCT:
                    inputs = [(x.float() * 0.5 + 1).to(dtype) for x in inputs]  # keep finite
                t = inputs[rank].to(dev)
                dist.all_reduce(t, op=op)
                check(t, expected_reduce(inputs, op, dtype), f"all_reduce {op} {dtype} {shape}")
                if shape[0] > 1000:
                    same_on_all_ranks(t, f"all_reduce {dtype} {shape}")
    ran.append("all_reduce")

    # A tensor viewed from a larger buffer (storage offset), and a complex one.
    base = torch.zeros(10, device=dev)
    view = base[3:7]
    view.copy_(torch.full((4,), float(rank + 1)))
    dist.all_reduce(view)
    assert base.cpu().tolist() == [0, 0, 0] + [n * (n + 1) / 2] * 4 + [0, 0, 0]
    c = torch.complex(torch.tensor([1.0, 2.0]), torch.tensor([float(rank), -1.0])).to(dev)
    dist.all_reduce(c)
    torch.testing.assert_close(c.cpu(), torch.complex(torch.tensor([n * 1.0, n * 2.0]),
                                                      torch.tensor([n * (n - 1) / 2, -n])))

    # Coalesced all_reduce (the coalescing manager's fast path).
    ts = [make(rank, torch.float32, (s,), 5).to(dev) for s in (3, 1000, 17)]
    with dist._coalescing_manager(device=dev):
        for t in ts:
            dist.all_reduce(t)
    for t, s in zip(ts, (3, 1000, 17)):
        check(t, expected_reduce([make(r, torch.float32, (s,), 5) for r in range(n)],
                                 dist.ReduceOp.SUM, torch.float32), "coalesced all_reduce")

    for dtype in FLOATS + (torch.int64, torch.bool):
        for shape in [(0,), (7, 5), (600_001,)]:
            inputs = [make(r, dtype, shape, 3) for r in range(n)]
            # broadcast from the last rank
            t = inputs[rank].to(dev)
            dist.broadcast(t, src=n - 1)
            check(t, inputs[n - 1], f"broadcast {dtype}", accum=False)
            # all_gather (list) and all_gather_into_tensor
            outs = [torch.empty(shape, dtype=dtype, device=dev) for _ in range(n)]
            dist.all_gather(outs, inputs[rank].to(dev))
            for r in range(n):
                check(outs[r], inputs[r], f"all_gather {dtype}", accum=False)
            flat = torch.empty((n * shape[0],) + shape[1:], dtype=dtype, device=dev)
            dist.all_gather_into_tensor(flat, inputs[rank].to(dev))
            check(flat, torch.cat(inputs), f"all_gather_into_tensor {dtype}", accum=False)
            # gather to rank 0, scatter from rank 0
            g = [torch.empty(shape, dtype=dtype, device=dev) for _ in range(n)] if rank == 0 else None
            dist.gather(inputs[rank].to(dev), g, dst=0)
            if rank == 0:
                for r in range(n):
                    check(g[r], inputs[r], f"gather {dtype}", accum=False)
            parts = [make(0, dtype, shape, 40 + r) for r in range(n)]
            out = torch.empty(shape, dtype=dtype, device=dev)
            dist.scatter(out, [p.to(dev) for p in parts] if rank == 0 else None, src=0)
            check(out, parts[rank], f"scatter {dtype}", accum=False)
            if dtype == torch.bool:
                continue
            # reduce to rank 1
            t = inputs[rank].to(dev)
            dist.reduce(t, dst=1, op=dist.ReduceOp.SUM)
            check(t, expected_reduce(inputs, dist.ReduceOp.SUM, dtype) if rank == 1
                  else inputs[rank], f"reduce {dtype}")
            # reduce_scatter (list) and reduce_scatter_tensor, SUM and AVG
            lists = [[make(r, dtype, shape, 60 + d) for d in range(n)] for r in range(n)]
            for op in ([dist.ReduceOp.SUM, dist.ReduceOp.AVG] if dtype.is_floating_point
                       else [dist.ReduceOp.SUM]):
                out = torch.empty(shape, dtype=dtype, device=dev)
                dist.reduce_scatter(out, [x.to(dev) for x in lists[rank]], op=op)
                check(out, expected_reduce([lists[r][rank] for r in range(n)], op, dtype),
                      f"reduce_scatter {op} {dtype} {shape}")
                out = torch.empty(shape, dtype=dtype, device=dev)
                dist.reduce_scatter_tensor(out, torch.cat(lists[rank]).to(dev), op=op)
                check(out, expected_reduce([lists[r][rank] for r in range(n)], op, dtype),
                      f"reduce_scatter_tensor {op} {dtype} {shape}")
    ran += ["broadcast", "all_gather", "gather", "scatter", "reduce", "reduce_scatter"]

    # PREMUL_SUM (FSDP2 uses it when the divide factor differs from the group size).
    t = make(rank, torch.float32, (1000,), 9).to(dev)
    out = torch.empty(1000 // n, device=dev)
    dist.reduce_scatter_tensor(out, t, op=dist._make_nccl_premul_sum(0.25))
    full = expected_reduce([make(r, torch.float32, (1000,), 9) for r in range(n)],
                           dist.ReduceOp.SUM, torch.float32) * 0.25
    check(out, full.chunk(n)[rank], "reduce_scatter PREMUL_SUM")
    # ... with a different factor on each rank (NCCL's semantics: each rank's input
    # times its own factor, then summed), a number or a device tensor.
    factors = [0.5 + r for r in range(n)]
    inputs = [make(r, torch.float32, (1000,), 10) for r in range(n)]
    want = sum(x * f for x, f in zip(inputs, factors))
    for form in ("number", "tensor"):
        f = factors[rank] if form == "number" else torch.tensor(factors[rank], device=dev)
        t = inputs[rank].to(dev)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(f))
        check(t, want, f"all_reduce PREMUL_SUM per-rank {form}")
        t = inputs[rank].to(dev)
        dist.reduce(t, dst=0, op=dist._make_nccl_premul_sum(f))
        check(t, want if rank == 0 else inputs[rank], f"reduce PREMUL_SUM per-rank {form}")
        out = torch.empty(1000 // n, device=dev)
        src = inputs[rank].to(dev)
        dist.reduce_scatter_tensor(out, src, op=dist._make_nccl_premul_sum(f))
        check(out, want.chunk(n)[rank], f"reduce_scatter_tensor PREMUL_SUM per-rank {form}")
        check(src, inputs[rank], "reduce_scatter_tensor PREMUL_SUM leaves its input")
        out = torch.empty(1000 // n, device=dev)
        dist.reduce_scatter(out, [c.to(dev) for c in inputs[rank].chunk(n)],
                            op=dist._make_nccl_premul_sum(f))
        check(out, want.chunk(n)[rank], f"reduce_scatter PREMUL_SUM per-rank {form}")

    # all_to_all_single: equal splits, uneven splits (rank r sends r + d + 1
    # rows to rank d), and the list form.
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        rows = [[r + d + 1 for d in range(n)] for r in range(n)]  # rows[src][dst]
        inputs = [make(r, dtype, (sum(rows[r]), 3), 7) for r in range(n)]
        out = torch.empty(sum(rows[s][rank] for s in range(n)), 3, dtype=dtype, device=dev)
        dist.all_to_all_single(out, inputs[rank].to(dev),
                               output_split_sizes=[rows[s][rank] for s in range(n)],
                               input_split_sizes=rows[rank])
        want = torch.cat([inputs[s].split(rows[s])[rank] for s in range(n)])
        check(out, want, f"all_to_all_single uneven {dtype}", accum=False)
        eq = [make(r, dtype, (4 * n, 2), 8) for r in range(n)]
        out = torch.empty(4 * n, 2, dtype=dtype, device=dev)
        dist.all_to_all_single(out, eq[rank].to(dev))
        check(out, torch.cat([eq[s].chunk(n)[rank] for s in range(n)]), "all_to_all_single",
              accum=False)
        outs = [torch.empty(rows[s][rank], 3, dtype=dtype, device=dev) for s in range(n)]
        dist.all_to_all(outs, [x.to(dev) for x in inputs[rank].split(rows[rank])])
        for s in range(n):
            check(outs[s], inputs[s].split(rows[s])[rank], "all_to_all list", accum=False)
    ran.append("all_to_all")

    # Point to point: a ring with send/recv, isend/irecv and batch_isend_irecv
    # of a message larger than the pair's ring buffer (both ranks send first).
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    for dtype in (torch.float32, torch.float16, torch.int32):
        big = make(rank, dtype, (700_000,), 11)
        recv = torch.empty_like(big, device=dev)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, big.to(dev), nxt),
                                       dist.P2POp(dist.irecv, recv, prv)])
        for q in reqs:
            q.wait()
        check(recv, make(prv, dtype, (700_000,), 11), "batch_isend_irecv", accum=False)
        small = make(rank, dtype, (33,), 12).to(dev)
        got = torch.empty_like(small)
        if rank % 2 == 0:
            dist.send(small, nxt)
            dist.recv(got, prv)
        else:
            dist.recv(got, prv)
            dist.send(small, nxt)
        check(got, make(prv, dtype, (33,), 12), "send/recv", accum=False)
        w = dist.isend(small, nxt)
        w2 = dist.irecv(got, prv)
        w.wait()
        w2.wait()
        check(got, make(prv, dtype, (33,), 12), "isend/irecv", accum=False)
    ran.append("p2p")

    # Objects (pickled into uint8 tensors on the current device).
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": rank, "x": [rank] * rank})
    assert objs == [{"rank": r, "x": [r] * r} for r in range(n)]
    lst = [f"from {rank}"] if rank == 0 else [None]
    dist.broadcast_object_list(lst, src=0)
    assert lst == ["from 0"]

    dist.barrier()
    ran.append("barrier")
    return ran


@pytest.mark.parametrize("world", [2, 4])
def test_collectives_match_cpu(world):
    results = run_ranks(_collectives, world, timeout=400)
    assert results == [results[0]] * world and "p2p" in results[0]


# ---------------------------------------------------------------- streams


def _large_collectives(rank, world):
    dist.init_process_group("axon", timeout=datetime.timedelta(seconds=60))
    dev = torch.device("axon", rank)
    from torch_axon import _C

    # Large collectives take the direct shared-memory paths on either thread:
    # the communication stream (async, or sync behind a busy stream) and the
    # calling thread (sync with idle streams).  Every element differs along
    # the tensor and across ranks, so a misplaced slice shows.
    count = 1_300_007
    base = torch.arange(count, dtype=torch.float32).remainder(1009)
    inputs = [base + 1000.0 * r for r in range(world)]
    want = sum(inputs)  # exact in float32: integers below 2^24
    chunk = count // world
    for mode in ("async", "busy", "idle"):
        big = inputs[rank].to(dev)
        bcast = inputs[rank].to(dev)
        gathered = torch.empty(world * count, device=dev)
        scattered = torch.empty(chunk, device=dev)
        if mode == "busy":
            _C._test_sleep_on_stream(rank, 50.0)
        else:
            torch.axon.synchronize()
        exchanged = torch.empty(chunk * world, device=dev)
        works = [dist.all_to_all_single(exchanged, big[:chunk * world],
                                        async_op=mode == "async"),
                 dist.all_reduce(big, async_op=mode == "async"),
                 dist.all_gather_into_tensor(gathered, big, async_op=mode == "async"),
                 dist.reduce_scatter_tensor(scattered, big[:chunk * world],
                                            async_op=mode == "async"),
                 dist.broadcast(bcast, src=world - 1, async_op=mode == "async")]
        for w in works:
            if w is not None:
                w.wait()
        assert torch.equal(exchanged.cpu(), torch.cat(
            [inputs[s][rank * chunk:(rank + 1) * chunk] for s in range(world)])), mode
        in_place = inputs[rank][:chunk * world].to(dev)
        dist.all_to_all_single(in_place, in_place)  # exchanges a copy of the input
        assert torch.equal(in_place.cpu(), exchanged.cpu()), mode
        assert torch.equal(big.cpu(), want), mode
        assert torch.equal(gathered.cpu(), want.repeat(world)), mode
        assert torch.equal(scattered.cpu(), want[rank * chunk:(rank + 1) * chunk] * world), mode
        assert torch.equal(bcast.cpu(), inputs[world - 1]), mode

    return True


@pytest.mark.parametrize("inline_bytes", [None, "0"])
def test_large_collectives_on_every_path(inline_bytes):
    """Large all_to_all_single, all_reduce, all_gather_into_tensor,
    reduce_scatter_tensor and broadcast (the direct shared-memory paths) against
    values computed on the CPU, async,
    sync behind a busy stream and sync with idle streams; with
    AXON_COMM_INLINE_BYTES=0 the idle-stream calls take the communication
    stream too (by default 2 ranks on this 2-core machine run them on the
    calling thread)."""
    env = {} if inline_bytes is None else {"AXON_COMM_INLINE_BYTES": inline_bytes}
    assert run_ranks(_large_collectives, 2, env=env) == [True, True]


def _stream_semantics(rank, world):
    dist.init_process_group("axon", timeout=datetime.timedelta(seconds=60))
    dev = torch.device("axon", rank)
    from torch_axon import _C

    # The collective is ordered after the kernel that produced its input, even
    # when that kernel is still queued behind a 300 ms sleep.
    x = torch.zeros(1000, device=dev)
    _C._test_sleep_on_stream(rank, 300.0)
    x.add_(rank + 1)
    t0 = time.monotonic()
    work = dist.all_reduce(x, async_op=True)
    issued = time.monotonic() - t0
    assert issued < 0.2, f"all_reduce(async_op=True) blocked the host for {issued:.3f} s"
    work.wait()  # orders the current stream; does not block the host
    assert x.cpu().eq(world * (world + 1) / 2).all()
    assert work.is_completed() and work.is_success()

    # The collective runs on a stream of its own: compute queued on the
    # current stream afterwards does not wait for a collective that waits for
    # a slow peer.
    y = torch.ones(10, device=dev)
    if rank == 1:
        time.sleep(0.3)
    w = dist.all_reduce(y, async_op=True)
    z = torch.arange(4, device=dev) * 2  # independent compute
    t0 = time.monotonic()
    z_cpu = z.cpu()
    compute_wait = time.monotonic() - t0
    w.wait()
    assert y.cpu().eq(world).all() and z_cpu.tolist() == [0, 2, 4, 6]
    if rank == 0:
        assert compute_wait < 0.25, f"compute waited {compute_wait:.3f} s for the collective"

    # The future: value is the output list, usable on the current stream.
    f = dist.all_reduce(torch.ones(3, device=dev), async_op=True).get_future()
    val = f.wait()
    assert val[0].cpu().tolist() == [world] * 3

    # A tensor freed right after an async collective is not reused before the
    # collective ran (record_stream on the communication stream).
    for _ in range(5):
        src = torch.full((1 << 18,), float(rank), device=dev)
        outs = torch.empty(world << 18, device=dev)
        h = dist.all_gather_into_tensor(outs, src, async_op=True)
        del src
        junk = torch.full((1 << 18,), -1.0, device=dev)  # may reuse the freed block
        h.wait()
        want = torch.arange(world, dtype=torch.float32).repeat_interleave(1 << 18)
        assert torch.equal(outs.cpu(), want), "input memory was reused before the collective"
        del junk

    # Subgroups and the device mesh.
    sub = dist.new_group([0, 1])
    if rank < 2:
        s = torch.ones(2, device=dev) * rank
        dist.all_reduce(s, group=sub)
        assert s.cpu().tolist() == [1.0, 1.0]
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("axon", (world,))
    m = torch.ones(1, device=dev)
    dist.all_reduce(m, group=mesh.get_group())
    assert m.item() == world

    # DDP's runtime statistics come from the axon timer (device events).
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8).to(dev))
    for _ in range(2):
        ddp(torch.randn(4, 8, device=dev)).sum().backward()
    stats = ddp._get_ddp_logging_data()
    assert stats["forward_compute_time"] > 0 and stats["backward_compute_time"] > 0, stats
    dist.barrier()
    return True


@pytest.mark.parametrize("world", [2])
def test_stream_ordering_futures_subgroups(world):
    assert run_ranks(_stream_semantics, world, timeout=180) == [True] * world


def _mixed_backends(rank, world):
    dist.init_process_group("cpu:gloo,axon:axon", timeout=datetime.timedelta(seconds=60))
    a = torch.full((3,), float(rank + 1), device=f"axon:{rank}")
    c = torch.full((3,), float(rank + 1))
    dist.all_reduce(a)
    dist.all_reduce(c)
    assert a.device.type == "axon" and c.device.type == "cpu"
    assert a.cpu().tolist() == c.tolist() == [world * (world + 1) / 2] * 3
    return dist.get_backend()


def test_cpu_gloo_axon_axon_group():
    assert run_ranks(_mixed_backends, 2, timeout=120) == ["cpu:gloo,axon:axon"] * 2


# ---------------------------------------------------------------- bad input


def _bad_input(rank, world):
    dist.init_process_group("axon", timeout=datetime.timedelta(seconds=30))
    dev = torch.device("axon", rank)
    errors = {}

    def expect(name, exc, fn, text):
        try:
            fn()
        except exc as e:  # noqa: PERF203
            assert text in str(e), f"{name}: {e}"
            errors[name] = str(e).splitlines()[0]
            return
        raise AssertionError(f"{name}: no error")

    x = torch.ones(8, device=dev)
    expect("mixed devices", (RuntimeError, ValueError),
           lambda: dist.all_gather_into_tensor(torch.empty(8 * world), x),
           "axon device")
    expect("non-contiguous", (RuntimeError, ValueError),
           lambda: dist.all_reduce(torch.ones(4, 4, device=dev).t()), "contiguous")
    expect("bad root", (RuntimeError, ValueError),
           lambda: dist.broadcast(x, src=world + 3), "")
    expect("unsupported dtype", (TypeError, RuntimeError),
           lambda: dist.all_reduce(torch.ones(4, device=dev, dtype=torch.float8_e4m3fn)),
           "does not support")
    expect("avg of ints", RuntimeError,
           lambda: dist.all_reduce(torch.ones(4, device=dev, dtype=torch.int32),
                                   op=dist.ReduceOp.AVG), "AVG is not supported for int32")
    expect("size mismatch", (RuntimeError, ValueError),
           lambda: dist.all_gather_into_tensor(torch.empty(3, device=dev), x), "world_size")
    expect("wrong device index", RuntimeError,
           lambda: dist.all_reduce(torch.ones(2, device=f"axon:{rank + 4}")),
           f"runs on axon:{rank}")
    expect("recv from any source", RuntimeError,
           lambda: dist.recv(torch.empty(2, device=dev)), "recv from any source")
    # The group still works after all of these (nothing was sent).
    dist.all_reduce(x)
    assert x.cpu().eq(world).all()
    return errors


def test_bad_input_raises_pytorch_style_errors():
    # A segment left by a creator that died before its ranks attached (its pid
    # is gone): the next group's creation removes it.
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"/dev/shm/axon-pg-{dead.pid}-0-0"
    with open(stale, "wb") as f:
        f.write(b"x")
    errors = run_ranks(_bad_input, 2, timeout=120)
    assert len(errors[0]) == 8, errors[0]
    assert not os.path.exists(stale), "a stale segment of a dead process was left behind"


def _shm_entries():
    return {n for n in os.listdir("/dev/shm") if n.startswith("axon-pg-")}


def _dead_rank(rank, world, mode):
    dist.init_process_group("axon", timeout=datetime.timedelta(seconds=3 if mode == "hang" else 60))
    dev = torch.device("axon", rank)
    t = torch.ones(4, device=dev)
    dist.all_reduce(t)  # the group works
    if rank == world - 1:
        if mode == "exit":
            os._exit(7)  # dies without a word
        time.sleep(8)  # alive but never calls the collective
        return "late"
    t0 = time.monotonic()
    try:
        dist.all_reduce(t)
        t.cpu()  # the error surfaces at the next synchronisation
    except RuntimeError as e:
        first = str(e)
    else:
        return "no error"
    elapsed = time.monotonic() - t0
    try:  # later calls on the broken group fail at once
        dist.all_reduce(t)
        second = "no error"
    except RuntimeError as e:
        second = str(e)
    return first, elapsed, second


@pytest.mark.parametrize("mode", ["exit", "hang"])
def test_dead_or_missing_rank_raises_within_timeout(mode):
    before = _shm_entries()
    world = 3
    results = run_ranks(_dead_rank, world, mode, timeout=120, allow_failures=True)
    for rank in range(world - 1):
        res = results[rank]
        assert not isinstance(res, RankFailed), res
        first, elapsed, second = res
        if mode == "exit":
            # Found by checking the peer's process, long before the 60 s timeout.
            assert f"rank {world - 1} (pid" in first and "exited" in first, first
            assert elapsed < 10, elapsed
        else:
            assert "all_reduce timed out" in first and f"rank(s) {world - 1}" in first, first
            assert 2.5 < elapsed < 10, elapsed
        assert "failed earlier" in second, second
    # No shared-memory segment left behind, even by the rank that died.
    assert _shm_entries() == before


# ---------------------------------------------------------------- several hosts

NETNS = ("axon-test-host0", "axon-test-host1")
NETNS_ADDR = ("10.231.77.1", "10.231.77.2")


def _setup_netns() -> bool:
    """Two network namespaces joined by a veth pair, as two hosts; False if not allowed."""
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("ip") is None or os.environ.get("AXON_TEST_NO_NETNS"):
        return False
    _teardown_netns()
    cmds = [f"ip netns add {NETNS[0]}", f"ip netns add {NETNS[1]}",
            "ip link add axv0 type veth peer name axv1",
            f"ip link set axv0 netns {NETNS[0]}", f"ip link set axv1 netns {NETNS[1]}"]
    for i in range(2):
        cmds += [f"ip -n {NETNS[i]} addr add {NETNS_ADDR[i]}/24 dev axv{i}",
                 f"ip -n {NETNS[i]} link set axv{i} up", f"ip -n {NETNS[i]} link set lo up"]
    for c in cmds:
        if subprocess.run(c.split(), capture_output=True).returncode != 0:
            _teardown_netns()
            return False
    return True


def _teardown_netns():
    import subprocess

    for ns in NETNS:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _enter_host(rank, world, mode):
    """Puts rank r on host r // 2: its network namespace, or just its AXON_HOST_ID."""
    host = rank // (world // 2)
    if mode == "netns":
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/var/run/netns/{NETNS[host]}", os.O_RDONLY)
        if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), "setns")
        os.close(fd)
        os.environ["MASTER_ADDR"] = NETNS_ADDR[0]
        os.environ["GLOO_SOCKET_IFNAME"] = f"axv{host}"
    else:
        os.environ["AXON_HOST_ID"] = f"test-host-{host}"


def _two_hosts(rank, world, mode):
    _enter_host(rank, world, mode)
    ran = _collectives(rank, world)
    backend = dist.group.WORLD._get_backend(torch.device("axon"))
    return ran, backend.multi_host, backend.local_rank


def test_collectives_across_two_hosts():
    """4 ranks on two "hosts" of 2: ranks 0-1 and 2-3.

    As root with `ip netns` available (the usual CI container), each host is
    a network namespace joined to the other by a veth pair: the ranks of one
    host share memory, and the hosts talk over that link (TCP store, gloo
    between the hosts' leaders).  Without those rights, the same ranks are
    forced onto the inter-host path with AXON_HOST_ID (same machine, same code
    path; also with AXON_TEST_NO_NETNS=1).  The test prints which one it used.  The collectives are the same
    checks as test_collectives_match_cpu.
    """
    mode = "netns" if _setup_netns() else "host-id"
    print(f"two hosts simulated with: {mode}")
    try:
        results = run_ranks(_two_hosts, 4, mode, timeout=400)
    finally:
        if mode == "netns":
            _teardown_netns()
    assert [r[1:] for r in results] == [(True, 0), (True, 1), (True, 0), (True, 1)]
    assert results[0][0] == results[3][0] and "p2p" in results[0][0]


def _mismatch_across_hosts(rank, world):
    _enter_host(rank * 2, world * 2, "host-id")  # one rank per host
    dist.init_process_group("axon", timeout=datetime.timedelta(seconds=30))
    dev = torch.device("axon", rank)
    cases = {
        "dtype": lambda g: dist.all_reduce(
            torch.ones(4, device=dev, dtype=torch.float32 if rank == 0 else torch.int32), group=g),
        "reduce op": lambda g: dist.all_reduce(
            torch.ones(4, device=dev), op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX,
            group=g),
        "elements": lambda g: dist.all_reduce(torch.ones(4 + rank, device=dev), group=g),
        "kind": lambda g: (dist.all_reduce(torch.ones(4, device=dev), group=g) if rank == 0
                           else dist.broadcast(torch.ones(4, device=dev), src=0, group=g)),
        "root": lambda g: dist.broadcast(torch.ones(4, device=dev), src=rank, group=g),
        "all_gather size": lambda g: dist.all_gather_into_tensor(
            torch.empty(2 * (3 + rank), device=dev), torch.ones(3 + rank, device=dev), group=g),
    }
    errors = {}
    for name, call in cases.items():
        g = dist.new_group(list(range(world)))
        try:
            call(g)
            torch.axon.synchronize()
            errors[name] = None
        except Exception as e:  # noqa: BLE001
            errors[name] = f"{type(e).__name__}: {e}"
    ok = torch.ones(4, device=dev)
    dist.all_reduce(ok, group=dist.new_group(list(range(world))))  # matching calls still work
    multi_host = dist.group.WORLD._get_backend(dev).multi_host
    return errors, ok.cpu(), multi_host


def test_mismatched_collectives_across_hosts_raise():
    """Ranks on different hosts compare their calls' signatures before moving data (on
    one host the shared-memory group does): a dtype, reduction, size, kind or root that
    differs raises the same error on every rank, instead of wrong data, a hang or gloo
    aborting the process."""
    for errors, ok, multi_host in run_ranks(_mismatch_across_hosts, 2, timeout=300):
        assert multi_host
        for name, err in errors.items():
            assert err is not None and "collectives do not match across ranks" in err, (name, err)
        torch.testing.assert_close(ok, torch.full((4,), 2.0))
