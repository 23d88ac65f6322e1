"""Jagged nested tensors: attention on axon."""

from __future__ import annotations

import functools

import torch

from ._hooks import on_import


@on_import("torch.nested._internal.ops")
def jagged_sdpa_math_path(ops) -> None:
    """Patch ``torch.nested._internal.ops.jagged_scaled_dot_product_attention`` (the
    function ``F.scaled_dot_product_attention`` reaches for jagged nested tensors).

    Its flash and memory-efficient paths accept cuda tensors only
    (``can_use_flash_attention``, ``can_use_efficient_attention``); on any device but cuda
    it takes its math path, which converts the inputs to nested tensors of the strided layout and runs
    ``_scaled_dot_product_attention_math`` on them.  Axon has no strided nested tensors,
    so the conversion failed (and ``NestedTensor.__torch_function__`` then retried on the
    fused kernel, which raised a misleading "not implemented" for
    ``_scaled_dot_product_fused_attention_overrideable``).  For axon inputs that upstream
    sends down the math path, the wrapper computes the same thing one sequence at a time
    on the dense values: each sequence's ``[heads, length, dim]`` slices through
    ``F.scaled_dot_product_attention`` (dropout and scale as given), the results joined
    into a jagged tensor with the query's offsets.  Every other call (other devices, the
    non-ragged special case, the errors upstream raises for masks or ``is_causal``) is
    upstream's.
    """
    original = ops.jagged_scaled_dot_product_attention
    if getattr(original, "_axon_patch", False):
        return
    from torch.nested._internal import sdpa
    from torch.nested._internal.nested_tensor import nested_view_from_values_offsets_lengths

    def per_sequence(query, key, value, dropout_p, scale, enable_gqa):
        # [B, H, j, D] (ragged dim 2) -> per sequence [H, len, D]
        def pieces(t):
            dense = t.transpose(1, 2)  # [B, j, H, D], ragged dim 1
            lengths = dense.offsets().diff().tolist()
            return [p.transpose(0, 1) for p in dense.values().split(lengths, dim=0)]

        qs, ks, vs = pieces(query), pieces(key), pieces(value)
        if not len(qs) == len(ks) == len(vs):
            raise RuntimeError("scaled_dot_product_attention: query, key and value must have "
                               f"the same batch size, got {len(qs)}, {len(ks)} and {len(vs)}")
        outs = [torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa)
                .transpose(0, 1) for q, k, v in zip(qs, ks, vs)]
        values = torch.cat(outs, dim=0)  # [sum of lengths, H, Dv]
        return nested_view_from_values_offsets_lengths(
            values, query.offsets(), lengths=query.lengths(),
            min_seqlen=query._maybe_min_seqlen, max_seqlen=query._maybe_max_seqlen,
        ).transpose(1, 2)

    @functools.wraps(original)
    def patched(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                enable_gqa=False):
        if getattr(query, "device", None) is None or query.device.type != "axon":
            return original(query, key, value, attn_mask, dropout_p, is_causal, scale,
                            enable_gqa)
        q, k, v, m = sdpa._autocast(query, key, value, attn_mask)
        sdpa._validate_sdpa_input(q, k, v, m, dropout_p, is_causal, scale)
        special = q.dim() > 3 and k.dim() > 3 and v.dim() > 3 and q._ragged_idx == 1
        if not special and sdpa._select_sdp_backend(
                q, k, v, m, dropout_p, is_causal, enable_gqa) == sdpa.SDPBackend.MATH:
            return per_sequence(q, k, v, dropout_p, scale, enable_gqa)
        return original(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    patched._axon_patch = True
    ops.jagged_scaled_dot_product_attention = patched


@on_import("torch.nested")
def strided_nested_on_axon_refused(nested) -> None:
    """Patch ``torch.nested.nested_tensor`` and ``torch.nested.as_nested_tensor``.

    Of the strided layout (the default) with ``device="axon"`` and CPU tensors
    or data, upstream builds the nested tensor on the CPU and moves its buffer
    to axon inside one CPU kernel, so no axon kernel refuses it (made from axon
    tensors, ``_nested_tensor_from_tensor_list`` does: csrc/aten/Fallback.cpp),
    and it failed only at its first use.  The wrappers raise that first use's
    error at the call; the jagged layout and other devices are upstream's.
    """
    import inspect

    from ._tools import replace_function

    for name in ("nested_tensor", "as_nested_tensor"):
        original = getattr(nested, name)
        if getattr(original, "_axon_patch", False):
            continue
        signature = inspect.signature(original)

        def wrapper(*args, _original=original, _signature=signature, _name=name, **kwargs):
            bound = _signature.bind(*args, **kwargs).arguments
            layout, device = bound.get("layout"), bound.get("device")
            if layout in (None, torch.strided) and device is not None:
                if isinstance(device, int):
                    device = torch.device(torch.accelerator.current_accelerator().type, device)
                if torch.device(device).type == "axon":
                    raise NotImplementedError(
                        f"Could not run 'torch.nested.{_name}' on axon: it makes a nested "
                        "tensor of the strided layout, which axon does not support (no "
                        "NestedTensorPrivateUse1 kernels). Use the jagged layout "
                        f"(torch.nested.{_name}(..., layout=torch.jagged)), which works on "
                        "axon, or keep strided nested tensors on the CPU.")
            return _original(*args, **kwargs)

        functools.update_wrapper(wrapper, original)
        wrapper._axon_patch = True
        replace_function(nested, name, wrapper)
