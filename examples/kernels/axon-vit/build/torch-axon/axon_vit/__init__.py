"""axon-vit: kernels for vision transformers on the axon device.

Functions: ``attention(q, k, v, scale)`` (softmax(q k^T * scale) v for
``[batch, seq, heads, head_dim]`` inputs, the projections' layout, one pass
per query row), ``add_layer_norm(x, residual, weight, bias, eps)`` (returns
``(LayerNorm(x + residual), x + residual)``) and ``bias_gelu(x, bias)``.
``layers`` holds the layers ``kernelize`` swaps in for Transformers' ViT:
``ViTAttention`` (the fused attention core between the projections; float32) and
``ViTLayer`` (the encoder block: residual add + LayerNorm fused, bias + GELU
fused, the attention submodule as it is, kernelized or not).  The C++ source
next to this file is JIT-built with ``torch_axon.kernel.load`` on first use;
the ops are ``torch.library`` custom ops with fake implementations and
backward formulas.
"""

from __future__ import annotations

from . import layers
from ._ops import add_layer_norm, attention, bias_gelu, library

__all__ = ["attention", "add_layer_norm", "bias_gelu", "layers", "library"]
