"""Memory: the torch.cuda memory API over axon's caching allocator."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from .device import _get_device_index

__all__ = [
    "empty_cache", "memory_stats", "memory_allocated", "max_memory_allocated",
    "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats",
    "reset_accumulated_memory_stats", "reset_max_memory_allocated", "mem_get_info",
    "memory_summary",
]


def _index(device) -> int:
    return _get_device_index(device, optional=True)


def empty_cache() -> None:
    """Return all unused cached device memory to the device."""
    torch.accelerator.empty_cache()


def memory_stats(device=None) -> OrderedDict[str, Any]:
    """The allocator's statistics, keyed as torch.cuda.memory_stats keys them."""
    return torch.accelerator.memory_stats(_index(device))


def memory_allocated(device=None) -> int:
    """Bytes currently occupied by tensors on the device."""
    return torch.accelerator.memory_allocated(_index(device))


def max_memory_allocated(device=None) -> int:
    return torch.accelerator.max_memory_allocated(_index(device))


def memory_reserved(device=None) -> int:
    """Bytes held by the caching allocator (allocated plus cached)."""
    return torch.accelerator.memory_reserved(_index(device))


def max_memory_reserved(device=None) -> int:
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
    """A short human-readable table of the allocator's statistics."""
    stats = memory_stats(device)

    def fmt(n: int) -> str:
        for unit in ("B", "KiB", "MiB", "GiB"):
            if abs(n) < 1024 or unit == "GiB":
                return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
            n /= 1024
        return str(n)

    lines = [f"axon:{_index(device)} memory summary",
             f"{'metric':<24}{'current':>14}{'peak':>14}"]
    for key in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes"):
        lines.append(f"{key:<24}{fmt(stats.get(f'{key}.all.current', 0)):>14}"
                     f"{fmt(stats.get(f'{key}.all.peak', 0)):>14}")
    for key in ("num_alloc_retries", "num_ooms"):
        lines.append(f"{key:<24}{stats.get(key, 0):>14}")
    return "\n".join(lines)
