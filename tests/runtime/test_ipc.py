"""Sharing axon tensors between processes (torch.multiprocessing, spawn), as CUDA IPC.

One spawned worker process serves the round trips (spawning is the slow part):
it gets a tensor as a Process argument, others over a Pipe and an mp.Queue.
The sender's and the receiver's tensors map the same device memory: each sees
the other's writes once the writer synchronised.  The sender's block stays
allocated while the receiver holds it (ipc_collect frees it afterwards).
"""

from __future__ import annotations

import gc

import pytest
import torch
import torch.multiprocessing as mp
from multiprocessing.reduction import ForkingPickler
from torch.multiprocessing import reductions

from conftest import run_python
from torch_axon import _C

DEV = torch.device("axon", 1)  # not the default device: the index must travel


def _bytes(t: torch.Tensor) -> tuple:
    c = t.detach().cpu().contiguous()
    return str(c.dtype), tuple(c.shape), bytes(c.reshape(-1).view(torch.uint8).numpy())


def _worker(conn, queue, arg):
    """The receiving process: answers (command, ...) messages until "exit"."""
    import torch  # noqa: F811  (spawned: a fresh interpreter)

    arg.add_(100)  # the Process argument: written here, read by the parent
    torch.axon.synchronize(arg.device)
    held = {}
    conn.send(("started", str(arg.device)))
    while True:
        msg = conn.recv()
        cmd = msg[0]
        if cmd == "exit":
            break
        if cmd == "describe":
            t = msg[1]
            conn.send((str(t.device), tuple(t.shape), t.stride(), t.storage_offset(),
                       str(t.dtype), t.requires_grad, type(t).__name__, _bytes(t)))
            del t, msg  # the sender may free it now
        elif cmd == "hold":
            held[msg[1]] = msg[2]
            conn.send("ok")
        elif cmd == "mul2":  # in place on a held tensor, visible to the sender
            held[msg[1]].mul_(2)
            torch.axon.synchronize(held[msg[1]].device)
            conn.send("ok")
        elif cmd == "read":
            conn.send(_bytes(held[msg[1]]))
        elif cmd == "drop":
            del held[msg[1]]
            gc.collect()
            conn.send("ok")
        elif cmd == "send_back":  # a received tensor, passed on (here: back)
            conn.send(held[msg[1]])
        elif cmd == "queue":
            t = queue.get(timeout=60)
            conn.send((str(t.device), _bytes(t)))
            del t


@pytest.fixture(scope="module")
def worker():
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    queue = ctx.Queue()
    arg = torch.arange(6, dtype=torch.float32, device=DEV)
    p = ctx.Process(target=_worker, args=(child, queue, arg), daemon=True)
    p.start()

    def answer(what):
        for _ in range(1200):  # 120 s, unless the worker died
            if parent.poll(0.1):
                return parent.recv()
            assert p.is_alive(), f"the worker died (exit code {p.exitcode}) before {what}"
        raise AssertionError(f"no answer to {what}")

    assert answer("starting") == ("started", "axon:1")

    def ask(*msg):
        parent.send(msg)
        return answer(msg[0])

    ask.queue = queue
    ask.arg = arg
    yield ask
    parent.send(("exit",))
    p.join(30)
    assert p.exitcode == 0


def _stats():
    """(shared storages the sender holds, dropped ones waiting for receivers)."""
    return _C._ipc_sent_stats()


def test_process_argument_is_shared(worker):
    # The worker added 100 in place before answering "started".
    assert worker.arg.tolist() == [100.0, 101.0, 102.0, 103.0, 104.0, 105.0]


def test_round_trip_writes_both_ways(worker):
    x = torch.arange(8, dtype=torch.float32, device=DEV)
    assert worker("hold", "x", x) == "ok"
    assert worker("mul2", "x") == "ok"  # the receiver writes ...
    assert x.tolist() == [2.0 * i for i in range(8)]  # ... the sender sees it
    x.add_(1)  # the sender writes ...
    torch.axon.synchronize(DEV)
    want = torch.arange(8, dtype=torch.float32) * 2 + 1
    assert worker("read", "x") == _bytes(want)  # ... the receiver sees it
    assert worker("drop", "x") == "ok"


def test_received_tensor_can_be_passed_on(worker):
    x = torch.zeros(5, device=DEV)
    assert worker("hold", "p", x) == "ok"
    back = worker("send_back", "p")  # mapped from the worker's mapping: the same memory
    assert back.device == DEV and back.data_ptr() != x.data_ptr()
    back.fill_(3.0)
    torch.axon.synchronize(DEV)
    assert x.tolist() == [3.0] * 5
    assert worker("read", "p") == _bytes(torch.full((5,), 3.0))
    del back
    assert worker("drop", "p") == "ok"


def _exiting_sender(queue, done):
    import torch  # noqa: F811

    t = torch.arange(1000, dtype=torch.int64, device="axon:1")
    queue.put(t)
    done.wait(60)  # the receiver mapped it; then this process exits, freeing nothing


