"""Copies on axon: host to device, device to host, device to device (also
to another device) between dtypes and layouts, broadcasting copies into
views, overlapping copies, non_blocking, the ordering of cross-device copies,
and .item()/.tolist().
"""

from __future__ import annotations

import pytest
import torch

from conftest import FLOAT_DTYPES, assert_same, layout_pair, make, tol
from op_util import ALL_DTYPES


COPY_DTYPES = [(torch.float32, torch.float32), (torch.float32, torch.bfloat16),
               (torch.float16, torch.float32), (torch.bfloat16, torch.float16),
               (torch.int64, torch.float32), (torch.float32, torch.int32),
               (torch.bool, torch.float16), (torch.float16, torch.bool), (torch.int32, torch.int64)]


@pytest.mark.parametrize("src_layout", ["contiguous", "transposed", "sliced", "expanded", "zero_size"])
@pytest.mark.parametrize("direction", ["h2d", "d2h", "d2d", "d2d_other_device"])
@pytest.mark.parametrize("dtypes", COPY_DTYPES, ids=lambda p: f"{p[0]}-{p[1]}".replace("torch.", ""))
def test_copy(dtypes, direction, src_layout):
    src_dtype, dst_dtype = dtypes
    sc, sa = layout_pair(src_layout, src_dtype, low=-3, high=3, seed=27)
    src = sc if direction == "h2d" else sa
    dst_dev = {"h2d": "axon", "d2h": "cpu", "d2d": "axon", "d2d_other_device": "axon:1"}[direction]
    expected = torch.full(sc.shape, 5, dtype=dst_dtype).copy_(sc)
    for dst in (torch.full(sc.shape, 5, dtype=dst_dtype, device=dst_dev),
                torch.full(tuple(reversed(sc.shape)), 5, dtype=dst_dtype, device=dst_dev).t()):
        r = dst.copy_(src)
        assert r is dst
        torch.testing.assert_close(dst.cpu(), expected, rtol=0, atol=0)
    # .to() as well
    moved = src.to(dst_dev, dst_dtype)
    assert moved.device.type == torch.device(dst_dev).type
    torch.testing.assert_close(moved.cpu(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_copy_broadcasts_and_writes_through_views(dtype):
    row = make((6,), dtype, seed=28)
    base_c, base_a = torch.zeros(4, 6, dtype=dtype), torch.zeros(4, 6, dtype=dtype, device="axon")
    base_c[1:3].copy_(row)
    base_a[1:3].copy_(row)  # CPU source broadcast into an axon view
    base_c.t()[::2, 3].copy_(row[:3])
    base_a.t()[::2, 3].copy_(row[:3].axon())
    base_c[0] = row[0]
    base_a[0] = row[0].axon()
    assert_same(base_a, base_c)


def test_copy_same_tensor_and_overlapping_views():
    x = torch.arange(10.0)
    a = x.axon()
    a.copy_(a)
    a[2:8].copy_(a[0:6].clone())
    x[2:8].copy_(x[0:6].clone())
    assert_same(a, x)


@pytest.mark.parametrize("non_blocking", [False, True])
def test_copy_non_blocking_flag_between_devices(non_blocking):
    x = make((8, 8), torch.float32, seed=29)
    a = x.to("axon", non_blocking=non_blocking)
    b = a.to("axon:3", non_blocking=non_blocking)
    c = b.to("cpu", non_blocking=non_blocking)
    torch.axon.synchronize(0)
    torch.axon.synchronize(3)
    torch.testing.assert_close(c, x, rtol=0, atol=0)


@pytest.mark.parametrize("then", ["free_and_reuse_source", "overwrite_source"])
def test_cross_device_copy_orders_source_device(then):
    x = torch.arange(256, dtype=torch.float32)
    src = x.to("axon:0")
    dst = torch.zeros(256, device="axon:1")
    torch.axon.synchronize(0)
    torch.axon.synchronize(1)
    torch.axon._C._test_sleep_on_stream(1, 200)  # axon:1's stream is busy
    dst.copy_(src)  # returns before the copy ran
    if then == "free_and_reuse_source":
        del src
        junk = torch.empty(256, device="axon:0")  # the cached block of src, same stream
        junk.fill_(-1.0)
    else:
        src.fill_(-1.0)  # work on the source device after the copy, in program order
    torch.axon.synchronize(1)
    torch.testing.assert_close(dst.cpu(), x, rtol=0, atol=0)


# ---------------------------------------------------------------- .item()

@pytest.mark.parametrize("dtype", ALL_DTYPES + (torch.float64, torch.uint8))
def test_item(dtype):
    x = make((3, 4), dtype, seed=30)
    a = x.axon()
    for idx in [(0, 0), (2, 3), (1,)]:
        if len(idx) == 1:
            c_val, a_val = x.t()[3, idx[0]].item(), a.t()[3, idx[0]].item()
        else:
            c_val, a_val = x[idx].item(), a[idx].item()
        assert type(a_val) is type(c_val)
        assert a_val == c_val
    assert a.sum().item() == pytest.approx(x.sum().item(), rel=tol(dtype, True)["rtol"])
    assert a.tolist() == x.tolist()
    if dtype == torch.bool:
        assert bool(a[0, 0]) == bool(x[0, 0])
    else:
        assert float(a[1, 1]) == float(x[1, 1]) and int(a[1, 1]) == int(x[1, 1])


def test_item_waits_for_pending_work():
    x = torch.tensor([42.0])
    src, dst = x.axon(), torch.zeros(1, device="axon")
    torch.axon.synchronize()
    torch.axon._C._test_sleep_on_stream(0, 100)
    dst.copy_(src)  # queued behind the sleep
    assert dst.item() == 42.0


def test_item_of_multi_element_tensor_raises():
    with pytest.raises(RuntimeError, match="element"):
        torch.ones(2, device="axon").item()
