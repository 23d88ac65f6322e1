"""The custom ops of axon-activation (torch.library) and their kernel launches."""

from __future__ import annotations

import functools
import hashlib
import math
from pathlib import Path

import torch
import torch.nn.functional as F

SILU, GELU, GELU_TANH = 0, 1, 2
_DIR = Path(__file__).resolve().parent
# One op namespace per copy of the package (two checkouts can be loaded at once).
library = "axon_activation_" + hashlib.sha1(str(_DIR).encode()).hexdigest()[:8]
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def _kernels():
    from torch_axon import kernel

    return kernel.load("axon_activation", sources=[str(_DIR / "activation.cpp")])


def _direct(*tensors) -> bool:
    from torch_axon.kernel import can_skip_dispatch

    return can_skip_dispatch(*tensors)


def act(gate: torch.Tensor, up: torch.Tensor, kind: int) -> torch.Tensor:
    """act(gate) * up (the op, or its implementation directly when nothing needs the op)."""
    if _direct(gate, up):
        return _compute(gate, up, kind)
    return act_mul(gate, up, kind)


def act_out(out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, kind: int) -> None:
    if _direct(out, gate, up):
        return _act_mul_out_impl(out, gate, up, kind)
    act_mul_out(out, gate, up, kind)


def _reference(gate, up, kind):
    if kind == SILU:
        return F.silu(gate) * up
    return F.gelu(gate, approximate="tanh" if kind == GELU_TANH else "none") * up


def _check(gate, up):
    if gate.shape != up.shape:
        raise RuntimeError(f"act_mul: gate and up must have the same shape, got "
                           f"{tuple(gate.shape)} and {tuple(up.shape)}")
    if gate.dtype != up.dtype:
        raise RuntimeError(f"act_mul: gate and up must have the same dtype, got "
                           f"{gate.dtype} and {up.dtype}")


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t as [rows, d] with unit stride in the last dim (a view when possible)."""
    if t.dim() == 0:
        t = t.reshape(1)
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        t = t.contiguous()
    return t.reshape(-1, t.shape[-1])


def _dense(t, dtype=None):
    from torch_axon.kernel import contiguous_as_fake

    return contiguous_as_fake(t, dtype)


def _launch(gate, up, out, kind):
    """out (contiguous) = act(gate) * up."""
    if out.numel() == 0:
        return
    _kernels().act_mul(_rows(gate), _rows(up), _rows(out), ints=(kind,),
                       written=(2,), name="axon_activation.act_mul")


def _compute(gate, up, kind):
    _check(gate, up)
    if gate.device.type != "axon" or gate.dtype not in _DTYPES:
        return _dense(_reference(gate, up, kind))
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    _launch(gate, up, out, kind)
    return out


@torch.library.custom_op(f"{library}::act_mul", mutates_args=())
def act_mul(gate: torch.Tensor, up: torch.Tensor, kind: int) -> torch.Tensor:
    """act(gate) * up; kind: 0 silu, 1 gelu (erf), 2 gelu (tanh)."""
    return _compute(gate, up, kind)


@act_mul.register_fake
def _(gate, up, kind):
    _check(gate, up)
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


def _act_and_grad(g: torch.Tensor, kind: int):
    """act(g) and act'(g), in float32."""
    if kind == SILU:
        s = torch.sigmoid(g)
        return g * s, s * (1 + g * (1 - s))
    if kind == GELU:
        cdf = 0.5 * (1 + torch.erf(g * (1 / math.sqrt(2))))
        pdf = torch.exp(-0.5 * g * g) * (1 / math.sqrt(2 * math.pi))
        return g * cdf, cdf + g * pdf
    k = math.sqrt(2 / math.pi)
    t = torch.tanh(k * (g + 0.044715 * g ** 3))
    return 0.5 * g * (1 + t), 0.5 * (1 + t) + 0.5 * g * (1 - t * t) * k * (1 + 3 * 0.044715 * g * g)


def _setup(ctx, inputs, output):
    gate, up, kind = inputs
    ctx.save_for_backward(gate, up)
    ctx.kind = kind


def _backward(ctx, grad):
    gate, up = ctx.saved_tensors
    a, da = _act_and_grad(gate.float(), ctx.kind)
    g = grad.float()
    return (g * up.float() * da).to(gate.dtype), (g * a).to(up.dtype), None


act_mul.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op(f"{library}::act_mul_out", mutates_args=("out",))
def act_mul_out(out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, kind: int) -> None:
    """out = act(gate) * up (out: the shape and dtype of gate)."""
    _act_mul_out_impl(out, gate, up, kind)


def _act_mul_out_impl(out, gate, up, kind):
    _check(gate, up)
    if out.shape != gate.shape or out.dtype != gate.dtype:
        raise RuntimeError(f"act_mul: out must have shape {tuple(gate.shape)} and dtype "
                           f"{gate.dtype}, got {tuple(out.shape)} and {out.dtype}")
    if out.device.type == "axon" and out.dtype in _DTYPES and out.is_contiguous() \
            and gate.device == out.device:
        _launch(gate, up, out, kind)
    else:
        out.copy_(_compute(gate, up, kind))


@act_mul_out.register_fake
def _(out, gate, up, kind):
    _check(gate, up)
