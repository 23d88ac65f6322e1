"""nn.DataParallel on axon's devices: torch.nn.parallel.comm without CUDA's C++ helpers."""

from __future__ import annotations

import contextlib
import functools

import torch

from ._hooks import on_import
from ._tools import axon_is_the_accelerator


def _axon(index: int) -> torch.device:
    return torch.device("axon", index)


def _stream_ctx(streams, i):
    s = streams[i] if streams else None
    return torch.axon.stream(s) if s is not None else contextlib.nullcontext()


def _broadcast(tensor, devices):
    return tuple(tensor if tensor.device == _axon(d) else tensor.to(_axon(d), non_blocking=True)
                 for d in devices)


def _broadcast_out(tensor, out):
    for o in out:
        o.copy_(tensor, non_blocking=True)
    return tuple(out)


def _broadcast_coalesced(tensors, devices, buffer_size):
    return [[t if t.device == _axon(d) else t.to(_axon(d), non_blocking=True) for t in tensors]
            for d in devices]


def _scatter(tensor, devices, chunk_sizes, dim, streams):
    if chunk_sizes is not None:
        if sum(chunk_sizes) != tensor.size(dim) or len(chunk_sizes) != len(devices):
            raise RuntimeError(f"scatter: chunk_sizes {list(chunk_sizes)} do not split dimension "
                               f"{dim} of size {tensor.size(dim)} over {len(devices)} devices")
        chunks = tensor.split(list(chunk_sizes), dim)
    else:
        chunks = tensor.chunk(len(devices), dim)
    out = []
    for i, (chunk, d) in enumerate(zip(chunks, devices)):
        with _stream_ctx(streams, i):
            out.append(chunk.to(_axon(d), non_blocking=True))
    return out


def _scatter_out(tensor, out, dim, streams):
    chunks = tensor.split([o.size(dim) for o in out], dim)
    for i, (chunk, o) in enumerate(zip(chunks, out)):
        with _stream_ctx(streams, i):
            o.copy_(chunk, non_blocking=True)
    return out


def _gather(tensors, dim, destination):
    # Into host memory the copies block (a non-blocking one would return before the
    # data is there), as CUDA's gather does.
    dest = torch.device("cpu") if destination == -1 else _axon(destination)
    return torch.cat([t.to(dest, non_blocking=dest.type == "axon") for t in tensors], dim)


def _gather_out(tensors, out, dim):
    offset = 0
    for t in tensors:
        out.narrow(dim, offset, t.size(dim)).copy_(t, non_blocking=out.device.type == "axon")
        offset += t.size(dim)
    return out


_IMPLEMENTATIONS = {"_broadcast": _broadcast, "_broadcast_out": _broadcast_out,
                    "_broadcast_coalesced": _broadcast_coalesced, "_scatter": _scatter,
                    "_scatter_out": _scatter_out, "_gather": _gather, "_gather_out": _gather_out}


class _CWithComm:
    """torch._C as comm.py sees it: its own attributes, and the device-copy helpers a
    CPU build of torch lacks (CUDA's are C++) done with axon copies."""

    def __getattr__(self, name):
        if not hasattr(torch._C, name) and name in _IMPLEMENTATIONS and axon_is_the_accelerator():
            return _IMPLEMENTATIONS[name]
        return getattr(torch._C, name)


class _TorchWithComm:
    """torch as comm.py sees it (``torch._C`` above, everything else torch's)."""

    _C = _CWithComm()
    _axon_patch = True

    def __getattr__(self, name):
        return getattr(torch, name)


@on_import("torch.nn.parallel.comm")
def data_parallel_comm(comm) -> None:
    """Patch ``torch.nn.parallel.comm.torch`` (the module's reference to torch).

    ``nn.DataParallel`` (which takes ``torch.accelerator``'s device type, axon) scatters
    inputs, replicates parameters and gathers outputs through comm.py's ``broadcast``,
    ``broadcast_coalesced``, ``scatter`` and ``gather``, which call CUDA's C++ helpers
    ``torch._C._broadcast``, ``_broadcast_coalesced``, ``_scatter``, ``_gather`` (and
    their ``_out`` forms), built only into torch for cuda (not for xpu, npu or the CPU):
    a CPU build of torch has none ("module 'torch._C' has no attribute '_scatter'"),
    so every ``if device_count() > 1: model =
    nn.DataParallel(model)`` failed on axon's 8 devices.  The module's ``torch`` is
    replaced by a view of torch whose ``_C`` supplies those helpers with axon copies
    (on the given streams) where torch lacks them and axon is the accelerator; the
    module's own argument checks, and everything else, are upstream's.
    """
    if isinstance(comm.torch, _TorchWithComm):
        return
    comm.torch = _TorchWithComm()
