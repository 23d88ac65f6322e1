"""How tier-2 ops run: as stream work. The host checks arguments, allocates
results and enqueues the kernel on the current axon stream, so the call
returns before the stream has finished; results wait for pending work; host
metadata changes and frees after the launch do not change what pending
kernels compute; side streams order with wait_stream; errors the host can
see are raised at the call like the CPU's (data-dependent ones at the next
synchronisation); a deadlock regression. More host checks: test_host_checks.py.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_same, make, run_python
from op_util import cpu_and_axon_raise_alike, sleep_on_stream


# ---------------------------------------------------------------- asynchrony

BUSY_MS = 800


def chain(x, w, b):
    y = (x + 1) * 0.5
    y = y @ w
    y = torch.softmax(y, -1)
    return F.layer_norm(y, (y.shape[-1],), b, b)


def test_ops_return_before_the_stream_is_done():
    x, w, b = make((16, 32), torch.float32, seed=1), make((32, 24), torch.float32, seed=2), \
        make((24,), torch.float32, 0.5, 1.5, seed=3)
    xa, wa, ba = x.axon(), w.axon(), b.axon()
    chain(xa, wa, ba)  # first calls of each kernel for these dtypes run synchronously
    torch.axon.synchronize()
    stream = torch.axon.current_stream()
    t0 = time.perf_counter()
    sleep_on_stream(0, BUSY_MS)
    out = chain(xa, wa, ba)
    launched = time.perf_counter() - t0
    assert launched < BUSY_MS / 1000 / 2, f"launch took {launched:.3f}s"
    assert not stream.query()  # still busy with the sleep or the chain
    torch.axon.synchronize()
    assert stream.query()
    assert time.perf_counter() - t0 >= BUSY_MS / 1000 * 0.9
    assert_same(out, chain(x, w, b), accum=True)


def test_results_wait_for_pending_work():
    x = make((8, 8), torch.float32, seed=1)
    xa = x.axon()
    (xa * 2).sum()
    torch.axon.synchronize()
    sleep_on_stream(0, 300)
    y = (xa * 2).sum()
    assert y.item() == pytest.approx((x * 2).sum().item(), rel=1e-6)  # .item() waits


@pytest.mark.parametrize("change", ["t_", "resize_grow", "resize_shrink", "set_", "as_strided_",
                                    "unsqueeze_", "detach_and_view"])
def test_host_metadata_change_after_launch(change):
    """Changing a tensor's sizes, strides or storage right after launching a
    kernel that writes it (y) or reads it (z = y * 2) does not change what the
    pending kernels compute."""
    x = make((3, 4), torch.float32, seed=1)
    xa = x.axon()
    # Warm-up: a launch signature seen for the first time runs synchronously
    # (after the stream drains), which would run the pending kernels now.
    (xa + 1) * 2
    torch.full((5,), 7.0, device="axon")
    torch.axon.synchronize()
    sleep_on_stream(0, 200)
    y = xa + 1
    z = y * 2
    other = torch.full((5,), 7.0, device="axon")
    assert not torch.axon.current_stream().query()  # the kernels are still pending
    if change == "t_":
        y.t_()
        expected = (x + 1).t()
    elif change == "resize_grow":
        y.resize_(40)
        expected = None
    elif change == "resize_shrink":
        y.resize_(2, 2)
        expected = (x + 1).flatten()[:4].view(2, 2)
    elif change == "set_":
        y.set_(other)
        expected = torch.full((5,), 7.0)
    elif change == "as_strided_":
        y.as_strided_((2, 3), (1, 4), 1)
        expected = (x + 1).flatten().as_strided((2, 3), (1, 4), 1)
    elif change == "unsqueeze_":
        y.unsqueeze_(0)
        expected = (x + 1).unsqueeze(0)
    else:
        y = y.detach().view(12)
        expected = (x + 1).flatten()
    assert_same(z, (x + 1) * 2)
    if expected is None:  # grown: the old elements kept, in place
        assert y.shape == (40,)
        assert_same(y[:12], (x + 1).flatten())
    else:
        assert_same(y, expected)
    assert_same(other, torch.full((5,), 7.0))  # set_ did not redirect the pending write


def test_input_storage_freed_after_launch_is_not_reused_early():
    x = make((64, 64), torch.float32, seed=1)
    xa = x.axon()
    (xa @ xa).sum()
    torch.axon.synchronize()
    sleep_on_stream(0, 200)
    tmp = xa * 3
    y = tmp @ xa  # pending, reads tmp
    del tmp  # the host drops its last reference before the kernel ran
    junk = [torch.full((64, 64), float(i), device="axon") for i in range(4)]
    assert_same(y, (x * 3) @ x, accum=True)
    del junk


@pytest.mark.parametrize("direction", ["default_to_side", "side_to_default"])
def test_side_stream_ordered_with_wait_stream(direction):
    x = make((32, 32), torch.float32, seed=1)
    w = make((32, 32), torch.float32, seed=2)
    expected = torch.softmax((x * 2) @ w, -1)
    xa, wa = x.axon(), w.axon()
    torch.softmax((xa * 2) @ wa, -1)
    torch.axon.synchronize()
    side = torch.axon.Stream()
    default = torch.axon.current_stream()
    if direction == "default_to_side":
        sleep_on_stream(0, 200)  # the producer on the default stream is late
        h = xa * 2
        side.wait_stream(default)
        with torch.axon.stream(side):
            out = torch.softmax(h @ wa, -1)
            h.record_stream(side)
        default.wait_stream(side)
    else:
        with torch.axon.stream(side):
            sleep_on_stream(0, 200)
            h = xa * 2
        default.wait_stream(side)
        h.record_stream(default)
        out = torch.softmax(h @ wa, -1)
    assert_same(out, expected, accum=True)


def test_side_stream_runs_while_default_stream_is_busy():
    a = make((16, 16), torch.float32, seed=1)
    aa = a.axon()
    side = torch.axon.Stream()
    with torch.axon.stream(side):
        (aa * 2 + 1).softmax(-1)
    torch.axon.synchronize()
    sleep_on_stream(0, BUSY_MS)
    t0 = time.perf_counter()
    with torch.axon.stream(side):
        r = (aa * 2 + 1).softmax(-1)
    side.synchronize()
    assert time.perf_counter() - t0 < BUSY_MS / 1000 / 2
    assert not torch.axon.default_stream().query()
    with torch.axon.stream(side):
        assert_same(r, (a * 2 + 1).softmax(-1))


# ---------------------------------------------------------------- errors at the call

ERROR_CASES = {
    "add_shapes": (lambda a, b: a + b, [torch.ones(3), torch.ones(4)]),
    "matmul_shapes": (lambda a, b: a @ b, [torch.ones(2, 3), torch.ones(2, 3)]),
    "bmm_shapes": (torch.bmm, [torch.ones(2, 2, 3), torch.ones(3, 3, 2)]),
    "inplace_broadcast_resize": (lambda a, b: a.add_(b), [torch.ones(3, 1), torch.ones(1, 4)]),
    "inplace_broadcast_mul": (lambda a, b: a.mul_(b), [torch.ones(1, 3), torch.ones(2, 3)]),
    "out_wrong_dtype_add": (lambda a, o: torch.add(a, a, out=o),
                            [torch.ones(3), torch.empty(3, dtype=torch.int64)]),
    "out_wrong_dtype_mm": (lambda a, o: torch.mm(a, a, out=o),
                           [torch.ones(2, 2), torch.empty(2, 2, dtype=torch.float16)]),
    "out_wrong_dtype_softmax": (lambda a, o: torch.softmax(a, -1, out=o),
                                [torch.ones(2, 2), torch.empty(2, 2, dtype=torch.int32)]),
    "float8_mul": (lambda a: a * 2, [torch.ones(3, dtype=torch.float8_e4m3fn)]),
    "float8_add": (lambda a: a + a, [torch.ones(3, dtype=torch.float8_e5m2)]),
    "bitwise_and_float": (torch.bitwise_and, [torch.ones(3), torch.ones(3)]),
    "softmax_int": (lambda a: torch.softmax(a, 0), [torch.ones(3, dtype=torch.int64)]),
    "layer_norm_shape": (lambda a: F.layer_norm(a, (4,)), [torch.ones(2, 3)]),
    "layer_norm_int": (lambda a: F.layer_norm(a, (3,)), [torch.ones(2, 3, dtype=torch.int32)]),
    "layer_norm_complex": (lambda a: F.layer_norm(a, (3,)),
                           [torch.ones(2, 3, dtype=torch.complex64)]),
    "sdpa_int": (lambda q: F.scaled_dot_product_attention(q, q, q),
                 [torch.ones(1, 2, 3, 4, dtype=torch.int32)]),
    "view_bad_shape": (lambda a: a.view(5), [torch.ones(2, 3)]),
    "rms_norm_int": (lambda a: F.rms_norm(a, (3,)), [torch.ones(2, 3, dtype=torch.int32)]),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_are_raised_at_the_call_like_cpu(case):
    fn, args = ERROR_CASES[case]
    cpu_and_axon_raise_alike(fn, args)


def test_index_out_of_range_is_reported_by_the_next_synchronisation():
    """Like a CUDA device-side error: an index is data, so a kernel finds it out of
    range on the stream (synchronously only on the first launch of a kernel with
    these dtypes), and the error names the op at the next synchronising call."""
    a = torch.ones(3, device="axon")
    a.index_select(0, torch.tensor([0], device="axon"))  # the dtype check's launch
    torch.axon.synchronize()
    with pytest.raises(RuntimeError, match="index_select.*out of range|out of range"):
        a.index_select(0, torch.tensor([5], device="axon"))
        torch.axon.synchronize()
    torch.testing.assert_close((a + 1).cpu(), torch.full((3,), 2.0))  # still usable


def test_unsupported_dtype_first_call_raises_and_later_calls_work():
    """A kernel's first call with a new dtype combination is synchronous, so an
    unsupported dtype raises at the call; asking again raises again."""
    for _ in range(2):
        x = torch.ones(3, dtype=torch.float8_e4m3fn).axon()
        with pytest.raises(NotImplementedError):
            x * 2
        with pytest.raises(NotImplementedError):
            torch.bitwise_and(torch.ones(3, device="axon"), torch.ones(3, device="axon"))
    torch.axon.synchronize()  # nothing asynchronous was left behind


# ---------------------------------------------------------------- deadlock regression

def test_setitem_in_a_loop_after_queued_ops_does_not_deadlock():
    r = run_python("""
        import torch, threading
        x = torch.zeros(64, 64, device="axon")
        w = torch.ones(64, 64, device="axon")
        torch.axon._C._test_sleep_on_stream(0, 100)
        for _ in range(500):  # many queued ops
            x = x * 1.0 + 0.0
        for i in range(200):
            y = x * 2
            x[0] = 1.0
            x[1, i % 64] = y[0, 0]
            x[x < -1] = 0.0
        # and with another Python thread holding the GIL busy
        stop = False
        def spin():
            while not stop:
                sum(range(100))
        t = threading.Thread(target=spin)
        t.start()
        for i in range(200):
            y = x @ w
            x[0] = float(i)
        stop = True
        t.join()
        torch.axon.synchronize()
        print("ok", x[0, 0].item(), x[1].sum().item())
    """, timeout=90)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", "199.0", "128.0"], r.stdout
