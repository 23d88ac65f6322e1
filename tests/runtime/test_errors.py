"""Errors a user can hit, each with its message: devices mixed in one op,
invalid device indices, out of memory, asynchronous errors, unsupported
dtypes/layouts, several streams' errors, a forked child. (The CPU fallback's
statistics and warnings: tests/ops/test_fallback.py.)"""

import json
import re

import pytest
import torch

from conftest import assert_same, make, run_python

SAME_DEVICE = "Expected all tensors to be on the same device"


# ---------------------------------------------------------------- mixed devices

MIXED_OPS = {
    "add": lambda a, c: a + c,
    "radd": lambda a, c: c + a,
    "add_": lambda a, c: a.add_(c),
    "cpu_add_": lambda a, c: c.add_(a),
    "mm": lambda a, c: torch.mm(a, c),
    "cat": lambda a, c: torch.cat([a, c]),
    "where": lambda a, c: torch.where(a > 0, a, c),
    "index_select_cpu_index": lambda a, c: a.index_select(0, c[0].long()),
    "linear": lambda a, c: torch.nn.functional.linear(a, c),
    "layer_norm": lambda a, c: torch.nn.functional.layer_norm(a, (3,), c[0]),
    "softmax_backward": lambda a, c: torch.ops.aten._softmax_backward_data(c, a, 1, torch.float32),
    # Tensor lists, the mixed tensor not first (kernels walk every list).
    "stack": lambda a, c: torch.stack([a, a, c]),
    "cat_out": lambda a, c: torch.cat([a, a], out=c),
    "foreach_add": lambda a, c: torch._foreach_add([a, a], [a, c]),
    "foreach_mul_": lambda a, c: torch._foreach_mul_([a, a], [a, c]),
    "foreach_addcmul_": lambda a, c: torch._foreach_addcmul_([a], [a], [c]),
    "index_put_values": lambda a, c: a.index_put_((torch.tensor([0], device=a.device),), c[0]),
    "einsum": lambda a, c: torch.einsum("ij,jk->ik", a, c),
    "adamw_fused": lambda a, c: torch._fused_adamw_(
        [a], [c], [a.clone()], [a.clone()], [], [torch.ones((), device="axon")], lr=0.1,
        beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False),
}


def test_sdpa_with_cpu_and_axon_tensors_raises_pytorchs_error():
    a = torch.ones(1, 1, 3, 3, device="axon")
    with pytest.raises(RuntimeError, match="Expected query, key, and value to have the same "
                                           "device type.*key.device: cpu"):
        torch.nn.functional.scaled_dot_product_attention(a, a.cpu(), a)


@pytest.mark.parametrize("op", list(MIXED_OPS))
def test_cpu_and_axon_tensors_in_one_op(op):
    a = torch.ones(3, 3, device="axon")
    c = torch.ones(3, 3)
    with pytest.raises(RuntimeError, match=SAME_DEVICE) as e:
        MIXED_OPS[op](a, c)
    assert "axon:0" in str(e.value) and "cpu" in str(e.value)


@pytest.mark.parametrize("op", ["add", "mm", "cat", "where", "linear", "stack", "cat_out",
                                "foreach_add", "foreach_addcmul_", "index_put_values"])
def test_two_axon_devices_in_one_op(op):
    a = torch.ones(3, 3, device="axon:0")
    b = torch.ones(3, 3, device="axon:1")
    with pytest.raises(RuntimeError, match=SAME_DEVICE) as e:
        MIXED_OPS[op](a, b)
    assert "axon:0" in str(e.value) and "axon:1" in str(e.value)


