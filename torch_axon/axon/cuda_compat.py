"""Smaller torch.cuda names, for axon: the allocator's raw interface and backend,
device memory use, deprecated aliases, build flags.

The names of torch.cuda that make no sense for the simulated device (nvtx,
jiterator, nccl, cudart, sensors such as temperature) are listed with their
reasons in tests/tools/test_cuda_parity.py.
"""

from __future__ import annotations

import os
import threading

import torch
from typing_extensions import deprecated

from .device import _DeviceLike, _get_device_index
from .memory import max_memory_reserved, mem_get_info, memory_reserved, reset_peak_memory_stats

__all__ = [
    "caching_allocator_alloc", "caching_allocator_delete", "get_allocator_backend",
    "device_memory_used", "list_gpu_processes", "is_tf32_supported", "has_half", "has_magma",
    "memory_cached", "max_memory_cached", "reset_max_memory_cached",
]

# torch.cuda.has_half / has_magma: half precision is supported; there is no MAGMA
# (linear algebra runs ATen's CPU kernels on device memory).
has_half: bool = True
has_magma: bool = False

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


def is_tf32_supported() -> bool:
    r"""False: float32 matmuls and convolutions on axon compute in float32 (no
    TF32 mode, whatever torch.backends.cuda.matmul.allow_tf32 says)."""
    return False


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
