"""Accelerate: choose axon where Accelerate's device chain ends at the CPU."""

from __future__ import annotations

import torch

from ._hooks import on_import


def _axon_available() -> bool:
    return hasattr(torch, "axon") and torch.axon.is_available()


@on_import("accelerate.state")
def partial_state_default_device(state) -> None:
    """Patch ``accelerate.state.PartialState.default_device``.

    Upstream walks a fixed chain (mps, mlu, sdaa, musa, npu, hpu, cuda, xpu,
    neuron) and otherwise returns the CPU, so an Accelerator (and the
    Transformers Trainer built on it) never picks a PrivateUse1 device.  The
    wrapper keeps every answer but that final CPU, which becomes the current
    axon device; once upstream returns axon itself the wrapper changes nothing.
    """
    cls = state.PartialState
    original = cls.default_device
    if getattr(original.fget, "_axon_patch", False):
        return

    def default_device(self) -> torch.device:
        device = original.fget(self)
        if device.type == "cpu" and _axon_available():
            return torch.device("axon", torch.axon.current_device())
        return device

    default_device._axon_patch = True
    default_device.__doc__ = original.__doc__
    cls.default_device = property(default_device)
