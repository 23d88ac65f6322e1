"""Layers for ``kernels.kernelize`` (stateless; forward replaces the original's)."""

from __future__ import annotations

import torch
import torch.nn as nn

from ._ops import GELU, GELU_TANH, SILU, act


def _halves(x):
    d = x.shape[-1] // 2
    return x[..., :d], x[..., d:2 * d]


class SiluAndMul(nn.Module):
    """silu(x[..., :d]) * x[..., d:]."""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return act(*_halves(x), SILU)


class GeluAndMul(nn.Module):
    """gelu(x[..., :d]) * x[..., d:] (erf)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return act(*_halves(x), GELU)


class GeluTanhAndMul(nn.Module):
    """gelu(x[..., :d], approximate="tanh") * x[..., d:]."""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return act(*_halves(x), GELU_TANH)


_KIND = {"silu": SILU, "swish": SILU, "gelu": GELU, "gelu_pytorch_tanh": GELU_TANH,
         "gelu_new": GELU_TANH}


class LlamaMLP(nn.Module):
    """Transformers' LlamaMLP (gate_proj, up_proj, down_proj, act_fn) with
    act(gate) * up as one kernel; other activations keep the original math."""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kind = _KIND.get(getattr(self.config, "hidden_act", None))
        if kind is None:
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(act(self.gate_proj(x), self.up_proj(x), kind))
