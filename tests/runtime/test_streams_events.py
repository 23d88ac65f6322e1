"""Streams and events: creation, the stream context, query/synchronize,
timing, and cross-stream ordering made observable with a sleep enqueued on a
stream (torch_axon._C._test_sleep_on_stream)."""

import threading

import pytest
import torch

from conftest import FLOAT_DTYPES, assert_same, make

sleep_on_stream = torch.axon._C._test_sleep_on_stream
# Long enough that "still pending right after enqueueing" cannot be a race on
# a loaded machine; short enough to keep the suite fast.
BUSY_MS = 200


def test_stream_creation():
    s = torch.axon.Stream()
    assert isinstance(s, torch.Stream) and isinstance(s, torch.axon.Stream)
    assert s.device == torch.device("axon:0")
    assert s != torch.axon.default_stream()
    assert s.stream_id != 0
    s1 = torch.axon.Stream(device=1)
    assert s1.device_index == 1
    assert torch.axon.Stream(device="axon:2").device_index == 2
    with torch.axon.device(3):
        assert torch.axon.Stream().device_index == 3
    assert "axon:1" in repr(s1)


def test_default_and_current_stream():
    d = torch.axon.default_stream()
    assert d.stream_id == 0 and d.device_index == 0
    assert torch.axon.current_stream() == d
    assert torch.axon.current_stream(1) == torch.axon.default_stream(1)
    assert torch.axon.current_stream(1) != d


def test_priorities_accepted_and_kept_apart():
    high = [torch.axon.Stream(priority=-1) for _ in range(3)]
    normal = [torch.axon.Stream(priority=0) for _ in range(3)]
    ids_high = {s.stream_id for s in high}
    ids_normal = {s.stream_id for s in normal}
    assert len(ids_high) == 3 and len(ids_normal) == 3
    assert not ids_high & ids_normal
    # a high-priority stream works like any other
    x = make((8,), torch.float32)
    with torch.axon.stream(high[0]):
        y = x.axon() * 3
    high[0].synchronize()
    assert_same(y, x * 3)


def test_stream_priority_attribute():
    assert torch.axon.Stream(priority=-1).priority < 0
    assert torch.axon.Stream().priority == 0


def test_stream_context_sets_current_stream():
    s = torch.axon.Stream()
    t = torch.axon.Stream()
    with torch.axon.stream(s):
        assert torch.axon.current_stream() == s
        assert torch.accelerator.current_stream() == s
        with torch.axon.stream(t):
            assert torch.axon.current_stream() == t
        assert torch.axon.current_stream() == s
        with torch.axon.stream(None):  # None: no change
            assert torch.axon.current_stream() == s
    assert torch.axon.current_stream() == torch.axon.default_stream()
    with pytest.raises(RuntimeError, match="inner"):
        with torch.axon.stream(s):
            raise RuntimeError("inner")
    assert torch.axon.current_stream() == torch.axon.default_stream()


def test_stream_context_on_another_device():
    s2 = torch.axon.Stream(device=2)
    prev = torch.axon.current_stream(2)
    with torch.axon.stream(s2):
        assert torch.axon.current_device() == 2
        assert torch.axon.current_stream() == s2
        x = torch.ones(3, device="axon")
        assert x.device.index == 2
    assert torch.axon.current_device() == 0
    assert torch.axon.current_stream(2) == prev


def test_set_stream():
    s = torch.axon.Stream()
    torch.axon.set_stream(s)
    assert torch.axon.current_stream() == s
    torch.axon.set_stream(torch.axon.default_stream())
    assert torch.axon.current_stream() == torch.axon.default_stream()


def test_current_stream_is_per_thread():
    s = torch.axon.Stream()
    seen = []
    with torch.axon.stream(s):
        th = threading.Thread(target=lambda: seen.append(torch.axon.current_stream()))
        th.start()
        th.join()
        assert torch.axon.current_stream() == s
    assert seen == [torch.axon.default_stream()]


