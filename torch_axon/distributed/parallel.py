"""PyTorch's parallel APIs (DDP, FSDP2, DTensor, tensor parallelism) on axon.

``install()`` is called once by ``torch_axon.distributed.install()`` (autoload).
What works without help, checked against torch 2.13:

* FSDP2 (``fully_shard``): its custom ops ``fsdp::all_gather_copy_in``,
  ``fsdp::split_with_sizes_copy`` and ``fsdp::chunk_cat`` have PrivateUse1
  kernels in torch itself; it creates ``torch.axon.Stream(priority=-1)`` and
  uses ``torch.axon.Event`` / ``current_stream().wait_event``.
* DTensor's RNG (``OffsetBasedRNGTracker``) reads and writes the generator
  state as 16 bytes (seed, offset), which is exactly the axon generator's
  state (csrc/core/AxonGenerator.h): a random op on a shard runs with
  offset + shard_index * shard_numel and every rank then advances the offset
  by the whole tensor's numel, so replicas draw the same numbers and shards
  different ones.

What this module fixes:

* The default backend of a process group.  ``init_process_group()`` without
  a backend (torchrun's usual call) builds the group from the accelerator's
  backend only (``axon:axon``), and torch then marks GLOO as the group's
  default backend type because the map holds no NCCL
  (``_new_process_group_helper``); mixed specs like ``"cpu:gloo,axon:axon"``
  leave it UNDEFINED.  Anything that asks the group for its default backend
  then fails; DDP's construction logging does:
  ``RuntimeError: Could not find backend type 1 for Process Group``.
  We set the default to the type of a backend the group really has (axon's,
  CUSTOM), as torch does for NCCL.
* gloo groups on axon tensors: every new group that has gloo and no axon
  backend gets ``gloo.register`` (see gloo.py).
* ``split_group`` on a backend that cannot split.  Once the default group is
  bound to a device (``init_process_group(device_id=...)``, as torchtitan
  does), ``init_device_mesh`` creates every mesh dimension's groups with
  ``split_group``, which only backends with ``supports_splitting`` accept
  ("No backend for the parent process group or its backend does not support
  splitting").  For a parent whose accelerator backend is axon's and cannot
  split, ``split_group`` here creates the same groups with ``new_group`` (what
  DeviceMesh does for unbound groups) and returns this rank's.
"""

from __future__ import annotations

import functools

import torch

def _registered_backend_types(pg) -> dict:
    """{BackendType: backend} of the backends registered on pg, by device type."""
    from torch.distributed import ProcessGroup

    found = {}
    for device in getattr(pg, "_device_types", []):
        try:
            backend = pg._get_backend(device)
        except RuntimeError:
            continue
        name = type(backend).__name__
        if name == "ProcessGroupGloo":
            found[ProcessGroup.BackendType.GLOO] = backend
        elif name == "ProcessGroupNCCL":
            found[ProcessGroup.BackendType.NCCL] = backend
        else:
            found.setdefault(ProcessGroup.BackendType.CUSTOM, backend)
    return found


def fix_default_backend(pg) -> None:
    """Makes pg's default backend one it has, if it has an axon backend and
    its default type names none of its backends (see the module docstring)."""
    from torch.distributed import ProcessGroup

    if not isinstance(pg, ProcessGroup):
        return
    devices = {d.type for d in getattr(pg, "_device_types", [])}
    if "axon" not in devices:
        return
    registered = _registered_backend_types(pg)
    name = pg._get_backend_name()
    names = {ProcessGroup.BackendType.GLOO: "gloo", ProcessGroup.BackendType.NCCL: "nccl",
             ProcessGroup.BackendType.CUSTOM: "custom"}
    if any(names.get(t) == name for t in registered):
        return
    try:
        axon_backend = pg._get_backend(torch.device("axon"))
    except RuntimeError:
        return
    for t, backend in registered.items():
        if backend is axon_backend:
            pg._set_default_backend(t)
            return


