"""FlexAttention (``torch.nn.attention.flex_attention``) on axon.

Eager mode needs nothing of axon's own: the ``flex_attention`` higher-order
op's dense implementation (``torch/_higher_order_ops/flex_attention.py::
sdpa_dense``/``sdpa_dense_backward``) is ATen ops, which run as axon kernels.
Only the front end refuses the device.  Under torch.compile, Inductor's side
is in ``torch_axon/compiler/flex_attention.py``.
"""

from __future__ import annotations

import functools

from ._hooks import on_import


@on_import("torch.nn.attention.flex_attention")
def flex_attention_device(flex_attention) -> None:
    """Patch ``torch/nn/attention/flex_attention.py::_validate_device``.

    It accepts a closed set of device types (``{"cuda", "cpu", "xpu", "hpu",
    "mps"}``, then raises "FlexAttention is only supported on CUDA, CPU, HPU,
    or MPS devices"), and refuses backward on "cpu" and "mps" (their compiled
    kernels are forward-only).  axon runs the op's dense implementation in
    eager mode and compiles forward and backward (see
    ``torch_axon.compiler.flex_attention``), so axon inputs pass, backward
    included.  Other devices get the original checks; once upstream accepts
    any device with the dense implementation (the generic fix: only refuse
    devices known not to work, e.g. backward on cpu/mps), this wrapper changes
    nothing.
    """
    original = flex_attention._validate_device
    if getattr(original, "_axon_patch", False):
        return

    @functools.wraps(original)
    def _validate_device(query, key, value) -> None:
        if query.device.type == "axon":
            return None
        return original(query, key, value)

    _validate_device._axon_patch = True
    flex_attention._validate_device = _validate_device


@on_import("torch._higher_order_ops.flex_attention")
def flex_attention_autocast(hops) -> None:
    """Give the ``flex_attention`` higher-order ops an ``AutocastPrivateUse1`` entry.

    ``torch/_higher_order_ops/flex_attention.py`` registers the forward op's
    autocast (cast q, k, v to the autocast dtype, then run with autocast
    excluded: ``_flex_attention_autocast_impl``) for ``AutocastCUDA`` and
    ``AutocastCPU`` only, and a higher-order op falls through only the
    autocast keys of ``torch/_ops.py::_HIGHER_ORDER_OP_DEFAULT_FALLTHROUGH_DISPATCH_KEYS``
    (CPU, CUDA, XPU): under ``torch.autocast("axon")`` both ops raised
    "could not find kernel for HigherOrderOperator flex_attention at dispatch
    key DispatchKey.AutocastPrivateUse1".  The forward op gets the same
    casts (excluding ``AutocastPrivateUse1`` itself, which upstream's helper
    does not), the backward op falls through, as for CPU and CUDA.  The
    generic fix: register the autocast implementation for every autocast key
    and exclude them all while redispatching, and add ``AutocastPrivateUse1``
    to the default fall-through keys.  Nothing is registered once upstream
    has an entry for the key.
    """
    import torch

    key = torch._C.DispatchKey.AutocastPrivateUse1
    flex, flex_backward = hops.flex_attention, hops.flex_attention_backward
    if key not in flex.py_kernels:

        def flex_attention_autocast_privateuse1(query, key_, value, score_mod, block_mask, scale,
                                                kernel_options, score_mod_other_buffers=(),
                                                mask_mod_other_buffers=()):
            device_type = query.device.type
            dtype = torch.get_autocast_dtype(device_type)
            query, key_, value = (hops._autocast_cast(t, device_type, dtype)
                                  for t in (query, key_, value))
            with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
                return flex(query, key_, value, score_mod, block_mask, scale, kernel_options,
                            score_mod_other_buffers, mask_mod_other_buffers)

        flex_attention_autocast_privateuse1._axon_patch = True
        flex.py_impl(key)(flex_attention_autocast_privateuse1)
    if key not in flex_backward.py_kernels:
        flex_backward.fallthrough(key)