def test_stream_query_and_synchronize():
    s = torch.axon.Stream()
    assert s.query()
    with torch.axon.stream(s):
        sleep_on_stream(0, BUSY_MS)
    assert not s.query()
    assert torch.axon.default_stream().query()  # other streams are unaffected
    s.synchronize()
    assert s.query()


def test_device_synchronize_waits_for_all_streams():
    streams = [torch.axon.Stream() for _ in range(3)]
    for s in streams:
        with torch.axon.stream(s):
            sleep_on_stream(0, 50)
    torch.axon.synchronize()
    assert all(s.query() for s in streams)


# ---------------------------------------------------------------- events

def test_event_is_torch_event():
    e = torch.axon.Event()
    assert isinstance(e, torch.Event) and isinstance(e, torch.axon.Event)
    assert e.device.type == "axon"
    e.record()  # like torch.cuda.Event, bound to a device index when recorded
    assert e.device == torch.device("axon:0")
    assert not isinstance(torch.Event(device="cpu"), torch.axon.Event)
    with torch.axon.device(1):
        e1 = torch.axon.Event()
        e1.record()
        assert e1.device == torch.device("axon:1")
    with pytest.raises(NotImplementedError):
        torch.axon.Event(interprocess=True)
    with pytest.raises(NotImplementedError, match="cannot be external"):
        torch.axon.Event(enable_timing=True, external=True)  # torch.cuda.Event's keyword


def test_event_record_query_synchronize():
    e = torch.axon.Event()
    assert e.query()  # never recorded: complete
    sleep_on_stream(0, BUSY_MS)
    e.record()
    assert not e.query()
    e.synchronize()
    assert e.query()
    # recording on an explicit stream, and through Stream.record_event
    s = torch.axon.Stream()
    with torch.axon.stream(s):
        sleep_on_stream(0, BUSY_MS)
    e.record(s)
    e2 = s.record_event()
    assert isinstance(e2, torch.Event)
    assert not e.query() and not e2.query()
    e2.synchronize()
    assert e.query() and e2.query()


def test_event_elapsed_time():
    start = torch.axon.Event(enable_timing=True)
    end = torch.axon.Event(enable_timing=True)
    start.record()
    sleep_on_stream(0, 50)
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end)
    assert 50 <= ms < 5000
    assert end.elapsed_time(start) < 0


def test_elapsed_time_needs_completed_events():
    start = torch.axon.Event(enable_timing=True)
    end = torch.axon.Event(enable_timing=True)
    start.record()
    sleep_on_stream(0, BUSY_MS)
    end.record()
    with pytest.raises(RuntimeError, match="elapsed time"):
        start.elapsed_time(end)
    torch.axon.synchronize()
    assert start.elapsed_time(end) >= BUSY_MS * 0.9


def _slow_copy_on(stream, dst, src):
    """On `stream`: a long sleep, then dst.copy_(src); returns an event after it."""
    with torch.axon.stream(stream):
        sleep_on_stream(0, BUSY_MS)
        dst.copy_(src)
        return stream.record_event()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + (torch.int64,))
@pytest.mark.parametrize("how", ["wait_event", "event_wait", "wait_stream"])
def test_cross_stream_ordering(dtype, how):
    x = make((64,), dtype, seed=3)
    src = x.axon()
    mid = torch.zeros(64, dtype=dtype, device="axon")
    out = torch.zeros(64, dtype=dtype, device="axon")
    torch.axon.synchronize()
    a, b = torch.axon.Stream(), torch.axon.Stream()
    ev = _slow_copy_on(a, mid, src)
    with torch.axon.stream(b):
        if how == "wait_event":
            b.wait_event(ev)
        elif how == "event_wait":
            ev.wait(b)
        else:
            b.wait_stream(a)
        out.copy_(mid)  # must see A's copy, though A is still sleeping
    assert not b.query()  # b really waits for a
    b.synchronize()
    assert a.query()
    assert_same(out, x)


