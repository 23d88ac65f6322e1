"""Pinned host memory and non-blocking copies between it and axon."""

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from conftest import FLOAT_DTYPES, assert_same, make

sleep_on_stream = torch.axon._C._test_sleep_on_stream
BUSY_MS = 200


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + (torch.int64, torch.bool))
def test_pin_memory(dtype):
    x = make((5, 7), dtype)
    assert not x.is_pinned()
    p = x.pin_memory()
    assert p.is_pinned() and p.device.type == "cpu"
    assert p.data_ptr() != x.data_ptr()
    torch.testing.assert_close(p, x, rtol=0, atol=0)
    assert p.pin_memory().data_ptr() == p.data_ptr()  # already pinned: no copy
    assert p.t().is_pinned() and p[1:, ::2].is_pinned()  # views of pinned memory
    assert not torch.ones(2, device="axon").is_pinned()


def test_empty_pinned_and_zero_size():
    assert torch.empty(4, 4, pin_memory=True).is_pinned()
    z = torch.empty(0).pin_memory()
    assert z.numel() == 0
    assert_same(z.to("axon", non_blocking=True), torch.empty(0))


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + (torch.int32,))
def test_non_blocking_h2d_and_d2h(dtype, layout):
    x = make((16, 8), dtype, seed=1)
    p = x.pin_memory()
    src, ref = (p, x) if layout == "contiguous" else (p.t(), x.t())
    d = src.to("axon", non_blocking=True)
    torch.axon.synchronize()
    assert_same(d, ref)
    h = torch.empty(ref.shape, dtype=dtype).pin_memory()
    if layout == "transposed":
        h = torch.empty(tuple(reversed(ref.shape)), dtype=dtype).pin_memory().t()
    h.copy_(d * 2, non_blocking=True)
    torch.axon.synchronize()
    torch.testing.assert_close(h, ref * 2, rtol=0, atol=0)


def test_non_blocking_d2h_is_asynchronous():
    x = make((64,), torch.float32, seed=2)
    d = x.axon()
    h = torch.zeros(64).pin_memory()
    torch.axon.synchronize()
    sleep_on_stream(0, BUSY_MS)
    h.copy_(d, non_blocking=True)  # queued behind the sleep: returns at once
    assert torch.equal(h, torch.zeros(64)), "non_blocking copy into pinned memory waited"
    assert not torch.axon.current_stream().query()
    torch.axon.current_stream().synchronize()
    torch.testing.assert_close(h, x, rtol=0, atol=0)


def test_non_blocking_h2d_is_asynchronous_and_ordered():
    x = make((64,), torch.float32, seed=3)
    p = x.pin_memory()
    d = torch.zeros(64, device="axon")
    torch.axon.synchronize()
    sleep_on_stream(0, BUSY_MS)
    d.copy_(p, non_blocking=True)
    assert not torch.axon.current_stream().query()  # the copy is still queued
    r = d * 3  # later work on the stream sees the copy
    assert_same(r, x * 3)


@pytest.mark.parametrize("pinned", [False, True])
def test_blocking_copies_wait(pinned):
    x = make((64,), torch.float32, seed=4)
    d = x.axon()
    h = torch.zeros(64)
    if pinned:
        h = h.pin_memory()
    torch.axon.synchronize()
    sleep_on_stream(0, BUSY_MS)
    h.copy_(d)  # blocking: done on return
    torch.testing.assert_close(h, x, rtol=0, atol=0)


def test_non_blocking_into_pageable_memory_still_completes():
    # pageable host memory cannot be copied asynchronously: the copy waits
    x = make((64,), torch.float32, seed=5)
    d = x.axon()
    h = torch.zeros(64)
    torch.axon.synchronize()
    sleep_on_stream(0, BUSY_MS)
    h.copy_(d, non_blocking=True)
    torch.testing.assert_close(h, x, rtol=0, atol=0)


def test_to_cpu_non_blocking_returns_pinned_tensor():
    x = make((10, 3), torch.bfloat16, seed=6)
    d = x.axon()
    h = d.to("cpu", non_blocking=True)
    assert h.is_pinned()
    torch.axon.synchronize()
    torch.testing.assert_close(h, x, rtol=0, atol=0)


def test_freeing_pinned_source_waits_for_pending_copy():
    x = make((4096,), torch.float32, seed=7)
    d = torch.zeros(4096, device="axon")
    torch.axon.synchronize()
    p = x.pin_memory()
    sleep_on_stream(0, BUSY_MS)
    d.copy_(p, non_blocking=True)
    del p  # must not release the buffer under the queued copy
    junk = [torch.full((4096,), -1.0).pin_memory() for _ in range(4)]
    torch.axon.synchronize()
    assert_same(d, x)
    del junk


def test_non_blocking_on_side_stream():
    x = make((32,), torch.float16, seed=8)
    p = x.pin_memory()
    s = torch.axon.Stream()
    with torch.axon.stream(s):
        d = p.to("axon", non_blocking=True)
        h = torch.empty(32, dtype=torch.float16).pin_memory()
        h.copy_(d + 1, non_blocking=True)
    s.synchronize()
    torch.testing.assert_close(h, x + 1, rtol=0, atol=0)


def test_dataloader_pin_memory():
    data = make((8, 3), torch.float32, seed=9)
    labels = torch.arange(8)
    dl = DataLoader(TensorDataset(data, labels), batch_size=4, pin_memory=True)
    seen = []
    for xb, yb in dl:
        assert xb.is_pinned() and yb.is_pinned()
        seen.append(xb.to("axon", non_blocking=True))
    torch.axon.synchronize()
    assert_same(torch.cat(seen), data)
