"""Devices: the torch.cuda device API, for axon."""

from __future__ import annotations

import dataclasses
import functools
import platform
import uuid as uuid_lib
from typing import Any

import torch

from .. import _C

__all__ = [
    "AcceleratorError",
    "is_available", "is_initialized", "init", "device_count", "current_device",
    "set_device", "device", "device_of", "synchronize", "get_device_name",
    "get_device_properties", "get_device_capability", "is_bf16_supported",
    "get_amp_supported_dtype", "utilization",
]

# torch.cuda.AcceleratorError is torch.AcceleratorError; so is axon's: the
# error an asynchronous kernel failure raises at the next synchronising call.
AcceleratorError = torch.AcceleratorError

_DeviceLike = Any  # int, str, torch.device or None


def is_available() -> bool:
    """True when at least one axon device exists."""
    return _C._device_count() > 0


def is_initialized() -> bool:
    """Axon initialises on import; always True once torch_axon is loaded."""
    return True


def init() -> None:
    """No-op: kept for code written against torch.cuda.init()."""


def _lazy_init() -> None:
    """No-op: PyTorch internals call this on device modules."""


def _is_in_bad_fork() -> bool:
    """True in a fork() child of a process that used axon (the device is unusable there)."""
    return _C._in_bad_fork()


def device_count() -> int:
    """Number of axon devices (AXON_NUM_DEVICES / AXON_LOGICAL_CORE_CONFIG)."""
    return _C._device_count()


def _get_device_index(device: _DeviceLike, optional: bool = False) -> int:
    """The index of an axon device given as int, str or torch.device."""
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "axon":
            raise ValueError(f"Expected an axon device, but got: {device}")
        index = device.index
    else:
        index = device
    if index is None:
        if not optional:
            raise ValueError("Expected a torch.device with a specified index or an integer, "
                             f"but got:{device}")
        return current_device()
    if not isinstance(index, int):
        raise TypeError(f"Invalid device: {device!r}")
    return index


def current_device() -> int:
    """Index of the calling thread's current axon device."""
    if torch.compiler.is_compiling():
        # Dynamo folds this to a constant (guarded), as torch.cuda.current_device.
        return torch.accelerator.current_device_index()
    return _C._current_device()


def set_device(device: _DeviceLike) -> None:
    """Set the calling thread's current axon device (negative: no-op; as torch.cuda, a
    device without an index or None is an error)."""
    index = _get_device_index(device)
    if index >= 0:
        _C._set_device(index)


class device:
    """Context manager that changes the current axon device."""

    def __init__(self, device: _DeviceLike):
        # None: the current device (as torch.cuda.device), restored on exit.
        self.idx = _get_device_index(device, optional=True)
        self.prev_idx = -1

    def __enter__(self):
        self.prev_idx = current_device()
        if self.idx >= 0 and self.idx != self.prev_idx:
            _C._set_device(self.idx)

    def __exit__(self, *exc):
        # Always back to the previous device (as torch.cuda.device): the block may
        # have called set_device itself.
        if self.idx >= 0:
            _C._set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of tensor `obj` current."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.device.type == "axon" else -1)


def synchronize(device: _DeviceLike = None) -> None:
    """Wait for all work on all streams of an axon device."""
    _C._synchronize(_get_device_index(device, optional=True))


@dataclasses.dataclass(frozen=True)
class _AxonDeviceProperties:
    """torch.cuda's device properties, for an axon device.  A compute unit is a
    host core the device's kernels run on; ``warp_size`` is the float32 lanes of
    one vector instruction of its kernels; ``L2_cache_size`` is its cores' L2;
    ``uuid`` is the same for this device of this machine in every process."""
    name: str
    total_memory: int
    multi_processor_count: int
    physical_cores: int
    host_accessible: bool
    major: int = 1
    minor: int = 0
    uuid: uuid_lib.UUID | None = None
    L2_cache_size: int = 0
    warp_size: int = 1
    is_integrated: int = 0
    is_multi_gpu_board: int = 0

    def __repr__(self) -> str:
        return (f"_AxonDeviceProperties(name='{self.name}', major={self.major}, "
                f"minor={self.minor}, total_memory={self.total_memory // (1 << 20)}MB, "
                f"multi_processor_count={self.multi_processor_count}, uuid={self.uuid}, "
                f"L2_cache_size={self.L2_cache_size // (1 << 20)}MB)")


def _l2_bytes_per_core() -> int:
    """The L2 cache of one core: the level-2 cache of cpu0 over the CPUs sharing it."""
    import glob

    for index in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            with open(f"{index}/level") as f:
                if f.read().strip() != "2":
                    continue
            with open(f"{index}/size") as f:
                text = f.read().strip()
            with open(f"{index}/shared_cpu_list") as f:
                shared = f.read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        digits = text.rstrip("KkMmGg")
        if not digits.isdigit():
            return 0
        cpus = 0
        for part in shared.split(","):
            lo, _, hi = part.partition("-")
            cpus += int(hi) - int(lo) + 1 if hi else 1
        return int(digits) * scale // max(1, cpus)
    return 0


@functools.lru_cache(maxsize=None)
def _static_properties(index: int) -> dict:
    machine = ""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path) as f:
                machine = f.read().strip()
            break
        except OSError:
            pass
    lanes = {"AVX512": 16, "AVX2": 8}.get(torch.backends.cpu.get_cpu_capability(), 4)
    return {"uuid": uuid_lib.uuid5(uuid_lib.NAMESPACE_OID,
                                   f"torch-axon/{machine or platform.node()}/{index}"),
            "warp_size": lanes}


def get_device_properties(device: _DeviceLike = None) -> _AxonDeviceProperties:
    """Name, memory capacity and compute units of an axon device."""
    index = _get_device_index(device, optional=True)
    props = _C._get_device_properties(index)
    return _AxonDeviceProperties(
        **props, **_static_properties(index),
        L2_cache_size=_l2_bytes_per_core() * props["multi_processor_count"])


def get_device_name(device: _DeviceLike = None) -> str:
    return get_device_properties(device).name


def get_device_capability(device: _DeviceLike = None) -> tuple[int, int]:
    p = get_device_properties(device)
    return p.major, p.minor


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    """Dtypes torch.autocast accepts for device_type='axon' (float32 too, as CUDA's
    autocast does: its lower-precision ops then compute in float32)."""
    return [torch.float16, torch.bfloat16, torch.float32]


def utilization(device: _DeviceLike = None) -> int:
    r"""Return the percent of time over the past sample period during which one or
    more streams of the device were running work (kernels, copies, collectives),
    as :func:`torch.cuda.utilization` does for "one or more kernels executing".

    The sample period is the last second (``torch_axon._C._utilization_period_ms()``).
    The runtime counts busy time from the first call on (so that a process that
    never asks pays nothing; the first call reports 0), cheaply, with the coarse
    monotonic clock: a few ms resolution, unbiased over many tasks.  Less than a
    second after that first call, it reports over the time since.  A stream
    waiting for another (an event it waits on) is not busy.

    Args:
        device (torch.device or int, optional): selected device. Returns
            statistic for the current device, given by :func:`current_device`,
            if :attr:`device` is ``None`` (default).
    """
    return _C._utilization(_get_device_index(device, optional=True))
