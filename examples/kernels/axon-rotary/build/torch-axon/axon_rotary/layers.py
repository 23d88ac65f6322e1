"""Layers for ``kernels.kernelize`` (stateless; forward replaces the original's)."""

from __future__ import annotations

import torch
import torch.nn as nn

from ._ops import apply_rotary_pos_emb


class RotaryPosEmb(nn.Module):
    """Transformers' ``apply_rotary_pos_emb`` (as the function layer
    ``use_kernel_forward_from_hub("rotary_pos_emb")`` makes of it)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                unsqueeze_dim: int = 1):
        return apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
