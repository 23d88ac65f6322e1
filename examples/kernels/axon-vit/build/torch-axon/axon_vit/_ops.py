"""The custom ops of axon-vit (torch.library) and their kernel launches."""

from __future__ import annotations

import functools
import hashlib
import math
from pathlib import Path

import torch
import torch.nn.functional as F

_DIR = Path(__file__).resolve().parent
library = "axon_vit_" + hashlib.sha1(str(_DIR).encode()).hexdigest()[:8]
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def _kernels():
    from torch_axon import kernel

    return kernel.load("axon_vit", sources=[str(_DIR / "vit.cpp")])


def _direct(*tensors) -> bool:
    from torch_axon.kernel import can_skip_dispatch

    return can_skip_dispatch(*tensors)


def _on_axon(*ts):
    t0 = ts[0]
    return t0.device.type == "axon" and t0.dtype in _DTYPES and all(
        t.dtype == t0.dtype and t.device == t0.device for t in ts)


def _lastdim(t):
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def _dense(t, dtype=None):
    from torch_axon.kernel import contiguous_as_fake

    return contiguous_as_fake(t, dtype)


def _rows(t):
    return _lastdim(t).reshape(-1, t.shape[-1])


# ---- attention ---------------------------------------------------------------------------

def _attention_ref(q, k, v, scale):
    # [B, S, H, D] -> [B, H, S, D]
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    w = torch.softmax((qh.float() @ kh.float().transpose(-1, -2)) * scale, dim=-1)
    return _dense((w @ vh.float()).transpose(1, 2), q.dtype)


def _check_attention(q, k, v):
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise RuntimeError(f"attention: q, k and v must be [batch, seq, heads, head_dim] of one "
                           f"shape, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")


def _attention_impl(q, k, v, scale):
    _check_attention(q, k, v)
    if not _on_axon(q, k, v):
        return _attention_ref(q, k, v, scale)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if out.numel():
        _kernels().attention(_lastdim(q), _lastdim(k), _lastdim(v), out, floats=(float(scale),),
                             written=(3,), name="axon_vit.attention")
    return out


@torch.library.custom_op(f"{library}::attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    return _attention_impl(q, k, v, scale)


def attention(q, k, v, scale):
    """softmax(q k^T * scale) v per (batch, head); q, k, v, result: [B, S, H, D]."""
    if _direct(q, k, v):
        return _attention_impl(q, k, v, scale)
    return _attention_op(q, k, v, scale)


@_attention_op.register_fake
def _(q, k, v, scale):
    _check_attention(q, k, v)
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def _attention_setup(ctx, inputs, output):
    q, k, v, scale = inputs
    ctx.scale = scale
    ctx.save_for_backward(q, k, v)


def _attention_backward(ctx, grad):
    q, k, v = ctx.saved_tensors
    qh, kh, vh, gh = (t.transpose(1, 2).float() for t in (q, k, v, grad))
    p = torch.softmax((qh @ kh.transpose(-1, -2)) * ctx.scale, dim=-1)
    dv = p.transpose(-1, -2) @ gh
    dp = gh @ vh.transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True)) * ctx.scale
    dq, dk = ds @ kh, ds.transpose(-1, -2) @ qh
    return (dq.transpose(1, 2).to(q.dtype), dk.transpose(1, 2).to(k.dtype),
            dv.transpose(1, 2).to(v.dtype), None)


_attention_op.register_autograd(_attention_backward, setup_context=_attention_setup)


# ---- add + LayerNorm ---------------------------------------------------------------------

def _check_aln(x, residual, weight, bias):
    d = x.shape[-1] if x.dim() else 0
    if x.dim() == 0 or residual.shape != x.shape or tuple(weight.shape) != (d,) \
            or tuple(bias.shape) != (d,):
        raise RuntimeError(f"add_layer_norm: x and residual of one shape, weight and bias of "
                           f"shape (last dim,), got {tuple(x.shape)}, {tuple(residual.shape)}, "
                           f"{tuple(weight.shape)}, {tuple(bias.shape)}")


def _add_layer_norm_impl(x, residual, weight, bias, eps):
    _check_aln(x, residual, weight, bias)
    if not _on_axon(x, residual, weight, bias):
        h = x + residual  # the results: contiguous, of the dtype of h (as the fake says)
        out = F.layer_norm(h.float(), h.shape[-1:], weight.float(), bias.float(), eps)
        return _dense(out, h.dtype), _dense(h, h.dtype)
    d = x.shape[-1]
    h = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out = torch.empty_like(h)
    if out.numel():
        _kernels().add_layer_norm(_rows(x), _rows(residual), weight.view(1, d), bias.view(1, d),
                                  h.view(-1, d), out.view(-1, d), floats=(float(eps),),
                                  written=(4, 5), name="axon_vit.add_layer_norm")
    return out, h


