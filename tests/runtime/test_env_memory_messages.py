"""Issue 15, items 5-7: configuration values that used to be accepted and then
wrong, device memory the host cannot back, and two error messages."""

import os
import re

import pytest
import torch

from conftest import TESTS_DIR, run_python

MiB = 1 << 20
GiB = 1 << 30


def host_memory() -> int:
    """Physical memory, or the cgroup limit if smaller (what the runtime uses)."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                v = f.read().strip()
        except OSError:
            continue
        if v != "max" and 0 < int(v) < total:
            total = int(v)
    return total


# ---------------------------------------------------------------- item 5: values

COUNT_SCRIPT = """
import torch
n = torch.axon.device_count()
torch.ones(2, device=f"axon:{n - 1}").sum().item()
print(n, torch.accelerator.device_count())
"""


@pytest.mark.parametrize("value", ["128", "256", "300"])
def test_device_count_pytorch_cannot_index_is_ignored_with_a_warning(value):
    r = run_python(COUNT_SCRIPT, env={"AXON_NUM_DEVICES": value})
    assert r.returncode == 0, r.stderr  # `import torch` must never break
    assert r.stdout.split() == ["8", "8"]
    assert (f"axon: ignoring AXON_NUM_DEVICES='{value}' (expected an integer in 0..127: "
            "PyTorch indexes at most 127 devices); using 8") in r.stderr


def test_device_count_127_is_the_largest_and_grouping_counts_logical_devices():
    r = run_python(COUNT_SCRIPT, env={"AXON_NUM_DEVICES": "127", "AXON_DEVICE_MEMORY": "1MiB"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["127", "127"]
    assert "ignoring" not in r.stderr
    r = run_python(COUNT_SCRIPT, env={"AXON_NUM_DEVICES": "250", "AXON_LOGICAL_CORE_CONFIG": "2",
                                      "AXON_DEVICE_MEMORY": "1MiB"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["125", "125"]


def test_bad_boolean_values_get_the_same_warning():
    r = run_python("""
        import torch
        print(torch.axon._C._launch_blocking())
        x = torch.ones(4, device="axon")
        print(torch.axon._C._env_bool("AXON_TEST_FLAG", False),
              torch.axon._C._env_bytes("AXON_TEST_BYTES", 4194304),
              torch.axon._C._env_bytes("AXON_TEST_SIZE", 1))
    """, env={"AXON_LAUNCH_BLOCKING": "sometimes", "AXON_SHAREABLE_MEMORY": "maybe",
              "AXON_TEST_FLAG": "perhaps", "AXON_TEST_BYTES": "abc", "AXON_TEST_SIZE": "2MiB"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False", "4194304", str(2 * MiB)]
    for line in [
        "axon: ignoring AXON_LAUNCH_BLOCKING='sometimes' (expected 0 or 1); using 0",
        "axon: ignoring AXON_SHAREABLE_MEMORY='maybe' (expected 0 or 1); using 1",
        "axon: ignoring AXON_TEST_FLAG='perhaps' (expected 0 or 1); using 0",
        "axon: ignoring AXON_TEST_BYTES='abc' (expected a size such as 1048576 or 4MiB); "
        "using 4194304",
    ]:
        assert line in r.stderr.splitlines(), r.stderr


def test_comm_and_python_side_variables_use_the_same_parsers():
    r = run_python("""
        import os, torch, torch.distributed as dist
        from conftest import free_port
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("axon", rank=0, world_size=1)
        t = torch.ones(3, device="axon")
        dist.all_reduce(t)
        print(t.sum().item())
        dist.destroy_process_group()
        torch.ones(4, device="axon").take(torch.tensor([0], device="axon"))
    """.replace("from conftest import free_port", "from dist_util import free_port"),
        env={"AXON_COMM_SLOT_BYTES": "abc", "AXON_COMM_P2P_BYTES": "-5",
             "AXON_TEST_HARNESS": "maybe", "AXON_FALLBACK_WARN": "perhaps",
             "PYTHONPATH": TESTS_DIR})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3.0"]
    lines = r.stderr.splitlines()
    for line in [
        "axon: ignoring AXON_COMM_SLOT_BYTES='abc' (expected a size such as 1048576 or 4MiB, "
        "at least 1); using 4194304",
        "axon: ignoring AXON_COMM_P2P_BYTES='-5' (expected a size such as 1048576 or 4MiB, "
        "at least 1); using 1048576",
        "axon: ignoring AXON_TEST_HARNESS='maybe' (expected 0 or 1); using 0",
        "axon: ignoring AXON_FALLBACK_WARN='perhaps' (expected 0 or 1); using 0",
    ]:
        assert lines.count(line) == 1, r.stderr


def test_boolean_words_are_accepted():
    r = run_python("""
        import torch
        print(torch.axon._C._launch_blocking())
    """, env={"AXON_LAUNCH_BLOCKING": "yes", "AXON_SHAREABLE_MEMORY": "off"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True"]
    assert "ignoring" not in r.stderr


# ---------------------------------------------------------------- item 6: host memory

def test_default_device_memory_fits_in_the_host():
    host = host_memory()
    n = torch.axon.device_count()
    per_device = torch.axon.get_device_properties(0).total_memory
    assert per_device == min(8 * GiB, host // n // MiB * MiB)
    assert per_device * n <= host
    free, limit = torch.axon._C._host_memory_info()
    assert limit == host and 0 < free <= limit


HOST_LIMIT_SCRIPT = """
import json, torch
MiB = 1 << 20
out = {}
a = torch.empty(40 * MiB, dtype=torch.uint8, device="axon:0")
try:
    torch.empty(40 * MiB, dtype=torch.uint8, device="axon:1")
