"""Asynchronous errors reach everything that depends on them (issue 15, item 3).

The model (runtime.h, AsyncError): a kernel's error is kept by its stream; an
event recorded after it carries it; a stream that waits on such an event
(``wait_stream``, ``wait_event``, also across devices) takes it, so every
synchronising call on that stream, and every host read of a result computed
there (``.cpu()``, ``.item()``, ``.tolist()``), raises it.  Work enqueued after
the failure or after the wait still runs.  A synchronising call reports every
failure pending on what it covers: the first one's message, then the others
listed.  Every stream that depends on a failure reports it once, whichever is
synchronised first: the stream it failed on and each stream that waited for it.
A stream never takes back a failure it reported.
"""

import datetime

import pytest
import torch

from conftest import make
from dist_util import run_ranks

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def inject(device, msg):
    """A kernel that fails with msg, on device's current stream."""
    torch.axon._C._test_inject_async_error(device, msg)


def failing_index_select(x):
    """index_select with an index out of range: checked by the kernel (the
    index is device data), so it fails asynchronously.  A valid call first, so
    the failing one is not the op's first launch."""
    ok = torch.tensor([0, 1], device=x.device)
    bad = torch.tensor([1, x.shape[0] + 40], device=x.device)
    x.index_select(0, ok)
    return x.index_select(0, bad)


def raises_once(fn, *parts):
    """fn raises a RuntimeError naming every part; returns the message."""
    with pytest.raises(RuntimeError) as e:
        fn()
    msg = str(e.value)
    for p in parts:
        assert p in msg, msg
    return msg


@pytest.mark.parametrize("dtype", DTYPES)
def test_wait_stream_carries_kernel_error_to_results(dtype):
    x = make((10,), dtype, seed=3).axon()
    torch.axon.synchronize()
    s = torch.axon.Stream()
    with torch.axon.stream(s):
        y = failing_index_select(x)
    torch.axon.current_stream().wait_stream(s)
    msg = raises_once(lambda: (y + 1).cpu(), "index out of range", "index_select",
                      f"axon:0 stream {s.stream_id}")
    assert "reported on axon:0 stream 0, which waited for the failed work" in msg
    # Reported once per stream: the default stream is clean now, s still has it.
    torch.axon.current_stream().synchronize()
    raises_once(s.synchronize, "index out of range")
    torch.axon.synchronize()


@pytest.mark.parametrize("read", ["item", "tolist", "cpu", "stream.synchronize",
                                  "synchronize"])
def test_every_read_through_the_wait_raises(read):
    x = torch.arange(10.0, device="axon")
    s = torch.axon.Stream()
    with torch.axon.stream(s):
        y = failing_index_select(x)
    torch.axon.current_stream().wait_stream(s)
    fn = {"item": lambda: y.sum().item(), "tolist": y.tolist, "cpu": lambda: (y * 2).cpu(),
          "stream.synchronize": torch.axon.current_stream().synchronize,
          "synchronize": torch.axon.synchronize}[read]
    raises_once(fn, "index out of range")
    if read != "synchronize":
        raises_once(torch.axon.synchronize, "index out of range")  # s's own
    torch.axon.synchronize()


def test_event_carries_the_error():
    x = torch.arange(6.0, device="axon")
    s = torch.axon.Stream()
    with torch.axon.stream(s):
        inject(0, "kernel before event")
        e = s.record_event()
    torch.axon.current_stream().wait_event(e)
    # Raised by the op itself (a first launch synchronises) or by the read.
    raises_once(lambda: (x * 2 + 1).cpu(), "kernel before event", "reported on axon:0 stream 0")
    # The event stands for s's work up to it: it reports the failure for s, once.
    raises_once(e.synchronize, "kernel before event")
    e.synchronize()
    s.synchronize()  # reported through the event
    # A stream that waits on the event afterwards depends on the failed work too.
    t = torch.axon.Stream()
    t.wait_event(e)
    raises_once(t.synchronize, "kernel before event", f"reported on axon:0 stream {t.stream_id}")
    t.synchronize()
    torch.axon.synchronize()


@pytest.mark.parametrize("first", ["failing", "waiting"])
def test_every_dependent_stream_reports_whichever_is_synchronized_first(first):
    """The failing stream and a stream that waited for it both report the
    failure, once each, in either order; values read through either raise."""
    x = torch.arange(10.0, device="axon")
    (x[:2] * 2).cpu()  # not z's first launch (a first launch synchronises)
    s, t = torch.axon.Stream(), torch.axon.Stream()
    with torch.axon.stream(s):
        y = failing_index_select(x)
    t.wait_stream(s)
    with torch.axon.stream(t):
        z = y * 2
    order = [s, t] if first == "failing" else [t, s]
    for stream in order:
        raises_once(stream.synchronize, "index out of range")
        stream.synchronize()
    torch.axon.synchronize()
    del z


