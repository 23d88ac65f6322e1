"""Layers for ``kernels.kernelize`` (stateless; forward replaces the original's)."""

from __future__ import annotations

import torch
import torch.nn as nn

from ._ops import layer_norm, rms_norm


class RMSNorm(nn.Module):
    """Transformers' LlamaRMSNorm (``weight``, ``variance_epsilon``) as one kernel.

    LlamaRMSNorm returns ``weight * normed.to(input dtype)``, in the promoted
    dtype of the two; when they differ the original math runs."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        eps = getattr(self, "variance_epsilon", None)
        if eps is None:
            eps = getattr(self, "eps", 1e-6)
        w = self.weight
        if w.dtype != hidden_states.dtype:
            h = hidden_states.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
            return w * h.to(hidden_states.dtype)
        return rms_norm(hidden_states, w, eps)


class LayerNorm(nn.Module):
    """torch.nn.LayerNorm over the last dim (``weight``, ``bias``, ``eps``,
    ``normalized_shape``) as one kernel; several normalised dims run the original."""

    can_torch_compile = True
    has_backward = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if len(self.normalized_shape) != 1:
            return nn.functional.layer_norm(input, self.normalized_shape, self.weight, self.bias,
                                            self.eps)
        return layer_norm(input, self.weight, self.bias, self.eps)


class LlamaDecoderLayer(nn.Module):
    """Transformers' LlamaDecoderLayer with the residual add after the attention fused
    into post_attention_layernorm: one kernel writes ``residual + attention`` and its
    RMSNorm (the layer's own submodules, kernelized or not, do the rest)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, position_ids=None,
                cache=None, use_cache=False, position_embeddings=None, **kwargs) -> torch.Tensor:
        if cache is None and "past_key_values" in kwargs:  # the deprecated name
            cache = kwargs.pop("past_key_values")
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                          position_ids=position_ids, cache=cache, use_cache=use_cache,
                                          position_embeddings=position_embeddings, **kwargs)
        norm = self.post_attention_layernorm
        if norm.weight.dtype == hidden_states.dtype and type(norm).__name__ == "LlamaRMSNorm":
            hidden_states, residual = rms_norm(hidden_states, norm.weight, norm.variance_epsilon,
                                               residual=residual)
        else:
            residual = residual + hidden_states
            hidden_states = norm(residual)
        hidden_states = self.mlp(hidden_states)
        return residual + hidden_states
