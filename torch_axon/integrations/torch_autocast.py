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
