"""torch.axon's memory tools: private pools (MemPool, use_mem_pool, the C++ pool
API graphs use), memory history and snapshots rendered by PyTorch's own
torch/cuda/_memory_viz.py, the per-process memory fraction, OutOfMemoryError,
pinned host memory statistics and memory_stats' keys.

Tests run on a device of their own (axon:6; test_memory.py uses axon:7) so
that exact byte counts are not disturbed by tensors of other tests.
"""

import gc
import pickle
import subprocess
import sys
import threading

import pytest
import torch

from torch.cuda import _memory_viz

_C = torch.axon._C
MiB = 1 << 20
DEV = 6


@pytest.fixture
def dev():
    """axon:6, current, with nothing allocated or cached and no history recorded."""
    if torch.axon.memory_allocated(DEV) != 0:
        gc.collect()
    torch.axon.synchronize(DEV)
    torch.axon.empty_cache()
    assert torch.axon.memory_allocated(DEV) == 0, "tensors left on axon:6 by an earlier test"
    assert torch.axon.memory_reserved(DEV) == 0, "segments left on axon:6 (a pool not released?)"
    torch.axon.reset_peak_memory_stats(DEV)
    torch.axon.reset_accumulated_memory_stats(DEV)
    with torch.axon.device(DEV):
        yield DEV
    torch.axon.memory._record_memory_history(None)
    torch.axon.set_per_process_memory_fraction(1.0, DEV)
    torch.axon.synchronize(DEV)
    torch.axon.empty_cache()


def segment_of(t: torch.Tensor, segments=None) -> dict:
    """The snapshot segment holding t's memory."""
    addr = t.untyped_storage().data_ptr()
    for seg in segments if segments is not None else torch.axon.memory_snapshot():
        if seg["address"] <= addr < seg["address"] + seg["total_size"]:
            return seg
    raise AssertionError(f"no segment holds {addr:#x}")


def pool_segments(pool_id) -> list:
    return [s for s in torch.axon.memory_snapshot() if s["segment_pool_id"] == tuple(pool_id)]


# ---------------------------------------------------------------- private pools

def test_allocations_inside_use_mem_pool_come_from_the_pool(dev):
    pool = torch.axon.MemPool()
    outside = torch.empty(1000, device="axon")
    with torch.axon.use_mem_pool(pool):
        inside = torch.empty(1000, device="axon")
        big = torch.empty(3 * MiB, dtype=torch.uint8, device="axon")
    after = torch.empty(1000, device="axon")
    assert segment_of(inside)["segment_pool_id"] == pool.id
    assert segment_of(big)["segment_pool_id"] == pool.id
    assert segment_of(big)["segment_type"] == "large"
    assert segment_of(outside)["segment_pool_id"] == (0, 0)
    assert segment_of(after)["segment_pool_id"] == (0, 0)
    assert segment_of(inside)["address"] != segment_of(outside)["address"]
    # The pool's snapshot holds its own segments only.
    assert {s["segment_pool_id"] for s in pool.snapshot()} == {pool.id}
    assert len(pool.snapshot()) == 2
    # Pool memory counts in the device's statistics, as CUDA's does.
    assert torch.axon.memory_allocated(dev) == 3 * 4096 + 3 * MiB
    del inside, big, outside, after, pool


def test_freed_pool_blocks_are_reused_only_inside_the_pool(dev):
    pool = torch.axon.MemPool()
    with torch.axon.use_mem_pool(pool):
        a = torch.empty(1000, device="axon")
    addr = a.data_ptr()
    del a
    b = torch.empty(1000, device="axon")  # same size, same stream: not the pool's block
    assert b.data_ptr() != addr
    assert segment_of(b)["segment_pool_id"] == (0, 0)
    with torch.axon.use_mem_pool(pool):
        c = torch.empty(1000, device="axon")
    assert c.data_ptr() == addr
    del b, c, pool


