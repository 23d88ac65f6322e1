"""Layers for ``kernels.kernelize`` (stateless; forward replaces the original's)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._ops import add_layer_norm, attention, bias_gelu


class ViTAttention(nn.Module):
    """Transformers' ViTAttention (q/k/v/o projections, ``head_dim``, ``scaling``)
    with the attention core as one kernel that reads the projections in their
    [batch, seq, heads, head_dim] layout and writes o_proj's input layout.
    An attention mask, attention dropout in training, a request for the
    attention weights, or bfloat16/float16 activations run the original forward
    (axon's half-precision matmuls use the CPU's bf16 dot-product instructions,
    which the kernel API's float32 Vec does not reach: the kernel is slower there)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **kwargs):
        if (attention_mask is not None or kwargs.get("output_attentions")
                or hidden_states.dtype != torch.float32
                or (self.training and self.attention_dropout > 0)):
            return type(self).forward(self, hidden_states, attention_mask, **kwargs)
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape)
        k = self.k_proj(hidden_states).view(shape)
        v = self.v_proj(hidden_states).view(shape)
        out = attention(q, k, v, self.scaling)
        return self.o_proj(out.flatten(-2)), None


class ViTLayer(nn.Module):
    """Transformers' ViTLayer (pre-norm encoder block) with the residual add and
    layernorm_after fused, and fc1's bias with an exact GELU fused; the attention
    submodule is called as it is (kernelized with ``ViTAttention`` or not)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **kwargs) -> torch.Tensor:
        ln1, ln2, mlp = self.layernorm_before, self.layernorm_after, self.mlp
        x = F.layer_norm(hidden_states, ln1.normalized_shape, ln1.weight, ln1.bias, ln1.eps)
        x, _ = self.attention(x, attention_mask, **kwargs)
        x = self.dropout(x)
        y, h = add_layer_norm(x, hidden_states, ln2.weight, ln2.bias, ln2.eps)
        if getattr(mlp.config, "hidden_act", None) == "gelu" and mlp.fc1.bias is not None:
            y = bias_gelu(F.linear(y, mlp.fc1.weight), mlp.fc1.bias)
        else:
            y = mlp.activation_fn(mlp.fc1(y))
        y = self.dropout(mlp.fc2(y))
        return y + h
