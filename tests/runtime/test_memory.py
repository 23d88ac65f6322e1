"""The caching allocator through torch.axon's memory API: exact accounting,
caching and empty_cache, peak statistics, block reuse, stream-aware reuse.

Each test uses a device of its own (no other test allocates there) so that
tensors kept alive elsewhere cannot disturb the exact byte counts.
"""

import gc

import pytest
import torch

sleep_on_stream = torch.axon._C._test_sleep_on_stream
num_device_allocs = torch.axon._C._num_device_allocs

KiB, MiB = 1 << 10, 1 << 20


def round512(n: int) -> int:
    return max(512, (n + 511) // 512 * 512) if n > 0 else 0


@pytest.fixture
def dev():
    """A clean device: nothing allocated or cached, statistics reset."""
    index = 7
    if torch.axon.memory_allocated(index) != 0:
        gc.collect()  # slow (~0.1 s): only when something may be left in a cycle
    torch.axon.synchronize(index)
    torch.axon.empty_cache()
    assert torch.axon.memory_allocated(index) == 0, (
        f"tensors left on axon:{index} by an earlier test (a failed test's traceback keeps "
        "its tensors alive: fix that failure first)")
    assert torch.axon.memory_reserved(index) == 0
    torch.axon.reset_peak_memory_stats(index)
    torch.axon.reset_accumulated_memory_stats(index)
    yield index
    torch.axon.empty_cache()


@pytest.mark.parametrize("nbytes", [1, 100, 511, 512, 513, 4000, MiB - 1, MiB, MiB + 1,
                                    3 * MiB + 7, 12 * MiB])
def test_allocated_grows_and_shrinks_by_rounded_size(dev, nbytes):
    t = torch.empty(nbytes, dtype=torch.uint8, device=f"axon:{dev}")
    assert torch.axon.memory_allocated(dev) == round512(nbytes)
    assert torch.axon.memory_reserved(dev) >= torch.axon.memory_allocated(dev)
    u = torch.empty(nbytes, dtype=torch.uint8, device=f"axon:{dev}")
    assert torch.axon.memory_allocated(dev) == 2 * round512(nbytes)
    del t
    assert torch.axon.memory_allocated(dev) == round512(nbytes)
    del u
    assert torch.axon.memory_allocated(dev) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64,
                                   torch.bool, torch.float64])
@pytest.mark.parametrize("shape", [(3, 5), (257,), (0, 4), (64, 64)])
def test_allocated_counts_tensor_bytes(dev, dtype, shape):
    t = torch.empty(shape, dtype=dtype, device=f"axon:{dev}")
    nbytes = t.numel() * t.element_size()
    assert torch.axon.memory_allocated(dev) == round512(nbytes)
    # a copy from the CPU allocates the same; views allocate nothing
    c = torch.zeros(shape, dtype=dtype).to(f"axon:{dev}")
    v = c.view(-1)[: max(0, c.numel() - 1)]
    assert torch.axon.memory_allocated(dev) == 2 * round512(nbytes)
    del c  # the view keeps the storage alive
    assert torch.axon.memory_allocated(dev) == 2 * round512(nbytes)
    del v, t
    assert torch.axon.memory_allocated(dev) == 0


