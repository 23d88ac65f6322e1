"""gloo process groups on axon tensors.

A ``"gloo"`` group (``init_process_group("gloo")``, ``new_group(backend="gloo")``)
gets backends for the ``cpu`` and ``cuda`` device types only
(``Backend.backend_capability["gloo"]`` in
torch/distributed/distributed_c10d.py), so a collective on axon tensors, or
``barrier(device_ids=[rank])`` on a machine whose accelerator is axon, fails in
c10d's dispatch with "No backend type associated with device type axon".

``register(pg)`` (run by the ``_new_process_group_helper`` patch of
``parallel.py`` for every new group) gives such a group a backend for device
type ``axon``: ``ProcessGroupGlooAxon`` (csrc/distributed/GlooAxon.cpp), which
hands each call to the group's own gloo backend with the axon tensors as host
views (CPU tensors over the same device memory, which is host-addressable),
after the current stream of their device has drained.  ``Work.wait()`` blocks
the host until gloo is done, as gloo does for CPU tensors, so stream work
queued afterwards sees the results.  Groups with a backend of their own for
axon (``"axon"``, ``"cpu:gloo,axon:axon"``) are left alone; they are the fast
path (gloo copies through its TCP transport, the axon backend through shared
memory on the communication stream).

``init_process_group("gloo", device_id=torch.device("axon", rank))`` binds the
group to the axon device; torch looks the device's backend up before this
registration could run, so the helper is called without ``device_id`` and the
group is bound afterwards.

Upstream fix: c10d would register gloo for any device whose tensors are
host-addressable (a device capability query), or fall back to the CPU backend
for such devices, instead of the fixed ``["cpu", "cuda"]``.
"""

from __future__ import annotations

import torch


def _backend_for(pg, device: str):
    try:
        return pg._get_backend(torch.device(device))
    except RuntimeError:
        return None


def needs_gloo_on_axon(backend) -> bool:
    """Whether a group created with this backend spec serves axon only through
    gloo's cpu entry (plain ``"gloo"``, or a spec without an axon entry)."""
    from torch.distributed.distributed_c10d import BackendConfig

    try:
        device_map = BackendConfig(backend).get_device_backend_map()
    except (ValueError, AssertionError, RuntimeError, TypeError):
        return False
    return "axon" not in device_map and device_map.get("cpu") == "gloo"


def register(pg) -> bool:
    """Gives pg a backend for axon tensors if it has gloo and no axon backend.
    Returns whether it registered one."""
    from torch.distributed import ProcessGroup

    from .. import _C

    if not isinstance(pg, ProcessGroup):
        return False
    devices = {d.type for d in getattr(pg, "_device_types", [])}
    if "axon" in devices or "cpu" not in devices:
        return False
    gloo = _backend_for(pg, "cpu")
    if gloo is None or gloo.name() != "gloo":
        return False
    # CUSTOM must be free: ProcessGroup::setBackend would reuse a backend
    # already registered under that type for axon.
    if any(getattr(_backend_for(pg, d.type), "name", lambda: None)() != "gloo"
           for d in pg._device_types):
        return False
    name, desc = pg.group_name, pg.group_desc
    pg._register_backend(torch.device("axon"), ProcessGroup.BackendType.CUSTOM,
                         _C._distributed.ProcessGroupGlooAxon(gloo))
    # the group's name and description live in its backends (c10d reads them
    # from whichever comes first), so the new one needs them too
    pg._set_group_name(name)
    pg._set_group_desc(desc)
    return True
