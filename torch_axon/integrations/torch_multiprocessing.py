"""torch.multiprocessing: a clear error for axon tensors sent to another process."""

from __future__ import annotations

import functools

import torch

from ._hooks import on_import

SHARE_ERROR = (
    "Cannot share an axon tensor with another process: torch.multiprocessing "
    "sends tensors as shared CPU memory (or CUDA IPC handles), and axon tensors "
    "are neither. Move axon tensors to the CPU to share them (tensor.cpu()), "
    "and back to axon in the receiving process."
)


def _is_axon(obj) -> bool:
    try:
        return obj.device.type == torch._C._get_privateuse1_backend_name()
    except Exception:  # noqa: BLE001  (not a tensor/storage we know)
        return False


@on_import("torch.multiprocessing.reductions")
def share_axon_tensors(reductions) -> None:
    """Patch the reducers ``torch/multiprocessing/reductions.py`` registers.

    ``init_reductions()`` registers ``reduce_tensor`` for every tensor class
    and ``reduce_storage`` for ``UntypedStorage`` with ``ForkingPickler``.
    ``reduce_tensor`` special-cases ``cuda`` and ``meta`` storages by name and
    sends every other storage through ``reduce_storage``, which calls
    ``storage._share_fd_cpu_()`` (or ``_share_filename_cpu_``): for an axon
    tensor that fails with the unhelpful ``_share_fd_: only available on
    CPU``.  The wrappers raise a clear error for axon tensors and storages and
    change nothing else.  Generic upstream fix: a device-neutral sharing hook
    (the backend exports and imports its memory, as CUDA IPC does), or at
    least an error naming the device; once upstream has either this only
    replaces an error by another.
    """
    from multiprocessing.reduction import ForkingPickler

    wrapped = {}
    for original in (reductions.reduce_tensor, reductions.reduce_storage):
        if getattr(original, "_axon_patch", False):
            return

        def make(original):
            @functools.wraps(original)
            def reduce(obj):
                if _is_axon(obj):
                    raise RuntimeError(SHARE_ERROR)
                return original(obj)

            reduce._axon_patch = True
            return reduce

        wrapped[original] = make(original)
    reducers = ForkingPickler._extra_reducers
    for cls, fn in list(reducers.items()):
        if fn in wrapped:
            reducers[cls] = wrapped[fn]
    reductions.reduce_tensor = wrapped[reductions.reduce_tensor]
    reductions.reduce_storage = wrapped[reductions.reduce_storage]
