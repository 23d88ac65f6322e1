"""torch.profiler sees the axon device (ProfilerActivity.PrivateUse1, Kineto): each
kernel, copy, fused run and collective is a device activity on its stream, timed on the
device, linked to the host op that launched it (key_averages' device time, the Chrome
trace's "External id" and flow arrows, a row per stream); and torch.axon.utilization().
"""

import json
import time

import pytest
import torch
import torch.distributed as dist
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import torch_axon
from dist_util import run_ranks

DEV = "axon"
ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def device_events(prof):
    return [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]


def train_step(x, w):
    y = (x @ w).relu()
    y.sum().backward()
    return y


@pytest.fixture
def tensors():
    x = torch.randn(128, 128, device=DEV, requires_grad=True)
    w = torch.randn(128, 128, device=DEV, requires_grad=True)
    train_step(x, w)  # warm up: a kernel's first launch runs on the calling thread
    torch.randn(64, device=DEV).cpu()
    torch.axon.synchronize()
    return x, w


def test_kineto_profiler_is_registered():
    assert torch_axon._C._kineto_profiler_registered()
    assert ProfilerActivity.PrivateUse1 in torch.profiler.supported_activities()
    assert ProfilerActivity.AXON is ProfilerActivity.PrivateUse1  # the renamed backend's alias


def test_kernels_and_copies_are_device_activities_linked_to_their_ops(tensors, tmp_path):
    x, w = tensors
    host = torch.randn(64, 64)
    with profile(activities=ACTIVITIES) as prof:
        y = train_step(x, w)
        d = host.to(DEV)  # a copy to the device
        back = (d * 2).cpu()  # and back
    torch.testing.assert_close(back, host * 2)
    stream = torch.axon.current_stream().stream_id
    dev = device_events(prof)
    names = [e.name for e in dev]
    assert "aten::mm (axon)" in names and "Memcpy (axon)" in names, names
    for e in dev:
        assert e.device_index == 0
        assert e.device_resource_id == stream  # the stream is the activity's resource
        assert e.time_range.end > e.time_range.start, e.name
    # key_averages: the host ops carry their kernels' device time.
    rows = {r.key: r for r in prof.key_averages() if r.device_type == DeviceType.CPU}
    for op in ("aten::mm", "aten::relu", "aten::threshold_backward"):
        assert rows[op].device_time_total > 0, op
        assert rows[op].self_device_time_total > 0, op
    assert rows["aten::copy_"].device_time_total > 0  # itself or its child aten::_copy_from
    kernel_rows = {r.key: r for r in prof.key_averages() if r.device_type == DeviceType.PrivateUse1}
    assert kernel_rows["aten::mm (axon)"].count == 3  # forward, and two in MmBackward0
    assert kernel_rows["aten::mm (axon)"].self_device_time_total > 0
    assert rows["aten::matmul"].self_device_time_total == 0  # its child aten::mm has the kernel
    assert rows["aten::matmul"].device_time_total > 0
    # ... and the backward pass (on the autograd engine's thread) its kernels'.
    bw = [e for e in prof.events() if e.name == "autograd::engine::evaluate_function: MmBackward0"]
    assert bw and bw[0].device_time_total > 0
    # The mm kernel's time is the op's device time, and lies after its launch.
    mm_op = next(e for e in prof.events()
                 if e.name == "aten::mm" and e.device_type == DeviceType.CPU)
    kernel = next(k for k in dev if k.name == "aten::mm (axon)")
    assert mm_op.kernels
    assert mm_op.kernels[0].duration == pytest.approx(kernel.time_range.elapsed_us())
    assert kernel.time_range.start >= mm_op.time_range.start - 50  # clocks agree within 50 us
    del y

    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in trace if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy")]
    assert kernels and all(e["pid"] == 0 and e["tid"] == stream for e in kernels)
    # A row per stream, named, on a process named after the device.
    meta = {(e["name"], e["pid"], e.get("tid")): e["args"] for e in trace if e.get("ph") == "M"}
    assert meta[("process_name", 0, 0)]["name"] == "axon:0"
    assert meta[("thread_name", 0, stream)]["name"] == f"stream {stream} (default)"
    # Each kernel names its host op ("External id") and ends a flow that starts at
    # the launch (axonLaunchKernel) on the op's thread.
    ops = {e["args"]["External id"]: e for e in trace
           if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    starts = {e["id"]: e for e in trace if e.get("ph") == "s" and e.get("cat") == "ac2g"}
    ends = {e["id"]: e for e in trace if e.get("ph") == "f" and e.get("cat") == "ac2g"}
    for k in kernels:
        op = ops[k["args"]["External id"]]
        if k["name"] == "aten::mm (axon)":
            assert op["name"] == "aten::mm"
        if k["cat"] == "gpu_memcpy":
            assert op["name"] in ("aten::copy_", "aten::_copy_from"), op["name"]
        flow = k["args"]["correlation"]
        assert ends[flow]["pid"] == 0 and ends[flow]["tid"] == stream
        assert starts[flow]["tid"] == op["tid"]
        assert op["ts"] <= starts[flow]["ts"] <= op["ts"] + op["dur"]
    launches = [e for e in trace if e.get("name") == "axonLaunchKernel"]
    assert len(launches) == len([k for k in kernels if k["cat"] == "kernel"])


def test_two_streams_are_two_rows(tensors, tmp_path):
    x, w = tensors
    s1, s2 = torch.axon.Stream(), torch.axon.Stream()
    assert s1.stream_id != s2.stream_id
    with profile(activities=ACTIVITIES) as prof:
        with torch.axon.stream(s1):
            a = x @ w
        with torch.axon.stream(s2):
            b = w @ x
        torch.axon.synchronize()
    mm = [e for e in device_events(prof) if e.name == "aten::mm (axon)"]
    assert {e.device_resource_id for e in mm} == {s1.stream_id, s2.stream_id}
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())["traceEvents"]
    rows = {e["tid"]: e["args"]["name"] for e in trace
            if e.get("ph") == "M" and e["name"] == "thread_name" and e["pid"] == 0}
    assert rows[s1.stream_id] == f"stream {s1.stream_id}"
    assert rows[s2.stream_id] == f"stream {s2.stream_id}"
    assert {e["tid"] for e in trace if e.get("cat") == "kernel"} == {s1.stream_id, s2.stream_id}
    del a, b

    # tools/trace_svg.py draws it: a row per stream, a line per launch flow.
    import importlib.util
    import pathlib
    import xml.dom.minidom

    tool = pathlib.Path(__file__).parents[2] / "tools" / "trace_svg.py"
    spec = importlib.util.spec_from_file_location("trace_svg", tool)
    trace_svg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trace_svg)
    svg = tmp_path / "trace.svg"
    trace_svg.render(str(path), str(svg), "two streams")
    doc = xml.dom.minidom.parse(str(svg))
    labels = [t.firstChild.data for t in doc.getElementsByTagName("text") if t.firstChild]
    assert f"axon:0 stream {s1.stream_id}" in labels and f"axon:0 stream {s2.stream_id}" in labels
    flows = [ln for ln in doc.getElementsByTagName("line")
             if ln.getAttribute("stroke") == "#c03030"]
    assert len(flows) == 2  # launch to kernel, one per matmul