@pytest.mark.parametrize("other", ["cpu", "axon:1"])
def test_foreach_over_tensors_on_several_devices_works_per_tensor(other):
    # As CUDA's foreach slow path: an op that pairs no tensors across devices
    # runs tensor by tensor, each result on its input's device.
    xs = [make((3, 4), torch.float32), make((5,), torch.float32)]
    ys = [xs[0].to("axon"), xs[1].to(other)]
    got = torch._foreach_add(ys, [1.5, -2.0])
    assert [t.device for t in got] == [t.device for t in ys]
    for g, w in zip(got, torch._foreach_add(xs, [1.5, -2.0])):
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0)
    got = torch._foreach_norm(ys)
    assert [t.device for t in got] == [t.device for t in ys]
    for g, w in zip(got, torch._foreach_norm(xs)):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-6, atol=0)


def test_cpu_scalar_tensors_mix_with_axon():
    # As with CUDA, 0-dim CPU tensors are scalars and may be mixed in.
    x = make((3, 4), torch.float32)
    s = torch.tensor(2.5)
    assert_same(x.axon() * s, x * s)
    assert_same(s - x.axon(), s - x)
    assert_same(torch.where(x.axon() > 0, x.axon(), s), torch.where(x > 0, x, s))


# ---------------------------------------------------------------- device indices

INVALID_INDEX = {
    "factory": lambda: torch.ones(2, device="axon:9"),
    "to": lambda: torch.ones(2).to("axon:9"),
    "axon()": lambda: torch.ones(2).axon(9),
    "set_device": lambda: torch.axon.set_device(9),
    "device_ctx": lambda: torch.axon.device(9).__enter__(),
    "synchronize": lambda: torch.axon.synchronize(9),
    "memory_allocated": lambda: torch.axon.memory_allocated(9),
    "properties": lambda: torch.axon.get_device_properties(9),
    "Stream": lambda: torch.axon.Stream(device=9),
    "current_stream": lambda: torch.axon.current_stream(9),
    "Generator": lambda: torch.Generator(device="axon:9"),
    "accelerator": lambda: torch.accelerator.set_device_index(9),
    "copy_to": lambda: torch.ones(2, device="axon").to("axon:9"),
}


@pytest.mark.parametrize("entry", list(INVALID_INDEX))
def test_invalid_device_index_message(entry):
    # torch.AcceleratorError (a RuntimeError), as CUDA's "invalid device ordinal"
    with pytest.raises(torch.AcceleratorError) as e:
        INVALID_INDEX[entry]()
    assert "Invalid device index: axon:9; the device count is 8" in str(e.value)
    assert torch.axon.current_device() == 0  # nothing changed


@pytest.mark.parametrize("index", [9, -1])
def test_invalid_device_index_rng_state(index):
    with pytest.raises(RuntimeError, match="Invalid device index"):
        torch.axon.get_rng_state(index)


# ---------------------------------------------------------------- out of memory

