"""Running a function on N ranks for the torch.distributed tests.

``run_ranks(fn, world_size, *args)`` spawns ``world_size`` fresh processes
(the "spawn" start method: axon, like CUDA, cannot be used in a forked child),
sets the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), pins rank r to ``axon:r`` and calls ``fn(rank, world_size,
*args)``.  ``fn`` must be a module-level function (it is pickled).  What the
ranks return (picklable; tensors too) comes back as a list indexed by rank; an exception in any rank
fails the test with that rank's traceback.  Ranks that do not finish within
``timeout`` seconds are killed and the test fails: a hang is a failure.
"""

from __future__ import annotations

import io
import os
import pickle
import socket
import traceback

import torch
import torch.multiprocessing as mp


def ship(obj) -> bytes:
    """A rank's result as torch.save bytes (unship() in the parent): tensors put
    on a torch.multiprocessing queue travel as shared-memory handles that die
    with the rank that exits right after."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def unship(results: list) -> list:
    """The objects of ship() from every rank (run_ranks' results)."""
    return [torch.load(io.BytesIO(b), weights_only=False) for b in results]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world_size, port, fn, args, env, queue):
    os.environ.update(env)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    try:
        import torch

        torch.axon.set_device(rank)
        result = fn(rank, world_size, *args)
        # Plain pickle: the queue's own pickler would send tensors as shared
        # memory handles, which vanish when this process exits.
        queue.put((rank, True, pickle.dumps(result)))
    except BaseException:  # noqa: BLE001  (reported to the parent)
        queue.put((rank, False, traceback.format_exc()))
    finally:
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def run_ranks(fn, world_size: int, *args, timeout: float = 240.0, env: dict | None = None,
              allow_failures: bool = False):
    """Runs fn(rank, world_size, *args) on world_size processes; returns results by rank.

    With allow_failures=True a rank's exception is returned (as its traceback
    text wrapped in RankFailed) instead of failing, and a rank that exits
    without reporting yields None: for tests of dying ranks.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world_size, port, fn, args, env or {}, queue),
                         daemon=False) for r in range(world_size)]
    # The ranks get env from birth: their first import (torch, with the runtime's
    # configuration) happens before _entry runs.
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        for p in procs:
            p.start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    results: dict[int, object] = {}
    import queue as queue_mod
    import time

    deadline = time.monotonic() + timeout
    try:
        while len(results) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                rank, ok, value = queue.get(timeout=min(remaining, 0.5))
            except queue_mod.Empty:
                if all(not p.is_alive() for p in procs) and queue.empty():
                    break
                continue
            if not ok and not allow_failures:
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results[rank] = pickle.loads(value) if ok else RankFailed(value)
    finally:
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()) if len(results) == world_size
                   else 1.0)
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    missing = [r for r in range(world_size) if r not in results]
    if hung and not allow_failures:
        raise AssertionError(f"ranks {hung} did not finish within {timeout} s (hang)")
    if missing and not allow_failures:
        codes = {r: procs[r].exitcode for r in missing}
        raise AssertionError(f"ranks {missing} exited without a result (exit codes {codes})")
    return [results.get(r) for r in range(world_size)]


class RankFailed(str):
    """The traceback text of a rank that raised (run_ranks(allow_failures=True))."""