def test_receiver_keeps_the_memory_after_the_sender_exits():
    ctx = mp.get_context("spawn")
    queue, done = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_exiting_sender, args=(queue, done), daemon=True)
    p.start()
    t = queue.get(timeout=120)
    done.set()
    p.join(60)
    assert p.exitcode == 0
    assert t.device == DEV
    assert torch.equal(t.cpu(), torch.arange(1000))
    t.mul_(2)  # still writable device memory of this process
    assert t.sum().item() == 999 * 1000
    del t
    gc.collect()  # releases the gone sender's counter without error


def _killed_receiver(queue, ready):
    import time

    t = queue.get(timeout=120)  # noqa: F841  (held until the process is killed)
    ready.set()
    time.sleep(120)


def test_ipc_collect_frees_what_a_killed_receiver_held():
    ctx = mp.get_context("spawn")
    queue, ready = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_killed_receiver, args=(queue, ready), daemon=True)
    p.start()
    x = torch.ones(1 << 16, device=DEV)
    queue.put(x)
    assert ready.wait(120)
    torch.axon.ipc_collect()
    live0, limbo0 = _stats()
    del x
    gc.collect()
    assert _stats() == (live0 - 1, limbo0 + 1)  # the receiver holds it
    torch.axon.ipc_collect()
    assert _stats() == (live0 - 1, limbo0 + 1)
    p.kill()
    p.join(30)
    torch.axon.ipc_collect()  # its receiver is gone without releasing it
    assert _stats() == (live0 - 1, limbo0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64],
                         ids=str)
def test_dtypes_and_views(worker, dtype):
    base = (torch.arange(5 * 7, dtype=torch.float64) * 1.25 - 9).to(dtype).reshape(5, 7).to(DEV)
    for view in (base, base[1:, 2::2], base.t(), base[3]):
        got = worker("describe", view)
        assert got == ("axon:1", tuple(view.shape), view.stride(), view.storage_offset(),
                       str(dtype), False, "Tensor", _bytes(view)), got
    # A write through the receiver's view lands in the sender's base tensor.
    view = base[1:, 2::2]
    assert worker("hold", "v", view) == "ok"
    assert worker("mul2", "v") == "ok"
    want = (torch.arange(5 * 7, dtype=torch.float64) * 1.25 - 9).to(dtype).reshape(5, 7)
    want[1:, 2::2] *= 2
    assert torch.equal(base.cpu(), want)
    assert worker("drop", "v") == "ok"


def test_zero_size_and_requires_grad(worker):
    empty = torch.empty(0, 3, device=DEV)
    assert worker("describe", empty)[:6] == ("axon:1", (0, 3), (3, 1), 0, "torch.float32", False)
    leaf = torch.randn(3, device=DEV, requires_grad=True)
    got = worker("describe", leaf)
    assert got[5] is True and got[6] == "Tensor" and got[7] == _bytes(leaf)
    param = torch.nn.Parameter(torch.randn(2, 2, device=DEV))
    got = worker("describe", param)
    assert got[5] is True and got[6] == "Parameter" and got[7] == _bytes(param)


def test_queue(worker):
    t = torch.linspace(0, 1, 9, device=DEV, dtype=torch.bfloat16)
    worker.queue.put(t)
    assert worker("queue") == ("axon:1", _bytes(t))


def test_keep_alive_until_the_receiver_drops_it(worker):
    n = 1 << 18  # 1 MiB: a block of its own
    x = torch.arange(n, dtype=torch.float32, device=DEV)
    want = _bytes(x)
    torch.axon.ipc_collect()  # what earlier tests sent and the worker dropped
    live0, limbo0 = _stats()
    assert worker("hold", "k", x) == "ok"
    assert _stats() == (live0 + 1, limbo0)
    before = torch.axon.memory_allocated(DEV)
    del x
    gc.collect()
    # The receiver still maps it: the block waits, still allocated.
    assert _stats() == (live0, limbo0 + 1)
    torch.axon.ipc_collect()
    assert _stats() == (live0, limbo0 + 1)
    assert torch.axon.memory_allocated(DEV) == before
    torch.axon.empty_cache()
    junk = [torch.full((n,), -1.0, device=DEV) for _ in range(3)]  # would reuse a freed block
    assert worker("read", "k") == want
    allocated = torch.axon.memory_allocated(DEV)
    assert worker("drop", "k") == "ok"
    assert torch.axon.memory_allocated(DEV) == allocated  # freed by ipc_collect, not before
    torch.axon.ipc_collect()
    assert _stats() == (live0, limbo0)
    assert torch.axon.memory_allocated(DEV) == allocated - 4 * n
    del junk