@torch.library.custom_op(f"{library}::add_layer_norm", mutates_args=())
def _add_layer_norm_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                   bias: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _add_layer_norm_impl(x, residual, weight, bias, eps)


def add_layer_norm(x, residual, weight, bias, eps):
    """(LayerNorm(x + residual), x + residual) over the last dim."""
    if _direct(x, residual, weight, bias):
        return _add_layer_norm_impl(x, residual, weight, bias, eps)
    return _add_layer_norm_op(x, residual, weight, bias, eps)


@_add_layer_norm_op.register_fake
def _(x, residual, weight, bias, eps):
    _check_aln(x, residual, weight, bias)
    dtype = torch.promote_types(x.dtype, residual.dtype)
    return (torch.empty_like(x, dtype=dtype, memory_format=torch.contiguous_format),
            torch.empty_like(x, dtype=dtype, memory_format=torch.contiguous_format))


def _aln_setup(ctx, inputs, output):
    x, residual, weight, bias, eps = inputs
    ctx.eps, ctx.bias_dtype = eps, bias.dtype
    ctx.save_for_backward(output[1], weight)


def _aln_backward(ctx, grad_out, grad_h):
    h, weight = ctx.saved_tensors
    hf = h.float()
    d = hf.shape[-1]
    c = hf - hf.mean(-1, keepdim=True)
    rstd = torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + ctx.eps)
    xhat = c * rstd
    g = grad_out.float()
    gw = g * weight.float()
    dh = (gw - gw.sum(-1, keepdim=True) / d - xhat * (gw * xhat).sum(-1, keepdim=True) / d) * rstd
    if grad_h is not None:
        dh = dh + grad_h.float()
    # sums over every dim but the last (reshape: a 1-d x has no leading dim to sum)
    dw, db = (g * xhat).reshape(-1, d).sum(0), g.reshape(-1, d).sum(0)
    dh = dh.to(h.dtype)
    return dh, dh, dw.to(weight.dtype), db.to(ctx.bias_dtype), None


_add_layer_norm_op.register_autograd(_aln_backward, setup_context=_aln_setup)


# ---- bias + GELU -------------------------------------------------------------------------

def _check_bg(x, bias):
    if x.dim() == 0 or tuple(bias.shape) != (x.shape[-1],):
        raise RuntimeError(f"bias_gelu: bias must have shape (last dim of x,), got "
                           f"{tuple(bias.shape)} for x of shape {tuple(x.shape)}")


def _bias_gelu_impl(x, bias):
    _check_bg(x, bias)
    if not _on_axon(x, bias):
        h = x + bias
        return _dense(F.gelu(h), h.dtype)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel():
        d = x.shape[-1]
        _kernels().bias_gelu(_rows(x), bias.view(1, d), out.view(-1, d), written=(2,),
                             name="axon_vit.bias_gelu")
    return out


@torch.library.custom_op(f"{library}::bias_gelu", mutates_args=())
def _bias_gelu_op(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return _bias_gelu_impl(x, bias)


def bias_gelu(x, bias):
    """gelu(x + bias) (erf)."""
    if _direct(x, bias):
        return _bias_gelu_impl(x, bias)
    return _bias_gelu_op(x, bias)


@_bias_gelu_op.register_fake
def _(x, bias):
    _check_bg(x, bias)
    return torch.empty_like(x, dtype=torch.promote_types(x.dtype, bias.dtype),
                            memory_format=torch.contiguous_format)


def _bg_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _bg_backward(ctx, grad):
    x, bias = ctx.saved_tensors
    g = (x.float() + bias.float())
    cdf = 0.5 * (1 + torch.erf(g * (1 / math.sqrt(2))))
    pdf = torch.exp(-0.5 * g * g) * (1 / math.sqrt(2 * math.pi))
    dx = grad.float() * (cdf + g * pdf)
    return dx.to(x.dtype), dx.reshape(-1, dx.shape[-1]).sum(0).to(bias.dtype)


_bias_gelu_op.register_autograd(_bg_backward, setup_context=_bg_setup)

