"""Memory: the torch.cuda memory API over axon's caching allocator.

Besides the statistics: private memory pools (``MemPool``, ``use_mem_pool``,
``graph_pool_handle``; graphs allocate from them), memory history and
snapshots in CUDA's format (``_record_memory_history``, ``_snapshot``,
``_dump_snapshot``, ``memory_snapshot``: torch/cuda/_memory_viz.py renders
them), the per-process memory fraction, and pinned host memory statistics.
The allocator is csrc/core/CachingAllocator.cpp; the bindings are
csrc/core/MemoryHistory.cpp.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import threading
from collections import OrderedDict
from typing import Any

import torch
from typing_extensions import deprecated

from .. import _C
from .device import _DeviceLike, _get_device_index, current_device

__all__ = [
    "caching_allocator_enable", "caching_allocator_disabled",
    "empty_cache", "memory_stats", "memory_stats_as_nested_dict", "memory_allocated",
    "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "reset_peak_memory_stats", "reset_accumulated_memory_stats", "reset_max_memory_allocated",
    "mem_get_info", "memory_summary", "memory_snapshot", "set_per_process_memory_fraction",
    "get_per_process_memory_fraction", "host_memory_stats", "host_memory_stats_as_nested_dict",
    "reset_accumulated_host_memory_stats", "reset_peak_host_memory_stats", "MemPool",
    "use_mem_pool", "graph_pool_handle", "OutOfMemoryError",
    "caching_allocator_alloc", "caching_allocator_delete", "get_allocator_backend",
    "device_memory_used", "list_gpu_processes", "memory_cached", "max_memory_cached",
    "reset_max_memory_cached",
]

# torch.cuda.OutOfMemoryError is torch.OutOfMemoryError; so is axon's.
OutOfMemoryError = torch.OutOfMemoryError


def _index(device) -> int:
    return _get_device_index(device, optional=True)


def caching_allocator_enable(value: bool = True) -> None:
    """Turn the caching allocator on or off (on by default), as torch.cuda's.

    Off, each allocation comes straight from the device and each free waits
    for the device's work first (memory that was cached stays cached); graph
    capture needs it on."""
    _C._caching_allocator_enable(bool(value))


@contextlib.contextmanager
def caching_allocator_disabled():
    """Context manager that turns the caching allocator off for its body."""
    prev = _C._caching_allocator_is_enabled()
    caching_allocator_enable(False)
    try:
        yield
    finally:
        caching_allocator_enable(prev)


def empty_cache() -> None:
    """Return all unused cached device memory to the device."""
    torch.accelerator.empty_cache()


def memory_stats(device=None) -> OrderedDict[str, Any]:
    """The allocator's statistics, keyed as torch.cuda.memory_stats keys them.

    ``max_split_size`` is PYTORCH_ALLOC_CONF's ``max_split_size_mb`` in bytes,
    -1 without one (CUDA's "no limit": every large block may split, and the
    ``oversize_*`` counts stay 0); ``num_oom_rejections`` is 0 (axon
    has no preemptive OOM policy); ``num_sync_all_streams`` counts the
    allocator's waits for all pending frees (``empty_cache``, OOM retries).
    Private pools (MemPool, graphs) count in ``all`` and in the small/large
    pool of their segments, as CUDA's do."""
    if _C._device_count() == 0:
        return OrderedDict()  # as torch.cuda's with no device: nothing allocated
    stats = dict(torch.accelerator.memory_stats(_index(device)))
    stats.setdefault("num_oom_rejections", 0)
    return OrderedDict(sorted(stats.items()))


def memory_stats_as_nested_dict(device=None) -> dict[str, Any]:
    """memory_stats() as nested dicts (``{"allocated_bytes": {"all": {"current": ...}}}``)."""
    nested: dict[str, Any] = {}
    for key, value in memory_stats(device).items():
        parts = key.split(".")
        d = nested
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = value
    return nested


