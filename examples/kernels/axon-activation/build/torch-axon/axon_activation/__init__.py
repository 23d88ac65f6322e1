"""axon-activation: gated activations for the axon device (SiLU/GELU-and-mul).

The kernels-community ``activation`` interface: ``silu_and_mul(out, x)``,
``gelu_and_mul(out, x)``, ``gelu_tanh_and_mul(out, x)`` write
``act(x[..., :d]) * x[..., d:]`` into ``out`` (``d = x.shape[-1] // 2``); the
functional forms (``silu_mul(gate, up)``, ...) return a new tensor, and
``layers`` holds the layers ``kernelize`` swaps in.  The C++ source next to
this file is JIT-built with ``torch_axon.kernel.load`` on first use; each
kernel is a ``torch.library`` custom op (``<namespace>::act_mul``, with a fake
implementation for ``torch.compile`` and a backward for autograd).
"""

from __future__ import annotations

import torch

from . import layers
from ._ops import GELU, GELU_TANH, SILU, act, act_out, library

__all__ = ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul", "silu_mul", "gelu_mul",
           "gelu_tanh_mul", "layers", "library"]


def _halves(x: torch.Tensor):
    d = x.shape[-1] // 2
    return x[..., :d], x[..., d:2 * d]


def silu_and_mul(out: torch.Tensor, x: torch.Tensor) -> None:
    """out = silu(x[..., :d]) * x[..., d:]."""
    act_out(out, *_halves(x), SILU)


def gelu_and_mul(out: torch.Tensor, x: torch.Tensor) -> None:
    """out = gelu(x[..., :d]) * x[..., d:] (exact, erf)."""
    act_out(out, *_halves(x), GELU)


def gelu_tanh_and_mul(out: torch.Tensor, x: torch.Tensor) -> None:
    """out = gelu(x[..., :d], approximate="tanh") * x[..., d:]."""
    act_out(out, *_halves(x), GELU_TANH)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up as one kernel (Llama's MLP)."""
    return act(gate, up, SILU)


def gelu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return act(gate, up, GELU)


def gelu_tanh_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return act(gate, up, GELU_TANH)