def test_pool_memory_is_freed_after_release_and_the_last_tensor(dev):
    pool = torch.axon.MemPool()
    pid = pool.id
    with torch.axon.use_mem_pool(pool):
        t = torch.empty(5 * MiB, dtype=torch.uint8, device="axon")
        u = torch.empty(100, device="axon")
    del u
    reserved = torch.axon.memory_reserved(dev)
    assert reserved >= 5 * MiB + 2 * MiB
    del pool  # released, but its tensors still live
    assert _C._mempool_use_count(dev, pid) == 0
    assert len(pool_segments(pid)) == 1  # the small segment (wholly free) went at once
    assert torch.axon.memory_reserved(dev) == reserved - 2 * MiB
    del t  # the last tensor: the segment goes back to the device
    assert pool_segments(pid) == []
    assert torch.axon.memory_reserved(dev) == 0
    assert torch.axon.memory_stats(dev)["num_device_free"] == 2


def test_released_pool_segment_waits_for_its_stream(dev):
    pool = torch.axon.MemPool()
    side = torch.axon.Stream()
    with torch.axon.stream(side), torch.axon.use_mem_pool(pool):
        t = torch.empty(1000, device="axon")
        _C._test_sleep_on_stream(dev, 300)
    pid = pool.id
    del pool, t  # wholly free, but work queued before the free may still use it
    assert len(pool_segments(pid)) == 1
    side.synchronize()
    torch.empty(1, device="axon")  # the allocator looks at completed work
    assert pool_segments(pid) == []


def test_empty_cache_keeps_a_live_pools_segments(dev):
    pool = torch.axon.MemPool()
    with torch.axon.use_mem_pool(pool):
        t = torch.empty(1000, device="axon")
    shared = torch.empty(1000, device="axon")
    del t, shared
    torch.axon.empty_cache()
    segs = [s for s in torch.axon.memory_snapshot() if s["device"] == dev]
    assert [s["segment_pool_id"] for s in segs] == [pool.id]
    assert [b["state"] for b in segs[0]["blocks"]] == ["inactive"]
    assert torch.axon.memory_reserved(dev) == 2 * MiB
    del pool  # now it is released: its cached segment goes
    assert torch.axon.memory_reserved(dev) == 0


def test_use_count(dev):
    pool = torch.axon.MemPool()
    assert pool.use_count() == 1
    with torch.axon.use_mem_pool(pool):
        assert pool.use_count() == 2
    assert pool.use_count() == 1
    _C._mempool_retain(dev, pool.id)  # a graph sharing it
    assert pool.use_count() == 2
    _C._mempool_release(dev, pool.id)
    assert pool.use_count() == 1
    assert torch.axon.MemPool().id != pool.id
    assert pool.id[0] == 0 and pool.id[1] > 0  # CUDA's {0, uid} for MemPool
    graph_id = _C._mempool_new_id(True)  # a graph's own pool: {uid, 0}
    assert graph_id[0] > 0 and graph_id[1] == 0


def test_use_mem_pool_routes_only_the_current_thread(dev):
    pool = torch.axon.MemPool()
    from_thread = []
    entered, allocated = threading.Event(), threading.Event()

    def other():
        entered.wait()
        torch.axon.set_device(dev)
        from_thread.append(torch.empty(1000, device="axon"))
        allocated.set()

    th = threading.Thread(target=other)
    th.start()
    with torch.axon.use_mem_pool(pool):
        entered.set()
        allocated.wait()
        mine = torch.empty(1000, device="axon")
    th.join()
    assert segment_of(mine)["segment_pool_id"] == pool.id
    assert segment_of(from_thread[0])["segment_pool_id"] == (0, 0)
    del mine, from_thread[:]


