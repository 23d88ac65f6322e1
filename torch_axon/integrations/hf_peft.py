"""PEFT: adapters load onto axon."""

from __future__ import annotations

import functools

from ._hooks import on_import
from ._tools import axon_is_the_accelerator, replace_function


@on_import("peft.utils.other")
def infer_device_axon(other) -> None:
    """Patch ``peft.utils.other.infer_device``.

    PEFT's default device is the first available of cuda, mps, mlu, xpu and npu, else
    "cpu".  Adapter weights loaded without a device (``load_peft_weights``, so
    ``PeftModel.from_pretrained`` / ``load_adapter``, hotswapping, X-LoRA) were mapped to
    the CPU on axon, and with ``low_cpu_mem_usage=True`` a ``modules_to_save`` copy (a
    sequence-classification head) stayed there, so the forward failed with mixed
    devices.  Where axon is the accelerator the wrapper answers "axon" instead of "cpu".
    """
    original = other.infer_device
    if getattr(original, "_axon_patch", False):
        return

    @functools.wraps(original)
    def infer_device() -> str:
        device = original()
        return "axon" if device == "cpu" and axon_is_the_accelerator() else device

    infer_device._axon_patch = True
    replace_function(other, "infer_device", infer_device)
