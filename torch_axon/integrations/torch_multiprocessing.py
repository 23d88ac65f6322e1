"""torch.multiprocessing: axon tensors sent to another process share device memory.

As CUDA tensors do (``torch/multiprocessing/reductions.py``: ``reduce_tensor``
and ``rebuild_cuda_tensor``), an axon tensor pickled by ``ForkingPickler``
(``mp.Queue``, ``Pipe``, a spawned ``Process``'s arguments) travels as a handle
to its device memory, not as a copy: the receiver maps the same memory as a
tensor on the same device index, with the sender's size, stride,
storage_offset, dtype and requires_grad.  Writes on either side are seen by the
other once the writer has synchronised its device.  The sender's memory stays
allocated until every receiver has dropped its tensor, even if the sender drops
its own first (``torch.axon.ipc_collect()`` then frees it); see
csrc/core/AxonIpc.h.  Receivers need the "spawn" (or "forkserver") start
method: a forked child cannot use the device.
"""

from __future__ import annotations

import functools

import torch

from ._hooks import on_import

STORAGE_ERROR = "Cannot pickle axon storage; try pickling an axon tensor instead"
FORK_ERROR = ("Cannot re-initialize axon in forked subprocess. To use axon with "
              "multiprocessing, you must use the 'spawn' start method (the device's "
              "worker threads do not survive fork()).")


def _is_axon(obj) -> bool:
    try:
        return obj.device.type == torch._C._get_privateuse1_backend_name()
    except Exception:  # noqa: BLE001  (not a tensor/storage we know)
        return False


def _cache_key(handle) -> tuple:
    # (pid, allocation id, offset, nbytes): one storage of one sender.
    return ("axon", handle[1], handle[3], handle[6], handle[7])


def rebuild_axon_tensor(tensor_cls, size, stride, storage_offset, dtype, device, handle,
                        requires_grad):
    """Unpickles an axon tensor: maps the sender's memory (or finds the storage
    this process already maps) and builds the tensor on it."""
    from torch.multiprocessing import reductions

    from .. import _C

    if _C._in_bad_fork():
        raise RuntimeError(FORK_ERROR)
    if handle is None:  # an empty storage: nothing to map
        storage = torch.UntypedStorage(0, device=torch.device("axon", device))
    else:
        key = _cache_key(handle)
        storage = reductions.storage_from_cache(torch.UntypedStorage, key)
        if storage is None:
            storage = _C._ipc_open(tuple(handle)).untyped_storage()
            reductions.shared_cache[key] = reductions.StorageWeakRef(storage)
        else:
            # This process holds it already: the sender's new count goes back now.
            _C._ipc_release_counter(handle[1], handle[8], handle[9], handle[10])
    typed = torch.storage.TypedStorage(wrap_storage=storage, dtype=dtype, _internal=True)
    t = torch._utils._rebuild_tensor(typed, storage_offset, size, stride)
    if tensor_cls == torch.nn.parameter.Parameter:
        # Through the constructor: integer tensors must get requires_grad=False there.
        return torch.nn.parameter.Parameter(t, requires_grad=requires_grad)
    t.requires_grad = requires_grad
    return t


def _reduce_axon_tensor(tensor):
    from torch.multiprocessing import reductions

    from .. import _C

    if tensor.requires_grad and not tensor.is_leaf:
        raise RuntimeError(
            "Cowardly refusing to serialize non-leaf tensor which requires_grad, "
            "since autograd does not support crossing process boundaries.  "
            "If you just want to transfer the data, call detach() on the tensor "
            "before serializing (e.g., putting it on the queue).")
    torch.utils.hooks.warn_if_has_hooks(tensor)
    storage = tensor.untyped_storage()
    device = tensor.device.index if tensor.device.index is not None else torch.axon.current_device()
    handle = None
    if storage.nbytes() > 0:
        handle = _C._ipc_share(tensor)
        # The same process unpickling it finds this storage.
        reductions.shared_cache[_cache_key(handle)] = reductions.StorageWeakRef(storage)
    return (rebuild_axon_tensor,
            (type(tensor), tensor.size(), tensor.stride(), tensor.storage_offset(), tensor.dtype,
             device, handle, tensor.requires_grad))


@on_import("torch.multiprocessing.reductions")
def share_axon_tensors(reductions) -> None:
    """Patch the reducers ``torch/multiprocessing/reductions.py`` registers.

    ``init_reductions()`` registers ``reduce_tensor`` for every tensor class
    and ``reduce_storage`` for ``UntypedStorage`` with ``ForkingPickler``.
    ``reduce_tensor`` special-cases ``cuda`` and ``meta`` storages by name and
    sends every other storage through ``reduce_storage``, which calls
    ``storage._share_fd_cpu_()``: for an axon tensor that fails with
    ``_share_fd_: only available on CPU``.  The wrappers send axon tensors as
    handles to their device memory (``_reduce_axon_tensor``, rebuilt by
    ``rebuild_axon_tensor``, the counterparts of ``rebuild_cuda_tensor`` and
    ``_share_cuda_``/``_new_shared_cuda``), refuse bare axon storages as CUDA
    refuses CUDA storages, and change nothing else.  Generic upstream fix: a
    device-neutral sharing hook in ``reduce_tensor`` (e.g. the storage's
    ``_share_device_``/``_new_shared_device`` through the PrivateUse1 hooks);
    then this patch is unnecessary.
    """
    from multiprocessing.reduction import ForkingPickler

    originals = (reductions.reduce_tensor, reductions.reduce_storage)
    if any(getattr(f, "_axon_patch", False) for f in originals):
        return

    @functools.wraps(reductions.reduce_tensor)
    def reduce_tensor(tensor):
        # Nested and sparse tensors: torch reduces their strided parts, through here.
        if _is_axon(tensor) and not tensor.is_nested and tensor.layout == torch.strided:
            return _reduce_axon_tensor(tensor)
        return original_tensor(tensor)

    @functools.wraps(reductions.reduce_storage)
    def reduce_storage(storage):
        if _is_axon(storage):
            raise RuntimeError(STORAGE_ERROR)
        return original_storage(storage)

    original_tensor, original_storage = originals
    reduce_tensor._axon_patch = True
    reduce_storage._axon_patch = True
    wrapped = {original_tensor: reduce_tensor, original_storage: reduce_storage}
    reducers = ForkingPickler._extra_reducers
    for cls, fn in list(reducers.items()):
        if fn in wrapped:
            reducers[cls] = wrapped[fn]
    reductions.reduce_tensor = reduce_tensor
    reductions.reduce_storage = reduce_storage