def test_pool_api_routes_by_stream(dev):
    """The C++ API graphs use (beginAllocateToPool with a stream filter)."""
    pid = torch.axon.graph_pool_handle()
    assert pid[0] == 0 and pid[1] > 0
    side = torch.axon.Stream()
    _C._test_begin_allocate_to_pool_on_streams(dev, pid, [side.stream_id])
    try:
        with torch.axon.stream(side):
            on_side = torch.empty(1000, device="axon")
        on_default = torch.empty(1000, device="axon")
    finally:
        _C._end_allocate_to_pool(dev, pid)
    assert _C._mempool_use_count(dev, pid) == 1
    assert segment_of(on_side)["segment_pool_id"] == pid
    assert segment_of(on_default)["segment_pool_id"] == (0, 0)
    with torch.axon.stream(side):
        later = torch.empty(1000, device="axon")  # routing ended
    assert segment_of(later)["segment_pool_id"] == (0, 0)
    _C._mempool_release(dev, pid)
    assert len(pool_segments(pid)) == 1  # on_side keeps it
    del on_side
    side.synchronize()
    assert pool_segments(pid) == []
    del on_default, later


def test_pool_api_errors(dev):
    pid = torch.axon.graph_pool_handle()
    _C._test_begin_allocate_to_pool_on_streams(dev, pid, [0])
    with pytest.raises(RuntimeError, match=r"beginAllocateToPool: already recording to mempool_id"):
        _C._test_begin_allocate_to_pool_on_streams(dev, pid, [0])
    _C._mempool_retain(dev, pid)
    _C._mempool_release(dev, pid)
    with pytest.raises(RuntimeError, match=r"releasePool: allocations are still routed"):
        _C._mempool_release(dev, pid)
    _C._end_allocate_to_pool(dev, pid)
    with pytest.raises(RuntimeError, match=r"endAllocateToPool: allocations are not routed"):
        _C._end_allocate_to_pool(dev, pid)
    _C._mempool_release(dev, pid)
    with pytest.raises(RuntimeError, match=r"releasePool: no live memory pool with id"):
        _C._mempool_release(dev, pid)
    with pytest.raises(RuntimeError, match=r"\(0, 0\) is not a private pool's id"):
        _C._mempool_retain(dev, (0, 0))


def test_pool_frees_follow_record_stream(dev):
    pool = torch.axon.MemPool()
    side = torch.axon.Stream()
    with torch.axon.use_mem_pool(pool):
        t = torch.empty(1000, device="axon")
    addr = t.data_ptr()
    with torch.axon.stream(side):
        _C._test_sleep_on_stream(dev, 300)
    t.record_stream(side)
    del t
    states = [b["state"] for b in pool.snapshot()[0]["blocks"]]
    assert states[0] == "active_pending_free"
    with torch.axon.use_mem_pool(pool):
        u = torch.empty(1000, device="axon")  # the block is not free yet
    assert u.data_ptr() != addr
    side.synchronize()
    with torch.axon.use_mem_pool(pool):
        v = torch.empty(1000, device="axon")
    assert v.data_ptr() == addr
    del u, v, pool


def test_record_stream_free_during_a_capture_waits_for_its_end(dev):
    """A free that needs events on a capturing stream is deferred to the end of
    the capture (recording or querying them there would invalidate it)."""
    x = torch.ones(1000, device="axon")
    addr = x.data_ptr()
    g = torch.axon.AxonGraph()
    with torch.axon.graph(g, stream=torch.axon.Stream()):
        y = x * 2
        x.record_stream(torch.axon.current_stream())
        del x
        z = torch.ones(100, device="axon") + y[:100]  # the allocator looks at pending frees

    def state():
        return [b["state"] for s in torch.axon.memory_snapshot() for b in s["blocks"]
                if b["address"] == addr]

    assert state() == ["active_pending_free"]
    g.replay()
    torch.axon.synchronize()
    torch.testing.assert_close(z.cpu(), torch.full((100,), 3.0))
    torch.empty(1, device="axon")  # events inserted now
    torch.axon.synchronize()
    torch.empty(1, device="axon")  # and found complete
    assert state() in (["inactive"], ["active_allocated"])
    del g, y, z


