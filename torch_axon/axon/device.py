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
    """True when at least one axon device exists (counting them sets the devices up)."""
    return _C._device_count() > 0


def is_initialized() -> bool:
    """Whether the devices were set up yet.  As CUDA, axon initialises lazily, at
    the first call that needs a device (counting them included): AXON_* variables
    (AXON_VISIBLE_DEVICES, AXON_NUM_DEVICES ...) set after ``import torch`` and
    before that call apply.  False in a forked child, which cannot use them (as
    torch.cuda.is_initialized)."""
    return _C._devices_initialized() and not _C._in_bad_fork()


def init() -> None:
    """Initialise axon's devices now (torch.cuda.init())."""
    _lazy_init()


def _lazy_init() -> None:
    """Initialise axon's devices if not yet, applying seeds given before
    (PyTorch calls this before making a tensor on axon, as torch.cuda's)."""
    from .random import _generators

    _generators()


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
    """torch.cuda's device properties, for an axon device.

    A compute unit (``multi_processor_count``) is a host core the device's
    kernels run on, one thread each (``max_threads_per_block`` and
    ``max_threads_per_multi_processor`` are 1); ``warp_size`` is the float32
    lanes of one vector instruction of its kernels and
    ``regs_per_multiprocessor`` its vector registers; ``L2_cache_size`` is its
    cores' L2 and the ``shared_memory_*`` sizes one core's L1 data cache (where
    a kernel's tile lives); ``clock_rate`` is the cores' top clock in kHz
    (cpufreq's; else the current clock /proc/cpuinfo reports, read once).
    ``memory_clock_rate`` and ``memory_bus_width`` are 0: the device's memory is
    the host's, whose clock the host does not report.  ``uuid`` is the same for
    this device of this machine in every process, whatever
    ``AXON_VISIBLE_DEVICES`` makes its index; ``pci_device_id`` is its index
    before ``AXON_VISIBLE_DEVICES`` (``system_index``)."""
    name: str
    total_memory: int
    multi_processor_count: int
    physical_cores: int
    host_accessible: bool
    system_index: int = 0
    major: int = 1
    minor: int = 0
    uuid: uuid_lib.UUID | None = None
    L2_cache_size: int = 0
    warp_size: int = 1
    is_integrated: int = 0
    is_multi_gpu_board: int = 0
    max_threads_per_multi_processor: int = 1
    max_threads_per_block: int = 1
    regs_per_multiprocessor: int = 16
    shared_memory_per_block: int = 0
    shared_memory_per_block_optin: int = 0
    shared_memory_per_multiprocessor: int = 0
    clock_rate: int = 0
    memory_clock_rate: int = 0
    memory_bus_width: int = 0
    gcnArchName: str = "axon"
    pci_bus_id: int = 0
    pci_device_id: int = 0
    pci_domain_id: int = 0

    def __repr__(self) -> str:
        return (f"_AxonDeviceProperties(name='{self.name}', major={self.major}, "
                f"minor={self.minor}, total_memory={self.total_memory // (1 << 20)}MB, "
                f"multi_processor_count={self.multi_processor_count}, uuid={self.uuid}, "
                f"pci_bus_id={self.pci_bus_id}, pci_device_id={self.pci_device_id}, "
                f"pci_domain_id={self.pci_domain_id}, "
                f"L2_cache_size={self.L2_cache_size // (1 << 20)}MB)")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _cache_bytes_per_core(level: int, kind: str = "") -> int:
    """A cache of cpu0 at `level` (of type `kind`, e.g. "Data", if given) over the
    CPUs sharing it; 0 when the host does not say."""
    import glob

    for index in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        if _read(f"{index}/level") != str(level):
            continue
        if kind and _read(f"{index}/type") not in (kind, "Unified"):
            continue
        text, shared = _read(f"{index}/size"), _read(f"{index}/shared_cpu_list")
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        digits = text.rstrip("KkMmGg")
        if not digits.isdigit():
            return 0
        cpus = 0
        for part in shared.split(","):
            lo, _, hi = part.partition("-")
            if lo.isdigit() and (not hi or hi.isdigit()):
                cpus += int(hi) - int(lo) + 1 if hi else 1
        return int(digits) * scale // max(1, cpus)
    return 0


def _l2_bytes_per_core() -> int:
    """The L2 cache of one core: the level-2 cache of cpu0 over the CPUs sharing it."""
    return _cache_bytes_per_core(2)


@functools.lru_cache(maxsize=None)
def _clock_khz() -> int:
    """The host cores' top clock in kHz (cpufreq's, else /proc/cpuinfo's current one),
    read once; 0 if unknown."""
    khz = _read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    if khz.isdigit():
        return int(khz)
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("cpu MHz"):
            try:
                return int(float(line.split(":", 1)[1]) * 1000)
            except ValueError:
                return 0
    return 0


@functools.lru_cache(maxsize=None)
def _static_properties(system_index: int) -> dict:
    machine = _read("/etc/machine-id") or _read("/var/lib/dbus/machine-id")
    capability = torch.backends.cpu.get_cpu_capability()
    lanes = {"AVX512": 16, "AVX2": 8}.get(capability, 4)
    l1d = _cache_bytes_per_core(1, "Data")
    return {"uuid": uuid_lib.uuid5(uuid_lib.NAMESPACE_OID,
                                   f"torch-axon/{machine or platform.node()}/{system_index}"),
            "warp_size": lanes,
            "regs_per_multiprocessor": 32 if capability == "AVX512" else 16,
            "shared_memory_per_block": l1d, "shared_memory_per_block_optin": l1d,
            "shared_memory_per_multiprocessor": l1d,
            "clock_rate": _clock_khz(), "pci_device_id": system_index}


def get_device_properties(device: _DeviceLike = None) -> _AxonDeviceProperties:
    """Name, memory capacity, compute units and the other fields of torch.cuda's
    device properties, for an axon device."""
    index = _get_device_index(device, optional=True)
    props = _C._get_device_properties(index)
    return _AxonDeviceProperties(
        **props, **_static_properties(props["system_index"]),
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
