"""gloo process groups on axon tensors (torch_axon/distributed/gloo.py,
csrc/distributed/GlooAxon.cpp).

Every collective runs in the same gloo group twice, on CPU tensors and on
axon copies of them: gloo does the same arithmetic on the same bytes (the axon
tensors travel as host views), so the results must be bitwise equal, and a
call gloo rejects on the CPU must be rejected the same way on axon.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from dist_util import run_ranks  # noqa: E402

# What gloo takes (ProcessGroupGloo's GENERATE_ALL_TYPES).
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64, torch.bool)


def _make(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if not dtype.is_floating_point:
        return torch.randint(0 if dtype == torch.uint8 else -5, 6, shape, generator=g).to(dtype)
    return (torch.rand(shape, generator=g, dtype=torch.float64) * 6 - 3).to(dtype)


def _outcome(fn, device, *make):
    """Runs fn on tensors made by `make` on device; (results on the CPU) or
    ('error', type, message)."""
    tensors = [m().to(device) for m in make]
    try:
        out = fn(*tensors)
    except Exception as e:  # noqa: BLE001  (compared with the CPU's)
        return ("error", type(e).__name__, str(e).split("\n")[0])
    flat = []

    def walk(x):
        if isinstance(x, torch.Tensor):
            if device != "cpu":
                assert x.device.type == "axon", x.device
            flat.append(x.cpu())
        elif isinstance(x, (list, tuple)):
            for e in x:
                walk(e)

    walk(out)
    return flat


def _same(cpu, ax, what):
    if isinstance(cpu, tuple):  # an error
        assert ax == cpu, f"{what}: cpu {cpu}, axon {ax}"
        return
    assert not isinstance(ax, tuple), f"{what}: axon raised {ax}, cpu gave results"
    assert len(cpu) == len(ax), what
    for c, a in zip(cpu, ax):
        assert c.dtype == a.dtype and c.shape == a.shape, (what, c, a)
        torch.testing.assert_close(a, c, rtol=0, atol=0, equal_nan=True, msg=what)


def _collectives(rank, ws):
    import torch.distributed as dist

    dist.init_process_group("gloo")
    R = dist.ReduceOp
    pg = dist.group.WORLD
    assert type(pg._get_backend(torch.device("axon"))).__name__ == "ProcessGroupGlooAxon"
    assert dist.get_backend() == "gloo"
    errors_seen = 0

    def check(name, fn, *make):
        nonlocal errors_seen
        cpu = _outcome(fn, "cpu", *make)
        ax = _outcome(fn, "axon", *make)
        _same(cpu, ax, name)
        errors_seen += isinstance(cpu, tuple)
        return cpu

    for dtype in DTYPES:
        n = 7
        mk = lambda r=rank, s=0: _make((n,), dtype, 10 * s + r)  # noqa: E731
        for op in (R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.AVG):
            def ar(t, op=op):
                dist.all_reduce(t, op=op)
                return t
            check(f"all_reduce {op} {dtype}", ar, mk)

        def bc(t):
            dist.broadcast(t, src=1)
            return t
        check(f"broadcast {dtype}", bc, mk)

        def red(t):
            dist.reduce(t, dst=0)
            return t if rank == 0 else []
        check(f"reduce {dtype}", red, mk)

        def ag(t, o0, o1):
            outs = [o0, o1]
            dist.all_gather(outs, t)
            return outs
        zeros = lambda: torch.zeros(n, dtype=dtype)  # noqa: E731
        check(f"all_gather {dtype}", ag, mk, zeros, zeros)

        def agt(t, out):
            dist.all_gather_into_tensor(out, t)
            return out
        check(f"all_gather_into_tensor {dtype}", agt, mk,
              lambda: torch.zeros(ws * n, dtype=dtype))

        def rst(t, out):
            dist.reduce_scatter_tensor(out, t)
            return out
        check(f"reduce_scatter_tensor {dtype}", rst, lambda: _make((ws * 3,), dtype, rank),
              lambda: torch.zeros(3, dtype=dtype))

        def rs(i0, i1, out):
            dist.reduce_scatter(out, [i0, i1])
            return out
        check(f"reduce_scatter {dtype}", rs, mk, lambda: mk(s=1), zeros)

        def ga(t, o0, o1):
            outs = [o0, o1] if rank == 0 else None
            dist.gather(t, outs, dst=0)
            return outs or []
        check(f"gather {dtype}", ga, mk, zeros, zeros)

        def sc(i0, i1, out):
            dist.scatter(out, [i0, i1] if rank == 1 else None, src=1)
            return out
        check(f"scatter {dtype}", sc, mk, lambda: mk(s=1), zeros)

        def a2a(t, out):
            dist.all_to_all_single(out, t)
            return out
        check(f"all_to_all_single {dtype}", a2a, lambda: _make((ws * 2, 3), dtype, rank),
              lambda: torch.zeros(ws * 2, 3, dtype=dtype))

        def sr(t, out):
            if rank == 0:
                dist.send(t, dst=1)
                dist.recv(out, src=1)
            else:
                dist.recv(out, src=0)
                dist.send(t, dst=0)
            return out
        check(f"send/recv {dtype}", sr, mk, zeros)

        def ring(t, out):
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, (rank + 1) % ws),
                                           dist.P2POp(dist.irecv, out, (rank - 1) % ws)])
            for q in reqs:
                q.wait()
            return out
        check(f"batch_isend_irecv {dtype}", ring, mk, zeros)

    # layouts: zero-size, non-contiguous (gloo's own checks decide, as on the CPU)
    def ar_sum(t):
        dist.all_reduce(t)
        return t
    check("all_reduce zero-size", ar_sum, lambda: torch.zeros(0, 3))
    check("all_reduce non-contiguous", ar_sum, lambda: _make((5, 4), torch.float32, rank).t())
    check("all_reduce sliced", ar_sum, lambda: _make((9,), torch.float32, rank)[2:7])
    assert errors_seen > 0  # AVG at least: gloo rejects it on the CPU and on axon
    return errors_seen


def test_gloo_collectives_on_axon_match_cpu():
    run_ranks(_collectives, 2)


def _async_streams_barrier(rank, ws):
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dev = torch.axon.current_device()
    sleep_on_stream = torch.axon._C._test_sleep_on_stream
    out = {}

    # barrier with device ids (upstream: "No backend type associated with device type axon")
    dist.barrier(device_ids=[rank])
    dist.barrier()

    # the collective sees work queued before it on the current stream ...
    x = torch.full((1000,), float(rank + 1), device="axon")
    sleep_on_stream(dev, 50)
    x.mul_(2)  # runs after the sleep
    work = dist.all_reduce(x, async_op=True)
    # ... and work queued after wait() sees its result
    work.wait()
    y = x + 1
    out["y"] = y.cpu()

    # ... and a side stream's work the current stream waited for
    s = torch.axon.Stream()
    z = torch.zeros(4, device="axon")
    with torch.axon.stream(s):
        sleep_on_stream(dev, 30)
        z.add_(rank + 10)
    torch.axon.current_stream().wait_stream(s)
    dist.all_reduce(z)
    out["z"] = z.cpu()

    # futures and results report the axon tensors, not their host views
    t = torch.ones(3, device="axon") * (rank + 1)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    value = fut.wait()
    assert value[0].device == t.device and value[0].data_ptr() == t.data_ptr()
    work.wait()  # (gloo completes the future before the work)
    assert work.result()[0].data_ptr() == t.data_ptr()
    assert work.is_completed() and work.is_success()
    chained = fut.then(lambda f: f.value()[0] * 2).wait()
    out["chained"] = chained.cpu()

    # the axon tensor stays alive while gloo uses it, even when dropped at once
    for i in range(3):
        buf = torch.full((1 << 16,), float(i + rank), device="axon")
        dist.all_reduce(buf, async_op=True)
        del buf
    dist.barrier(device_ids=[rank])

    # ... and not after: a waited collective's tensors are freed with the caller's last reference
    torch.axon.synchronize()
    before = torch.axon.memory_allocated()
    big = torch.ones(1 << 20, device="axon")
    dist.all_reduce(big, async_op=True).wait()
    del big
    out["freed"] = torch.axon.memory_allocated() - before

    # a subgroup created with backend="gloo", and "cpu:gloo" alone
    sub = dist.new_group([0, 1], backend="gloo")
    u = torch.arange(4.0, device="axon") + rank
    dist.all_reduce(u, group=sub)
    out["u"] = u.cpu()
    cg = dist.new_group([0, 1], backend="cpu:gloo")
    v = torch.arange(3, device="axon") * (rank + 1)
    dist.broadcast(v, src=1, group=cg)
    out["v"] = v.cpu()
    # a mixed group keeps the axon backend for axon tensors
    mixed = dist.new_group([0, 1], backend="cpu:gloo,axon:axon")
    out["mixed"] = type(mixed._get_backend(torch.device("axon"))).__name__
    return out


def test_gloo_async_stream_order_futures_and_barrier():
    a, b = run_ranks(_async_streams_barrier, 2)
    assert a["freed"] == 0 and b["freed"] == 0, (a["freed"], b["freed"])
    for r in (a, b):
        torch.testing.assert_close(r["y"], torch.full((1000,), 2.0 * (1 + 2) + 1))
        torch.testing.assert_close(r["z"], torch.full((4,), 10.0 + 11.0))
        torch.testing.assert_close(r["chained"], torch.full((3,), 6.0))
        torch.testing.assert_close(r["u"], torch.arange(4.0) * 2 + 1)
        torch.testing.assert_close(r["v"], torch.arange(3) * 2)
        assert r["mixed"] == "ProcessGroupAxon"


def _bound_device(rank, ws):
    import torch.distributed as dist

    dist.init_process_group("gloo", device_id=torch.device("axon", rank))
    assert dist.group.WORLD.bound_device_id == torch.device("axon", rank)
    t = torch.full((5,), float(rank), device="axon")
    dist.all_reduce(t)
    dist.barrier()  # picks the bound axon device
    # DDP on the gloo group (its reducer's all_reduce, futures and broadcasts)
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to("axon")
    ddp = DDP(model, device_ids=[rank])
    ddp(_make((16, 8), torch.float32, rank).to("axon")).sum().backward()
    return t.cpu(), [p.grad.cpu() for p in model.parameters()]


def test_gloo_group_bound_to_axon_device_and_ddp():
    torch.manual_seed(0)
    ref = torch.nn.Linear(8, 4)
    (sum(ref(_make((16, 8), torch.float32, r)).sum() for r in range(2)) / 2).backward()
    for t, grads in run_ranks(_bound_device, 2):
        torch.testing.assert_close(t, torch.full((5,), 1.0))
        for g, p in zip(grads, ref.parameters()):
            torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-5)