except torch.OutOfMemoryError as e:
    out["message"] = str(e)
out["free_1"] = torch.axon.mem_get_info(1)[0]
del a
torch.axon.empty_cache()
b = torch.empty(40 * MiB, dtype=torch.uint8, device="axon:1").fill_(3)
out["after_free"] = int(b[::MiB].sum().item())
print(json.dumps(out))
"""


def test_devices_together_never_exceed_the_host_limit():
    import json

    r = run_python(HOST_LIMIT_SCRIPT, env={"AXON_NUM_DEVICES": "2",
                                           "AXON_DEVICE_MEMORY": "48MiB",
                                           "AXON_HOST_MEMORY": "64MiB"})
    assert r.returncode == 0, r.stderr
    assert ("axon: 2 device(s) x 48.00 MiB (AXON_DEVICE_MEMORY) is more than the 64.00 MiB of "
            "host memory; allocations past the host's memory raise torch.OutOfMemoryError"
            in r.stderr)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    msg = out["message"]
    assert msg.startswith("axon out of memory. Tried to allocate 40.00 MiB on axon:1, but the "
                          "host ran out of memory ("), msg
    assert ("the devices of this process use 40.00 MiB of the 64.00 MiB of host memory"
            in msg), msg
    assert "is free" not in msg
    assert out["free_1"] == 48 * MiB  # the device itself had room
    assert out["after_free"] == 3 * 40


def test_freed_memory_of_one_device_serves_another_when_the_host_is_full():
    # Device memory is host memory: a block freed on axon:0 (kept in axon:0's cache)
    # serves axon:1 once the host is full, without torch.axon.empty_cache(); data intact
    r = run_python("""
        import torch
        MiB = 1 << 20
        keep = torch.full((8 * MiB,), 7, dtype=torch.uint8, device="axon:0")
        a = torch.empty(40 * MiB, dtype=torch.uint8, device="axon:0")
        del a
        assert torch.axon.memory_reserved(0) >= 48 * MiB  # cached, not returned
        b = torch.full((40 * MiB,), 3, dtype=torch.uint8, device="axon:1")
        print(int(b[::MiB].sum()), int(keep[::MiB].sum()), torch.axon.memory_reserved(0) // MiB)
    """, env={"AXON_NUM_DEVICES": "2", "AXON_DEVICE_MEMORY": "64MiB",
              "AXON_HOST_MEMORY": "64MiB"})
    assert r.returncode == 0, r.stderr
    total_b, total_keep, reserved_0 = map(int, r.stdout.split())
    assert (total_b, total_keep) == (3 * 40, 7 * 8)
    assert reserved_0 < 40  # axon:0 gave its free segment back; the live tensor stays


def test_host_refusing_memory_raises_out_of_memory_error():
    # The address-space limit makes mmap fail as a host without memory would.
    r = run_python("""
        import resource, torch
        x = torch.ones(4, device="axon")
        x.sum().item()
        with open("/proc/self/status") as f:
            vm = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), resource.RLIM_INFINITY))
        try:
            torch.empty(1 << 30, dtype=torch.uint8, device="axon")
        except torch.OutOfMemoryError as e:
            print("OOM:", e)
        y = torch.ones(1 << 20, device="axon")  # smaller allocations still work
        print("after:", int(y.sum().item()))
    """, env={"AXON_DEVICE_MEMORY": "2GiB", "AXON_NUM_DEVICES": "2"})
    assert r.returncode == 0, r.stderr
    oom = next(l for l in r.stdout.splitlines() if l.startswith("OOM:"))
    assert "Tried to allocate 1.00 GiB on axon:0, but the host ran out of memory" in oom, oom
    assert re.search(r"the host refused 1\.00 GiB \((mmap|memfd_create|ftruncate): ", oom), oom
    assert "is free" not in oom
    assert "after: 1048576" in r.stdout


# ---------------------------------------------------------------- item 7: messages

def test_record_stream_on_a_cpu_stream_says_so():
    x = torch.ones(4, device="axon")
    with pytest.raises(RuntimeError) as e:
        x.record_stream(torch.Stream("cpu"))
    assert str(e.value).startswith(
        "record_stream: expected an axon stream, but got a cpu stream; an axon tensor can "
        "only be recorded on an axon stream"), str(e.value)
    x.record_stream(torch.axon.Stream())  # an axon stream is fine
