"""torch.axon.amp: the deprecated torch.cuda.amp names, for code written against them.

``torch.axon.amp.autocast(...)`` is ``torch.amp.autocast("axon", ...)``,
``torch.axon.amp.GradScaler(...)`` is ``torch.amp.GradScaler("axon", ...)``, and
``custom_fwd`` / ``custom_bwd`` are torch.amp's with ``device_type="axon"``; each warns
(FutureWarning) as torch.cuda.amp's do, with torch.amp's spelling to use instead.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import torch
from typing_extensions import deprecated

__all__ = ["amp_definitely_not_available", "autocast", "custom_bwd", "custom_fwd", "GradScaler"]


def amp_definitely_not_available() -> bool:
    """False when an axon device exists (as torch.cuda.amp's with CUDA)."""
    return not torch.axon.is_available()


@deprecated("`torch.axon.amp.autocast(args...)` is deprecated. "
            "Please use `torch.amp.autocast('axon', args...)` instead.", category=FutureWarning)
class autocast(torch.amp.autocast_mode.autocast):
    """See :class:`torch.autocast`; ``torch.amp.autocast("axon", ...)``."""

    if sys.version_info < (3, 13):

        def __new__(cls, enabled: bool = True, dtype: torch.dtype = torch.float16,
                    cache_enabled: bool = True):
            return super().__new__(cls)

        def __init_subclass__(cls):
            pass

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16,
                 cache_enabled: bool = True):
        super().__init__("axon", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any):  # type: ignore[override]
        return super().__exit__(exc_type, exc_val, exc_tb)


class GradScaler(torch.amp.GradScaler):
    """See :class:`torch.amp.GradScaler`; ``torch.amp.GradScaler("axon", ...)``."""

    @deprecated("`torch.axon.amp.GradScaler(args...)` is deprecated. "
                "Please use `torch.amp.GradScaler('axon', args...)` instead.",
                category=FutureWarning)
    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        super().__init__("axon", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)


@deprecated("`torch.axon.amp.custom_fwd(args...)` is deprecated. "
            "Please use `torch.amp.custom_fwd(args..., device_type='axon')` instead.",
            category=FutureWarning)
def custom_fwd(fwd=None, *, cast_inputs=None):
    """``torch.amp.custom_fwd(..., device_type="axon")``."""
    return functools.partial(torch.amp.custom_fwd, device_type="axon")(fwd=fwd,
                                                                       cast_inputs=cast_inputs)


@deprecated("`torch.axon.amp.custom_bwd(args...)` is deprecated. "
            "Please use `torch.amp.custom_bwd(args..., device_type='axon')` instead.",
            category=FutureWarning)
def custom_bwd(bwd):
    """``torch.amp.custom_bwd(..., device_type="axon")``."""
    return functools.partial(torch.amp.custom_bwd, device_type="axon")(bwd)
