"""Meta kernels on axon's behalf: the layout they give an axon op's results."""

from __future__ import annotations

from ._hooks import on_import


@on_import("torch._meta_registrations")
def meta_device_hint(meta) -> None:
    """Patch ``torch._meta_registrations.device_hint``.

    Several Python Meta kernels lay their results out by device (the FFTs,
    ``linalg_svd``, ``linalg_eig``, ``median``/``mode``, ``histc``, 2-D
    padding, ...), asking ``device_hint``: a FakeTensor answers its fake
    device, a meta tensor "cuda".  Axon's generic kernel runs these Meta
    kernels on meta tensors, so axon's eager results took CUDA's layout,
    while ``torch.compile`` (FakeTensors on axon) expected the layout of the
    other branch: the compiled code's stride assertion failed (for example
    ``torch.fft.rfft2``), and results differed in layout from the CPU's.
    While the generic kernel runs a Meta kernel for an axon op
    (``_C._meta_for_axon()``), a meta tensor answers "axon", as its
    FakeTensor would.  The generic fix: pass the device to Meta kernels.
    """
    from .. import _C

    original = meta.device_hint
    if getattr(original, "_axon_patched", False):
        return

    def device_hint(tensor) -> str:
        if getattr(tensor, "is_meta", False) and _C._meta_for_axon():
            import torch

            if not isinstance(tensor, torch._subclasses.FakeTensor):
                return "axon"
        return original(tensor)

    device_hint._axon_patched = True
    device_hint.__wrapped__ = original
    meta.device_hint = device_hint
