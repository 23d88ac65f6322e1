"""torch.distributed on axon: the c10d backend ``axon``.

``install()`` (run on autoload) registers ``ProcessGroupAxon`` (C++,
csrc/distributed/) as the backend of device type ``axon``, so that
``dist.init_process_group()`` picks it for axon devices, and
``init_process_group("axon")``, ``"cpu:gloo,axon:axon"`` and
``init_device_mesh("axon", shape)`` work.

Environment (read when a group is created; every rank must agree):
``AXON_COMM_SLOT_BYTES`` (4 MiB) bytes a rank stages per step and buffer,
``AXON_COMM_P2P_BYTES`` (1 MiB) the send/recv ring buffer per pair of ranks,
``AXON_COMM_SMALL_BYTES`` (256 KiB) the all_reduce size up to which every rank
reduces every input (low latency) instead of reduce-scatter + all-gather.
"""

from __future__ import annotations

import torch

BACKEND_NAME = "axon"

_installed = False


def _create_backend(common_opts, backend_opts):  # noqa: ARG001  (extended API signature)
    from .. import _C

    return _C._distributed.ProcessGroupAxon(
        common_opts.store, common_opts.group_rank, common_opts.group_size, common_opts.timeout)


def install() -> None:
    """Registers the ``axon`` c10d backend for device type ``axon``."""
    global _installed
    if _installed:
        return
    _installed = True
    import torch.distributed as dist

    if not dist.is_available():
        return
    if BACKEND_NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True,
                                      devices=["axon"])
    try:
        from . import parallel
    except ImportError:
        parallel = None
    if parallel is not None and hasattr(parallel, "install"):
        parallel.install()


def memcpy_bandwidth(nbytes: int, reps: int = 5) -> float:
    """Bytes/s of a single-threaded host memcpy of nbytes (median of reps): the
    physical reference for the collective benchmarks."""
    from .. import _C

    return _C._distributed.memcpy_bandwidth(int(nbytes), int(reps))
