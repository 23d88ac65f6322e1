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
reduces every input (low latency) instead of reduce-scatter + all-gather;
``AXON_HOST_ID`` overrides which host a rank counts as being on (``host_id``).
``AXON_TEST_HARNESS=1`` (read at autoload) imports ``torch_axon.testing``, which
makes PyTorch's DTensor/FSDP test harnesses run on axon.

gloo groups also take axon tensors (``gloo.py``).
"""

from __future__ import annotations

import os
import socket

BACKEND_NAME = "axon"

_installed = False


def host_id() -> str:
    """Which host this process is on, for the collectives' topology.

    ``AXON_HOST_ID`` if set, else the host name and the network namespace:
    processes in different network namespaces count as different hosts (their
    traffic between each other goes over the network, as between machines).
    """
    env = os.environ.get("AXON_HOST_ID")
    if env:
        return env
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = ""
    return f"{socket.gethostname()}/{netns}"


def _create_backend(common_opts, backend_opts):  # noqa: ARG001  (extended API signature)
    """The creator registered with c10d: one ProcessGroupAxon per group and rank.

    Ranks publish their host in the group's store.  On one host (the usual
    case) the group is shared memory only.  Across hosts, each host's ranks
    share memory and the lowest rank of each host joins a gloo group with the
    other hosts' leaders (hierarchical all_reduce/broadcast/barrier); a gloo
    group over all ranks carries the other collectives.
    """
    from .. import _C

    store, rank, size = common_opts.store, common_opts.group_rank, common_opts.group_size
    timeout = common_opts.timeout
    store.set(f"axon_host/{rank}", host_id())
    ids = [store.get(f"axon_host/{r}").decode() for r in range(size)]
    hosts = list(dict.fromkeys(ids))  # in the order of their lowest rank
    host_of = [hosts.index(h) for h in ids]
    leaders = everyone = None
    if len(hosts) > 1:
        import torch.distributed as dist

        everyone = dist.ProcessGroupGloo(dist.PrefixStore("axon_all/", store), rank, size, timeout)
        leader_ranks = [ids.index(h) for h in hosts]
        if rank in leader_ranks:
            leaders = dist.ProcessGroupGloo(dist.PrefixStore("axon_leaders/", store),
                                            leader_ranks.index(rank), len(hosts), timeout)
    return _C._distributed.ProcessGroupAxon(store, rank, size, timeout, host_of, leaders, everyone)


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
    from . import parallel

    parallel.install()
    from .._C import _env_bool  # the runtime's parser: 1/true/yes/on, warns on bad values

    if _env_bool("AXON_TEST_HARNESS", False):
        # PyTorch's own distributed test harnesses on axon (torch_axon/testing).
        from .. import testing  # noqa: F401  (registers its patches)


def memcpy_bandwidth(nbytes: int, reps: int = 5) -> float:
    """Bytes/s of a single-threaded host memcpy of nbytes (median of reps): the
    physical reference for the collective benchmarks."""
    from .. import _C

    return _C._distributed.memcpy_bandwidth(int(nbytes), int(reps))