OOM_SCRIPT = r"""
import json, torch
MiB = 1 << 20
out = {}
a = torch.empty(40 * MiB, dtype=torch.uint8, device="axon")
try:
    torch.empty(40 * MiB, dtype=torch.uint8, device="axon")
except torch.OutOfMemoryError as e:
    out["type"] = type(e).__name__
    out["is_runtime_error"] = isinstance(e, RuntimeError)
    out["message"] = str(e)
out["allocated_after_oom"] = torch.axon.memory_allocated()
out["num_ooms"] = torch.axon.memory_stats()["num_ooms"]
# an op whose result does not fit raises the same
try:
    a.float()
except torch.OutOfMemoryError as e:
    out["op_message"] = str(e)
del a
b = torch.empty(40 * MiB, dtype=torch.uint8, device="axon")  # fits once a is freed
b.fill_(7)
out["after_free_ok"] = bool((b[::MiB].cpu() == 7).all())
del b
# cached free memory is released to satisfy a request of another size
c = torch.empty(50 * MiB, dtype=torch.uint8, device="axon")
out["retries"] = torch.axon.memory_stats()["num_alloc_retries"]
out["reserved_after_retry"] = torch.axon.memory_reserved()
del c
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def oom_run():
    r = run_python(OOM_SCRIPT, env={"AXON_DEVICE_MEMORY": "64MiB"})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_oom_raises_out_of_memory_error(oom_run):
    assert oom_run["type"] == "OutOfMemoryError"
    assert oom_run["is_runtime_error"]
    assert oom_run["num_ooms"] >= 1


def test_oom_message_names_sizes(oom_run):
    msg = oom_run["message"]
    assert "Tried to allocate 40.00 MiB" in msg
    assert "axon:0" in msg
    assert "total capacity of 64.00 MiB" in msg
    assert "24.00 MiB is free" in msg
    assert re.search(r"40\.00 MiB is allocated by PyTorch", msg)
    assert "reserved by PyTorch but unallocated" in msg
    assert "Tried to allocate 160.00 MiB" in oom_run["op_message"]  # 40 Mi floats


def test_oom_leaves_allocator_consistent_and_recovers(oom_run):
    assert oom_run["allocated_after_oom"] == 40 * 2**20
    assert oom_run["after_free_ok"]
    assert oom_run["retries"] >= 1
    assert oom_run["reserved_after_retry"] == 50 * 2**20


# ---------------------------------------------------------------- asynchronous errors

def inject(device, msg):
    torch.axon._C._test_inject_async_error(device, msg)


def test_async_error_surfaces_at_synchronize():
    inject(0, "injected failure 1")
    with pytest.raises(RuntimeError) as e:
        torch.axon.synchronize()
    msg = str(e.value)
    assert "asynchronous error" in msg and "injected failure 1" in msg
    assert "axon_test_error" in msg and "axon:0" in msg
    torch.axon.synchronize()  # reported once


@pytest.mark.parametrize("where", ["stream.synchronize", "event.synchronize", "item",
                                   "blocking_copy", "accelerator.synchronize"])
def test_async_error_surfaces_at_next_sync_point(where):
    x = torch.ones(4, device="axon")
    torch.axon.synchronize()
    inject(0, f"boom at {where}")
    with pytest.raises(RuntimeError, match=f"boom at {where}"):
        if where == "stream.synchronize":
            torch.axon.current_stream().synchronize()
        elif where == "event.synchronize":
            e = torch.axon.Event()
            e.record()
            e.synchronize()
        elif where == "item":
            x.sum().item()
        elif where == "blocking_copy":
            x.cpu()
        else:
            torch.accelerator.synchronize()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_device_keeps_working_after_async_error(dtype):
    x = make((5, 6), dtype, seed=11)
    a = x.axon()
    inject(0, "transient")
    with pytest.raises(RuntimeError, match="transient"):
        torch.axon.synchronize()
    assert_same(a * 2 + 1, x * 2 + 1)
    assert_same(a.sum(1), x.sum(1), accum=True)
    torch.axon.synchronize()


def test_async_error_on_side_stream_and_other_device():
    s = torch.axon.Stream(device=1)
    with torch.axon.stream(s):
        inject(1, "side stream failure")
    torch.axon.synchronize(0)  # device 0 is not affected
    with pytest.raises(RuntimeError, match="side stream failure") as e:
        torch.axon.synchronize(1)
    assert "axon:1" in str(e.value)
    torch.axon.synchronize(1)


def test_async_error_does_not_lose_later_work():
    x = make((16,), torch.float32, seed=2)
    src, dst = x.axon(), torch.zeros(16, device="axon")
    torch.axon.synchronize()
    inject(0, "before copy")
    dst.copy_(src)  # device-to-device: enqueued after the failing task, does not sync
    with pytest.raises(RuntimeError, match="before copy"):
        torch.axon.synchronize()
    assert_same(dst, x)


# ---------------------------------------------------------------- dtypes and layouts

@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64, torch.uint8, torch.int8,
                                   torch.int16, torch.uint16])
def test_less_common_dtypes_work(dtype):
    x = make((4, 5), dtype, low=0, high=9, seed=5)
    a = x.axon()
    assert a.dtype == dtype
    assert_same(a, x)
    assert_same(a * 2, x * 2)
    assert_same(a.sum(0), x.sum(0), accum=True)
    assert_same(a.t().contiguous(), x.t().contiguous())


def test_float8_storage_works_and_arithmetic_matches_cpu_error():
    x = make((4, 4), torch.float32).to(torch.float8_e4m3fn)
    a = x.axon()
    assert a.dtype == torch.float8_e4m3fn
    assert torch.equal(a.cpu().view(torch.uint8), x.view(torch.uint8))
    assert_same(a.float(), x.float())
    with pytest.raises(Exception) as cpu_err:
        x * 2
    with pytest.raises(type(cpu_err.value)) as axon_err:
        a * 2
    assert str(axon_err.value).splitlines()[0] == str(cpu_err.value).splitlines()[0]
    assert "Float8_e4m3fn" in str(axon_err.value)


def test_sparse_layout_is_rejected():
    with pytest.raises((RuntimeError, NotImplementedError)):
        torch.empty(2, 2, layout=torch.sparse_coo, device="axon")
    with pytest.raises((RuntimeError, NotImplementedError), match="Sparseaxon|sparse"):
        torch.eye(3).to_sparse().to("axon")


def test_pin_memory_of_axon_tensor_is_rejected():
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        torch.ones(2, device="axon").pin_memory()


# ---------------------------------------------------------------- more asynchronous errors

def test_errors_of_several_streams_are_each_reported_once():
    s1, s2 = torch.axon.Stream(), torch.axon.Stream()
    with torch.axon.stream(s1):
        inject(0, "first stream failed")
    with torch.axon.stream(s2):
        inject(0, "second stream failed")
    # One device synchronize reports both: the first raised, the other listed.
    with pytest.raises(RuntimeError) as e:
        torch.axon.synchronize()
    msg = str(e.value)
    assert "first stream failed" in msg and "second stream failed" in msg, msg
    assert "1 more asynchronous error since the last synchronization" in msg
    torch.axon.synchronize()  # nothing left


def test_forked_child_gets_a_clear_error():
    # The device's worker threads do not survive fork(): a child must be told
    # so (like CUDA's "Cannot re-initialize CUDA in forked subprocess").
    r = run_python("""
        import os, torch
        x = torch.ones(4, device="axon") * 2          # the parent uses the device
        pid = os.fork()
        if pid == 0:
            # As torch.cuda: not initialised in a bad fork; CUDA's message.
            ok = torch.axon._is_in_bad_fork() and not torch.axon.is_initialized()
            try:
                torch.ones(1, device="axon")
                os._exit(3)
            except RuntimeError as e:
                os._exit(0 if ok and str(e).startswith(
                    "Cannot re-initialize axon in forked subprocess. To use axon with "
                    "multiprocessing, you must use the 'spawn' start method") else 4)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status), "parent", x.sum().item(),
              torch.axon._is_in_bad_fork())
    """)
    assert r.returncode == 0, r.stderr[-500:]
    assert r.stdout.split() == ["child", "0", "parent", "8.0", "False"], r.stdout


def test_cpu_tensor_indexed_with_axon_indices_raises_like_cuda():
    """A CPU tensor indexed with axon index tensors: PyTorch's error for it (as
    with CUDA indices), for getitem and aten::index; setitem's in-place write
    raises the mixed-device error.  axon indices on an axon tensor work."""
    x = make((3, 4, 5), torch.float32)
    idx = torch.tensor([0, 2, 1], device="axon")
    for call in [lambda: x[idx], lambda: torch.ops.aten.index(x, [idx]),
                 lambda: x[idx, idx]]:
        with pytest.raises(RuntimeError, match=re.escape(
                "indices should be either on cpu or on the same device as the indexed "
                "tensor (cpu)")):
            call()
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x[idx] = 1.0
    assert_same(x.to("axon")[idx], x[idx.cpu()])
