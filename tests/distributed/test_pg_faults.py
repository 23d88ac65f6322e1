"""Fault injection for the process group (ProcessGroupAxon), on spawned ranks.

- calls that do not match across ranks (every kind of mismatch the ranks can
  see: element counts, dtypes, ops, kinds, roots, a skipped call, send/recv)
  fail on every rank with DistBackendError naming both calls, and leave that
  group unusable while the process (and its other groups) carry on;
- a rank killed with SIGKILL in the middle of all_reduces: the others get an
  error well within the timeout, not a hang;
- a rank stopped with SIGSTOP: the others time out after the group's 10 s
  timeout, naming it;
- every dtype (bool and int8 included) and odd and zero sizes against a
  reference each rank computes on the CPU from every rank's (seeded) inputs.
  Tolerances: exact for data movement, integers and bool (int8 sums wrap as on
  the CPU); float reductions of 2 ranks are one rounding of the float32 sum on
  both sides, so also exact, and AVG within 1 ulp of the dtype.

Host shared memory: an all_reduce loop of large tensors created and deleted
(with empty_cache) keeps the pages this process maps within a small constant
of the two devices' reserved memory (the peers' mappings of freed memory hold
no pages: issue 15 item 1).
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import time

import pytest
import torch
import torch.distributed as dist

from dist_util import RankFailed, run_ranks

ALL_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
              torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64)
SIZES = (0, 1, 7, 1023, 70001)  # 70001 float32 elements pass the 256 KiB small path


def make(rank: int, dtype: torch.dtype, n: int, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(7919 * rank + 31 * salt + n)
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(n, generator=g, dtype=torch.float32 if not dtype.is_complex else dtype).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype == torch.uint8:
        return torch.randint(0, 256, (n,), generator=g).to(dtype)
    if dtype == torch.int8:
        return torch.randint(-128, 128, (n,), generator=g).to(dtype)
    return torch.randint(-1000, 1000, (n,), generator=g).to(dtype)


def reference(inputs, op, dtype):
    """The reduction over ranks in rank order, as the CPU computes it."""
    if dtype == torch.bool:
        x = torch.stack(inputs)
        return x.any(0) if op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX) else x.all(0)
    acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    r = inputs[0].to(acc)
    for t in inputs[1:]:
        t = t.to(acc)
        if op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            r = r + t
        elif op == dist.ReduceOp.MAX:
            r = torch.maximum(r, t)
        elif op == dist.ReduceOp.MIN:
            r = torch.minimum(r, t)
    if op == dist.ReduceOp.AVG:
        r = r / len(inputs)
    return r.to(dtype)


def _check(got: torch.Tensor, want: torch.Tensor, what: str, ulp: bool = False):
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if ulp:
        torch.testing.assert_close(got, want, rtol=2 ** -7 if want.dtype == torch.bfloat16
                                   else 2 ** -10, atol=0, msg=what)
    else:
        assert torch.equal(got, want), f"{what}: {got[:8]} vs {want[:8]}"


def _dtypes_and_sizes(rank, world):
    dev = torch.device("axon", rank)
    checked = 0
    for dtype in ALL_DTYPES:
        for n in SIZES:
            if n == 70001 and dtype in (torch.float64, torch.int16, torch.complex64):
                continue  # the large path is dtype-independent; keeps the run short
            ins = [make(r, dtype, n) for r in range(world)]
            ops = [dist.ReduceOp.SUM]
            if not dtype.is_complex:
                ops += [dist.ReduceOp.MAX, dist.ReduceOp.MIN]
            if dtype.is_floating_point:
                ops.append(dist.ReduceOp.AVG)
            for op in ops:
                t = ins[rank].to(dev)
                dist.all_reduce(t, op=op)
                _check(t, reference(ins, op, dtype), f"all_reduce {dtype} n={n} {op}",
                       ulp=op == dist.ReduceOp.AVG)
                checked += 1
            # Data movement: exact.
            t = ins[rank].to(dev)
            dist.broadcast(t, src=1)
            _check(t, ins[1], f"broadcast {dtype} n={n}")
            out = torch.empty(world * n, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, ins[rank].to(dev))
            _check(out, torch.cat(ins), f"all_gather {dtype} n={n}")
            # reduce_scatter over an odd total: n elements per rank.
            full = [make(r, dtype, world * n, salt=1) for r in range(world)]
            out = torch.empty(n, dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(out, full[rank].to(dev))
            _check(out, reference(full, dist.ReduceOp.SUM, dtype)[rank * n:(rank + 1) * n],
                   f"reduce_scatter {dtype} n={n}")
            # Uneven all_to_all: rank r sends n + d elements to rank d.
            send = [n + d for d in range(world)]
            recv = [n + rank for _ in range(world)]
            src = [make(r, dtype, sum(n + d for d in range(world)), salt=2) for r in range(world)]
            out = torch.empty(sum(recv), dtype=dtype, device=dev)
            dist.all_to_all_single(out, src[rank].to(dev), recv, send)
            want = torch.cat([src[r][sum(send[:rank]):sum(send[:rank + 1])] for r in range(world)])
            _check(out, want, f"all_to_all {dtype} n={n}")
            # Point to point, both directions.
            if rank == 0:
                dist.send(ins[0].to(dev), dst=1)
                got = torch.empty(n, dtype=dtype, device=dev)
                dist.recv(got, src=1)
                _check(got, ins[1], f"recv {dtype} n={n}")
            else:
                got = torch.empty(n, dtype=dtype, device=dev)
                dist.recv(got, src=0)
                dist.send(ins[1].to(dev), dst=0)
                _check(got, ins[0], f"recv {dtype} n={n}")
            checked += 5
    return checked


# Mismatched calls: (name, rank 0's call, rank 1's call, text both errors hold).
def _mismatch_cases(dev):
    def ar(n, dtype=torch.float32, op=dist.ReduceOp.SUM):
        return lambda g: dist.all_reduce(torch.ones(n, dtype=dtype, device=dev), op=op, group=g)

    def bc(n, src, dtype=torch.float32):
        return lambda g: dist.broadcast(torch.ones(n, dtype=dtype, device=dev), src=src, group=g)

    def red(dst):
        return lambda g: dist.reduce(torch.ones(8, device=dev), dst=dst, group=g)

    def ag(dtype, n):
        def f(g):
            out = torch.empty(2 * n, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, torch.ones(n, dtype=dtype, device=dev), group=g)
        return f

    def rs(n):
        def f(g):
            out = torch.empty(n, device=dev)
            dist.reduce_scatter_tensor(out, torch.ones(2 * n, device=dev), group=g)
        return f

    def skip_then_bc(g):
        bc(16, 0)(g)

    def ar_then_bc(g):
        ar(16)(g)
        bc(16, 0)(g)

    def a2a(split):
        def f(g):
            out = torch.empty(sum(split), device=dev)
            dist.all_to_all_single(out, torch.ones(8, device=dev), split, [4, 4], group=g)
        return f

    return [
        ("count", ar(2_000_000), ar(2_000_020),
         "rank 0 called all_reduce #0 (float32, 2000000 elements, SUM) but rank 1 called "
         "all_reduce #0 (float32, 2000020 elements, SUM)"),
        ("small count", ar(100), ar(101), "(float32, 101 elements, SUM)"),
        ("dtype", ar(1000), ar(1000, torch.bfloat16), "(bfloat16, 1000 elements, SUM)"),
        ("op", ar(1000), ar(1000, op=dist.ReduceOp.MAX), "(float32, 1000 elements, MAX)"),
        ("kind", ar(16), bc(16, 0), "but rank 1 called broadcast #0 (64 bytes of float32, root 0)"),
        ("root", bc(16, 0), bc(16, 1), "but rank 1 called broadcast #0 (64 bytes of float32, root 1)"),
        ("reduce root", red(0), red(1), "(float32, 8 elements, SUM, root 1)"),
        ("gather dtype", ag(torch.float32, 64), ag(torch.int32, 64), "(256 bytes of int32)"),
        ("reduce_scatter", rs(64), rs(65), "reduce_scatter #0 (float32, 65 elements, SUM)"),
        ("skipped call", ar_then_bc, skip_then_bc,
         "rank 0 called all_reduce #0 (float32, 16 elements, SUM) but rank 1 called broadcast #0"),
        ("all_to_all splits", a2a([4, 4]), a2a([2, 6]), "which expects"),
    ]


def _mismatches(rank, world):
    dev = torch.device("axon", rank)
    out = {}
    for name, a, b, want in _mismatch_cases(dev):
        g = dist.new_group(backend="axon", timeout=datetime.timedelta(seconds=20))
        t0 = time.monotonic()
        try:
            (a if rank == 0 else b)(g)
            torch.axon.synchronize()
            err, etype = "no error", None
        except Exception as e:  # noqa: BLE001
            err, etype = str(e), type(e).__name__
        elapsed = time.monotonic() - t0
        try:  # the group is unusable now
            dist.all_reduce(torch.ones(4, device=dev), group=g)
            again = "no error"
        except Exception as e:  # noqa: BLE001
            again = str(e)
        out[name] = (err, etype, want, elapsed, again)
    # Send/recv of another dtype: the receiver sees it; the sender at its next call.
    g = dist.new_group(backend="axon", timeout=datetime.timedelta(seconds=20))
    try:
        if rank == 0:
            dist.send(torch.ones(4, device=dev), dst=1, group=g)
            dist.barrier(group=g)
        else:
            dist.recv(torch.empty(4, dtype=torch.int32, device=dev), src=0, group=g)
            # Point-to-point runs as stream work: its error comes at the next
            # synchronisation (a DistBackendError all the same).
            torch.axon.synchronize()
        err, etype = "no error", None
    except Exception as e:  # noqa: BLE001
        err, etype = str(e), type(e).__name__
    out["send/recv dtype"] = (err, etype, "expects int32 from rank 0, which sent float32", 0, "")
    # A rank that skips one of two identical calls cannot be told apart by
    # the signatures (its second call pairs with the others' first): the
    # others' extra call times out naming it, and the skipping rank's next
    # call fails because the group failed.
    g = dist.new_group(backend="axon", timeout=datetime.timedelta(seconds=2))
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(16, device=dev), group=g)
        if rank == 0:
            dist.all_reduce(torch.ones(16, device=dev), group=g)
        else:
            time.sleep(3)
            dist.barrier(group=g)
        torch.axon.synchronize()
        err, etype = "no error", None
    except Exception as e:  # noqa: BLE001
        err, etype = str(e), type(e).__name__
    want = "all_reduce timed out on rank 0" if rank == 0 else "failed earlier"
    out["skipped identical call"] = (err, etype, want, time.monotonic() - t0, "failed earlier")
    # The process and its other groups carry on.
    t = torch.full((3,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    out["world still works"] = t.cpu().tolist()
    return out


def _correctness_and_mismatch(rank, world):
    dist.init_process_group("axon", timeout=datetime.timedelta(seconds=30))
    return _dtypes_and_sizes(rank, world), _mismatches(rank, world)


def test_dtypes_sizes_and_mismatched_calls():
    results = run_ranks(_correctness_and_mismatch, 2, timeout=150)
    for rank, (checked, mism) in enumerate(results):
        assert checked > 300, checked
        assert mism.pop("world still works") == [3.0, 3.0, 3.0]
        for name, (err, etype, want, elapsed, again) in mism.items():
            # Also when it ran as stream work (raised at the next synchronisation).
            assert etype == "DistBackendError", (rank, name, etype, err)
            assert want in err, (rank, name, err)
            if name not in ("send/recv dtype", "skipped identical call"):
                if name != "all_to_all splits":
                    assert "do not match across ranks" in err, (rank, name, err)
                assert elapsed < 10, (rank, name, elapsed)
                assert "failed earlier" in again, (rank, name, again)


# ---------------------------------------------------------------- dying and stopped ranks

def _killed(rank, world):
    dist.init_process_group("axon", timeout=datetime.timedelta(seconds=60))
    dev = torch.device("axon", rank)
    t = torch.ones(4 << 20, device=dev)  # 16 MiB: each call takes a while
    dist.all_reduce(t)
    if rank == world - 1:  # killed from outside in 0.5 s, whatever this process does
        subprocess.Popen(["sh", "-c", f"sleep 0.5; kill -KILL {os.getpid()}"])
    t0 = time.monotonic()
    try:
        for _ in range(100000):
            dist.all_reduce(t)
        torch.axon.synchronize()
    except Exception as e:  # noqa: BLE001
        return type(e).__name__, str(e), time.monotonic() - t0
    return "no error", "", time.monotonic() - t0


def test_rank_killed_mid_all_reduce():
    world = 3
    results = run_ranks(_killed, world, timeout=90, allow_failures=True)
    assert results[world - 1] is None  # killed, no report
    for rank in range(world - 1):
        res = results[rank]
        assert not isinstance(res, RankFailed), res
        etype, err, elapsed = res
        assert etype == "DistBackendError", (etype, err)
        assert f"rank {world - 1} (pid" in err and "exited" in err, err
        assert elapsed < 15, elapsed  # the timeout is 60 s


def _failed_inputs(rank, world, n, async_op):
    # Rank 0's input comes from a kernel that fails asynchronously (an index out of
    # range): its collective must not send that garbage. Every rank gets an error
    # naming the failure, instead of rank 1 getting a result made of it.
    dist.init_process_group("axon", timeout=datetime.timedelta(seconds=30))
    dev = torch.device("axon", rank)
    x = torch.ones(n, device=dev)
    good = torch.zeros(n, dtype=torch.long, device=dev)
    bad = good.clone()
    bad[0] = 10 ** 9
    x[good]  # the first launch of a signature runs at the call: later ones are asynchronous
    torch.axon.synchronize()
    y = x[bad] if rank == 0 else x[good]
    t0 = time.monotonic()
    try:
        work = dist.all_reduce(y, async_op=async_op)
        if async_op:
            work.wait()
        torch.axon.synchronize()
        out = ("no error", y.cpu().tolist()[:3])
    except Exception as e:  # noqa: BLE001
        out = (type(e).__name__, str(e))
    # the group is unusable afterwards, on every rank, with the same reason
    try:
        dist.all_reduce(torch.ones(1, device=dev))
        torch.axon.synchronize()
        after = "no error"
    except Exception as e:  # noqa: BLE001
        after = str(e)
    return out, after, time.monotonic() - t0


@pytest.mark.parametrize("n, async_op", [(4, False), (4, True), (1 << 20, False)])
def test_collective_refuses_inputs_from_failed_work(n, async_op):
    results = run_ranks(_failed_inputs, 2, n, async_op, timeout=120)
    for rank in range(2):
        (etype, err), after, elapsed = results[rank]
        assert etype == "DistBackendError", (rank, etype, err)
        assert "all_reduce on rank 0 refused to run: the work that produced its inputs " \
               "failed" in err or "index 1000000000 is out of bounds" in err, (rank, err)
        assert "refused to run" in after, (rank, after)
        assert elapsed < 20, elapsed
    # rank 1 learns why: rank 0's failed kernel
    assert "rank 0 failed" in results[1][0][1] and "out of bounds" in results[1][0][1]


def _timed_all_reduce(t):
    """(exception type name or None, message, seconds) of an all_reduce of t."""
    t0 = time.monotonic()
    try:
        dist.all_reduce(t)
        torch.axon.synchronize()
        err, etype = "no error", None
    except Exception as e:  # noqa: BLE001
        err, etype = str(e), type(e).__name__
    return etype, err, time.monotonic() - t0


def _stopped(rank, world):
    dist.init_process_group("axon", timeout=datetime.timedelta(seconds=10))
    dev = torch.device("axon", rank)
    pids = [None] * world
    dist.all_gather_object(pids, os.getpid())
    t = torch.ones(1024, device=dev)
    dist.all_reduce(t)
    if rank == 1:
        time.sleep(0.3)  # rank 0 stops this process meanwhile, and continues it later
    else:
        os.kill(pids[1], signal.SIGSTOP)
    etype, err, elapsed = _timed_all_reduce(t)
    if rank == 0:
        os.kill(pids[1], signal.SIGCONT)
    return etype, err, elapsed


def test_stopped_rank_times_out():
    results = run_ranks(_stopped, 2, timeout=90)
    etype, err, elapsed = results[0]
    assert etype == "DistBackendError", (etype, err)
    assert "all_reduce timed out" in err and "rank(s) 1" in err, err
    assert 9 < elapsed < 20, elapsed
    # The stopped rank, once continued, learns of the failure instead of waiting.
    etype, err, elapsed = results[1]
    assert etype == "DistBackendError", (etype, err)
    assert "rank 0 failed" in err and "timed out" in err, err


def _one_call_fewer(rank, world):
    dist.init_process_group("axon", timeout=datetime.timedelta(seconds=60))
    dev = torch.device("axon", rank)
    t = torch.ones(16, device=dev)
    dist.all_reduce(t)
    if rank == 1:  # one call fewer: destroys its group and lives on
        dist.destroy_process_group()
        time.sleep(3)
        return None, "left", 0.0
    return _timed_all_reduce(t)


def test_rank_that_destroyed_the_group_fails_its_peers_call_at_once():
    """A rank that makes fewer calls and destroys the group while its process
    lives on: the peer's extra call fails within the liveness check's period,
    naming the mismatch, instead of waiting out the 60 s timeout."""
    etype, err, elapsed = run_ranks(_one_call_fewer, 2, timeout=90)[0]
    assert etype == "DistBackendError", (etype, err)
    assert "rank 1 destroyed the group after 1 collective call(s)" in err, err
    assert "different numbers of calls" in err, err
    assert elapsed < 10, elapsed


# ---------------------------------------------------------------- host memory

def _axon_memfd_rss() -> int:
    """Bytes of axon device memory (own and mapped peers') resident in this process."""
    total = 0
    in_memfd = False
    with open("/proc/self/smaps") as f:
        for line in f:
            if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
                in_memfd = "memfd:axon-device-memory" in line
            elif in_memfd and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


def _memory_loop(rank, world):
    dist.init_process_group("axon", timeout=datetime.timedelta(seconds=60))
    dev = torch.device("axon", rank)
    worst = 0
    sizes = [15, 35, 25, 40, 20, 30]  # MiB, float32
    for i in range(24):
        n = (sizes[i % len(sizes)] << 20) // 4 + 17 * i
        t = torch.ones(n, device=dev)
        dist.all_reduce(t)
        assert t[-1].item() == world
        del t
        if i % 3 == 2:
            torch.axon.empty_cache()
        dist.barrier()
        both = [None] * world
        dist.all_gather_object(both, torch.axon.memory_reserved(dev))
        excess = _axon_memfd_rss() - sum(both)
        worst = max(worst, excess)
    return worst


def test_peer_mappings_do_not_keep_freed_memory(monkeypatch):
    # The loop reserves up to 2 x 40 MiB at a time and moves 740 MiB per rank
    # in all; before the fix the peers' mappings kept freed memory resident.
    # (Set in the parent: the ranks read it when they import torch.)
    monkeypatch.setenv("AXON_DEVICE_MEMORY", "128MiB")
    for rank, worst in enumerate(run_ranks(_memory_loop, 2, timeout=120)):
        assert worst < 16 << 20, f"rank {rank}: {worst / 2**20:.0f} MiB over the reserved memory"


# ---------------------------------------------------------------- wait(timeout), memory formats

def _wait_timeout(rank, world):
    dist.init_process_group("axon", timeout=datetime.timedelta(seconds=15))
    dev = torch.device("axon", rank)
    dist.all_reduce(torch.ones(4, device=dev))
    if rank == 1:
        time.sleep(4)  # joins the second collective late
    work = dist.all_reduce(torch.ones(4, device=dev), async_op=True)
    t0 = time.monotonic()
    try:
        work.wait(timeout=datetime.timedelta(seconds=1))
        outcome = "returned"
    except Exception as e:  # noqa: BLE001
        outcome = f"{type(e).__name__}: {e}"
    elapsed = time.monotonic() - t0
    work.wait()  # the collective itself still completes
    torch.axon.synchronize()
    return outcome, elapsed


def test_wait_with_a_timeout_raises_when_the_collective_is_late():
    """Work.wait(timeout) waits on the host at most `timeout`, as gloo's and NCCL's do
    (the timeout used to be ignored: the error came at the group's timeout)."""
    (outcome, elapsed), (outcome1, _) = run_ranks(_wait_timeout, 2, timeout=90)
    assert outcome.startswith("DistBackendError") and "wait(timeout=1000 ms) timed out" in outcome
    assert 0.9 < elapsed < 3.5, elapsed
    assert outcome1 == "returned"


def _mixed_formats(rank, world):
    dist.init_process_group("axon")
    dev = torch.device("axon", rank)
    x = (torch.arange(24.0).reshape(2, 3, 2, 2) + 100 * rank).to(dev)
    cl = x.contiguous(memory_format=torch.channels_last)
    errors = []
    calls = {
        "all_gather": lambda: dist.all_gather([torch.empty_like(x) for _ in range(world)], cl),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(
            torch.empty(2 * world, 3, 2, 2, device=dev), cl),
        "reduce_scatter": lambda: dist.reduce_scatter(torch.empty_like(x), [cl] * world),
        "all_to_all": lambda: dist.all_to_all([torch.empty_like(x)] * world, [cl] * world),
    }
    for name, call in calls.items():
        try:
            call()
            errors.append((name, None))
        except RuntimeError as e:
            errors.append((name, str(e)))
    # The same format on every tensor is fine, channels_last included.
    outs = [torch.empty_like(cl) for _ in range(world)]
    dist.all_gather(outs, cl)
    return errors, [o.cpu() for o in outs]


def test_collectives_refuse_tensors_of_mixed_memory_formats():
    """Collectives move bytes: a channels_last input gathered into contiguous outputs
    would land its bytes as other elements (silently wrong); it is refused with a clear
    error, and calls whose tensors share one format (channels_last too) are right."""
    for errors, outs in run_ranks(_mixed_formats, 2, timeout=90):
        for name, err in errors:
            assert err is not None and "must have the same memory format" in err, (name, err)
        for r, o in enumerate(outs):
            torch.testing.assert_close(o, torch.arange(24.0).reshape(2, 3, 2, 2) + 100 * r)


def _set_pg_timeout_then_late_rank(rank, world):
    import warnings

    from torch.distributed.distributed_c10d import _set_pg_timeout

    dist.init_process_group("axon", timeout=datetime.timedelta(seconds=60))
    dev = torch.device("axon", rank)
    dist.all_reduce(torch.ones(4, device=dev))
    torch.axon.synchronize()
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        _set_pg_timeout(datetime.timedelta(seconds=2))
    if rank == 1:
        time.sleep(6)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4, device=dev))
        torch.axon.synchronize()
        outcome = "returned"
    except RuntimeError as e:
        outcome = str(e)
    return outcome, time.monotonic() - t0, [str(w.message) for w in ws]


