"""torch.cuda's sync debug mode, for axon: warn or raise on synchronising calls.

Flagged, as on CUDA (c10/cuda/CUDAFunctions.h ``warn_or_error_on_sync``):
``.item()`` and everything built on it (``bool(t)``, ``.tolist()`` reads through a
copy), blocking copies between host and device (``.cpu()``, ``.numpy()`` via
``.cpu()``, ``torch.tensor(..., device="axon")``, ``.to("axon")``), ``nonzero`` and
``masked_select`` (and boolean-mask indexing through them), and
``Stream.synchronize()``.  Not flagged, as on CUDA: ``torch.axon.synchronize()``,
``Event.synchronize()`` and ``non_blocking=True`` copies; nor the host's own reads of
device memory inside ops without an axon kernel (the CPU fallback).
"""

from __future__ import annotations

from .. import _C

__all__ = ["set_sync_debug_mode", "get_sync_debug_mode"]


def set_sync_debug_mode(debug_mode: int | str) -> None:
    r"""Set the debug mode for axon synchronizing operations.

    Args:
        debug_mode(str or int): if "default" or 0, don't error or warn on synchronizing
            operations, if "warn" or 1, warn on synchronizing operations, if "error" or 2,
            error out synchronizing operations.
    """
    if isinstance(debug_mode, str):
        modes = {"default": 0, "warn": 1, "error": 2}
        if debug_mode not in modes:
            raise RuntimeError(
                "invalid value of debug_mode, expected one of `default`, `warn`, `error`")
        debug_mode = modes[debug_mode]
    _C._set_sync_debug_mode(debug_mode)


def get_sync_debug_mode() -> int:
    r"""Return current value of debug mode for axon synchronizing operations."""
    return _C._get_sync_debug_mode()