def memory_allocated(device=None) -> int:
    """Bytes currently occupied by tensors on the device (0 without a device, as
    torch.cuda's)."""
    if _C._device_count() == 0:
        return 0
    return torch.accelerator.memory_allocated(_index(device))


def max_memory_allocated(device=None) -> int:
    if _C._device_count() == 0:
        return 0
    return torch.accelerator.max_memory_allocated(_index(device))


def memory_reserved(device=None) -> int:
    """Bytes held by the caching allocator (allocated plus cached)."""
    if _C._device_count() == 0:
        return 0
    return torch.accelerator.memory_reserved(_index(device))


def max_memory_reserved(device=None) -> int:
    if _C._device_count() == 0:
        return 0
    return torch.accelerator.max_memory_reserved(_index(device))


def reset_peak_memory_stats(device=None) -> None:
    torch.accelerator.reset_peak_memory_stats(_index(device))


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(_index(device))


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of device memory."""
    return torch.accelerator.get_memory_info(_index(device))


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A human-readable printout of the caching allocator's statistics, laid out
    as ``torch.cuda.memory_summary``'s (current, peak, total allocated and total
    freed of each statistic; per pool unless ``abbreviated``)."""
    device = _index(device)
    stats = memory_stats(device)  # empty without a device: a summary of zeros

    def size(n: int, ref: int) -> str:
        unit = "B  "
        for next_unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
            if ref < 768 * 1024:
                break
            unit, n, ref = next_unit, n // 1024, ref / 1024
        return f"{n:6d} {unit}"

    def count(n: int, ref: int) -> str:
        unit = " "
        for next_unit in ("K", "M"):
            if ref < 750 * 1000:
                break
            unit, n, ref = next_unit, n // 1000, ref / 1000
        return f"{n:7d} {unit} "

    rule, double = "-" * 75, "=" * 75
    lines = [double,
             f" {'':16} PyTorch axon memory summary, device ID {device:<17d} ",
             rule,
             f"  {'':9} axon OOMs: {stats.get('num_ooms', 0):<12d} | {'':6} "
             f"device alloc retries: {stats.get('num_alloc_retries', 0):<6d}  ",
             double,
             "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  "]
    pools = [("all", None)] if abbreviated else [
        ("all", None), ("large_pool", "      from large pool"), ("small_pool", "      from small pool")]
    for key, title, fmt in (
            ("allocated_bytes", "Allocated memory", size), ("active_bytes", "Active memory", size),
            ("requested_bytes", "Requested memory", size),
            ("reserved_bytes", "Reserved memory", size),
            ("inactive_split_bytes", "Non-releasable memory", size),
            ("allocation", "Allocations", count), ("active", "Active allocs", count),
            ("segment", "Reserved segments", count),
            ("inactive_split", "Non-releasable allocs", count)):
        lines.append(rule)
        ref = None
        for pool, name in pools:
            values = [stats.get(f"{key}.{pool}.{f}", 0)
                      for f in ("current", "peak", "allocated", "freed")]
            ref = ref or values  # the sub-rows use the total's units
            cells = " | ".join(fmt(v, r) for v, r in zip(values, ref))
            lines.append(f" {name or title:<21} | {cells} ")
    for key, title in (("oversize_allocations", "Oversize allocations"),
                       ("oversize_segments", "Oversize segments")):
        lines.append(rule)
        values = [stats.get(f"{key}.{f}", 0) for f in ("current", "peak", "allocated", "freed")]
        lines.append(f" {title:<21} | " + " | ".join(count(v, v) for v in values) + " ")
    lines.append(double)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- fraction

def set_per_process_memory_fraction(fraction, device=None) -> None:
    """Cap the caching allocator's segments on ``device`` at ``fraction`` of its
    total memory; allocations beyond it raise ``torch.OutOfMemoryError`` (after
    the cache is released, as for any out-of-memory)."""
    device = _index(device)
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _C._set_memory_fraction(fraction, device)