def test_mempool_argument_errors(dev):
    with pytest.raises(NotImplementedError, match=r"custom allocator is not supported on axon"):
        torch.axon.MemPool(allocator=object())
    with pytest.raises(NotImplementedError, match=r"use_on_oom=True is not supported"):
        torch.axon.MemPool(use_on_oom=True)
    with pytest.raises(TypeError, match=r"use_mem_pool: expected a torch.axon.MemPool, got tuple"):
        with torch.axon.use_mem_pool((0, 1)):
            pass


# ---------------------------------------------------------------- history and snapshots

def _allocate_in_named_function():
    return torch.empty(1000, device="axon")


def test_history_records_stacks_naming_the_allocating_function(dev):
    torch.axon.memory._record_memory_history(stacks="python", clear_history=True)
    t = _allocate_in_named_function()
    addr = t.data_ptr()
    del t
    snap = torch.axon.memory._snapshot()
    trace = [e for e in snap["device_traces"][dev]
             if e.get("addr") == addr and not e["action"].startswith("segment")]
    assert [e["action"] for e in trace] == ["alloc", "free_requested", "free_completed"]
    alloc = trace[0]
    assert alloc["size"] == 4000 and alloc["stream"] == 0 and alloc["pool_id"] == (0, 0)
    names = [f["name"] for f in alloc["frames"]]
    assert names[0] == "_allocate_in_named_function"
    assert "test_history_records_stacks_naming_the_allocating_function" in names
    assert all(f["filename"].endswith(".py") or f["filename"].startswith("<")
               for f in alloc["frames"])
    # context="all": the free has the stack of the del.
    assert trace[1]["frames"][0]["name"] == (
        "test_history_records_stacks_naming_the_allocating_function")
    seg_allocs = [e for e in snap["device_traces"][dev] if e["action"] == "segment_alloc"]
    assert seg_allocs and seg_allocs[0]["size"] == 2 * MiB
    # A live block keeps its allocation's stack.
    keep = _allocate_in_named_function()
    block = next(b for s in torch.axon.memory_snapshot() for b in s["blocks"]
                 if b["address"] == keep.data_ptr())
    assert block["state"] == "active_allocated" and block["requested_size"] == 4000
    assert block["frames"][0]["name"] == "_allocate_in_named_function"
    del keep


def test_history_context_state_and_max_entries(dev):
    torch.axon.memory._record_memory_history(enabled="all", context="state", stacks="python",
                                             max_entries=4, clear_history=True)
    def alloc_named(n):
        return torch.empty(n, device="axon")

    ts = []
    for i in range(6):
        ts.append(alloc_named(1000 + i))
    trace = torch.axon.memory._snapshot()["device_traces"][dev]
    assert len(trace) == 4  # the last 4 events, oldest first
    assert [e["size"] for e in trace] == [4008, 4012, 4016, 4020]
    assert all(e["frames"] == [] for e in trace)  # context="state": no stacks in the trace
    block = next(b for s in torch.axon.memory_snapshot() for b in s["blocks"]
                 if b["address"] == ts[-1].data_ptr())
    assert block["frames"][0]["name"] == "alloc_named"
    # Off: nothing more is recorded, and the history is gone.
    torch.axon.memory._record_memory_history(None)
    t = torch.empty(10, device="axon")
    assert torch.axon.memory._snapshot()["device_traces"][dev] == []
    block = next(b for s in torch.axon.memory_snapshot() for b in s["blocks"]
                 if b["address"] == t.data_ptr())
    assert block["frames"] == []
    del ts, t


def test_history_skip_actions(dev):
    torch.axon.memory._record_memory_history(stacks="python", clear_history=True,
                                             skip_actions=["free_requested", "segment_alloc"])
    t = torch.empty(10, device="axon")
    del t
    actions = [e["action"] for e in torch.axon.memory._snapshot()["device_traces"][dev]]
    assert actions == ["alloc", "free_completed"]


