"""DTensor: scaled-dot-product attention on sharded axon tensors.

``F.scaled_dot_product_attention`` on DTensors dispatches the op SDPA chose to
DTensor's sharding propagation, which has strategies for CUDA's backend ops
(``_scaled_dot_product_flash_attention``, ``_efficient_attention``,
``_cudnn_attention``: ``torch/distributed/tensor/_ops/_matrix_ops.py``) but not
for ``_scaled_dot_product_fused_attention_overrideable``, the op every
PrivateUse1 backend's SDPA runs: "Operator aten._scaled_dot_product_fused_
attention_overrideable.default does not have a sharding strategy registered".
The strategies below are upstream's for the other attention ops: everything
replicated, heads sharded (tensor parallelism), or batch sharded, with the
mask (``attn_bias``) following where it has that dimension.
"""

from __future__ import annotations

from ._hooks import on_import


def _mask_placement(strategy, dim: str, shard):
    """The mask's placement when q/k/v are sharded on `dim` ("heads" or
    "batch"): sharded on its own dimension of that name if it has one of size
    > 1 (masks broadcast from the right: [B, H, L, S], [H, L, S], [L, S]),
    else replicated."""
    from torch.distributed.tensor.placement_types import Replicate

    shape = strategy.shape
    index = {"heads": len(shape) - 3, "batch": len(shape) - 4}[dim]
    if index >= 0 and shape[index] > 1:
        return shard(index)
    return Replicate()


@on_import("torch.distributed.tensor._ops._matrix_ops")
def overrideable_attention_sharding(_matrix_ops) -> None:
    """Patch ``torch.distributed.tensor._ops._matrix_ops.register_op_strategy`` registrations:
    add strategies for ``aten._scaled_dot_product_fused_attention_overrideable`` and its
    backward.

    Upstream registers SDPA sharding strategies only for the ops of its own
    backends (cuda's flash / efficient / cudnn attention, and the cpu flash op
    has none either), so SDPA on DTensors fails for every PrivateUse1 device;
    axon's SDPA runs the overrideable op.  The generic upstream fix: register
    the same strategies for the overrideable op, whose outputs are the cudnn
    op's and whose backward takes the mask like the efficient op's.
    """
    import torch
    from torch.distributed.tensor._api import DTensor
    from torch.distributed.tensor._op_schema import OpStrategy, RuntimeSchemaInfo
    from torch.distributed.tensor._ops.utils import (
        expand_to_full_mesh_op_strategy, register_op_strategy)
    from torch.distributed.tensor.placement_types import Replicate, Shard

    aten = torch.ops.aten
    fwd = aten._scaled_dot_product_fused_attention_overrideable.default
    bwd = aten._scaled_dot_product_fused_attention_overrideable_backward.default
    if fwd in DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs:
        return  # upstream has one now (or this ran before)

    def placements(args, bias_index):
        """(q/k/v placement, mask placement or None) per strategy: all
        replicated, heads sharded, batch sharded."""
        bias = args[bias_index] if len(args) > bias_index else None  # (trailing defaults
        has_bias = isinstance(bias, OpStrategy)                        # are not in args)
        for shard, dim in ((None, None), (Shard(1), "heads"), (Shard(0), "batch")):
            mask = None
            if has_bias:
                mask = Replicate() if dim is None else _mask_placement(bias, dim, Shard)
            yield shard if shard is not None else Replicate(), mask

    def heads_divide(args, q_index):
        """Grouped-query heads (fewer key/value heads) sharded on heads must
        split on group boundaries: the shard count divides the key/value heads
        (else a shard would pair query heads with another group's keys)."""
        q_heads, kv_heads = args[q_index].shape[1], args[q_index + 1].shape[1]

        def valid(input_specs, _output_specs):
            if q_heads == kv_heads:
                return True
            spec = input_specs[0]  # the query's (its first tensor input after grad_out)
            shards = 1
            for mesh_dim, placement in enumerate(spec.placements):
                if isinstance(placement, Shard) and placement.dim == 1:
                    shards *= spec.mesh.size(mesh_dim)
            return kv_heads % shards == 0
        return valid

    def forward_strategy(op_schema):
        # (query, key, value, attn_bias?, dropout_p, is_causal, return_debug_mask, scale)
        # -> out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed,
        #    philox_offset (CPU scalars), debug_attn_mask (undefined)
        args = op_schema.args_schema
        strategies = [[p, p, None, None, None, None, None, None, None, p, p, p] +
                      ([] if mask is None else [mask])
                      for p, mask in placements(args, 3)]
        return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(), op_schema,
                                               strategies, input_index=9,
                                               is_valid_strategy_cb=heads_divide(args, 0))

    def backward_strategy(op_schema):
        # (grad_out, query, key, value, attn_bias?, grad_input_mask, out, logsumexp,
        #  cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed,
        #  philox_offset, scale) -> grad_q, grad_k, grad_v, grad_attn_bias
        args = op_schema.args_schema
        strategies = []
        for p, mask in placements(args, 4):
            # (the mask's gradient: never computed, axon's kernel refuses it)
            row = [p, p, p, mask]
            for i, arg in enumerate(args):
                if isinstance(arg, OpStrategy):
                    # grad_out, q, k, v, out, logsumexp; the mask; cum_seq_*, philox scalars
                    row.append(p if i in (0, 1, 2, 3, 6, 7) else mask if i == 4 else Replicate())
            strategies.append(row)
        valid = heads_divide(args, 1)  # (inputs: grad_out, q, k, ...)
        return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(), op_schema,
                                               strategies, input_index=4,
                                               is_valid_strategy_cb=lambda i, o: valid(i[1:], o))

    register_op_strategy(fwd, schema_info=RuntimeSchemaInfo(4))(forward_strategy)
    register_op_strategy(bwd)(backward_strategy)
    forward_strategy._axon_patch = backward_strategy._axon_patch = True