def get_per_process_memory_fraction(device=None) -> float:
    """The fraction set_per_process_memory_fraction set (1.0 by default)."""
    return _C._get_memory_fraction(_index(device))


# ---------------------------------------------------------------- host memory

def host_memory_stats_as_nested_dict() -> dict[str, Any]:
    """Pinned host memory statistics, nested (torch.cuda.host_memory_stats_as_nested_dict).

    Pinned buffers are cached as CUDA's: sizes round up to a power of two, a
    freed buffer is kept and reused once no queued copy uses it.
    ``allocations``/``allocated_bytes`` count the buffers owned (in use and
    cached), ``active_*`` those in use, ``num_host_alloc``/``num_host_free`` the
    runtime allocations and frees (``torch.accelerator.empty_host_cache()``
    frees the cached ones).  CUDA's ``host_alloc_time``/``host_free_time`` are
    not measured."""
    return _C._host_memory_stats()


def host_memory_stats() -> dict[str, Any]:
    """Pinned host memory statistics, flat (``"allocated_bytes.current"`` ...)."""
    result = []

    def add(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                add(f"{prefix}.{k}" if prefix else k, v)
        else:
            result.append((prefix, obj))

    add("", host_memory_stats_as_nested_dict())
    result.sort()
    return OrderedDict(result)


def reset_accumulated_host_memory_stats() -> None:
    _C._host_reset_accumulated_stats()


def reset_peak_host_memory_stats() -> None:
    _C._host_reset_peak_stats()


# ---------------------------------------------------------------- private pools

def graph_pool_handle() -> tuple[int, int]:
    """A new memory pool id to share between graph captures (torch.cuda.graph_pool_handle)."""
    return tuple(_C._mempool_new_id(False))


class MemPool:
    """A private pool of device memory (torch.cuda.MemPool).

    Allocations made inside ``use_mem_pool(pool)`` come from the pool's own
    segments and, when freed, return to it; the pool keeps its cached memory
    through ``empty_cache()``.  Once the pool object is gone (and no graph
    shares it), its memory goes back to the device as soon as the last tensor
    in it dies.  Only the caching allocator's own memory is supported:
    ``allocator`` must be None.
    """

    def __init__(self, allocator=None, use_on_oom: bool = False, no_split: bool = False):
        if allocator is not None:
            raise NotImplementedError(
                "torch.axon.MemPool: a custom allocator is not supported on axon; the pool's "
                "memory always comes from axon's caching allocator (pass allocator=None)")
        if use_on_oom:
            raise NotImplementedError(
                "torch.axon.MemPool: use_on_oom=True is not supported on axon")
        if no_split:
            raise NotImplementedError(
                "torch.axon.MemPool: no_split=True is not supported on axon")
        self._device = current_device()
        self._id = tuple(_C._mempool_new_id(False))
        _C._mempool_retain(self._device, self._id)
        self._released = False

    @property
    def id(self) -> tuple[int, int]:
        """The pool's id, a tuple of two ints."""
        return self._id

    @property
    def allocator(self):
        return None

    def use_count(self) -> int:
        """Owners of the pool: this object, active use_mem_pool scopes, graphs sharing it."""
        return _C._mempool_use_count(self._device, self._id)

    def snapshot(self, include_traces: bool = True):
        """memory_snapshot() of this pool's segments only."""
        return memory_snapshot(self._id, include_traces=include_traces)

    def __del__(self):
        if getattr(self, "_released", True):
            return
        self._released = True
        try:
            _C._mempool_release(self._device, self._id)
        except Exception:  # interpreter teardown
            pass

    def __repr__(self) -> str:
        return f"torch.axon.MemPool(id={self._id}, device=axon:{self._device})"


@contextlib.contextmanager
def use_mem_pool(pool: MemPool, device=None):
    """Route the current thread's allocations on ``device`` to ``pool`` (torch.cuda.use_mem_pool).

    Other threads (autograd's backward workers included) keep allocating from
    the shared pools."""
    if not isinstance(pool, MemPool):
        raise TypeError(f"use_mem_pool: expected a torch.axon.MemPool, got {type(pool).__name__}")
    device_index = current_device() if device is None else _get_device_index(device)
    _C._begin_allocate_current_thread_to_pool(device_index, pool.id)
    try:
        yield
    finally:
        _C._end_allocate_to_pool(device_index, pool.id)
        _C._mempool_release(device_index, pool.id)


# ---------------------------------------------------------------- history and snapshots

def _record_memory_history(enabled: str | bool | None = "all", context: str | None = "all",
                           stacks: str = "all", max_entries: int = sys.maxsize, device=None,
                           clear_history: bool = False, compile_context: bool = False,
                           global_record_annotations: bool = False,
                           skip_actions: list[str] | None = None) -> None:
    """Record what the allocator does, for _snapshot() (torch.cuda.memory._record_memory_history).

    ``enabled``: "all" keeps a history of every alloc/free/segment/oom event
    (the last ``max_entries`` per device) and the stacks of live allocations;
    "state" only the stacks of live allocations; None stops recording and
    drops the history.  ``context``: which events keep a stack: "state" (live
    allocations), "alloc" (also alloc events), "all" (also frees), None.
    ``stacks``: "python" or "all" (Python and C++ frames; symbolizing C++
    frames makes _snapshot() slower).  Python stacks are recorded for
    allocations made by Python threads; the allocator never waits for the GIL
    on other threads.  Off, recording costs the allocation path one relaxed
    atomic load.  ``skip_actions`` leaves those actions ("alloc",
    "free_requested", "free_completed", "segment_alloc", "segment_free",
    "oom") out of the history.  ``device`` is ignored (the history covers
    every device, as CUDA's); ``compile_context`` and
    ``global_record_annotations`` (torch.compile and record_function
    annotations) are accepted and not recorded."""
    if isinstance(enabled, bool):  # the legacy form: _record_memory_history(True)
        enabled = "all" if enabled else None
    if max_entries <= 0:
        raise ValueError(f"max_entries must be positive, got {max_entries}")
    _C._record_memory_history(enabled, context, stacks, min(max_entries, sys.maxsize),
                              clear_history, list(skip_actions or ()))


@deprecated(
    "torch.axon._set_allocator_settings is deprecated. Use "
    "torch._C._accelerator_setAllocatorSettings instead.",
    category=FutureWarning,
)
def _set_allocator_settings(env: str):
    """PYTORCH_ALLOC_CONF's settings at run time (as torch.cuda.memory's): the caching
    allocator reads them at its next allocation."""
    return torch._C._accelerator_setAllocatorSettings(env)


def _snapshot(device=None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
    """The allocator's state and recorded history, as torch.cuda.memory._snapshot
    returns it: ``segments`` (with their ``blocks``) and ``device_traces``."""
    s = _C._memory_snapshot(None, True)
    if augment_with_fx_traces:
        from torch.cuda.memory import _augment_memory_snapshot_stack_traces

        s = _augment_memory_snapshot_stack_traces(s)
    return s


def _dump_snapshot(filename: str = "dump_snapshot.pickle",
                   augment_with_fx_traces: bool = False) -> None:
    """Pickle _snapshot() to ``filename`` (for pytorch.org/memory_viz or
    ``python -m torch.cuda._memory_viz``)."""
    s = _snapshot(augment_with_fx_traces=augment_with_fx_traces)
    with open(filename, "wb") as f:
        pickle.dump(s, f)


def memory_snapshot(mempool_id=None, include_traces: bool = True) -> list[dict[str, Any]]:
    """The segments of every device (or of the pool ``mempool_id``), as
    torch.cuda.memory_snapshot."""
    pool = None if mempool_id is None else tuple(mempool_id)
    return _C._memory_snapshot(pool, include_traces)["segments"]


# ------------------------------------------------------------ the raw allocator, aliases

# caching_allocator_alloc's blocks, by address: the tensor owning each.
_raw_blocks: dict[int, torch.Tensor] = {}
_raw_lock = threading.Lock()


def caching_allocator_alloc(size: int, device: _DeviceLike = None, stream=None) -> int:
    r"""Allocate ``size`` bytes from the axon caching allocator and return the
    address (as torch.cuda.caching_allocator_alloc), for interoperability with
    other frameworks.  The block belongs to ``stream`` (default: the device's
    current stream).  Free it with :func:`caching_allocator_delete`."""
    index = _get_device_index(torch.axon.current_device() if device is None else device,
                              optional=True)
    if stream is None:
        stream = torch.axon.current_stream(index)
    if not isinstance(stream, torch.Stream):
        raise TypeError("Invalid type for stream argument, must be `torch.axon.Stream` "
                        "(axon streams have no raw handle)")
    with torch.axon.device(index), torch.axon.stream(stream):
        t = torch.empty(size, dtype=torch.uint8, device=torch.device("axon", index))
    ptr = t.data_ptr()
    with _raw_lock:
        _raw_blocks[ptr] = t
    return ptr


def caching_allocator_delete(mem_ptr: int) -> None:
    r"""Free memory :func:`caching_allocator_alloc` returned."""
    with _raw_lock:
        t = _raw_blocks.pop(mem_ptr, None)
    if t is None:
        raise RuntimeError(f"invalid device pointer: {mem_ptr:#x} "
                           "(not returned by torch.axon.caching_allocator_alloc)")
    del t


def get_allocator_backend() -> str:
    r"""The allocator backend: always ``"native"`` (the caching allocator over the
    runtime's memory; there is no asynchronous-allocator backend)."""
    return "native"


def device_memory_used(device: _DeviceLike = None) -> int:
    r"""Device memory in use, in bytes (torch.cuda's is what nvidia-smi reports).
    A simulated device belongs to its process, so this is the memory this
    process reserved on it: ``total - free`` of :func:`mem_get_info`."""
    free, total = mem_get_info(device)
    return total - free


def list_gpu_processes(device: _DeviceLike = None) -> str:
    r"""The processes using the device and their memory, formatted as
    torch.cuda.list_gpu_processes.  A simulated device belongs to its process:
    this process, if it holds device memory."""
    index = _get_device_index(device, optional=True)
    lines = [f"GPU:{index}"]
    used = device_memory_used(index)
    if used == 0:
        lines.append("no processes are running")
    else:
        lines.append(f"process {os.getpid():>10d} uses {used / (1024 * 1024):>12.3f} MB GPU memory")
    return "\n".join(lines)


@deprecated("`torch.axon.memory_cached` has been renamed to `torch.axon.memory_reserved`",
            category=FutureWarning)
def memory_cached(device: _DeviceLike = None) -> int:
    r"""Deprecated; see :func:`torch.axon.memory_reserved`."""
    return memory_reserved(device=device)


@deprecated("`torch.axon.max_memory_cached` has been renamed to `torch.axon.max_memory_reserved`",
            category=FutureWarning)
def max_memory_cached(device: _DeviceLike = None) -> int:
    r"""Deprecated; see :func:`torch.axon.max_memory_reserved`."""
    return max_memory_reserved(device=device)


@deprecated("torch.axon.reset_max_memory_cached now calls torch.axon.reset_peak_memory_stats, "
            "which resets /all/ peak memory stats.", category=FutureWarning)
def reset_max_memory_cached(device: _DeviceLike = None) -> None:
    r"""Deprecated; see :func:`torch.axon.reset_peak_memory_stats`."""
    reset_peak_memory_stats(device=device)
