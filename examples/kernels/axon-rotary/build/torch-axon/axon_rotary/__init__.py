"""axon-rotary: rotary position embedding for the axon device.

``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` is Transformers'
function of the same name (Llama and its copies: ``q * cos + rotate_half(q) *
sin``, the same for ``k``), with the query and the key rotated by one kernel
launch.  ``layers.RotaryPosEmb`` is the layer ``kernelize`` swaps in for
Transformers' ``rotary_pos_emb`` function layer.  The C++ source next to this
file is JIT-built with ``torch_axon.kernel.load`` on first use; the op is a
``torch.library`` custom op with a fake implementation and a backward.
"""

from __future__ import annotations

from . import layers
from ._ops import apply_rotary_pos_emb, library

__all__ = ["apply_rotary_pos_emb", "layers", "library"]
