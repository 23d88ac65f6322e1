"""torch.nn.TransformerEncoder: the padding-mask fast path on axon."""

from __future__ import annotations

import functools
import threading

import torch

from ._hooks import on_import

_probe = threading.local()


class _NestedPath(Exception):
    """Raised by the probe where upstream converts an axon batch to a nested tensor."""


@on_import("torch.nn.modules.transformer")
def transformer_encoder_nested_fast_path(transformer) -> None:
    """Patch ``torch.nn.modules.transformer.TransformerEncoder.forward``.

    In inference with a ``src_key_padding_mask`` the encoder takes its "sparsity fast
    path" on the devices it lists (cpu, cuda, xpu and the PrivateUse1 backend): it packs
    the batch into a nested tensor (``torch._nested_tensor_from_mask``), runs the layers
    on it, pads the result with zeros and applies the final norm.  Axon has no
    nested-tensor kernels ("NestedTensorImpl doesn't support strides").  The wrapper lets
    upstream decide (its own checks: eval mode, no grad, no ``mask``, left-aligned
    padding, autocast, ...): for axon inputs, a probe in ``torch._nested_tensor_from_mask``
    stops the call where upstream would convert, and the wrapper runs the same layers on
    the dense batch with the padding mask instead, sets the padded positions to zero, then
    applies the norm, which is what the fast path returns.  Other devices, and axon calls
    upstream does not send down that path, are unchanged.
    """
    cls = transformer.TransformerEncoder
    original = cls.forward
    if getattr(original, "_axon_patch", False):
        return
    nested_from_mask = torch._nested_tensor_from_mask
    if not getattr(nested_from_mask, "_axon_probe", False):
        @functools.wraps(nested_from_mask)
        def probe(t, mask, *args, **kwargs):
            if getattr(_probe, "active", False) and t.device.type == "axon":
                raise _NestedPath
            return nested_from_mask(t, mask, *args, **kwargs)

        probe._axon_probe = True
        torch._nested_tensor_from_mask = probe

    def dense_fast_path(self, src, src_key_padding_mask, is_causal):
        # The nested path's results on the dense batch (upstream: layers on the nested
        # tensor, to_padded_tensor(0.0), then the norm).
        pad = src_key_padding_mask
        if pad.dtype != torch.bool:
            pad = pad != 0  # a float mask: -inf (nonzero) marks padding, 0 keeps
        is_causal = transformer._detect_is_causal_mask(None, is_causal, src.size(1))
        output = src
        for mod in self.layers:
            output = mod(output, src_mask=None, is_causal=is_causal, src_key_padding_mask=pad)
        output = output.masked_fill(pad.unsqueeze(-1), 0.0)
        if self.norm is not None:
            output = self.norm(output)
        return output

    @functools.wraps(original)
    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        if (src_key_padding_mask is None or not isinstance(src, torch.Tensor)
                or src.device.type != "axon" or getattr(_probe, "active", False)):
            return original(self, src, mask=mask, src_key_padding_mask=src_key_padding_mask,
                            is_causal=is_causal)
        _probe.active = True
        try:
            return original(self, src, mask=mask, src_key_padding_mask=src_key_padding_mask,
                            is_causal=is_causal)
        except _NestedPath:
            pass
        finally:
            _probe.active = False
        return dense_fast_path(self, src, src_key_padding_mask, is_causal)

    forward._axon_patch = True
    cls.forward = forward
