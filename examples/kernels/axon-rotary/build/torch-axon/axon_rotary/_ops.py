"""The custom op of axon-rotary (torch.library) and its kernel launch."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import torch

_DIR = Path(__file__).resolve().parent
library = "axon_rotary_" + hashlib.sha1(str(_DIR).encode()).hexdigest()[:8]
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def _kernels():
    from torch_axon import kernel

    return kernel.load("axon_rotary", sources=[str(_DIR / "rotary.cpp")])


def _direct(*tensors) -> bool:
    from torch_axon.kernel import can_skip_dispatch

    return can_skip_dispatch(*tensors)


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _reference(x, c, s):
    return x * c + _rotate_half(x) * s


def _check(q, k, cos, sin, unsqueeze_dim):
    if cos.shape != sin.shape:
        raise RuntimeError(f"apply_rotary_pos_emb: cos and sin shapes differ: "
                           f"{tuple(cos.shape)} and {tuple(sin.shape)}")
    if q.shape[-1] % 2 or q.shape[-1] != k.shape[-1]:
        raise RuntimeError(f"apply_rotary_pos_emb: q and k need the same even last dim, got "
                           f"{q.shape[-1]} and {k.shape[-1]}")
    c = list(cos.shape)
    c.insert(unsqueeze_dim if unsqueeze_dim >= 0 else len(c) + 1 + unsqueeze_dim, 1)
    shapes = _broadcast(q.shape, c), _broadcast(k.shape, c)
    if shapes[0] is None or shapes[1] is None:
        raise RuntimeError(f"apply_rotary_pos_emb: cos/sin of shape {tuple(cos.shape)} "
                           f"(unsqueezed at {unsqueeze_dim}) do not broadcast to q "
                           f"{tuple(q.shape)} and k {tuple(k.shape)}")
    return shapes


def _broadcast(a, b):
    """The broadcast shape of a and b, None if they do not broadcast (torch.broadcast_shapes
    costs tens of microseconds a call)."""
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return torch.Size(out)


def _dense(t, dtype=None):
    from torch_axon.kernel import contiguous_as_fake

    return contiguous_as_fake(t, dtype)


def _dtypes(q, k, cos, sin):
    """The result dtypes of the unfused math: (promote(q, cos, sin), promote(k, cos, sin))."""
    cs = torch.promote_types(cos.dtype, sin.dtype)
    return torch.promote_types(q.dtype, cs), torch.promote_types(k.dtype, cs)


def _lastdim(t):
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


@torch.library.custom_op(f"{library}::rotary", mutates_args=())
def _rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            unsqueeze_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _rotary_impl(q, k, cos, sin, unsqueeze_dim)


def _rotary_impl(q, k, cos, sin, unsqueeze_dim):
    shape_q, shape_k = _check(q, k, cos, sin, unsqueeze_dim)
    c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    same = all(t.dtype == q.dtype and t.device == q.device for t in (k, cos, sin))
    if (q.device.type != "axon" or q.dtype not in _DTYPES or not same or len(shape_q) != 4
            or shape_q != q.shape or shape_k != k.shape):
        dq, dk = _dtypes(q, k, cos, sin)
        return _dense(_reference(q, c, s), dq), _dense(_reference(k, c, s), dk)
    out_q = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    out_k = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if out_q.numel() or out_k.numel():
        c, s = _lastdim(c), _lastdim(s)
        _kernels().rotary(_lastdim(q), c.expand(q.shape), s.expand(q.shape), out_q,
                          _lastdim(k), c.expand(k.shape), s.expand(k.shape), out_k,
                          written=(3, 7), name="axon_rotary.rotary")
    return out_q, out_k


@_rotary.register_fake
def _(q, k, cos, sin, unsqueeze_dim):
    shape_q, shape_k = _check(q, k, cos, sin, unsqueeze_dim)
    dq, dk = _dtypes(q, k, cos, sin)
    return q.new_empty(shape_q, dtype=dq), k.new_empty(shape_k, dtype=dk)


def _setup(ctx, inputs, output):
    q, k, cos, sin, unsqueeze_dim = inputs
    ctx.dim = unsqueeze_dim
    ctx.needs_cs = cos.requires_grad or sin.requires_grad
    ctx.shapes = (cos.shape, sin.shape)
    ctx.save_for_backward(q, k, cos, sin)


def _unrotate(g, c, s):
    # transpose of x -> x * c + rotate_half(x) * s: g * c - rotate_half(g * s)
    return g * c - _rotate_half(g * s)


def _backward(ctx, gq, gk):
    q, k, cos, sin = ctx.saved_tensors
    c, s = cos.unsqueeze(ctx.dim), sin.unsqueeze(ctx.dim)
    dq = _unrotate(gq, c, s).to(q.dtype)
    dk = _unrotate(gk, c, s).to(k.dtype)
    dc = ds = None
    if ctx.needs_cs:
        dc = ((gq * q).sum_to_size(c.shape) + (gk * k).sum_to_size(c.shape)).squeeze(ctx.dim)
        ds = ((gq * _rotate_half(q)).sum_to_size(s.shape)
              + (gk * _rotate_half(k)).sum_to_size(s.shape)).squeeze(ctx.dim)
        dc, ds = dc.to(cos.dtype), ds.to(sin.dtype)
    return dq, dk, dc, ds, None


_rotary.register_autograd(_backward, setup_context=_setup)


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         unsqueeze_dim: int = 1):
    """(q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin), cos/sin unsqueezed
    at ``unsqueeze_dim`` to broadcast over the heads."""
    if _direct(q, k, cos, sin):
        return _rotary_impl(q, k, cos, sin, unsqueeze_dim)
    return _rotary(q, k, cos, sin, unsqueeze_dim)