def test_each_device_is_a_process_of_the_trace(tmp_path):
    a = torch.randn(64, 64, device="axon:0")
    b = torch.randn(64, 64, device="axon:1")
    a @ a, b @ b  # warm up
    torch.axon.synchronize(0), torch.axon.synchronize(1)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.AXON]) as prof:
        a @ a
        b @ b
        torch.axon.synchronize(1)
    assert sorted(e.device_index for e in device_events(prof)) == [0, 1]
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in trace
             if e.get("ph") == "M" and e["name"] == "process_name"}
    assert names[0] == "axon:0" and names[1] == "axon:1"
    assert sorted(e["pid"] for e in trace if e.get("cat") == "kernel") == [0, 1]


def test_fused_run_is_one_activity_naming_its_ops():
    torch.axon.synchronize()
    torch.ops.axon._set_kernel_threads("worker")  # kernels the thread policy times never fuse
    torch.axon._C._set_adaptive_eager(1)
    try:
        a = torch.randn(64, 512, device=DEV)
        chain = lambda: (a + 1) * 2  # noqa: E731
        chain()
        torch.axon.synchronize()
        with profile(activities=ACTIVITIES) as prof:
            torch.axon._C._test_sleep_on_stream(torch.axon.current_device(), 30)  # ops queue up
            out = chain()
        torch.testing.assert_close(out.cpu(), (a.cpu() + 1) * 2, atol=0, rtol=0)
    finally:
        torch.axon.synchronize()
        torch.axon._C._set_adaptive_eager(-1)
        torch.ops.axon._set_kernel_threads("")
    fused = [e for e in device_events(prof) if e.name.startswith("fused: ")]
    assert [e.name for e in fused] == ["fused: aten::add.Tensor, aten::mul.Tensor (axon)"]
    rows = {r.key: r for r in prof.key_averages() if r.device_type == DeviceType.CPU}
    assert rows["aten::add"].device_time_total > 0  # linked to the run's first op


def test_recording_stops_with_the_profiler_and_profiling_twice_works(tensors):
    x, w = tensors
    counts = []
    for _ in range(2):
        assert not torch_axon._C._task_recording()
        with profile(activities=ACTIVITIES) as prof:
            assert torch_axon._C._task_recording()
            x @ w
        assert not torch_axon._C._task_recording()
        x @ w  # not recorded: nothing may leak into the next trace
        torch.axon.synchronize()
        counts.append(len([e for e in device_events(prof) if e.name == "aten::mm (axon)"]))
    assert counts == [1, 1]
    # Host ops only: the device is not recorded at all.
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert not torch_axon._C._task_recording()
        x @ w
    assert device_events(prof) == []


