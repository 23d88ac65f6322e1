"""torch.axon.set_sync_debug_mode: warn or raise on synchronising calls, as
torch.cuda.set_sync_debug_mode (the cases of PyTorch's test_cuda.py
test_sync_warning, plus .item()/.cpu()/.tolist()/.numpy() and the streams)."""

from __future__ import annotations

import time
import warnings

import pytest
import torch

from torch_axon import _C

DEV = torch.device("axon", 0)
MSG = "called a synchronizing axon operation"


@pytest.fixture
def inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(4, generator=g).to(DEV)
    y = torch.rand((), generator=g).to(DEV)
    ind = torch.tensor([0, 3, 1]).to(DEV)
    mask = torch.tensor([True, False, True, True]).to(DEV)
    repeats = torch.tensor([2]).to(DEV)
    torch.axon.synchronize()
    yield dict(x=x, y=y, ind=ind, ind_cpu=ind.cpu(), mask=mask, repeats=repeats)
    torch.axon.set_sync_debug_mode(0)


def _put(x, i, v):
    x[i] = v
    return x


def _cond(x):
    return x if x else 2 * x  # bool() of a tensor reads it


# Synchronising on CUDA and on axon.
SYNC = {
    "item": lambda a: a["y"].item(),
    "bool": lambda a: _cond(a["y"]),
    "cpu": lambda a: a["x"].cpu(),
    "tolist": lambda a: a["x"].tolist(),
    "numpy": lambda a: a["x"].cpu().numpy(),
    "to_device": lambda a: torch.tensor([1.0, 2.0], device=DEV),
    "copy_from_cpu": lambda a: a["x"].copy_(torch.ones(4)),
    "nonzero": lambda a: a["x"].nonzero(),
    "masked_select": lambda a: a["x"].masked_select(a["mask"]),
    "index_mask": lambda a: a["x"][a["mask"]],
    "index_cpu": lambda a: a["x"][a["ind_cpu"]],
    "one_hot": lambda a: torch.nn.functional.one_hot(a["ind"]),
    "repeat_interleave": lambda a: torch.repeat_interleave(a["x"], a["repeats"]),
    "unique": lambda a: torch.unique(a["x"]),
    "bincount": lambda a: torch.bincount(a["ind"]),
    "stream_synchronize": lambda a: torch.axon.current_stream().synchronize(),
    "torch_stream_synchronize": lambda a: torch.Stream(device=DEV).synchronize(),
}
# Not synchronising (on CUDA and on axon), or not flagged by CUDA.
NO_SYNC = {
    "put_mask_scalar": lambda a: _put(a["x"], a["mask"], 1.0),
    "put_index": lambda a: _put(a["x"], a["ind"], a["y"]),
    "get_index": lambda a: a["x"][a["ind"]],
    "one_hot_num_classes": lambda a: torch.nn.functional.one_hot(a["ind"], num_classes=4),
    "randperm": lambda a: torch.randperm(2000, device=DEV),
    "repeat_interleave_int": lambda a: torch.repeat_interleave(a["x"], 2, output_size=8),
    "any": lambda a: torch.any(a["y"]),
    "non_blocking_copy": lambda a: a["x"].to("cpu", non_blocking=True),
    "device_copy": lambda a: a["x"].to("axon:1"),
    "elementwise": lambda a: a["x"] * 2 + a["y"],
    # As CUDA: device and event synchronisation are not flagged.
    "device_synchronize": lambda a: torch.axon.synchronize(),
    "event_synchronize": lambda a: torch.axon.Event().synchronize(),
}


def _flagged(fn, inputs) -> int:
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fn(inputs)
    return sum(MSG in str(x.message) for x in w)


@pytest.mark.parametrize("name", list(SYNC))
def test_sync_calls_warn_and_raise(inputs, name):
    fn = SYNC[name]
    assert _flagged(fn, inputs) == 0  # default: silent
    torch.axon.set_sync_debug_mode("warn")
    assert _flagged(fn, inputs) >= 1
    torch.axon.set_sync_debug_mode(2)
    with pytest.raises(RuntimeError, match=MSG):
        fn(inputs)
    torch.axon.set_sync_debug_mode("default")
    assert _flagged(fn, inputs) == 0


@pytest.mark.parametrize("name", list(NO_SYNC))
def test_non_sync_calls_pass(inputs, name):
    torch.axon.set_sync_debug_mode("error")
    NO_SYNC[name](inputs)
    torch.axon.set_sync_debug_mode("warn")
    assert _flagged(NO_SYNC[name], inputs) == 0


def test_unflagged_calls_do_not_wait():
    """What is not flagged really leaves the host free: boolean-mask and CPU-index
    writes (which synchronise on CUDA) run as stream work on axon."""
    x = torch.zeros(4, device=DEV)
    mask = torch.tensor([True, False, True, False], device=DEV)
    one, two = torch.tensor(1.0, device=DEV), torch.tensor(2.0, device=DEV)
    index_cpu = torch.tensor([1])
    for _ in range(2):  # the first launch of a kernel runs on the calling thread
        _put(x, mask, one)
        _put(x, index_cpu, two)
    torch.axon.synchronize()
    _C._test_sleep_on_stream(0, 300.0)
    start = time.perf_counter()
    _put(x, mask, one)
    _put(x, index_cpu, two)
    elapsed = time.perf_counter() - start
    torch.axon.synchronize()
    assert elapsed < 0.2, elapsed
    assert x.tolist() == [1.0, 2.0, 1.0, 0.0]


def test_mode_values_and_errors():
    try:
        for mode, want in (("warn", 1), ("error", 2), ("default", 0), (1, 1), (2, 2), (0, 0)):
            torch.axon.set_sync_debug_mode(mode)
            assert torch.axon.get_sync_debug_mode() == want
        with pytest.raises(RuntimeError, match="invalid value of debug_mode, expected one of "
                                               "`default`, `warn`, `error`"):
            torch.axon.set_sync_debug_mode("loud")
        with pytest.raises(RuntimeError,
                           match="invalid value of debug_mode, expected one of 0,1,2"):
            torch.axon.set_sync_debug_mode(3)
        assert torch.axon.get_sync_debug_mode() == 0
    finally:
        torch.axon.set_sync_debug_mode(0)


def test_results_unchanged_in_warn_mode(inputs):
    want = (inputs["x"].cpu()[inputs["mask"].cpu()], inputs["x"].cpu().nonzero())
    torch.axon.set_sync_debug_mode("warn")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = (inputs["x"][inputs["mask"]], inputs["x"].nonzero())
        assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
