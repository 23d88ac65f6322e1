"""axon-layernorm: RMSNorm and LayerNorm for the axon device, each optionally
fused with the residual add before it.

Functions: ``rms_norm(x, weight, eps, residual=None)`` and
``layer_norm(x, weight, bias, eps, residual=None)`` return the normalised
tensor, or with ``residual`` the pair ``(normalised(x + residual), x +
residual)`` from one pass (the pre-norm transformer's "add & norm").
``layers`` holds the layers ``kernelize`` swaps in: ``RMSNorm`` (the forward of
Transformers' LlamaRMSNorm and its copies: ``weight``, ``variance_epsilon``),
``LayerNorm`` (``torch.nn.LayerNorm``) and ``LlamaDecoderLayer`` (Transformers'
decoder layer with the residual add fused into its post-attention RMSNorm).  The C++ source next to this file is
JIT-built with ``torch_axon.kernel.load`` on first use; the ops are
``torch.library`` custom ops with fake implementations and backward formulas.
"""

from __future__ import annotations

from . import layers
from ._ops import layer_norm, library, rms_norm

__all__ = ["rms_norm", "layer_norm", "layers", "library"]