def test_history_argument_errors(dev):
    with pytest.raises(RuntimeError, match=r"Unknown TraceEntry action: frees"):
        torch.axon.memory._record_memory_history(skip_actions=["frees"])
    with pytest.raises(RuntimeError, match=r"expected enabled to be 'state', 'all', or None"):
        torch.axon.memory._record_memory_history(enabled="everything")
    with pytest.raises(RuntimeError, match=r"expected context to be 'state', 'alloc', 'all'"):
        torch.axon.memory._record_memory_history(context="some")
    with pytest.raises(RuntimeError, match=r"expected stacks to be 'python', or 'all'"):
        torch.axon.memory._record_memory_history(stacks="cpp")
    with pytest.raises(ValueError, match=r"max_entries must be positive"):
        torch.axon.memory._record_memory_history(max_entries=0)


def test_snapshot_is_rendered_by_memory_viz(dev, tmp_path):
    torch.axon.memory._record_memory_history(stacks="python", clear_history=True)
    pool = torch.axon.MemPool()
    a = _allocate_in_named_function()
    b = torch.empty(3 * MiB, dtype=torch.uint8, device="axon")
    with torch.axon.use_mem_pool(pool):
        c = torch.empty(100, device="axon")
    del a
    snap = torch.axon.memory._snapshot()
    assert set(snap) >= {"segments", "device_traces"}
    for seg in snap["segments"]:
        assert set(seg) >= {"device", "address", "total_size", "allocated_size", "active_size",
                            "requested_size", "stream", "segment_type", "segment_pool_id",
                            "blocks"}
        assert sum(blk["size"] for blk in seg["blocks"]) == seg["total_size"]
        for blk in seg["blocks"]:
            assert set(blk) >= {"address", "size", "requested_size", "state", "frames"}
            assert blk["state"] in ("active_allocated", "active_pending_free", "inactive")
    assert {s["segment_pool_id"] for s in snap["segments"]} == {(0, 0), pool.id}
    actions = {e["action"] for e in snap["device_traces"][dev]}
    assert actions == {"segment_alloc", "alloc", "free_requested", "free_completed"}

    def flame(lines):  # _memory_viz would download flamegraph.pl
        return lines

    seg_lines = _memory_viz.segments(snap, format_flamegraph=flame)
    assert "_allocate_in_named_function" not in seg_lines  # a is freed
    mem_lines = _memory_viz.memory(snap, format_flamegraph=flame)
    assert "active_allocated;" in mem_lines and "test_memory_tools.py" in mem_lines
    for html in (_memory_viz.trace_plot(snap), _memory_viz.segment_plot(snap),
                 _memory_viz.trace_plot(snap, plot_segments=True)):
        assert html.startswith("\n<!DOCTYPE html>") and "snapshot.pickle" in html
    summary = _memory_viz.segsum(snap)
    assert f"segments: {len(snap['segments'])}" in summary
    text = _memory_viz.trace(snap)
    assert f"Device {dev} ----" in text and "cudaMalloc(" in text
    # The command-line tool on a dumped snapshot.
    path = tmp_path / "snap.pickle"
    torch.axon.memory._dump_snapshot(str(path))
    with open(path, "rb") as f:
        assert pickle.load(f)["segments"]
    for cmd, expect in (("stats", "total_reserved:"), ("trace", "cudaMalloc(")):
        r = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", cmd, str(path)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert expect in r.stdout
    del b, c, pool


