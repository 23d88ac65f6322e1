"""Autocast on axon: the parts of PyTorch that list autocast keys by device."""

from __future__ import annotations

from ._hooks import on_import


@on_import("torch._ops")
def higher_order_ops_autocast(ops) -> None:
    """Patch ``torch._ops._HIGHER_ORDER_OP_DEFAULT_FALLTHROUGH_DISPATCH_KEYS``.

    Every higher-order op (``torch.cond``, ``while_loop``, ``flex_attention``,
    checkpoint's ``tag_activation_checkpoint``, ...) falls through the autocast
    keys of cpu, cuda and xpu only, so under ``torch.autocast("axon")`` each
    raised "could not find kernel for HigherOrderOperator ... at dispatch key
    DispatchKey.AutocastPrivateUse1".  The key is added to the list (for ops
    created later) and made a fall-through of the ops that exist and have no
    kernel of their own for it: the ops inside then autocast as they do on
    cpu, cuda and xpu.  The generic fix: list every autocast key (or the
    PrivateUse1 one) upstream.
    """
    import torch

    key = torch._C.DispatchKey.AutocastPrivateUse1
    keys = ops._HIGHER_ORDER_OP_DEFAULT_FALLTHROUGH_DISPATCH_KEYS
    if key in keys:
        return
    keys.append(key)
    for op in list(ops._higher_order_ops.values()):
        if key not in op.py_kernels:
            op.fallthrough(key)


@on_import("torch.amp.grad_scaler")
def grad_scaler_without_devices(grad_scaler) -> None:
    """Patch ``torch.amp.grad_scaler.GradScaler.__init__``.

    ``GradScaler("cuda")`` on a machine without CUDA warns and disables itself
    (its ``update``/``step`` then do plain steps); any other device type stays
    enabled, so ``GradScaler("axon")`` without an axon device scaled losses of
    CPU tensors.  The wrapper does for axon what upstream does for cuda.
    """
    import warnings

    import torch

    cls = grad_scaler.GradScaler
    original = cls.__init__
    if getattr(original, "_axon_patch", False):
        return

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self._device == "axon" and self._enabled and not torch.axon.is_available():
            warnings.warn("torch.amp.GradScaler is enabled, but axon is not available.  "
                          "Disabling.")
            self._enabled = False

    __init__.__wrapped__ = original
    __init__.__doc__ = original.__doc__
    __init__._axon_patch = True
    cls.__init__ = __init__