def test_in_process_round_trip_shares_the_storage():
    x = torch.arange(4.0, device=DEV)
    live0, limbo0 = _stats()
    y = ForkingPickler.loads(ForkingPickler.dumps(x[1:]))
    assert y.device == DEV and y.storage_offset() == 1
    assert y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    y[0] = 10.0
    assert x.tolist() == [0.0, 10.0, 2.0, 3.0]
    assert _stats() == (live0 + 1, limbo0)
    del x, y
    gc.collect()
    assert _stats() == (live0, limbo0)  # the counter went back at once: freed, not in limbo


def test_shared_twice_counts_twice(worker):
    x = torch.ones(16, device=DEV)
    torch.axon.ipc_collect()
    live0, limbo0 = _stats()
    assert worker("hold", "a", x) == "ok"
    assert worker("hold", "b", x[4:]) == "ok"  # same storage: found in the receiver's cache
    assert _stats() == (live0 + 1, limbo0)
    del x
    gc.collect()
    assert _stats() == (live0, limbo0 + 1)
    assert worker("drop", "a") == "ok"
    torch.axon.ipc_collect()
    assert _stats() == (live0, limbo0 + 1)  # "b" still maps it
    assert worker("drop", "b") == "ok"
    torch.axon.ipc_collect()
    assert _stats() == (live0, limbo0)


def test_errors():
    x = torch.ones(3, device=DEV, requires_grad=True)
    with pytest.raises(RuntimeError, match="Cowardly refusing to serialize non-leaf tensor"):
        ForkingPickler.dumps(x * 2)
    with pytest.raises(RuntimeError, match="Cannot pickle axon storage; try pickling an axon tensor"):
        ForkingPickler.dumps(torch.ones(3, device=DEV).untyped_storage())
    # A handle whose memory is gone (or not the memory it names) and one for a
    # device the receiver lacks.
    y = torch.ones(3, device=DEV)
    fn, args = reductions.reduce_tensor(y)
    handle = list(args[6])
    stale = list(handle)
    stale[3] += 1000  # another allocation id: not in the cache, opened anew
    stale[4] += 1     # ... and not that memfd's inode
    with pytest.raises(RuntimeError, match=r"cannot map the device memory process \d+ shared "
                                           r"\(is it still running\?\): .* no longer the exported"):
        fn(*args[:6], tuple(stale), args[7])
    bad = list(handle)
    bad[0] = 99
    bad[3] += 2000
    with pytest.raises(RuntimeError, match=r"Invalid device index: axon:99.*the receiving process "
                                           r"must have the sender's device"):
        fn(*args[:5], 99, tuple(bad), args[7])
    with pytest.raises(RuntimeError, match="invalid handle"):
        _C._ipc_open(tuple(handle[:7] + [handle[5] + 64] + handle[8:]))


def test_can_device_access_peer():
    n = torch.axon.device_count()
    assert torch.axon.can_device_access_peer(0, 1) is True
    assert torch.axon.can_device_access_peer("axon:1", torch.device("axon", 0)) is True
    assert torch.axon.can_device_access_peer(1, 1) is False  # as CUDA: not its own peer
    with pytest.raises(AssertionError, match="Invalid device id"):
        torch.axon.can_device_access_peer(n, 0)
    with pytest.raises(AssertionError, match="Invalid peer device id"):
        torch.axon.can_device_access_peer(0, -1)
    with pytest.raises(ValueError, match="Expected an axon device"):
        torch.axon.can_device_access_peer("cpu", 0)


def test_private_memory_and_forked_children_error():
    r = run_python("""
        import os, torch
        from multiprocessing.reduction import ForkingPickler
        from torch_axon.integrations.torch_multiprocessing import rebuild_axon_tensor
        x = torch.ones(4, device="axon")
        try:
            ForkingPickler.dumps(x)
            print("shared")
        except RuntimeError as e:
            print("private", "AXON_SHAREABLE_MEMORY=0" in str(e) and "tensor.cpu()" in str(e))

        class Data(torch.utils.data.Dataset):
            def __len__(self):
                return 2
            def __getitem__(self, i):
                return torch.ones(1, device="axon")

        loader = torch.utils.data.DataLoader(Data(), num_workers=1, multiprocessing_context="fork")
        try:
            list(loader)
            print("loaded")
        except RuntimeError as e:
            print("worker", "Cannot re-initialize axon in forked subprocess" in str(e)
                  and "'spawn' start method" in str(e))

        pid = os.fork()
        if pid == 0:
            try:
                rebuild_axon_tensor(torch.Tensor, (0,), (1,), 0, torch.float32, 0, None, False)
                os._exit(3)
            except RuntimeError as e:
                ok = "Cannot re-initialize axon in forked subprocess" in str(e)
                os._exit(0 if ok and "'spawn' start method" in str(e) else 4)
        _, status = os.waitpid(pid, 0)
        print("rebuild", os.waitstatus_to_exitcode(status))
    """, env={"AXON_SHAREABLE_MEMORY": "0"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["private", "True", "worker", "True", "rebuild", "0"], \
        (r.stdout, r.stderr[-2000:])