def test_event_synchronize_reports_the_error():
    s = torch.axon.Stream()
    with torch.axon.stream(s):
        inject(0, "seen at the event")
        e = s.record_event()
    raises_once(e.synchronize, "seen at the event", f"axon:0 stream {s.stream_id}")
    e.synchronize()
    s.synchronize()  # reported through the event
    torch.axon.synchronize()


def test_torch_event_and_accelerator_apis():
    s = torch.axon.Stream()
    with torch.axon.stream(s):
        inject(0, "through torch.Event")
    ev = torch.Event("axon")
    ev.record(s)
    torch.accelerator.current_stream().wait_event(ev)
    raises_once(torch.accelerator.current_stream().synchronize, "through torch.Event")
    raises_once(torch.accelerator.synchronize, "through torch.Event")


def test_unrelated_stream_is_not_affected():
    x = torch.arange(4.0, device="axon")
    s, t = torch.axon.Stream(), torch.axon.Stream()
    with torch.axon.stream(s):
        inject(0, "only on s")
    t.wait_stream(torch.axon.current_stream())  # x is made on the default stream
    with torch.axon.stream(t):
        y = x + 1
    t.synchronize()
    torch.axon.current_stream().wait_stream(t)
    assert y.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]
    raises_once(torch.axon.synchronize, "only on s")


def test_error_reported_before_the_event_is_not_carried():
    s = torch.axon.Stream()
    with torch.axon.stream(s):
        inject(0, "seen already")
    raises_once(s.synchronize, "seen already")
    torch.axon.current_stream().wait_stream(s)
    torch.axon.current_stream().synchronize()
    torch.axon.synchronize()


def test_cross_device_wait_carries_the_error():
    x1 = torch.arange(8.0, device="axon:1")
    s1 = torch.axon.Stream(device=1)
    with torch.axon.stream(s1):
        y1 = failing_index_select(x1)
    x0 = torch.arange(8.0, device="axon:0")
    torch.axon.current_stream(0).wait_stream(s1)
    raises_once(lambda: (x0 * 3).cpu(), "index out of range", "on axon:1 stream",
                "reported on axon:0 stream 0")
    raises_once(lambda: torch.axon.synchronize(1), "index out of range")
    del y1
    torch.axon.synchronize(0)
    torch.axon.synchronize(1)


def test_chain_of_waits_across_devices():
    s1 = torch.axon.Stream(device=1)
    s2 = torch.axon.Stream(device=2)
    with torch.axon.stream(s1):
        inject(1, "start of the chain")
    s2.wait_stream(s1)
    torch.axon.current_stream(0).wait_stream(s2)
    raises_once(torch.axon.current_stream(0).synchronize, "start of the chain")
    # s2 only passed it on, but its work after the wait depends on it too
    raises_once(lambda: torch.axon.synchronize(2), "start of the chain")
    raises_once(lambda: torch.axon.synchronize(1), "start of the chain")  # where it failed


def test_reported_error_does_not_come_back_through_a_collective_style_stream():
    # A side stream that waits on the user's stream and is never synchronised
    # by the user (as the process groups' communication streams): once the
    # user saw the error, later waits on that stream do not raise it again on
    # the user's stream.  The side stream reports it once, to a device-wide
    # synchronize (its work after the wait depends on it).
    x = torch.arange(4.0, device="axon")
    comm = torch.axon.Stream()
    inject(0, "seen once")
    comm.wait_stream(torch.axon.current_stream())
    raises_once(torch.axon.current_stream().synchronize, "seen once")
    for _ in range(3):
        with torch.axon.stream(comm):
            y = x + 1
        torch.axon.current_stream().wait_stream(comm)
        assert y.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]
    raises_once(torch.axon.synchronize, "seen once")
    torch.axon.synchronize()


def test_two_failures_before_one_synchronize_are_both_reported():
    inject(0, "first failure")
    inject(0, "second failure")
    msg = raises_once(torch.axon.synchronize, "first failure", "second failure",
                      "1 more asynchronous error since the last synchronization")
    assert msg.index("first failure") < msg.index("second failure")
    torch.axon.synchronize()


