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


@on_import("accelerate.utils.dataclasses")
def dynamo_backend_axon(dataclasses) -> None:
    """Add ``AXON`` to ``accelerate.utils.dataclasses.DynamoBackend``.

    ``TorchDynamoPlugin`` (which ``TrainingArguments(torch_compile_backend=...)``
    and ``accelerate launch --dynamo_backend`` reach) converts the backend name
    with ``DynamoBackend(name.upper())``, a closed enum of the backends
    Accelerate knows (inductor, neuron, ...), so ``"axon"`` raised
    ``ValueError: 'AXON' is not a valid DynamoBackend``.  The member added here
    has the value ``"AXON"``; the plugin passes ``backend="axon"`` (its
    lower-cased value) to ``torch.compile``, which finds torch_axon's backend.
    """
    enum_cls = dataclasses.DynamoBackend
    if "AXON" in enum_cls.__members__:
        return
    member = str.__new__(enum_cls, "AXON")
    member._name_ = "AXON"
    member._value_ = "AXON"
    member.__objclass__ = enum_cls
    member.__init__("AXON")
    type.__setattr__(enum_cls, "AXON", member)
    enum_cls._member_map_["AXON"] = member
    enum_cls._value2member_map_["AXON"] = member
    enum_cls._member_names_.append("AXON")
