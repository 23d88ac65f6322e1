"""Smaller torch.cuda names, for axon: the allocator's raw interface and backend,
device memory use, deprecated aliases, build flags.

The names of torch.cuda that make no sense for the simulated device (nvtx,
jiterator, nccl, cudart, sensors such as temperature) are listed with their
reasons in tests/tools/test_cuda_parity.py.
"""

from __future__ import annotations

# The allocator's raw interface and the memory names torch.cuda.memory also has live
# in .memory (torch.axon.memory.list_gpu_processes, as torch.cuda.memory's).
from .memory import (caching_allocator_alloc, caching_allocator_delete, device_memory_used,  # noqa: F401
                     get_allocator_backend, list_gpu_processes, max_memory_cached,
                     memory_cached, reset_max_memory_cached)

__all__ = [
    "caching_allocator_alloc", "caching_allocator_delete", "get_allocator_backend",
    "device_memory_used", "list_gpu_processes", "is_tf32_supported", "has_half", "has_magma",
    "memory_cached", "max_memory_cached", "reset_max_memory_cached",
]

# torch.cuda.has_half / has_magma: half precision is supported; there is no MAGMA
# (linear algebra runs ATen's CPU kernels on device memory).
has_half: bool = True
has_magma: bool = False


def is_tf32_supported() -> bool:
    r"""False: float32 matmuls and convolutions on axon compute in float32 (no
    TF32 mode, whatever torch.backends.cuda.matmul.allow_tf32 says)."""
    return False

