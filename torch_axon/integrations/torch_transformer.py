"""torch.nn.TransformerEncoder: the padding-mask fast path on axon."""

from __future__ import annotations

import functools

import torch

from ._hooks import on_import


@on_import("torch.nn.modules.transformer")
def transformer_encoder_nested_fast_path(transformer) -> None:
    """Patch ``torch.nn.modules.transformer.TransformerEncoder.forward``.

    In inference (``eval()``, no grad) with a ``src_key_padding_mask`` the encoder
    takes its "sparsity fast path" for the devices it lists (cpu, cuda, xpu and the
    PrivateUse1 backend): it packs the batch into a nested tensor
    (``torch._nested_tensor_from_mask``), runs the layers on it and pads the result
    with zeros.  Axon has no nested-tensor kernels ("NestedTensorImpl doesn't support
    strides"), so for axon inputs the wrapper runs the encoder with that path off
    (``use_nested_tensor`` false for the call, as ``enable_nested_tensor=False``
    would) and sets the padded positions to zero, which is what the fast path
    returns there; the layers still take their own fast path on dense tensors.
    Other devices, and axon calls without a padding mask, are unchanged.
    """
    cls = transformer.TransformerEncoder
    original = cls.forward
    if getattr(original, "_axon_patch", False):
        return

    @functools.wraps(original)
    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        if not (getattr(self, "use_nested_tensor", False) and src_key_padding_mask is not None
                and isinstance(src, torch.Tensor) and src.device.type == "axon"
                and not src.is_nested):
            return original(self, src, mask=mask, src_key_padding_mask=src_key_padding_mask,
                            is_causal=is_causal)
        fast = not self.training and not (torch.is_grad_enabled() and (
            src.requires_grad or any(p.requires_grad for p in self.parameters())))
        self.use_nested_tensor = False
        try:
            out = original(self, src, mask=mask, src_key_padding_mask=src_key_padding_mask,
                           is_causal=is_causal)
        finally:
            self.use_nested_tensor = True
        if fast:
            # (use_nested_tensor implies batch_first layers: [batch, seq, features])
            pad = src_key_padding_mask
            if pad.dtype != torch.bool:
                pad = pad != 0  # a float mask: -inf (or nonzero) marks padding
            out = out.masked_fill(pad.unsqueeze(-1), 0.0)
        return out

    forward._axon_patch = True
    cls.forward = forward