def test_cross_stream_without_wait_is_unordered():
    # The control for test_cross_stream_ordering: without the wait, B reads mid
    # before A's delayed copy, so the ordering above is due to the wait.
    x = make((64,), torch.float32, seed=3)
    src = x.axon()
    mid = torch.zeros(64, device="axon")
    out = torch.full((64,), 7.0, device="axon")
    torch.axon.synchronize()
    a, b = torch.axon.Stream(), torch.axon.Stream()
    _slow_copy_on(a, mid, src)
    with torch.axon.stream(b):
        out.copy_(mid)
    b.synchronize()
    assert not a.query()
    assert_same(out, torch.zeros(64))
    torch.axon.synchronize()
    assert_same(mid, x)


def test_ops_on_a_stream_wait_for_its_earlier_work():
    # Work on one stream runs in order: an op after a delayed copy sees its result.
    x = make((5, 5), torch.float32, seed=4)
    src, dst = x.axon(), torch.zeros(5, 5, device="axon")
    torch.axon.synchronize()
    s = torch.axon.Stream()
    with torch.axon.stream(s):
        sleep_on_stream(0, 50)
        dst.copy_(src)
        r = dst.sum(0) * 2
    s.synchronize()
    assert_same(r, x.sum(0) * 2, accum=True)


def test_events_on_another_device():
    s = torch.axon.Stream(device=1)
    with torch.axon.stream(s):
        e = torch.axon.Event()
        sleep_on_stream(1, BUSY_MS)
        e.record()
    assert e.device == torch.device("axon:1")
    assert not e.query()
    e.synchronize()
    assert e.query()


def test_event_recorded_on_another_devices_stream_message():
    e = torch.axon.Event()
    e.record()  # bound to axon:0
    with pytest.raises(RuntimeError) as err:
        e.record(torch.axon.Stream(device=1))
    assert "Event device index 0 does not match recording stream's device index 1" in str(err.value)


def test_event_recorded_on_another_devices_stream_raises():
    e = torch.axon.Event()
    e.record()
    with pytest.raises(RuntimeError, match="Event device index"):
        e.record(torch.axon.Stream(device=1))


@pytest.mark.parametrize("wait", ["torch.axon.synchronize", "stream.synchronize",
                                  "event.synchronize", "item"])
def test_blocking_waits_release_the_gil(wait):
    # Another Python thread must run while the host waits for the device.
    ticks = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks.append(1)
            stop.wait(0.005)

    x = torch.zeros(1, device="axon")
    torch.axon.synchronize()
    sleep_on_stream(0, 300)
    th = threading.Thread(target=spin)
    th.start()
    try:
        if wait == "torch.axon.synchronize":
            torch.axon.synchronize()
        elif wait == "stream.synchronize":
            torch.axon.current_stream().synchronize()
        elif wait == "event.synchronize":
            torch.axon.current_stream().record_event().synchronize()
        else:
            x.item()
        n = len(ticks)
    finally:
        stop.set()
        th.join()
    assert n >= 10, f"the other thread ran only {n} times during a 300 ms wait"


def test_a_stream_of_another_device_type_is_refused():
    # as torch.cuda.stream / set_stream with a CPU stream: "Expected a cuda device"
    cpu = torch.Stream("cpu")
    with pytest.raises(ValueError, match="Expected an axon device, but got: cpu"):
        with torch.axon.stream(cpu):
            pass
    with pytest.raises(ValueError, match="Expected an axon device, but got: cpu"):
        torch.axon.set_stream(cpu)
    assert torch.axon.current_stream() == torch.axon.default_stream()


def test_elapsed_time_between_devices_is_an_error():
    # as CUDA's (cudaEventElapsedTime refuses events of two devices)
    a, b = torch.axon.Event(enable_timing=True), torch.axon.Event(enable_timing=True)
    a.record(torch.axon.current_stream(0))
    b.record(torch.axon.current_stream(1))
    b.synchronize()
    a.synchronize()
    with pytest.raises(RuntimeError, match="recorded on the same device.*axon:0 and axon:1"):
        a.elapsed_time(b)
    c = torch.axon.Event(enable_timing=True)
    c.record(torch.axon.current_stream(0))
    c.synchronize()
    assert a.elapsed_time(c) >= 0
