"""Dynamo's view of the axon device (torch._dynamo.device_interface).

Dynamo and Inductor reach devices through a DeviceInterface: the current
device, streams and events (Dynamo recognises axon stream and event objects
by it), synchronisation, and the device properties that size Inductor's
reduction heuristics.  (``with torch.axon.stream(s):`` inside a compiled
function is not traced: the graph breaks there and that region runs eagerly.)  Registered when ``torch._dynamo.device_interface`` is
first imported (see torch_axon.integrations.torch_compile): importing Dynamo
costs ~1 s, too much to do whenever torch loads.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._dynamo.device_interface import DeviceInterface, caching_worker_current_devices, \
    caching_worker_device_properties


def _index(device: Any) -> int:
    if device is None:
        return torch.axon.current_device()
    return torch.axon._get_device_index(device, optional=True)


class AxonInterface(DeviceInterface):
    device = torch.axon.device  # type: ignore[assignment]
    # Dynamo accepts torch.Event / torch.Stream subclasses; torch.axon.Event()
    # returns a plain torch.Event on the axon device.
    Event = torch.Event  # type: ignore[assignment]
    Stream = torch.axon.Stream  # type: ignore[assignment]

    class Worker:
        """Device queries usable in Inductor's compile workers (cached before they fork)."""

        @staticmethod
        def set_device(device: int) -> None:
            caching_worker_current_devices["axon"] = device

        @staticmethod
        def current_device() -> int:
            if "axon" in caching_worker_current_devices:
                return caching_worker_current_devices["axon"]
            return torch.axon.current_device()

        @staticmethod
        def get_device_properties(device: Any = None) -> Any:
            if device is None:
                device = AxonInterface.Worker.current_device()
            else:
                device = _index(device)
            if "axon" not in caching_worker_device_properties:
                caching_worker_device_properties["axon"] = [
                    torch.axon.get_device_properties(i) for i in range(torch.axon.device_count())]
            return caching_worker_device_properties["axon"][device]

    current_device = staticmethod(torch.axon.current_device)
    set_device = staticmethod(torch.axon.set_device)  # type: ignore[assignment]
    device_count = staticmethod(torch.axon.device_count)
    stream = staticmethod(torch.axon.stream)  # type: ignore[assignment]
    current_stream = staticmethod(torch.axon.current_stream)
    set_stream = staticmethod(torch.axon.set_stream)  # type: ignore[assignment]
    synchronize = staticmethod(torch.axon.synchronize)
    memory_allocated = staticmethod(torch.axon.memory_allocated)  # type: ignore[assignment]

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        torch.axon.set_stream(torch.axon.Stream(
            stream_id=stream_id, device_index=device_index, device_type=device_type))

    @staticmethod
    def exchange_device(device: int) -> int:
        previous = torch.axon.current_device()
        if device >= 0 and device != previous:
            torch.axon.set_device(device)
        return previous

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        return AxonInterface.exchange_device(device)

    @staticmethod
    def is_available() -> bool:
        return torch.axon.is_available()

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        # Only Triton and GPU wrapper code use raw streams; axon kernels are
        # launched on the current stream by the runtime.
        return torch.axon.current_stream(device_idx).stream_id

    @staticmethod
    def get_compute_capability(device: Any = None) -> Any:
        # Inductor keys caches on this; axon's code is the host's C++ (no Triton).
        return ""

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return True

    @staticmethod
    def is_triton_capable(device: Any = None) -> bool:
        return False