@on_import("torch.distributed.tensor.experimental._context_parallel._attention")
def context_parallel_overrideable_attention(cp_attention) -> None:
    """Patch ``torch.distributed.tensor.experimental._context_parallel._attention.custom_ops``:
    ring attention for ``aten._scaled_dot_product_fused_attention_overrideable``.

    ``context_parallel()`` hands SDPA's backend ops to ring attention through
    DTensor custom-op handlers, listed for the cuda backends only (flash,
    memory-efficient and cudnn attention); the op SDPA runs on a PrivateUse1
    device (axon's; mtia, xpu on some paths) went to DTensor's ordinary
    propagation instead, which gathers the sequence and returns a replicated
    output that the context-parallel output hook then took for the local
    shard.  The handlers below run the overrideable op as upstream's ring
    flash attention (``_scaled_dot_product_ring_flash_attention`` and its
    backward, which call ``aten._scaled_dot_product_flash_attention``, an axon
    op), with the same restrictions (no attention mask; no dropout, which the
    ring's backward cannot replay), for q, k, v sharded on the sequence.  The generic upstream
    fix: list the overrideable op with the flash op's ring functions.
    """
    import torch
    from torch.distributed.tensor import DTensor, Shard

    aten = torch.ops.aten
    fwd = aten._scaled_dot_product_fused_attention_overrideable.default
    bwd = aten._scaled_dot_product_fused_attention_overrideable_backward.default
    ops = getattr(cp_attention, "custom_ops", None)
    ring_fwd = getattr(cp_attention, "_scaled_dot_product_ring_flash_attention", None)
    ring_bwd = getattr(cp_attention, "_scaled_dot_product_ring_flash_attention_backward", None)
    if not isinstance(ops, dict) or fwd in ops or ring_fwd is None or ring_bwd is None:
        return

    def arg(args, kwargs, i, name, default):
        return args[i] if len(args) > i else kwargs.get(name, default)

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    def sequence_shards(name, *tensors):
        """The mesh and placements of q, k, v sharded on the sequence (what
        context_parallel's input hook makes); anything else inside the
        context (heads-sharded or replicated attention) is refused rather than
        taken for sequence shards."""
        mesh = tensors[0].device_mesh
        for t in tensors:
            if not (isinstance(t, DTensor) and t.device_mesh == mesh and mesh.ndim == 1
                    and tuple(t.placements) == (Shard(2),)):
                raise NotImplementedError(
                    f"{name} under context_parallel on axon: expected query, key and value "
                    "sharded on the sequence (Shard(2)) over a 1-D mesh, got "
                    f"{[getattr(x, 'placements', type(x).__name__) for x in tensors]}")
        return mesh, (Shard(2),)

    def forward(op_call, args, kwargs):
        q, k, v = args[:3]
        if arg(args, kwargs, 3, "attn_bias", None) is not None:
            raise NotImplementedError(
                "context parallelism (ring attention) on axon takes no attention mask, as with "
                "CUDA's flash attention; use is_causal=True for causal masking")
        if arg(args, kwargs, 4, "dropout_p", 0.0) > 0:
            raise NotImplementedError(
                "context parallelism (ring attention) on axon takes no attention dropout (each "
                "ring step draws its own random numbers, which the backward cannot replay)")
        mesh, placements = sequence_shards("scaled_dot_product_attention", q, k, v)
        outs = ring_fwd(mesh, local(q), local(k), local(v),
                        arg(args, kwargs, 4, "dropout_p", 0.0),
                        arg(args, kwargs, 5, "is_causal", False),
                        arg(args, kwargs, 6, "return_debug_mask", False),
                        scale=arg(args, kwargs, 7, "scale", None))
        out, lse, *rest = outs
        return (DTensor.from_local(out, mesh, placements, run_check=False),
                DTensor.from_local(lse, mesh, placements, run_check=False), *rest)

    def backward(op_call, args, kwargs):
        names = ["grad_out", "query", "key", "value", "attn_bias", "grad_input_mask", "out",
                 "logsumexp", "cum_seq_q", "cum_seq_k", "max_q", "max_k", "dropout_p",
                 "is_causal", "philox_seed", "philox_offset", "scale"]
        a = {n: arg(args, kwargs, i, n, None) for i, n in enumerate(names)}
        q = a["query"]
        mesh, placements = sequence_shards("scaled_dot_product_attention backward", q,
                                           a["key"], a["value"])
        grads = ring_bwd(mesh, local(a["grad_out"]), local(q), local(a["key"]), local(a["value"]),
                         local(a["out"]), local(a["logsumexp"]), a["cum_seq_q"], a["cum_seq_k"],
                         a["max_q"], a["max_k"], a["dropout_p"] or 0.0, bool(a["is_causal"]),
                         a["philox_seed"], a["philox_offset"], scale=a["scale"])
        return tuple(DTensor.from_local(g, mesh, placements, run_check=False)
                     for g in grads[:3]) + (None,)

    forward._axon_patch = backward._axon_patch = True
    ops[fwd] = forward
    ops[bwd] = backward