def test_two_failures_on_two_streams_are_both_reported():
    s, t = torch.axon.Stream(), torch.axon.Stream()
    with torch.axon.stream(s):
        inject(0, "failure on s")
        e = s.record_event()
    torch.axon._C._test_event_wait(e.event_id)  # s's failure happens first (not reported)
    with torch.axon.stream(t):
        inject(0, "failure on t")
    t.wait_event(e)  # t now has s's failure too: still reported once
    msg = raises_once(torch.axon.synchronize, "failure on s", "failure on t",
                      "1 more asynchronous error")
    assert msg.count("failure on s") == 1
    assert msg.index("failure on s") < msg.index("failure on t")
    torch.axon.synchronize()


def test_many_failures_are_counted():
    for i in range(20):
        inject(0, f"failure {i}")
    msg = raises_once(torch.axon.synchronize, "failure 0", "failure 15",
                      "19 more asynchronous errors", "and 4 more (not kept)")
    assert "failure 16" not in msg


def test_work_after_the_wait_still_runs():
    x = make((16,), torch.float32, seed=2)
    src, dst = x.axon(), torch.zeros(16, device="axon")
    s = torch.axon.Stream()
    with torch.axon.stream(s):
        inject(0, "before the copy")
    torch.axon.current_stream().wait_stream(s)
    dst.copy_(src)
    raises_once(torch.axon.synchronize, "before the copy")
    assert torch.equal(dst.cpu(), x)


def test_freeing_memory_does_not_consume_the_users_error():
    inject(0, "for the user")
    torch.axon.empty_cache()  # waits for the streams, reports nothing
    raises_once(torch.axon.synchronize, "for the user")


# ---------------------------------------------------------------- recv timeout

def _recv_times_out(rank, world_size, blocking):
    import torch.distributed as dist

    dist.init_process_group("axon", timeout=datetime.timedelta(seconds=2))
    dev = torch.device("axon", rank)
    out = {}
    if rank == 0:
        buf = torch.zeros(4, device=dev)
        if blocking:
            dist.recv(buf, 1)  # orders the stream after the recv; no host wait
        else:
            dist.irecv(buf, 1)  # never waited for
    dist.destroy_process_group()  # rank 0: returns once the recv has timed out
    try:
        torch.axon.synchronize()
        out["raised"] = None
    except RuntimeError as e:
        out["raised"] = str(e)
    return out


@pytest.mark.parametrize("blocking", [True, False], ids=["recv", "irecv"])
def test_recv_that_times_out_is_reported_after_destroy(blocking):
    results = run_ranks(_recv_times_out, 2, blocking, timeout=120)
    msg = results[0]["raised"]
    assert msg is not None, "the failed recv was swallowed"
    assert "recv" in msg and "axon process group" in msg, msg
    assert results[1]["raised"] is None


@pytest.mark.parametrize("query", ["event", "stream"])
def test_query_of_finished_work_raises_its_error_once(query):
    """As CUDA's: a query that finds the work done reports its pending asynchronous error
    (once; later queries and synchronize do not repeat it); unfinished work reports
    nothing yet."""
    x = torch.arange(10.0, device="axon")
    torch.axon.synchronize()
    s = torch.axon.Stream()
    with torch.axon.stream(s):
        failing_index_select(x)
        ev = s.record_event()
    q = ev.query if query == "event" else s.query
    seen = None
    for _ in range(100000):  # until the work has run
        try:
            if q():
                break
        except RuntimeError as e:
            seen = str(e)
            break
    assert seen is not None and "index out of range" in seen and "index_select" in seen
    assert q() is True  # reported: later queries are clean
    s.synchronize()
    if query == "stream":
        torch.axon.synchronize()  # the stream reported it
    else:
        # reported through the event: the recording stream does not report it again
        torch.axon.synchronize()


def test_query_while_work_runs_is_false_and_raises_nothing():
    s = torch.axon.Stream()
    gate = torch.axon.Event()
    x = torch.randn(1 << 20, device="axon")
    with torch.axon.stream(s):
        for _ in range(20):
            x = x * 1.0001
        gate.record()
    # either still running (False) or done (True): never an error without one
    assert gate.query() in (True, False) and s.query() in (True, False)
    s.synchronize()
    assert gate.query() is True and s.query() is True


def test_kernel_failure_is_an_accelerator_error():
    """As CUDA's: an asynchronous device error is torch.AcceleratorError (a
    RuntimeError, torch.axon.AcceleratorError too), raised once."""
    x = torch.randn(4, 3, device="axon")
    failing_index_select(x)
    with pytest.raises(torch.AcceleratorError, match="index_select") as e:
        torch.axon.synchronize()
    assert torch.axon.AcceleratorError is torch.AcceleratorError
    assert isinstance(e.value, RuntimeError)
    torch.axon.synchronize()  # reported once
    torch.testing.assert_close((x + 1).cpu(), x.cpu() + 1)