def test_snapshot_shows_oom_and_segment_free(dev):
    torch.axon.memory._record_memory_history(stacks="python", clear_history=True)
    total = torch.axon.mem_get_info(dev)[1]
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(total + MiB, dtype=torch.uint8, device="axon")
    t = torch.empty(100, device="axon")
    del t
    torch.axon.empty_cache()
    trace = torch.axon.memory._snapshot()["device_traces"][dev]
    oom = [e for e in trace if e["action"] == "oom"]
    assert len(oom) == 1 and oom[0]["size"] == total + MiB and oom[0]["device_free"] > 0
    assert "addr" not in oom[0]
    assert [e["action"] for e in trace if e["action"].startswith("segment")] == [
        "segment_alloc", "segment_free"]
    assert "raise OutOfMemoryError" in _memory_viz.trace({"segments": [],
                                                          "device_traces": [trace]})


# ---------------------------------------------------------------- fraction and OOM

def test_memory_fraction_oom_and_recovery(dev):
    total = torch.axon.mem_get_info(dev)[1]
    assert torch.axon.get_per_process_memory_fraction() == 1.0
    torch.axon.set_per_process_memory_fraction(0.05)
    assert torch.axon.get_per_process_memory_fraction(dev) == 0.05
    allowed = int(0.05 * total)
    first = torch.empty(allowed * 6 // 10, dtype=torch.uint8, device="axon")
    ooms = torch.axon.memory_stats(dev)["num_ooms"]
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(allowed * 6 // 10, dtype=torch.uint8, device="axon")
    msg = str(info.value)
    assert msg.startswith("axon out of memory. Tried to allocate ")
    assert f"axon:{dev} has a total capacity of " in msg
    assert " allowed (per-process memory fraction 0.05); Of the allocated memory " in msg
    assert isinstance(info.value, torch.axon.OutOfMemoryError)
    assert torch.axon.memory_stats(dev)["num_ooms"] == ooms + 1
    del info
    # The process frees and continues.
    del first
    second = torch.empty(allowed * 6 // 10, dtype=torch.uint8, device="axon")
    second.fill_(3)
    assert int(second[-1]) == 3
    # Memory of private pools is told apart, as CUDA tells graphs' pools apart.
    pool = torch.axon.MemPool()
    with torch.axon.use_mem_pool(pool):
        in_pool = torch.empty(allowed // 4, dtype=torch.uint8, device="axon")
    with pytest.raises(torch.OutOfMemoryError,
                       match=r"is allocated by PyTorch, with [0-9.]+ MiB allocated in private "
                             r"pools \(e\.g\., graphs\), and "):
        torch.empty(allowed // 2, dtype=torch.uint8, device="axon")
    del in_pool, pool
    # Back to the whole device: the same request fits.
    torch.axon.set_per_process_memory_fraction(1.0)
    del second
    torch.empty(allowed * 2, dtype=torch.uint8, device="axon")


def test_memory_fraction_argument_errors(dev):
    with pytest.raises(TypeError, match=r"Invalid type for fraction argument, must be `float`"):
        torch.axon.set_per_process_memory_fraction(1)
    with pytest.raises(ValueError, match=r"Invalid fraction value: 1.5. Allowed range: 0~1"):
        torch.axon.set_per_process_memory_fraction(1.5)
    with pytest.raises(RuntimeError, match=r"invalid fraction:-0.5. Please set within \[0, 1\]"):
        _C._set_memory_fraction(-0.5, dev)


def test_out_of_memory_error_is_torchs():
    assert torch.axon.OutOfMemoryError is torch.OutOfMemoryError
    assert torch.axon.OutOfMemoryError is torch.cuda.OutOfMemoryError


# ---------------------------------------------------------------- statistics

def test_host_memory_stats_count_pinned_memory():
    gc.collect()
    torch.accelerator.empty_host_cache()
    before = torch.axon.host_memory_stats()
    assert set(before) >= {f"{k}.{m}" for k in ("allocations", "allocated_bytes",
                                                "active_requests", "active_bytes")
                           for m in ("current", "peak", "allocated", "freed")}
    x = torch.ones(1000).pin_memory()                     # 4000 bytes: a 4096-byte buffer
    y = torch.ones(10, dtype=torch.float64).pin_memory()  # 80 bytes: 128
    mid = torch.axon.host_memory_stats()
    assert mid["allocations.current"] == before["allocations.current"] + 2
    assert mid["allocated_bytes.current"] == before["allocated_bytes.current"] + 4096 + 128
    assert mid["active_bytes.current"] == before["active_bytes.current"] + 4096 + 128
    assert mid["num_host_alloc"] == before["num_host_alloc"] + 2
    nested = torch.axon.host_memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["current"] == mid["allocated_bytes.current"]
    del x, y
    cached = torch.axon.host_memory_stats()  # freed into the cache: still owned, not active
    assert cached["allocations.current"] == mid["allocations.current"]
    assert cached["active_requests.current"] == before["active_requests.current"]
    assert cached["num_host_free"] == before["num_host_free"]
    torch.accelerator.empty_host_cache()
    after = torch.axon.host_memory_stats()
    assert after["allocations.current"] == before["allocations.current"]
    assert after["num_host_free"] == before["num_host_free"] + 2
    torch.axon.reset_peak_host_memory_stats()
    assert torch.axon.host_memory_stats()["allocated_bytes.peak"] == after["allocated_bytes.current"]


def test_pinned_buffers_are_cached_and_reused_once_their_copies_ran():
    """As CUDA's caching host allocator (test_cuda's test_caching_pinned_memory):
    a freed pinned buffer comes back for the next request of its size, but not
    while a queued copy still reads it; freeing never waits for the device."""
    gc.collect()
    t = torch.ones(1000).pin_memory()
    ptr = t.data_ptr()
    del t
    again = torch.ones(1000).pin_memory()
    assert again.data_ptr() == ptr  # reused
    dev = torch.empty(1000, device="axon")
    s = torch.axon.Stream()
    with torch.axon.stream(s):
        torch.axon._C._test_sleep_on_stream(0, 300)  # the copy below waits behind this
        dev.copy_(again, non_blocking=True)
    expected = again.clone()
    del again  # returns at once, the copy still queued
    busy = torch.ones(1000).pin_memory()
    assert busy.data_ptr() != ptr  # the queued copy still reads the old buffer
    busy.fill_(7.0)
    busy_ptr = busy.data_ptr()
    s.synchronize()
    assert torch.equal(dev.cpu(), expected)  # the copy read what was there
    del busy
    assert torch.ones(1000).pin_memory().data_ptr() in (ptr, busy_ptr)  # both free again


def test_memory_stats_has_cudas_keys(dev):
    stats = torch.axon.memory_stats(dev)
    expected = {f"{m}.{p}.{k}"
                for m in ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
                          "reserved_bytes", "active_bytes", "inactive_split_bytes",
                          "requested_bytes")
                for p in ("all", "large_pool", "small_pool")
                for k in ("current", "peak", "allocated", "freed")}
    expected |= {f"{m}.{k}" for m in ("oversize_allocations", "oversize_segments")
                 for k in ("current", "peak", "allocated", "freed")}
    expected |= {"num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                 "num_device_free", "num_oom_rejections", "max_split_size"}
    assert expected <= set(stats), sorted(expected - set(stats))
    assert stats["max_split_size"] == -1  # no limit on splitting, as CUDA's default
    t = torch.empty(3000, dtype=torch.uint8, device="axon")
    stats = torch.axon.memory_stats(dev)
    assert stats["num_device_alloc"] == 1
    assert stats["requested_bytes.all.current"] == 3000
    assert stats["allocated_bytes.small_pool.current"] == 3072
    del t
    syncs = stats["num_sync_all_streams"]
    torch.axon.empty_cache()
    stats = torch.axon.memory_stats(dev)
    assert stats["num_device_free"] == 1
    assert stats["num_sync_all_streams"] == syncs + 1
    nested = torch.axon.memory_stats_as_nested_dict(dev)
    assert nested["segment"]["all"]["freed"] == 1