def test_memory_stats_keys_agree(dev):
    t = torch.empty(1000, device=f"axon:{dev}")
    big = torch.empty(2 * MiB, dtype=torch.uint8, device=f"axon:{dev}")
    st = torch.axon.memory_stats(dev)
    assert st["allocated_bytes.all.current"] == torch.axon.memory_allocated(dev) == 4096 + 2 * MiB
    assert st["allocated_bytes.small_pool.current"] == 4096
    assert st["allocated_bytes.large_pool.current"] == 2 * MiB
    assert st["reserved_bytes.all.current"] == torch.axon.memory_reserved(dev)
    assert st["allocation.all.current"] == 2
    assert st["requested_bytes.all.current"] == 4000 + 2 * MiB
    assert st["active_bytes.all.current"] == 4096 + 2 * MiB
    assert st["num_ooms"] == 0
    assert st["allocated_bytes.all.peak"] >= st["allocated_bytes.all.current"]
    assert torch.axon.memory_stats(f"axon:{dev}") == st
    # The summary is laid out as torch.cuda.memory_summary's: per statistic
    # current, peak, total allocated and freed, per pool unless abbreviated.
    summary = torch.axon.memory_summary(dev)
    assert f"device ID {dev} " in summary
    rows = [(line.split("|")[0].strip(), [c.split() for c in line.split("|")[1:]])
            for line in summary.splitlines() if line.count("|") == 4]
    names = [name for name, _ in rows]
    i = names.index("Allocated memory")
    assert rows[i][1][0] == ["2052", "KiB"]  # 4096 + 2 MiB
    assert rows[i + 1] == ("from large pool", [["2048", "KiB"]] * 3 + [["0", "B"]])
    assert rows[i + 2][0] == "from small pool" and rows[i + 2][1][0] == ["4", "KiB"]
    rows = dict(rows)
    assert rows["Allocations"][0] == ["2"]
    assert rows["Requested memory"][0] == [str((4000 + 2 * MiB) // 1024), "KiB"]
    short = torch.axon.memory_summary(dev, abbreviated=True)
    assert "from large pool" in summary and "from large pool" not in short
    assert "Allocated memory" in short
    del t, big


def test_reserved_segments_follow_documented_sizes(dev):
    # CachingAllocator.h: small requests (<= 1 MiB) come from 2 MiB segments,
    # requests under 10 MiB from 20 MiB segments, larger ones are rounded to 2 MiB.
    small = torch.empty(KiB, dtype=torch.uint8, device=f"axon:{dev}")
    assert torch.axon.memory_reserved(dev) == 2 * MiB
    large = torch.empty(11 * MiB + 1, dtype=torch.uint8, device=f"axon:{dev}")
    assert torch.axon.memory_reserved(dev) == 2 * MiB + 12 * MiB
    medium = torch.empty(3 * MiB, dtype=torch.uint8, device=f"axon:{dev}")
    assert torch.axon.memory_reserved(dev) == 2 * MiB + 12 * MiB + 20 * MiB
    # the rest of the 20 MiB segment serves later medium requests
    medium2 = torch.empty(5 * MiB, dtype=torch.uint8, device=f"axon:{dev}")
    assert torch.axon.memory_reserved(dev) == 34 * MiB
    assert torch.axon.memory_reserved(dev) >= torch.axon.memory_allocated(dev)
    del small, medium, large, medium2


def test_empty_cache_releases_reserved(dev):
    free0, total = torch.axon.mem_get_info(dev)
    tensors = [torch.empty(n, dtype=torch.uint8, device=f"axon:{dev}")
               for n in (KiB, 3 * MiB, 12 * MiB)]
    reserved = torch.axon.memory_reserved(dev)
    segments = torch.axon.memory_stats(dev)["segment.all.current"]
    assert reserved > 0 and segments >= 2
    assert torch.axon.mem_get_info(dev) == (free0 - reserved, total)
    del tensors
    # freed blocks stay cached
    assert torch.axon.memory_allocated(dev) == 0
    assert torch.axon.memory_reserved(dev) == reserved
    torch.axon.empty_cache()
    assert torch.axon.memory_reserved(dev) == 0
    assert torch.axon.mem_get_info(dev) == (free0, total)
    assert torch.axon.memory_stats(dev)["num_device_free"] == segments
    assert torch.axon.memory_stats(dev)["segment.all.current"] == 0


def test_empty_cache_keeps_live_segments(dev):
    keep = torch.empty(KiB, dtype=torch.uint8, device=f"axon:{dev}")
    gone = torch.empty(12 * MiB, dtype=torch.uint8, device=f"axon:{dev}")
    del gone
    torch.axon.empty_cache()
    assert torch.axon.memory_reserved(dev) == 2 * MiB  # the segment `keep` lives in
    assert torch.axon.memory_allocated(dev) == round512(KiB)
    keep.fill_(3)
    assert torch.equal(keep.cpu(), torch.full((KiB,), 3, dtype=torch.uint8))


def test_peak_stats_and_reset(dev):
    a = torch.empty(5 * MiB, dtype=torch.uint8, device=f"axon:{dev}")
    b = torch.empty(3 * MiB, dtype=torch.uint8, device=f"axon:{dev}")
    peak = 8 * MiB
    del b
    assert torch.axon.memory_allocated(dev) == 5 * MiB
    assert torch.axon.max_memory_allocated(dev) == peak
    peak_reserved = torch.axon.max_memory_reserved(dev)
    assert peak_reserved >= torch.axon.memory_reserved(dev) >= 5 * MiB
    torch.axon.empty_cache()
    assert torch.axon.max_memory_reserved(dev) == peak_reserved  # peaks survive
    torch.axon.reset_peak_memory_stats(dev)
    assert torch.axon.max_memory_allocated(dev) == torch.axon.memory_allocated(dev) == 5 * MiB
    assert torch.axon.max_memory_reserved(dev) == torch.axon.memory_reserved(dev)
    c = torch.empty(MiB, dtype=torch.uint8, device=f"axon:{dev}")
    assert torch.axon.max_memory_allocated(dev) == 6 * MiB
    del a, c
    assert torch.axon.max_memory_allocated(dev) == 6 * MiB
    torch.axon.reset_max_memory_allocated(dev)
    assert torch.axon.max_memory_allocated(dev) == 0


def test_reset_accumulated_stats(dev):
    t = torch.empty(KiB, device=f"axon:{dev}")
    del t
    st = torch.axon.memory_stats(dev)
    assert st["allocation.all.allocated"] >= 1 and st["allocation.all.freed"] >= 1
    torch.axon.reset_accumulated_memory_stats(dev)
    st = torch.axon.memory_stats(dev)
    assert st["allocation.all.allocated"] == 0 and st["allocation.all.freed"] == 0
    assert st["num_device_alloc"] == 0


@pytest.mark.parametrize("nbytes", [100, 4000, MiB, 3 * MiB, 12 * MiB])
def test_block_reuse_same_size(dev, nbytes):
    t = torch.empty(nbytes, dtype=torch.uint8, device=f"axon:{dev}")
    ptr = t.data_ptr()
    n = num_device_allocs(dev)
    del t
    for _ in range(5):
        t = torch.empty(nbytes, dtype=torch.uint8, device=f"axon:{dev}")
        assert t.data_ptr() == ptr
        del t
    assert num_device_allocs(dev) == n


def test_small_blocks_share_a_segment(dev):
    n = num_device_allocs(dev)
    ts = [torch.empty(512, dtype=torch.uint8, device=f"axon:{dev}") for _ in range(100)]
    assert num_device_allocs(dev) == n + 1
    assert len({t.data_ptr() for t in ts}) == 100
    del ts
    big = torch.empty(100 * 512, dtype=torch.uint8, device=f"axon:{dev}")  # merged blocks
    assert num_device_allocs(dev) == n + 1
    del big


def test_freed_block_reused_on_its_stream_only(dev):
    s = torch.axon.Stream(device=dev)
    t = torch.axon.Stream(device=dev)
    with torch.axon.stream(s):
        x = torch.empty(4096, device=f"axon:{dev}")
        ptr = x.data_ptr()
        del x
        y = torch.empty(4096, device=f"axon:{dev}")
        assert y.data_ptr() == ptr  # same stream: at once
        del y
    with torch.axon.stream(t):
        z = torch.empty(4096, device=f"axon:{dev}")
        assert z.data_ptr() != ptr  # other stream: never
    del z


def test_allocation_on_current_device_and_stream(dev):
    with torch.axon.device(dev):
        x = torch.empty(100, device="axon")
    assert x.device.index == dev
    assert torch.axon.memory_allocated(dev) == 512
    del x


def test_record_stream_delays_reuse():
    dev = 6  # not the `dev` fixture's device: an xfail's traceback keeps x alive
    base = torch.axon.memory_allocated(dev)
    s = torch.axon.Stream(device=dev)
    other = torch.axon.Stream(device=dev)
    with torch.axon.stream(s):
        x = torch.ones(4096, device=f"axon:{dev}")
    ptr = x.data_ptr()
    torch.axon.synchronize(dev)
    with torch.axon.stream(other):
        sleep_on_stream(dev, 300)  # `other` still uses x for a while
    x.record_stream(other)
    del x
    assert torch.axon.memory_allocated(dev) == base  # accounted as freed at once
    with torch.axon.stream(s):
        y = torch.empty(4096, device=f"axon:{dev}")
        assert y.data_ptr() != ptr, "block reused while another stream still used it"
        del y
    other.synchronize()
    with torch.axon.stream(s):
        z = torch.empty(4096, device=f"axon:{dev}")
        assert z.data_ptr() == ptr, "block not reused once the other stream finished"
    del z


def test_tensor_resize_updates_accounting(dev):
    t = torch.empty(128, device=f"axon:{dev}")  # 512 bytes
    t.copy_(torch.arange(128.0))
    t.resize_(1024)  # 4096 bytes: a new block, contents kept
    assert torch.axon.memory_allocated(dev) == 4096
    assert torch.equal(t[:128].cpu(), torch.arange(128.0))
    t.untyped_storage().resize_(8192)
    assert torch.axon.memory_allocated(dev) == 8192
    assert torch.equal(t[:128].cpu(), torch.arange(128.0))
    del t
    assert torch.axon.memory_allocated(dev) == 0


def test_devices_are_accounted_separately(dev):
    other = dev - 1
    gc.collect()
    before = torch.axon.memory_allocated(other)
    t = torch.empty(MiB, dtype=torch.uint8, device=f"axon:{dev}")
    assert torch.axon.memory_allocated(other) == before
    assert torch.axon.memory_allocated(dev) == MiB
    u = t.to(f"axon:{other}")
    assert torch.axon.memory_allocated(other) == before + MiB
    del t, u


def test_oom_in_process_for_an_impossible_request(dev):
    total = torch.axon.mem_get_info(dev)[1]
    keep = torch.empty(KiB, device=f"axon:{dev}")
    with pytest.raises(torch.OutOfMemoryError) as e:
        torch.empty(2 * total, dtype=torch.uint8, device=f"axon:{dev}")
    msg = str(e.value)
    # The default capacity is min(8 GiB, host memory / device count).
    assert f"Tried to allocate {2 * total / 2**30:.2f} GiB" in msg and f"axon:{dev}" in msg
    assert f"total capacity of {total / 2**30:.2f} GiB" in msg
    assert "4.00 KiB is allocated by PyTorch" in msg
    assert torch.axon.memory_stats(dev)["num_ooms"] >= 1
    # nothing leaked, the device still works
    assert torch.axon.memory_allocated(dev) == 4096
    keep.fill_(2.0)
    assert torch.equal(keep.cpu(), torch.full((KiB,), 2.0))


def test_oom_for_more_than_an_exabyte_as_cuda(dev):
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate more than 1EB memory"):
        torch.empty((1 << 60) + 1, dtype=torch.uint8, device=f"axon:{dev}")
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate 1073741824.00 GiB"):
        torch.empty(1 << 60, dtype=torch.uint8, device=f"axon:{dev}")
    assert torch.ones(3, device=f"axon:{dev}").sum().item() == 3.0


def test_concurrent_allocations_from_threads(dev):
    import threading

    errors = []

    def work(seed):
        try:
            g = torch.Generator().manual_seed(seed)
            for i in range(50):
                n = int(torch.randint(1, 300_000, (1,), generator=g))
                t = torch.empty(n, dtype=torch.uint8, device=f"axon:{dev}")
                t.fill_(seed % 200)
                assert int(t[n // 2]) == seed % 200
                del t
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert torch.axon.memory_allocated(dev) == 0
    st = torch.axon.memory_stats(dev)
    assert st["allocation.all.allocated"] == st["allocation.all.freed"] == 200


_ALLOC_CONF_SCRIPT = """
import json, os, torch, warnings
MiB = 1 << 20
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    if os.environ.get("SET_AT_RUN_TIME"):  # the settings set by the program
        torch.axon.memory._set_allocator_settings(os.environ["SET_AT_RUN_TIME"])
    big = torch.empty(300 * MiB, dtype=torch.uint8, device="axon")
    del big  # cached: one free 300 MiB segment
    small = torch.empty(10 * MiB, dtype=torch.uint8, device="axon")
    st = torch.axon.memory_stats()
    out = {"reserved": torch.axon.memory_reserved(), "segments": st["segment.all.current"],
           "max_split": st["max_split_size"],
           "oversize_segments": st["oversize_segments.current"],
           "oversize_allocations": st["oversize_allocations.current"],
           "snapshot_max_split": torch.axon.memory._snapshot()["allocator_settings"]["max_split_size"]}
    del small
    # garbage_collection_threshold, with a per-process fraction (as CUDA's)
    torch.axon.empty_cache()
    total = torch.axon.mem_get_info()[1]
    torch.axon.set_per_process_memory_fraction(0.5)
    a1 = torch.empty(int(total * 0.14), dtype=torch.uint8, device="axon")
    a2 = torch.empty(int(total * 0.14), dtype=torch.uint8, device="axon")
    del a1  # cached; reserved 28% of the device, over half the 50% allowed
    b = torch.empty(int(total * 0.15), dtype=torch.uint8, device="axon")  # a new segment
    out["reserved_after_gc"] = torch.axon.memory_reserved() / total
    out["warnings"] = [str(w.message) for w in caught]
print(json.dumps(out))
"""


@pytest.mark.parametrize("at_run_time", [False, True])
@pytest.mark.parametrize("conf", ["", "max_split_size_mb:64", "garbage_collection_threshold:0.5",
                                  "expandable_segments:True"])
def test_pytorch_alloc_conf(conf, at_run_time):
    """PYTORCH_ALLOC_CONF, as CUDA's allocator reads it: max_split_size_mb makes blocks that
    large "oversize" (never split: a small request gets a segment of its own, counted in the
    oversize statistics); garbage_collection_threshold (with a memory fraction) returns
    the cached segments before a new one when reserved memory is over that share;
    expandable_segments is not implemented and warns.  From the environment, or set by
    the program (torch.axon.memory._set_allocator_settings, as torch.cuda's)."""
    import json

    from conftest import run_python

    env = {("SET_AT_RUN_TIME" if at_run_time else "PYTORCH_ALLOC_CONF"): conf} if conf else {}
    r = run_python(_ALLOC_CONF_SCRIPT, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    MiB = 1 << 20
    if conf.startswith("max_split"):
        assert out["max_split"] == out["snapshot_max_split"] == 64 * MiB
        assert out["reserved"] == 310 * MiB and out["segments"] == 2  # 300 MiB not split
        assert out["oversize_segments"] == 1 and out["oversize_allocations"] == 0
    else:
        assert out["max_split"] == out["snapshot_max_split"] == -1
        assert out["reserved"] == 300 * MiB and out["segments"] == 1  # split for 10 MiB
        assert out["oversize_segments"] == out["oversize_allocations"] == 0
    if conf.startswith("garbage"):
        assert 0.28 < out["reserved_after_gc"] < 0.31  # the cached 14% went back first
    else:
        assert out["reserved_after_gc"] > 0.42
    unsupported = [w for w in out["warnings"] if "does not implement expandable_segments" in w]
    assert len(unsupported) == (1 if conf.startswith("expandable") else 0), out["warnings"]


def test_alloc_conf_changed_at_run_time_keeps_statistics_exact():
    """max_split_size_mb set or changed while blocks are allocated: each block is uncounted
    as it was counted (the oversize counters end at 0), and memory_stats() shows the
    setting before any allocation."""
    import json

    from conftest import run_python

    r = run_python("""
        import json, torch, warnings
        warnings.simplefilter("ignore", FutureWarning)
        MiB = 1 << 20
        first = torch.axon.memory_stats()["max_split_size"]
        a = torch.empty(300 * MiB, dtype=torch.uint8, device="axon")  # limit 64: oversize
        torch.axon.memory._set_allocator_settings("max_split_size_mb:200")
        b = torch.empty(100 * MiB, dtype=torch.uint8, device="axon")  # under 200: not
        torch.axon.memory._set_allocator_settings("max_split_size_mb:64")
        mid = torch.axon.memory_stats()
        del a, b
        torch.axon.empty_cache()
        st = torch.axon.memory_stats()
        print(json.dumps({"first": first, "mid_max_split": mid["max_split_size"],
                          "mid": [mid["oversize_allocations.current"], mid["oversize_segments.current"]],
                          "end": [st["oversize_allocations.current"], st["oversize_segments.current"],
                                  st["segment.all.current"], st["allocated_bytes.all.current"]]}))
    """, env={"PYTORCH_ALLOC_CONF": "max_split_size_mb:64"})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["first"] == 64 << 20 and out["mid_max_split"] == 64 << 20
    assert out["mid"] == [1, 1]
    assert out["end"] == [0, 0, 0, 0]
