"""The custom ops of axon-layernorm (torch.library) and their kernel launches."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Optional

import torch

_DIR = Path(__file__).resolve().parent
library = "axon_layernorm_" + hashlib.sha1(str(_DIR).encode()).hexdigest()[:8]
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
RMS, LAYER = 0, 1


@functools.cache
def _kernels():
    from torch_axon import kernel

    return kernel.load("axon_layernorm", sources=[str(_DIR / "layernorm.cpp")])


def _rows(t: torch.Tensor) -> torch.Tensor:
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        t = t.contiguous()
    return t.reshape(-1, t.shape[-1])


def _dense(t, dtype=None):
    from torch_axon.kernel import contiguous_as_fake

    return contiguous_as_fake(t, dtype)


def _dtype(x, residual):
    """The dtype of both results: that of x + residual (x's without a residual)."""
    return x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)


def _direct(*tensors) -> bool:
    from torch_axon.kernel import can_skip_dispatch

    return can_skip_dispatch(*tensors)


def _reference(kind, x, residual, weight, bias, eps):
    """The unfused math (as Transformers/PyTorch compute it), any device."""
    h = x if residual is None else x + residual
    hf = h.float()
    if kind == RMS:
        y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    else:
        mean = hf.mean(-1, keepdim=True)
        y = (hf - mean) * torch.rsqrt((hf - mean).pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    # the fake's contiguous results (h is only a result with a residual)
    return _dense(y, h.dtype), (h if residual is None else _dense(h, h.dtype))


def _check(kind, x, residual, weight, bias):
    d = x.shape[-1] if x.dim() else 1
    name = "rms_norm" if kind == RMS else "layer_norm"
    if x.dim() == 0:
        raise RuntimeError(f"{name}: expected a tensor with at least one dim")
    if residual is not None and residual.shape != x.shape:
        raise RuntimeError(f"{name}: residual must have the shape of x {tuple(x.shape)}, "
                           f"got {tuple(residual.shape)}")
    for n, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != (d,):
            raise RuntimeError(f"{name}: {n} must have shape ({d},), got {tuple(p.shape)}")


def _kernel_ok(x, residual, weight, bias):
    return x.device.type == "axon" and x.dtype in _DTYPES and all(
        t is None or (t.dtype == x.dtype and t.device == x.device) for t in (residual, weight, bias))


def _compute(kind, x, residual, weight, bias, eps):
    _check(kind, x, residual, weight, bias)
    if not _kernel_ok(x, residual, weight, bias):
        return _reference(kind, x, residual, weight, bias, eps)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(out) if residual is not None else out
    if out.numel():
        d = x.shape[-1]
        tensors = [_rows(x)]
        if residual is not None:
            tensors.append(_rows(residual))
        tensors += [weight.view(1, d) if weight is not None else tensors[0],
                    bias.view(1, d) if bias is not None else tensors[0], out.view(-1, d)]
        written = (len(tensors) - 1,)
        if residual is not None:
            tensors.append(res_out.view(-1, d))
            written = (len(tensors) - 2, len(tensors) - 1)
        _kernels().norm(*tensors, ints=(kind, residual is not None, weight is not None,
                                        bias is not None), floats=(float(eps),),
                        written=written, name="axon_layernorm.norm")
    return out, res_out


@torch.library.custom_op(f"{library}::norm", mutates_args=())
def _norm(kind: int, x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
          eps: float) -> torch.Tensor:
    return _compute(kind, x, None, weight, bias, eps)[0]


@_norm.register_fake
def _(kind, x, weight, bias, eps):
    _check(kind, x, None, weight, bias)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op(f"{library}::norm_add", mutates_args=())
def _norm_add(kind: int, x: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor],
              bias: Optional[torch.Tensor], eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _compute(kind, x, residual, weight, bias, eps)


@_norm_add.register_fake
def _(kind, x, residual, weight, bias, eps):
    _check(kind, x, residual, weight, bias)
    dtype = _dtype(x, residual)
    return (torch.empty_like(x, dtype=dtype, memory_format=torch.contiguous_format),
            torch.empty_like(x, dtype=dtype, memory_format=torch.contiguous_format))


def _grads(ctx, h, weight, bias, grad_out, grad_res):
    """Gradients w.r.t. h (= x, or x + residual), weight and bias."""
    has_w, has_b = weight is not None, bias is not None
    hf = h.float()
    d = hf.shape[-1]
    g = grad_out.float()
    if ctx.kind == LAYER:
        hf = hf - hf.mean(-1, keepdim=True)
    rstd = torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + ctx.eps)
    xhat = hf * rstd
    gw = weight.float() * g if has_w else g
    # d xhat/dh applied to gw: rstd * (gw - xhat * mean(gw * xhat) [- mean(gw) for LayerNorm])
    dh = gw - xhat * (gw * xhat).sum(-1, keepdim=True) / d
    if ctx.kind == LAYER:
        dh = dh - gw.sum(-1, keepdim=True) / d
    dh = dh * rstd
    if grad_res is not None:
        dh = dh + grad_res.float()
    # sums over every dim but the last (reshape: a 1-d x has no leading dim to sum)
    dw = (g * xhat).reshape(-1, d).sum(0).to(weight.dtype) if has_w else None
    db = g.reshape(-1, d).sum(0).to(bias.dtype) if has_b else None
    return dh.to(h.dtype), dw, db


def _setup(ctx, inputs, output):
    kind, x, weight, bias, eps = inputs
    ctx.kind, ctx.eps = kind, eps
    ctx.save_for_backward(x, weight, bias)


def _backward(ctx, grad_out):
    x, weight, bias = ctx.saved_tensors
    dh, dw, db = _grads(ctx, x, weight, bias, grad_out, None)
    return None, dh, dw, db, None


_norm.register_autograd(_backward, setup_context=_setup)


def _setup_add(ctx, inputs, output):
    kind, x, residual, weight, bias, eps = inputs
    ctx.kind, ctx.eps = kind, eps
    ctx.save_for_backward(output[1], weight, bias)


def _backward_add(ctx, grad_out, grad_res):
    h, weight, bias = ctx.saved_tensors
    dh, dw, db = _grads(ctx, h, weight, bias, grad_out, grad_res)
    return None, dh, dh, dw, db, None


_norm_add.register_autograd(_backward_add, setup_context=_setup_add)


def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float,
             residual: Optional[torch.Tensor] = None):
    """RMSNorm of x (or of x + residual: then returns (normalised, x + residual))."""
    if _direct(x, residual, weight):
        out, res = _compute(RMS, x, residual, weight, None, eps)
        return out if residual is None else (out, res)
    if residual is None:
        return _norm(RMS, x, weight, None, eps)
    return _norm_add(RMS, x, residual, weight, None, eps)


def layer_norm(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
               eps: float, residual: Optional[torch.Tensor] = None):
    """LayerNorm of x over the last dim (or of x + residual: returns (normalised, x + residual))."""
    if _direct(x, residual, weight, bias):
        out, res = _compute(LAYER, x, residual, weight, bias, eps)
        return out if residual is None else (out, res)
    if residual is None:
        return _norm(LAYER, x, weight, bias, eps)
    return _norm_add(LAYER, x, residual, weight, bias, eps)