def _patch_new_process_group_helper() -> None:
    import torch.distributed.distributed_c10d as c10d

    original = c10d._new_process_group_helper
    if getattr(original, "_axon_patched", False):
        return

    @functools.wraps(original)
    def _new_process_group_helper(*args, **kwargs):
        from . import gloo

        # A gloo-only group bound to an axon device: torch looks the device's
        # backend up before gloo.register() can add it; bind after (gloo.py).
        device_id = kwargs.get("device_id")
        backend = kwargs.get("backend", args[3] if len(args) > 3 else None)
        bind_later = (isinstance(device_id, torch.device) and device_id.type == "axon"
                      and gloo.needs_gloo_on_axon(backend))
        if bind_later:
            kwargs["device_id"] = None
        result = original(*args, **kwargs)
        pg = result[0] if isinstance(result, tuple) else result
        if gloo.register(pg) and bind_later:
            pg.bound_device_id = device_id
        fix_default_backend(pg)
        return result

    _new_process_group_helper._axon_patched = True
    c10d._new_process_group_helper = _new_process_group_helper


def _axon_backend_without_split(pg):
    try:
        backend = pg._get_backend(torch.device("axon"))
    except RuntimeError:
        return None
    if getattr(backend, "supports_splitting", False):
        return None
    return backend


def _patch_split_group() -> None:
    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh
    import torch.distributed.distributed_c10d as c10d

    original = c10d.split_group
    if getattr(original, "_axon_patched", False):
        return

    @functools.wraps(original)
    def split_group(parent_pg=None, split_ranks=None, timeout=None, pg_options=None,
                    group_desc=None, *args, **kwargs):
        parent = parent_pg if parent_pg is not None else c10d._get_default_group()
        if (args or kwargs.get("backend") is not None or split_ranks is None
                or parent is not c10d._get_default_group()
                or _axon_backend_without_split(parent) is None):
            return original(parent_pg, split_ranks, timeout, pg_options, group_desc,
                            *args, **kwargs)
        # every rank of the (default) parent creates every subgroup, in order
        mine = None
        rank = parent.rank()
        for ranks in split_ranks:
            group = c10d.new_group(ranks=list(ranks), timeout=timeout, pg_options=pg_options,
                                   group_desc=group_desc)
            if rank in ranks:
                mine = group
        return mine

    split_group._axon_patched = True
    c10d.split_group = split_group
    if getattr(device_mesh, "split_group", None) is original:
        device_mesh.split_group = split_group
    if getattr(dist, "split_group", None) is original:
        dist.split_group = split_group


def _patch_set_pg_timeout() -> None:
    """``distributed_c10d._set_pg_timeout`` (torchtitan lowers the timeout after
    the first step with it) sets the timeout of a group's gloo (cpu) and nccl
    (cuda) backends only, and warns "only supported for either nccl or gloo"
    when there is none.  The wrapper also sets it on the group's axon backend
    (``Backend.set_timeout``: later collectives and point-to-point calls)."""
    import torch.distributed.distributed_c10d as c10d

    original = c10d._set_pg_timeout
    if getattr(original, "_axon_patched", False):
        return

    @functools.wraps(original)
    def _set_pg_timeout(timeout, group=None):
        pg = group if group is not None else c10d._get_default_group()
        backend = None
        if (isinstance(pg, c10d.ProcessGroup) and not c10d._rank_not_in_group(pg)
                and torch.device("axon") in pg._device_types):
            backend = pg._get_backend(torch.device("axon"))
        if backend is None:
            return original(timeout, group)
        backend.set_timeout(timeout)
        others = [d for d in pg._device_types if d.type != "axon"]
        if any(pg._get_backend(d) is not backend for d in others):
            original(timeout, group)  # the cpu (gloo) backend as well

    _set_pg_timeout._axon_patched = True
    c10d._set_pg_timeout = _set_pg_timeout


def install() -> None:
    """Applies the fixes above (each patch is idempotent).  Called by
    ``torch_axon.distributed.install()`` once torch.distributed is available."""
    _patch_new_process_group_helper()
    _patch_split_group()
    _patch_set_pg_timeout()
