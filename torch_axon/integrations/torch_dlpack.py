"""DLPack: ``torch.from_dlpack(axon_tensor)`` through the ``__dlpack__`` protocol."""

from __future__ import annotations

import functools

import torch

from ._hooks import on_import


@on_import("torch._tensor")
def tensor_dlpack_device(tensor_module) -> None:
    """Patch ``torch._tensor.Tensor.__dlpack_device__``.

    Upstream maps the tensor's device type to a DLPack device type from a fixed
    chain of names (cuda, cpu, xpu, xla, mps) and ``self.device.type ==
    "privateuse1"``, which a renamed PrivateUse1 backend never matches, so it
    raises "Unknown device type axon for Dlpack" and ``torch.from_dlpack``
    (which asks the producer's ``__dlpack_device__`` first) fails, while the
    capsule itself (``Tensor.__dlpack__``, C++ ``torch::utils::toDLPack``) maps
    PrivateUse1 to ``kDLExtDev`` by dispatch key.  The wrapper answers
    ``(kDLExtDev, index)``, as the capsule says, for the renamed backend only
    where upstream raised; once upstream compares with
    ``torch._C._get_privateuse1_backend_name()`` (or asks
    ``torch._C._torchDeviceToDLDevice``) it changes nothing.
    """
    cls = tensor_module.Tensor
    original = cls.__dlpack_device__
    if getattr(original, "_axon_patch", False):
        return

    @functools.wraps(original)
    def __dlpack_device__(self):
        try:
            return original(self)
        except ValueError:
            device = self.device
            if device.type != torch._C._get_privateuse1_backend_name():
                raise
            from torch.utils.dlpack import DLDeviceType

            return (DLDeviceType.kDLExtDev, device.index if device.index is not None else 0)

    __dlpack_device__._axon_patch = True
    cls.__dlpack_device__ = __dlpack_device__