def test_set_pg_timeout_reaches_the_axon_backend():
    """torch.distributed's _set_pg_timeout (torchtitan lowers the timeout with it
    after the first step) sets the axon backend's timeout: a late rank fails the
    collective after the new 2 s, not the group's 60 s, and no "only supported
    for nccl or gloo" warning."""
    results = run_ranks(_set_pg_timeout_then_late_rank, 2, timeout=90)
    outcome, elapsed, warned = results[0]
    assert "all_reduce timed out" in outcome and "rank(s) 1" in outcome, outcome
    assert 1.5 < elapsed < 5, elapsed
    assert not warned, warned
    assert results[1][0] != "returned"  # the group broke while rank 1 slept


def _formats_differ_across_ranks(rank, world, op):
    dist.init_process_group("axon")
    dev = torch.device("axon", rank)
    x = (torch.arange(24.0).reshape(2, 3, 2, 2) + 100 * rank).to(dev)
    # The same format on every rank is fine, channels_last included.
    same = x.contiguous(memory_format=torch.channels_last)
    dist.all_reduce(same)
    ok = same.cpu()
    mine = same if rank == 1 else x.clone()
    try:
        if op == "all_reduce":
            dist.all_reduce(mine)
        elif op == "broadcast":
            dist.broadcast(mine, src=0)
        else:
            dist.all_gather([torch.empty_like(mine) for _ in range(world)], mine)
        torch.axon.synchronize()
        return ok, None
    except RuntimeError as e:
        return ok, str(e)


@pytest.mark.parametrize("op", ["all_reduce", "broadcast", "all_gather"])
def test_ranks_with_different_memory_formats_fail_the_collective(op):
    """Collectives move memory: rank 0's contiguous tensor against rank 1's
    channels_last one would mix elements (silently wrong); the ranks' signatures
    carry the memory layout, so the call fails on every rank, naming both."""
    results = run_ranks(_formats_differ_across_ranks, 2, op, timeout=90)
    for ok, err in results:
        want = torch.arange(24.0).reshape(2, 3, 2, 2) * 2 + 100
        torch.testing.assert_close(ok, want)
        assert err is not None and "do not match across ranks" in err, err
        assert "contiguous" in err and "channels_last" in err, err
