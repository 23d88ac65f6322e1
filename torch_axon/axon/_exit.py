"""Process exit after a backward pass on axon: no crash in autograd's device threads.

A backward pass on a non-CPU device runs its nodes on autograd's thread for that
device. The pass's GraphTask holds Python objects: ``torch.autograd.backward``
stashes the caller's ``contextvars`` context in thread-local state, which the
GraphTask copies, and ``torch.autograd.grad``'s results are tensors with Python
objects. The device thread drops its reference to the GraphTask only when its
loop turns over, which can be just *after* the caller's ``backward()`` returned.
A script that exits right then finalises Python while the device thread still
holds the last reference: releasing those objects needs the GIL, Python ends the
thread inside the destructor, and the process aborts ("terminate called without
an active exception"; 2-8 of 25 runs of a four-line script on a 2-core machine,
torch 2.13).

At exit, before Python finalises, :func:`release_autograd_graph_tasks` runs one
backward pass on each axon device that was used, from C++ with tensors that have
no Python objects (``_C._autograd_turnover``). The device thread takes that
pass's node only after finishing its previous loop turn, so once it returns,
every earlier GraphTask has been released while the GIL could still be taken,
and releasing the new one needs no GIL.
"""

from __future__ import annotations

from .. import _C


def _used_devices() -> list[int]:
    from .memory import memory_reserved

    if not _C._devices_initialized():  # never used: nothing to release
        return []
    return [d for d in range(_C._device_count())
            if _C._num_device_allocs(d) > 0 or memory_reserved(d) > 0]


def release_autograd_graph_tasks() -> list[int]:
    """Turn over autograd's thread of every used axon device; returns those devices."""
    if _C._in_bad_fork():
        return []
    done = []
    try:
        devices = _used_devices()
    except Exception:  # noqa: BLE001 - at exit, never raise
        return done
    for d in devices:
        try:
            _C._autograd_turnover(d)
            done.append(d)
        except Exception:  # noqa: BLE001 - a device in an error state: nothing to turn over
            pass
    return done