def _profile_all_reduce(rank, world_size):
    dist.init_process_group("axon")
    t = torch.full((1024,), float(rank + 1), device=DEV)
    dist.all_reduce(t)  # warm up (connects the ranks)
    torch.axon.synchronize()
    with profile(activities=ACTIVITIES) as prof:
        # Queued behind work, as after a backward pass: the collective runs on
        # the communication stream (on idle streams a small one runs on the
        # calling thread, which the device timeline does not show).
        torch.axon._C._test_sleep_on_stream(rank, 50)
        dist.all_reduce(t)
        torch.axon.synchronize()
    out = t.cpu()
    dev = [(e.name, e.device_resource_id) for e in device_events(prof)]
    ops = {e.id: e.name for e in prof.events() if e.device_type == DeviceType.CPU}
    linked = [ops.get(e.linked_correlation_id) for e in device_events(prof)]
    return out, dev, linked, torch.axon.current_stream().stream_id


def test_collective_runs_on_the_communication_stream():
    results = run_ranks(_profile_all_reduce, 2)
    for out, dev, linked, current in results:
        torch.testing.assert_close(out, torch.full((1024,), 6.0))  # (1 + 2) summed twice
        comm = [(name, sid, op) for (name, sid), op in zip(dev, linked) if sid != current]
        assert comm, dev
        name, sid, op = comm[0]
        assert sid > 2 * 32, sid  # a dedicated (communication) stream, not a pool stream
        assert name == "all_reduce (axon)", name
        assert op == "c10d::allreduce_", op
    # Work that names itself for axon keeps its name: "c10d::wait (axon)".
    assert any(name == "c10d::wait (axon)" for name, _ in results[0][1]), results[0][1]


def test_utilization_is_high_while_busy_and_low_when_idle():
    m = torch.randn(384, 384, device=DEV)
    (m @ m).sum().item()
    for device in (None, 0, "axon:0", torch.device("axon", 0)):
        assert 0 <= torch.axon.utilization(device) <= 100
    # Keep the stream's queue full for well over a second (a period): each batch
    # is queued before the previous one is waited for.
    t0 = time.perf_counter()
    previous = None
    while time.perf_counter() - t0 < 1.3:
        for _ in range(4):
            m @ m
        ev = torch.axon.Event()
        ev.record()
        if previous is not None:
            previous.synchronize()
        previous = ev
    busy_now = torch.axon.utilization()
    torch.axon.synchronize()
    busy_after = torch.axon.utilization()
    assert busy_now >= 70 and busy_after >= 70, (busy_now, busy_after)
    time.sleep(1.2)
    assert torch.axon.utilization() <= 10
    assert torch.axon.utilization(1) <= 10  # another device, unused here


def test_utilization_errors():
    with pytest.raises(ValueError, match="Expected an axon device, but got: cpu"):
        torch.axon.utilization("cpu")
    with pytest.raises(RuntimeError, match=r"Invalid device index: axon:99; the device count is"):
        torch.axon.utilization(99)


def test_nvtx_ranges_are_profiler_ranges(tensors):
    """torch.axon.nvtx (torch.cuda.nvtx's calls, for scripts instrumented for Nsight):
    nested push/pop, start/end across threads, mark and the range context manager record
    torch.profiler ranges around the ops inside them; depths as NVTX returns them."""
    import inspect
    import threading

    nvtx = torch.axon.nvtx
    for name in torch.cuda.nvtx.__all__:
        if not name.startswith("_"):
            assert inspect.signature(getattr(nvtx, name)).parameters.keys() == \
                inspect.signature(getattr(torch.cuda.nvtx, name)).parameters.keys(), name
    x, w = tensors
    with profile(activities=ACTIVITIES) as prof:
        assert nvtx.range_push("outer") == 0
        assert nvtx.range_push("inner") == 1
        y = x @ w
        assert nvtx.range_pop() == 1
        assert nvtx.range_pop() == 0
        rid = nvtx.range_start("across threads")
        t = threading.Thread(target=nvtx.range_end, args=(rid,))
        t.start()
        t.join()
        nvtx.mark("a mark")
        with nvtx.range("step {}", 3):
            (y * 2).sum().item()
    assert nvtx.range_pop() == -1  # nothing open
    with pytest.raises(ValueError, match="no open range with id"):
        nvtx.range_end(rid)
    names = [e.name for e in prof.events()]
    for expected in ("outer", "inner", "across threads", "a mark", "step 3"):
        assert expected in names, (expected, sorted(set(names))[:40])
    inner = next(e for e in prof.events() if e.name == "inner")
    mm = [e for e in prof.events() if e.name == "aten::mm"]
    assert any(inner.time_range.start <= e.time_range.start <= inner.time_range.end for e in mm)
