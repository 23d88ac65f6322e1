"""Memory shared between processes and devices: torch.cuda's ipc_collect and
can_device_access_peer, for axon (torch.multiprocessing sends axon tensors as
shared device memory: torch_axon/integrations/torch_multiprocessing.py)."""

from __future__ import annotations

from .. import _C
from .device import _DeviceLike, _get_device_index, device_count

__all__ = ["ipc_collect", "can_device_access_peer"]


def ipc_collect() -> None:
    """Free the device memory of tensors this process sent to other processes
    (torch.multiprocessing) and dropped since, once no receiver holds them any
    more.  As torch.cuda.ipc_collect: the memory stays allocated while a
    receiver maps it, and is freed here (or at the next share) afterwards."""
    _C._ipc_collect()


def can_device_access_peer(device: _DeviceLike, peer_device: _DeviceLike) -> bool:
    """True if ``device`` can read and write ``peer_device``'s memory directly.

    The simulated devices of a host share the host's memory: every device can
    access every other one.  A device is not its own peer (False), as for CUDA."""
    device = _get_device_index(device, optional=True)
    peer_device = _get_device_index(peer_device)
    n = device_count()
    if device < 0 or device >= n:
        raise AssertionError("Invalid device id")
    if peer_device < 0 or peer_device >= n:
        raise AssertionError("Invalid peer device id")
    return device != peer_device
