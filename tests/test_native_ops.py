"""Native asynchronous ops on axon against the same computation on the CPU.

Ops on axon run as stream work: the host checks arguments, allocates results
and enqueues a kernel on the current axon stream.  This file covers the
fused kernels (scaled_dot_product_attention, layer_norm, rms_norm,
softmax/log_softmax, fused Adam/AdamW) forward and backward, that the host
really returns before the stream has finished, that errors are still raised
at the call, a deadlock regression, and reproducibility of random ops.

Tolerances are conftest's: tol(dtype) for elementwise results, tol(dtype,
accum=True) for anything that sums (attention, norms, softmax gradients).
"""

from __future__ import annotations

import copy
import math
import re
import time

import pytest
import torch
import torch.nn.functional as F

from conftest import FLOAT_DTYPES, assert_same, make, run_python, tol

sleep_on_stream = torch.axon._C._test_sleep_on_stream  # (device index, milliseconds)
FUSED_SDPA = "ScaledDotProductFusedAttentionOverrideableBackward0"
Z = 6.0  # standard errors allowed in statistical checks


@pytest.fixture
def no_fallback():
    """The test runs without any op going to the synchronous CPU fallback."""
    torch.axon.synchronize()
    torch.axon.reset_fallback_stats()
    yield
    assert torch.axon.fallback_stats() == {}


def leaf(t: torch.Tensor, device, grad=True) -> torch.Tensor:
    """A fresh leaf copy of t on device."""
    return t.detach().to(device).requires_grad_(grad)


def upstream_grad(shape, dtype, layout, device, seed=99):
    """A fixed gradient for an output of shape: contiguous, non-contiguous
    (a permuted contiguous tensor) or expanded (stride 0 in the last dim)."""
    if layout == "contiguous":
        return make(shape, dtype, -1, 1, seed=seed).to(device)
    if layout == "permuted":
        perm = list(reversed(range(len(shape))))
        return make([shape[i] for i in perm], dtype, -1, 1, seed=seed).to(device).permute(perm)
    if layout == "expanded":
        return make(tuple(shape[:-1]) + (1,), dtype, -1, 1, seed=seed).to(device).expand(shape)
    raise ValueError(layout)


def fwd_bwd(fn, inputs, device="cpu", n_grad=None, grad_layout="contiguous"):
    """fn(*inputs) on device, then backward of a fixed upstream gradient;
    returns (output, [grads of the floating inputs among the first n_grad],
    output.grad_fn name)."""
    n_grad = len(inputs) if n_grad is None else n_grad
    xs = [leaf(t, device, t.is_floating_point() and i < n_grad)
          if isinstance(t, torch.Tensor) else t for i, t in enumerate(inputs)]
    out = fn(*xs)
    name = out.grad_fn.name() if out.grad_fn is not None else None
    out.backward(upstream_grad(out.shape, out.dtype, grad_layout, device))
    grads = [x.grad for x in xs if isinstance(x, torch.Tensor) and x.requires_grad]
    return out.detach(), grads, name


def compare_fwd_bwd(fn, inputs, dtype, accum=True, n_grad=None, grad_layout="contiguous", **kw):
    """fn forward and backward on axon match the CPU; returns the axon grad_fn
    name of the output."""
    out_c, grads_c, _ = fwd_bwd(fn, inputs, "cpu", n_grad, grad_layout)
    out_a, grads_a, name = fwd_bwd(fn, inputs, "axon", n_grad, grad_layout)
    assert_same(out_a, out_c, dtype=dtype, accum=accum, **kw)
    assert len(grads_a) == len(grads_c)
    for ga, gc in zip(grads_a, grads_c):
        assert ga is not None and ga.shape == gc.shape and ga.dtype == gc.dtype
        assert_same(ga, gc, dtype=dtype, accum=accum, **kw)
    return name


# ================================================================ attention

# (B, Hq, Hkv, L, S, D, Dv) and SDPA keyword arguments per case
SDPA_CASES = {
    "plain": ((2, 2, 2, 5, 5, 8, 8), {}),
    "causal": ((2, 2, 2, 5, 5, 8, 8), dict(is_causal=True)),
    "q_shorter": ((2, 2, 2, 3, 7, 8, 8), {}),
    "q_longer_causal": ((1, 2, 2, 6, 4, 8, 8), dict(is_causal=True)),
    "q_shorter_causal": ((1, 2, 2, 5, 9, 8, 8), dict(is_causal=True)),
    "bool_mask_2d": ((2, 2, 2, 4, 6, 8, 8), dict(attn_mask="bool2d")),
    "bool_mask_4d": ((2, 2, 2, 4, 6, 8, 8), dict(attn_mask="bool4d")),
    "bool_mask_full_row": ((1, 2, 2, 4, 6, 8, 8), dict(attn_mask="bool_full_row")),
    "additive_mask_2d": ((2, 2, 2, 4, 6, 8, 8), dict(attn_mask="add2d")),
    "additive_mask_b1ls": ((2, 3, 3, 4, 6, 8, 8), dict(attn_mask="add_b1ls")),
    "gqa": ((2, 4, 2, 5, 7, 8, 8), dict(enable_gqa=True)),
    "gqa_causal_mask": ((1, 4, 2, 5, 7, 8, 8), dict(enable_gqa=True, attn_mask="bool2d")),
    "noncontig": ((2, 3, 3, 5, 6, 8, 8), dict(layout="blhd")),
    "noncontig_gqa_causal": ((2, 4, 2, 5, 6, 8, 8), dict(layout="blhd", enable_gqa=True,
                                                         is_causal=True)),
    "head_dim_1": ((1, 2, 2, 4, 6, 1, 1), dict(is_causal=True)),
    "head_dim_3": ((1, 2, 2, 4, 6, 3, 3), dict(is_causal=True)),
    "head_dim_64": ((1, 2, 2, 9, 17, 64, 64), dict(is_causal=True)),
    "dv_differs": ((1, 2, 2, 4, 6, 8, 5), {}),
    "scale": ((1, 2, 2, 4, 6, 8, 8), dict(scale=0.3, is_causal=True)),
    "long_kv": ((1, 1, 1, 3, 70, 16, 16), dict(attn_mask="add2d")),
    "tiles": ((1, 2, 2, 40, 70, 32, 32), dict(is_causal=True)),
    "decode_one_query": ((2, 4, 2, 1, 19, 16, 16), dict(enable_gqa=True)),
    "large_logits": ((1, 2, 2, 33, 33, 64, 64), dict(range=4.0)),
    "bool_mask_padding": ((3, 2, 2, 4, 6, 8, 8), dict(attn_mask="bool_b11s")),
    # Decoding with a static KV cache: whole tiles of unused positions hidden
    # (the kernel skips them), one batch row seeing only 3 keys, one a hole.
    "static_cache_decode": ((3, 4, 2, 2, 260, 16, 16), dict(attn_mask="bool_static_cache",
                                                          enable_gqa=True)),
    "static_cache_decode_add": ((2, 4, 4, 1, 200, 16, 16), dict(attn_mask="add_static_cache")),
    "float32_mask": ((2, 2, 2, 4, 6, 8, 8), dict(attn_mask="add_f32")),
    "kv_cache_slice": ((2, 2, 2, 3, 5, 8, 8), dict(layout="kv_cache")),
    "expanded_kv": ((2, 4, 4, 3, 5, 8, 8), dict(layout="expanded_kv")),
    "strided_head_dim": ((1, 2, 2, 3, 5, 8, 8), dict(layout="strided_d")),
    "zero_batch": ((0, 2, 2, 3, 5, 8, 8), {}),
    "zero_kv_len": ((1, 2, 2, 3, 0, 8, 8), {}),
}


def sdpa_inputs(case, dtype):
    """(fn, [q, k, v, (mask)]) for a SDPA_CASES case: CPU leaves; fn applies the
    case's views (the same on both devices, so axon really gets those strides)."""
    (B, Hq, Hkv, L, S, D, Dv), kw = SDPA_CASES[case]
    kw = dict(kw)
    layout = kw.pop("layout", "bhld")
    r = kw.pop("range", 1.0)
    if layout == "blhd":  # as a model makes them: [B, L, H, D] transposed to [B, H, L, D]
        shapes = [(B, L, Hq, D), (B, S, Hkv, D), (B, S, Hkv, Dv)]
        views = [lambda t: t.transpose(1, 2)] * 3
    elif layout == "kv_cache":  # the first S positions of a longer cache
        shapes = [(B, Hq, L, D), (B, Hkv, S + 4, D), (B, Hkv, S + 4, Dv)]
        views = [lambda t: t, lambda t: t[:, :, :S], lambda t: t[:, :, :S]]
    elif layout == "expanded_kv":  # stride 0 over the heads
        shapes = [(B, Hq, L, D), (B, 1, S, D), (B, 1, S, Dv)]
        views = [lambda t: t, lambda t: t.expand(B, Hkv, S, D), lambda t: t.expand(B, Hkv, S, Dv)]
    elif layout == "strided_d":  # every other element of the head dimension
        shapes = [(B, Hq, L, 2 * D), (B, Hkv, S, 2 * D), (B, Hkv, S, 2 * Dv)]
        views = [lambda t: t[..., ::2]] * 3
    else:
        shapes = [(B, Hq, L, D), (B, Hkv, S, D), (B, Hkv, S, Dv)]
        views = [lambda t: t] * 3
    inputs = [make(shapes[0], dtype, -r, r, seed=1), make(shapes[1], dtype, -r, r, seed=2),
              make(shapes[2], dtype, -1, 1, seed=3)]
    mask_kind = kw.pop("attn_mask", None)
    if mask_kind is not None:
        g = torch.Generator().manual_seed(4)
        if mask_kind.endswith("static_cache"):
            seen = torch.zeros(B, 1, 1, S, dtype=torch.bool)
            seen[0, ..., :70] = True
            seen[0, ..., 140:150] = True
            seen[1, ..., :3] = True
            seen[2:, ..., :S // 2] = True
            mask = seen if mask_kind.startswith("bool") else \
                torch.zeros(B, 1, 1, S, dtype=dtype).masked_fill(~seen, float("-inf"))
        elif mask_kind.startswith("bool"):
            shape = {"bool4d": (B, Hq, L, S), "bool_b11s": (B, 1, 1, S)}.get(mask_kind, (L, S))
            mask = torch.rand(shape, generator=g) < 0.6
            mask[..., 0] = True  # every row attends somewhere ...
            if mask_kind == "bool_full_row":
                mask[1] = False  # ... except this one (a zero output row, as on the CPU)
        else:
            shape = (L, S) if mask_kind == "add2d" else (B, 1, L, S)
            mask_dtype = torch.float32 if mask_kind == "add_f32" else dtype
            mask = (torch.rand(shape, generator=g) * 4 - 2).to(mask_dtype)
        inputs.append(mask)

    def fn(q, k, v, mask=None):
        q, k, v = (view(t) for view, t in zip(views, (q, k, v)))
        if layout != "bhld" and q.numel() > 0:
            assert not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous())
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    return fn, inputs


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_sdpa_forward_backward_matches_cpu(case, dtype, no_fallback):
    fn, inputs = sdpa_inputs(case, dtype)
    name = compare_fwd_bwd(fn, inputs, dtype, n_grad=3)  # no gradient for the mask
    if not case.startswith("zero"):  # empty inputs with gradients take the math path
        assert name == FUSED_SDPA


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("grad_layout", ["permuted", "expanded"])
@pytest.mark.parametrize("case", ["causal", "gqa", "noncontig"])
def test_sdpa_backward_of_non_contiguous_upstream_gradient(case, grad_layout, dtype, no_fallback):
    fn, inputs = sdpa_inputs(case, dtype)
    assert compare_fwd_bwd(fn, inputs, dtype, grad_layout=grad_layout) == FUSED_SDPA


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("variant", ["projection", "self_attention_one_tensor", "only_q_grad",
                                     "sum_loss"])
def test_sdpa_in_an_attention_block(variant, dtype, no_fallback):
    """The output consumed through transpose + reshape + matmul (a non-contiguous
    upstream gradient), q = k = v one tensor, gradients for q only."""
    B, H, L, D = 2, 3, 5, 8
    x = make((B, H, L, D), dtype, -1, 1, seed=1)
    kv = make((2, B, H, L, D), dtype, -1, 1, seed=2)
    w = make((H * D, 4), dtype, -1, 1, seed=3)

    def run(device):
        xa = leaf(x, device)
        kva = leaf(kv, device, grad=variant != "only_q_grad")
        if variant == "self_attention_one_tensor":
            out = F.scaled_dot_product_attention(xa, xa, xa, is_causal=True)
        else:
            out = F.scaled_dot_product_attention(xa, kva[0], kva[1], is_causal=True)
        if variant == "sum_loss":
            loss = out.sum()
        else:
            loss = (out.transpose(1, 2).reshape(B, L, H * D) @ w.to(device)).pow(2).sum()
        loss.backward()
        results = [out.detach(), xa.grad]
        if variant in ("projection", "sum_loss"):
            results.append(kva.grad)
        return results, out.grad_fn.name()

    expected, _ = run("cpu")
    actual, name = run("axon")
    assert name == FUSED_SDPA
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert_same(a, e, accum=True)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_sdpa_additive_mask_requiring_grad_matches_cpu(dtype, no_fallback):
    """A mask that needs a gradient takes PyTorch's math path on axon."""
    fn, inputs = sdpa_inputs("additive_mask_b1ls", dtype)
    name = compare_fwd_bwd(fn, inputs, dtype)
    assert name != FUSED_SDPA


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", ["plain", "causal", "bool_mask_4d", "noncontig", "zero_batch"])
def test_sdpa_forward_without_grad_matches_cpu(case, dtype, no_fallback):
    fn, inputs = sdpa_inputs(case, dtype)
    expected = fn(*inputs)
    with torch.no_grad():
        actual = fn(*[t.axon() for t in inputs])
    assert_same(actual, expected, accum=True)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_sdpa_uses_the_fused_kernel(dtype, no_fallback):
    q, k, v = (make((2, 3, 6, 16), dtype, -1, 1, seed=s).axon() for s in (1, 2, 3))
    fused = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(
        q, k, v, None, 0.0, True)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # the same kernel: bitwise equal (the math path would round differently)
    torch.testing.assert_close(out.cpu(), fused[0].cpu(), rtol=0, atol=0)
    assert fused[1].shape == (2, 3, 6) and fused[1].dtype == torch.float32  # logsumexp
    expected = F.scaled_dot_product_attention(q.cpu(), k.cpu(), v.cpu(), is_causal=True)
    assert_same(out, expected, accum=True)
    out_g = F.scaled_dot_product_attention(*(t.requires_grad_() for t in (q, k, v)),
                                           is_causal=True)
    assert out_g.grad_fn.name() == FUSED_SDPA


def test_sdpa_mismatched_shapes_raise_like_cpu():
    cases = [((1, 2, 3, 4), (1, 2, 3, 5), (1, 2, 3, 4), {}),
             ((1, 4, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4), {}),  # GQA heads without enable_gqa
             ((1, 3, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4), dict(enable_gqa=True))]
    for qs, ks, vs, kw in cases:
        args = [torch.ones(s) for s in (qs, ks, vs)]
        with pytest.raises(RuntimeError) as cpu_err:
            F.scaled_dot_product_attention(*args, **kw)
        with pytest.raises(RuntimeError) as ax_err:
            F.scaled_dot_product_attention(*(a.axon() for a in args), **kw)
        assert str(ax_err.value).splitlines()[0] == str(cpu_err.value).splitlines()[0]


# ---------------------------------------------------------------- attention dropout

P_DROP = 0.5


def dropout_sdpa(q, k, v, seed, **kw):
    torch.manual_seed(seed)
    return F.scaled_dot_product_attention(q, k, v, dropout_p=P_DROP, **kw)


def keep_mask(q, k, seed, **kw):
    """The keep mask [B, H, L, S] the kernel draws for seed: attention to
    one-hot values v[s] = e_s gives P[l, s] * keep[l, s] / (1 - p)."""
    B, H, _, _ = q.shape
    S = k.shape[2]
    eye = torch.eye(S, dtype=q.dtype).expand(B, k.shape[1], S, S).to(q.device)
    with torch.no_grad():
        p = dropout_sdpa(q, k, eye, seed, **kw).cpu()
    return p != 0, p


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_sdpa_dropout_is_reproducible(dtype, no_fallback):
    q, k, v = (make((2, 2, 8, 16), dtype, -1, 1, seed=s).axon() for s in (1, 2, 3))
    a = dropout_sdpa(q, k, v, 10).cpu()
    b = dropout_sdpa(q, k, v, 10).cpu()
    c = dropout_sdpa(q, k, v, 11).cpu()
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c)
    # successive calls draw different masks
    torch.manual_seed(10)
    F.scaled_dot_product_attention(q, k, v, dropout_p=P_DROP)
    assert not torch.equal(F.scaled_dot_product_attention(q, k, v, dropout_p=P_DROP).cpu(), a)
    # dropout_p=0 is deterministic and equals the CPU
    assert_same(F.scaled_dot_product_attention(q, k, v, dropout_p=0.0),
                F.scaled_dot_product_attention(q.cpu(), k.cpu(), v.cpu()), accum=True)


def test_sdpa_dropout_keep_fraction_and_scaling(no_fallback):
    B, H, L, S, D = 2, 4, 16, 32, 8
    q = make((B, H, L, D), torch.float32, -1, 1, seed=1)
    k = make((B, H, S, D), torch.float32, -1, 1, seed=2)
    keep, p = keep_mask(q.axon(), k.axon(), seed=5)
    n = keep.numel()
    frac = keep.double().mean().item()
    assert abs(frac - (1 - P_DROP)) < Z * math.sqrt(P_DROP * (1 - P_DROP) / n), frac
    # kept probabilities are the softmax scaled by 1 / (1 - p)
    probs = torch.softmax(q.double() @ k.double().transpose(-1, -2) / math.sqrt(D), -1)
    torch.testing.assert_close(p.double(), probs * keep / (1 - P_DROP), rtol=1e-5, atol=1e-6)
    # every (batch, head) draws its own mask
    flat = keep.reshape(B * H, L * S)
    assert len({tuple(r.tolist()) for r in flat}) == B * H


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("kind", ["plain", "causal_gqa"])
def test_sdpa_dropout_backward_matches_math_with_the_same_mask(dtype, kind, no_fallback):
    """Forward and backward of dropout attention equal the math on the CPU (in
    float64) with the keep mask the kernel drew for the same seed."""
    B, Hq, Hkv, L, S, D = 2, 4, (2 if kind == "causal_gqa" else 4), 6, 10, 8
    kw = dict(is_causal=True, enable_gqa=True) if kind == "causal_gqa" else {}
    q = make((B, Hq, L, D), dtype, -1, 1, seed=1)
    k = make((B, Hkv, S, D), dtype, -1, 1, seed=2)
    v = make((B, Hkv, S, D), dtype, -1, 1, seed=3)
    keep, _ = keep_mask(q.axon(), k.axon(), seed=7, **kw)

    qa, ka, va = (leaf(t, "axon") for t in (q, k, v))
    out = dropout_sdpa(qa, ka, va, 7, **kw)
    assert out.grad_fn.name() == FUSED_SDPA
    g = make(out.shape, dtype, -1, 1, seed=4)
    out.backward(g.axon())

    qc, kc, vc = (leaf(t.double(), "cpu") for t in (q, k, v))
    rep = Hq // Hkv
    kr, vr = kc.repeat_interleave(rep, 1), vc.repeat_interleave(rep, 1)
    scores = qc @ kr.transpose(-1, -2) / math.sqrt(D)
    if kw.get("is_causal"):
        scores = scores.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), -math.inf)
    expected = (torch.softmax(scores, -1) * keep / (1 - P_DROP)) @ vr
    expected.backward(g.double())
    t = tol(dtype, accum=True)
    torch.testing.assert_close(out.detach().cpu().double(), expected.detach(), **t)
    for a, c in ((qa, qc), (ka, kc), (va, vc)):
        assert a.grad.dtype == dtype
        torch.testing.assert_close(a.grad.cpu().double(), c.grad, **t)


def test_sdpa_dropout_finite_differences(no_fallback):
    """Directional finite differences (float64 sums of a float32 kernel) agree
    with the backward; the mask is reproduced by reseeding before each call."""
    q, k, v = (make((1, 1, 3, 4), torch.float32, -1, 1, seed=s) for s in (1, 2, 3))
    w = make((1, 1, 3, 4), torch.float32, -1, 1, seed=4).axon()

    def loss(q, k, v):
        return (dropout_sdpa(q, k, v, 3) * w).sum()

    qa, ka, va = (leaf(t, "axon") for t in (q, k, v))
    loss(qa, ka, va).backward()
    eps = 1e-2
    for i, (t, grad) in enumerate(((q, qa.grad), (k, ka.grad), (v, va.grad))):
        d = make(t.shape, torch.float32, -1, 1, seed=10 + i)
        args_p = [x.axon() for x in (q, k, v)]
        args_m = [x.axon() for x in (q, k, v)]
        args_p[i] = (t + eps * d).axon()
        args_m[i] = (t - eps * d).axon()
        with torch.no_grad():
            fd = (loss(*args_p).item() - loss(*args_m).item()) / (2 * eps)
        analytic = (grad.cpu() * d).sum().item()
        assert fd == pytest.approx(analytic, rel=2e-2, abs=2e-3), (i, fd, analytic)


# ================================================================ norms and softmax

AFFINE = ["none", "weight", "weight_bias"]


def norm_input(shape_kind, dtype):
    """A CPU input for the norm tests: (x, normalized_shape)."""
    if shape_kind == "contiguous":
        return make((2, 3, 40), dtype, seed=1), (40,)
    if shape_kind == "transposed":  # non-contiguous input
        return make((2, 40, 3), dtype, seed=1).transpose(1, 2), (40,)
    if shape_kind == "two_dims":
        return make((3, 4, 6), dtype, seed=1), (4, 6)
    if shape_kind == "zero_rows":
        return make((0, 7), dtype, seed=1), (7,)
    if shape_kind == "wide":  # a row longer than one kernel tile
        return make((3, 1031), dtype, seed=1), (1031,)
    raise ValueError(shape_kind)


NORM_SHAPES = ["contiguous", "transposed", "two_dims", "zero_rows", "wide"]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("shape_kind", NORM_SHAPES)
def test_layer_norm_forward_backward(shape_kind, affine, dtype, no_fallback):
    x, ns = norm_input(shape_kind, dtype)
    inputs = [x]
    if affine != "none":
        inputs.append(make(ns, dtype, 0.5, 1.5, seed=2))
    if affine == "weight_bias":
        inputs.append(make(ns, dtype, -1, 1, seed=3))

    def fn(x, w=None, b=None):
        return F.layer_norm(x, ns, w, b)
    compare_fwd_bwd(fn, inputs, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("grad_layout", ["permuted", "expanded"])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "softmax", "log_softmax"])
def test_norm_and_softmax_backward_of_non_contiguous_upstream_gradient(op, grad_layout, dtype,
                                                                     no_fallback):
    x = make((6, 20), dtype, seed=1)
    w, b = make((20,), dtype, 0.5, 1.5, seed=2), make((20,), dtype, seed=3)
    fn = {"layer_norm": lambda x, w, b: F.layer_norm(x, (20,), w, b),
          "rms_norm": lambda x, w, b: F.rms_norm(x, (20,), w) + b,
          "softmax": lambda x, w, b: F.softmax(x * w + b, -1),
          "log_softmax": lambda x, w, b: F.log_softmax(x * w + b, -1)}[op]
    compare_fwd_bwd(fn, [x, w, b], dtype, grad_layout=grad_layout)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_norms_with_strided_parameters(dtype, no_fallback):
    """Weight and bias that are views into a larger tensor (every other row)."""
    x = make((5, 12), dtype, seed=1)
    params = make((12, 3), dtype, 0.5, 1.5, seed=2)
    compare_fwd_bwd(lambda x, p: F.layer_norm(x, (12,), p[:, 0], p[:, 2]), [x, params], dtype)
    compare_fwd_bwd(lambda x, p: F.rms_norm(x, (12,), p[:, 1]), [x, params], dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_layer_norm_low_precision_input_float32_params(dtype, no_fallback):
    x = make((4, 24), dtype, seed=1)
    w, b = make((24,), torch.float32, 0.5, 1.5, seed=2), make((24,), torch.float32, seed=3)
    compare_fwd_bwd(lambda x, w, b: F.layer_norm(x, (24,), w, b, eps=1e-3), [x, w, b], dtype)


def test_layer_norm_float64_uses_aten_path(no_fallback):
    x, ns = norm_input("transposed", torch.float64)
    w, b = make(ns, torch.float64, 0.5, 1.5, seed=2), make(ns, torch.float64, seed=3)
    compare_fwd_bwd(lambda x, w, b: F.layer_norm(x, ns, w, b), [x, w, b], torch.float64)
    # native_layer_norm's statistics keep the input dtype there
    out, mean, rstd = torch.native_layer_norm(x.axon(), ns, w.axon(), b.axon(), 1e-5)
    assert mean.dtype == rstd.dtype == torch.float64
    assert_same(out, F.layer_norm(x, ns, w, b))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_layer_norm_module_and_statistics(dtype, no_fallback):
    m_cpu = torch.nn.LayerNorm(16, dtype=dtype)
    with torch.no_grad():
        m_cpu.weight.copy_(make((16,), dtype, 0.5, 1.5, seed=2))
        m_cpu.bias.copy_(make((16,), dtype, seed=3))
    m_ax = torch.nn.LayerNorm(16, dtype=dtype, device="axon")
    m_ax.load_state_dict(m_cpu.state_dict())
    x = make((5, 16), dtype, seed=1)
    assert_same(m_ax(x.axon()), m_cpu(x), accum=True)
    out, mean, rstd = torch.native_layer_norm(x.axon(), (16,), None, None, 1e-5)
    xd = x.double()
    assert mean.shape == rstd.shape == (5, 1)
    torch.testing.assert_close(mean.cpu().double(), xd.mean(1, keepdim=True),
                               **tol(dtype, accum=True))
    torch.testing.assert_close(rstd.cpu().double(),
                               (xd.var(1, unbiased=False, keepdim=True) + 1e-5).rsqrt(),
                               rtol=tol(dtype, accum=True)["rtol"], atol=1e-3)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("eps", [None, 1e-3])
@pytest.mark.parametrize("affine", ["none", "weight"])
@pytest.mark.parametrize("shape_kind", NORM_SHAPES)
def test_rms_norm_forward_backward(shape_kind, affine, eps, dtype, no_fallback):
    x, ns = norm_input(shape_kind, dtype)
    inputs = [x]
    if affine == "weight":
        inputs.append(make(ns, dtype, 0.5, 1.5, seed=2))

    def fn(x, w=None):
        return F.rms_norm(x, ns, w, eps)
    compare_fwd_bwd(fn, inputs, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_rms_norm_module_and_fused_op(dtype, no_fallback):
    m_cpu = torch.nn.RMSNorm(12, dtype=dtype)
    with torch.no_grad():
        m_cpu.weight.copy_(make((12,), dtype, 0.5, 1.5, seed=2))
    m_ax = torch.nn.RMSNorm(12, dtype=dtype, device="axon")
    m_ax.load_state_dict(m_cpu.state_dict())
    x = make((3, 12), dtype, seed=1)
    y = m_ax(leaf(x, "axon"))
    assert y.grad_fn.name().startswith("FusedRmsNormBackward")  # F.rms_norm routes there
    assert_same(y, m_cpu(x), accum=True)
    out, rstd = torch.ops.aten._fused_rms_norm(x.axon(), [12], None, None)
    assert rstd.dtype == torch.float32 and rstd.shape == (3, 1)
    expected = (x.double().pow(2).mean(1, keepdim=True) + torch.finfo(dtype).eps).rsqrt()
    torch.testing.assert_close(rstd.cpu().double(), expected, rtol=tol(dtype, True)["rtol"],
                               atol=1e-3)



def test_rms_norm_float64_like_cpu():
    x = make((3, 8), torch.float64, seed=1)
    w = make((8,), torch.float64, 0.5, 1.5, seed=2)
    compare_fwd_bwd(lambda x, w: F.rms_norm(x, (8,), w), [x, w], torch.float64)


SOFTMAX_CASES = {
    "last_dim": ((3, 4, 37), -1, None),
    "dim0": ((3, 4, 37), 0, None),
    "dim1": ((3, 4, 37), 1, None),
    "last_dim_transposed": ((3, 37, 4), -1, "transpose"),
    "last_dim_wide": ((2, 1100), -1, None),
    "one_dim": ((9,), 0, None),
    "zero_rows": ((0, 5), -1, None),
    "zero_cols": ((3, 0), -1, None),
    "zero_rows_dim0": ((0, 5), 0, None),
}


def softmax_input(case, dtype):
    shape, dim, view = SOFTMAX_CASES[case]
    x = make(shape, dtype, -4, 4, seed=1)
    if view == "transpose":
        x = x.transpose(-1, -2)
    return x, dim


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("case", list(SOFTMAX_CASES))
def test_softmax_forward_backward(case, log, dtype, no_fallback):
    x, dim = softmax_input(case, dtype)
    f = F.log_softmax if log else F.softmax
    compare_fwd_bwd(lambda x: f(x, dim), [x], dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax_to_float32(log, dtype, no_fallback):
    x = make((4, 33), dtype, -4, 4, seed=1)
    f = F.log_softmax if log else F.softmax
    compare_fwd_bwd(lambda x: f(x, -1, dtype=torch.float32), [x], torch.float32)


def test_softmax_of_infinities_matches_cpu(no_fallback):
    x = torch.tensor([[0.0, -math.inf, 1.0], [-math.inf, -math.inf, 2.0],
                      [-math.inf, -math.inf, -math.inf], [math.inf, 0.0, 1.0]])
    for f in (F.softmax, F.log_softmax):
        assert_same(f(x.axon(), -1), f(x, -1))


# ================================================================ optimizers

PARAM_SHAPES = [(7,), (3, 5), (2, 3, 4), (1,), (33,)]


def params_for(dtype, device):
    return [torch.nn.Parameter(make(s, dtype, -1, 1, seed=i).to(device))
            for i, s in enumerate(PARAM_SHAPES)]


def run_optimizer(cls, dtype, device, steps=3, **kw):
    params = params_for(dtype, device)
    opt = cls(params, **kw)
    for step in range(steps):
        for i, p in enumerate(params):
            p.grad = make(p.shape, dtype, -1, 1, seed=100 * step + i).to(device)
        opt.step()
    return params, opt


OPT_CONFIGS = {
    "adamw_fused": (torch.optim.AdamW, dict(fused=True)),
    "adam_fused": (torch.optim.Adam, dict(fused=True)),
    "adamw_foreach": (torch.optim.AdamW, {}),  # the default on axon (foreach)
    "adam_foreach": (torch.optim.Adam, dict(foreach=True)),
}


@pytest.mark.parametrize("maximize", [False, True], ids=["min", "max"])
@pytest.mark.parametrize("amsgrad", [False, True], ids=["adam", "amsgrad"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("config", list(OPT_CONFIGS))
def test_adam_steps_match_cpu(config, weight_decay, amsgrad, maximize, no_fallback):
    cls, extra = OPT_CONFIGS[config]
    kw = dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=weight_decay,
              amsgrad=amsgrad, maximize=maximize, **extra)
    cpu_params, cpu_opt = run_optimizer(cls, torch.float32, "cpu", **kw)
    ax_params, ax_opt = run_optimizer(cls, torch.float32, "axon", **kw)
    for pa, pc in zip(ax_params, cpu_params):
        assert_same(pa.detach(), pc.detach(), accum=True)
        sa, sc = ax_opt.state[pa], cpu_opt.state[pc]
        for key in ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if amsgrad else ()):
            assert_same(sa[key], sc[key], accum=True)
        assert sa["step"].item() == sc["step"].item() == 3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("config", ["adamw_fused", "adam_fused"])
def test_fused_adam_low_precision_params(config, dtype, no_fallback):
    cls, extra = OPT_CONFIGS[config]
    kw = dict(lr=0.05, weight_decay=0.1, **extra)
    cpu_params, _ = run_optimizer(cls, dtype, "cpu", **kw)
    ax_params, _ = run_optimizer(cls, dtype, "axon", **kw)
    for pa, pc in zip(ax_params, cpu_params):
        assert pa.dtype == dtype
        assert_same(pa.detach(), pc.detach(), accum=True)


def test_fused_adamw_tensor_lr_and_grad_scaler(no_fallback):
    # a tensor learning rate (the _fused_adamw_.tensor_lr overload), on the CPU or on axon
    kw = dict(weight_decay=0.01, fused=True)
    cpu_params, _ = run_optimizer(torch.optim.AdamW, torch.float32, "cpu",
                                  lr=torch.tensor(0.02), **kw)
    for lr_device in ("cpu", "axon"):
        ax_params, _ = run_optimizer(torch.optim.AdamW, torch.float32, "axon",
                                     lr=torch.tensor(0.02).to(lr_device), **kw)
        for pa, pc in zip(ax_params, cpu_params):
            assert_same(pa.detach(), pc.detach(), accum=True)
    # found_inf skips the step
    params = params_for(torch.float32, "axon")
    before = [p.detach().cpu() for p in params]
    opt = torch.optim.AdamW(params, lr=0.1, fused=True)
    for p in params:
        p.grad = torch.ones_like(p)
    grad_scale = torch.tensor(1.0, device="axon")
    found_inf = torch.tensor(1.0, device="axon")
    torch._fused_adamw_(params, [p.grad for p in params],
                        [torch.zeros_like(p) for p in params],
                        [torch.zeros_like(p) for p in params], [],
                        [torch.tensor(1.0, device="axon") for _ in params],
                        lr=0.1, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8,
                        amsgrad=False, maximize=False, grad_scale=grad_scale,
                        found_inf=found_inf)
    for p, b in zip(params, before):
        torch.testing.assert_close(p.detach().cpu(), b, rtol=0, atol=0)
    del opt


# ================================================================ asynchrony

BUSY_MS = 800


def chain(x, w, b):
    y = (x + 1) * 0.5
    y = y @ w
    y = torch.softmax(y, -1)
    return F.layer_norm(y, (y.shape[-1],), b, b)


def test_ops_return_before_the_stream_is_done():
    x, w, b = make((16, 32), torch.float32, seed=1), make((32, 24), torch.float32, seed=2), \
        make((24,), torch.float32, 0.5, 1.5, seed=3)
    xa, wa, ba = x.axon(), w.axon(), b.axon()
    chain(xa, wa, ba)  # first calls of each kernel for these dtypes run synchronously
    torch.axon.synchronize()
    stream = torch.axon.current_stream()
    t0 = time.perf_counter()
    sleep_on_stream(0, BUSY_MS)
    out = chain(xa, wa, ba)
    launched = time.perf_counter() - t0
    assert launched < BUSY_MS / 1000 / 2, f"launch took {launched:.3f}s"
    assert not stream.query()  # still busy with the sleep or the chain
    torch.axon.synchronize()
    assert stream.query()
    assert time.perf_counter() - t0 >= BUSY_MS / 1000 * 0.9
    assert_same(out, chain(x, w, b), accum=True)


def test_results_wait_for_pending_work():
    x = make((8, 8), torch.float32, seed=1)
    xa = x.axon()
    (xa * 2).sum()
    torch.axon.synchronize()
    sleep_on_stream(0, 300)
    y = (xa * 2).sum()
    assert y.item() == pytest.approx((x * 2).sum().item(), rel=1e-6)  # .item() waits


@pytest.mark.parametrize("change", ["t_", "resize_grow", "resize_shrink", "set_", "as_strided_",
                                    "unsqueeze_", "detach_and_view"])
def test_host_metadata_change_after_launch(change):
    """Changing a tensor's sizes, strides or storage right after launching a
    kernel that writes it (y) or reads it (z = y * 2) does not change what the
    pending kernels compute."""
    x = make((3, 4), torch.float32, seed=1)
    xa = x.axon()
    (xa + 1) * 2
    torch.axon.synchronize()
    sleep_on_stream(0, 200)
    y = xa + 1
    z = y * 2
    other = torch.full((5,), 7.0, device="axon")
    assert not torch.axon.current_stream().query()  # the kernels are still pending
    if change == "t_":
        y.t_()
        expected = (x + 1).t()
    elif change == "resize_grow":
        y.resize_(40)
        expected = None
    elif change == "resize_shrink":
        y.resize_(2, 2)
        expected = (x + 1).flatten()[:4].view(2, 2)
    elif change == "set_":
        y.set_(other)
        expected = torch.full((5,), 7.0)
    elif change == "as_strided_":
        y.as_strided_((2, 3), (1, 4), 1)
        expected = (x + 1).flatten().as_strided((2, 3), (1, 4), 1)
    elif change == "unsqueeze_":
        y.unsqueeze_(0)
        expected = (x + 1).unsqueeze(0)
    else:
        y = y.detach().view(12)
        expected = (x + 1).flatten()
    assert_same(z, (x + 1) * 2)
    if expected is None:  # grown: the old elements kept, in place
        assert y.shape == (40,)
        assert_same(y[:12], (x + 1).flatten())
    else:
        assert_same(y, expected)
    assert_same(other, torch.full((5,), 7.0))  # set_ did not redirect the pending write


def test_input_storage_freed_after_launch_is_not_reused_early():
    x = make((64, 64), torch.float32, seed=1)
    xa = x.axon()
    (xa @ xa).sum()
    torch.axon.synchronize()
    sleep_on_stream(0, 200)
    tmp = xa * 3
    y = tmp @ xa  # pending, reads tmp
    del tmp  # the host drops its last reference before the kernel ran
    junk = [torch.full((64, 64), float(i), device="axon") for i in range(4)]
    assert_same(y, (x * 3) @ x, accum=True)
    del junk


@pytest.mark.parametrize("direction", ["default_to_side", "side_to_default"])
def test_side_stream_ordered_with_wait_stream(direction):
    x = make((32, 32), torch.float32, seed=1)
    w = make((32, 32), torch.float32, seed=2)
    expected = torch.softmax((x * 2) @ w, -1)
    xa, wa = x.axon(), w.axon()
    torch.softmax((xa * 2) @ wa, -1)
    torch.axon.synchronize()
    side = torch.axon.Stream()
    default = torch.axon.current_stream()
    if direction == "default_to_side":
        sleep_on_stream(0, 200)  # the producer on the default stream is late
        h = xa * 2
        side.wait_stream(default)
        with torch.axon.stream(side):
            out = torch.softmax(h @ wa, -1)
            h.record_stream(side)
        default.wait_stream(side)
    else:
        with torch.axon.stream(side):
            sleep_on_stream(0, 200)
            h = xa * 2
        default.wait_stream(side)
        h.record_stream(default)
        out = torch.softmax(h @ wa, -1)
    assert_same(out, expected, accum=True)


def test_side_stream_runs_while_default_stream_is_busy():
    a = make((16, 16), torch.float32, seed=1)
    aa = a.axon()
    side = torch.axon.Stream()
    with torch.axon.stream(side):
        (aa * 2 + 1).softmax(-1)
    torch.axon.synchronize()
    sleep_on_stream(0, BUSY_MS)
    t0 = time.perf_counter()
    with torch.axon.stream(side):
        r = (aa * 2 + 1).softmax(-1)
    side.synchronize()
    assert time.perf_counter() - t0 < BUSY_MS / 1000 / 2
    assert not torch.axon.default_stream().query()
    with torch.axon.stream(side):
        assert_same(r, (a * 2 + 1).softmax(-1))


# ================================================================ errors at the call

def cpu_and_axon_raise_alike(fn, cpu_args, stream_busy=True, same_message=True):
    """fn raises the same exception type (and first message line) on axon as on
    the CPU, at the call, even while the axon stream is busy."""
    with pytest.raises(Exception) as cpu_err:  # noqa: PT011 - the CPU's error defines it
        fn(*cpu_args)
    ax_args = [a.axon() if isinstance(a, torch.Tensor) else a for a in cpu_args]
    torch.axon.synchronize()
    if stream_busy:
        sleep_on_stream(0, 150)
    match = re.escape(str(cpu_err.value).splitlines()[0]) if same_message else None
    with pytest.raises(cpu_err.type, match=match):
        fn(*ax_args)
    # the device keeps working after the error
    assert (torch.ones(2, device="axon") * 3).sum().item() == 6


ERROR_CASES = {
    "add_shapes": (lambda a, b: a + b, [torch.ones(3), torch.ones(4)]),
    "matmul_shapes": (lambda a, b: a @ b, [torch.ones(2, 3), torch.ones(2, 3)]),
    "bmm_shapes": (torch.bmm, [torch.ones(2, 2, 3), torch.ones(3, 3, 2)]),
    "inplace_broadcast_resize": (lambda a, b: a.add_(b), [torch.ones(3, 1), torch.ones(1, 4)]),
    "inplace_broadcast_mul": (lambda a, b: a.mul_(b), [torch.ones(1, 3), torch.ones(2, 3)]),
    "out_wrong_dtype_add": (lambda a, o: torch.add(a, a, out=o),
                            [torch.ones(3), torch.empty(3, dtype=torch.int64)]),
    "out_wrong_dtype_mm": (lambda a, o: torch.mm(a, a, out=o),
                           [torch.ones(2, 2), torch.empty(2, 2, dtype=torch.float16)]),
    "out_wrong_dtype_softmax": (lambda a, o: torch.softmax(a, -1, out=o),
                                [torch.ones(2, 2), torch.empty(2, 2, dtype=torch.int32)]),
    "float8_mul": (lambda a: a * 2, [torch.ones(3, dtype=torch.float8_e4m3fn)]),
    "float8_add": (lambda a: a + a, [torch.ones(3, dtype=torch.float8_e5m2)]),
    "bitwise_and_float": (torch.bitwise_and, [torch.ones(3), torch.ones(3)]),
    "softmax_int": (lambda a: torch.softmax(a, 0), [torch.ones(3, dtype=torch.int64)]),
    "layer_norm_shape": (lambda a: F.layer_norm(a, (4,)), [torch.ones(2, 3)]),
    "layer_norm_int": (lambda a: F.layer_norm(a, (3,)), [torch.ones(2, 3, dtype=torch.int32)]),
    "layer_norm_complex": (lambda a: F.layer_norm(a, (3,)),
                           [torch.ones(2, 3, dtype=torch.complex64)]),
    "sdpa_int": (lambda q: F.scaled_dot_product_attention(q, q, q),
                 [torch.ones(1, 2, 3, 4, dtype=torch.int32)]),
    "view_bad_shape": (lambda a: a.view(5), [torch.ones(2, 3)]),
    "rms_norm_int": (lambda a: F.rms_norm(a, (3,)), [torch.ones(2, 3, dtype=torch.int32)]),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_are_raised_at_the_call_like_cpu(case):
    fn, args = ERROR_CASES[case]
    cpu_and_axon_raise_alike(fn, args)


def test_index_out_of_range_is_reported_by_the_next_synchronisation():
    """Like a CUDA device-side error: an index is data, so a kernel finds it out of
    range on the stream (synchronously only on the first launch of a kernel with
    these dtypes), and the error names the op at the next synchronising call."""
    a = torch.ones(3, device="axon")
    a.index_select(0, torch.tensor([0], device="axon"))  # the dtype check's launch
    torch.axon.synchronize()
    with pytest.raises(RuntimeError, match="index_select.*out of range|out of range"):
        a.index_select(0, torch.tensor([5], device="axon"))
        torch.axon.synchronize()
    torch.testing.assert_close((a + 1).cpu(), torch.full((3,), 2.0))  # still usable


def test_unsupported_dtype_first_call_raises_and_later_calls_work():
    """A kernel's first call with a new dtype combination is synchronous, so an
    unsupported dtype raises at the call; asking again raises again."""
    for _ in range(2):
        x = torch.ones(3, dtype=torch.float8_e4m3fn).axon()
        with pytest.raises(NotImplementedError):
            x * 2
        with pytest.raises(NotImplementedError):
            torch.bitwise_and(torch.ones(3, device="axon"), torch.ones(3, device="axon"))
    torch.axon.synchronize()  # nothing asynchronous was left behind


# ================================================================ deadlock regression

def test_setitem_in_a_loop_after_queued_ops_does_not_deadlock():
    r = run_python("""
        import torch, threading
        x = torch.zeros(64, 64, device="axon")
        w = torch.ones(64, 64, device="axon")
        torch.axon._C._test_sleep_on_stream(0, 100)
        for _ in range(500):  # many queued ops
            x = x * 1.0 + 0.0
        for i in range(200):
            y = x * 2
            x[0] = 1.0
            x[1, i % 64] = y[0, 0]
            x[x < -1] = 0.0
        # and with another Python thread holding the GIL busy
        stop = False
        def spin():
            while not stop:
                sum(range(100))
        t = threading.Thread(target=spin)
        t.start()
        for i in range(200):
            y = x @ w
            x[0] = float(i)
        stop = True
        t.join()
        torch.axon.synchronize()
        print("ok", x[0, 0].item(), x[1].sum().item())
    """, timeout=90)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", "199.0", "128.0"], r.stdout


# ================================================================ random ops

def random_draws(seed, busy=False, dtype=torch.float32):
    torch.manual_seed(seed)
    if busy:
        sleep_on_stream(0, 100)
    x = torch.ones(200, device="axon", dtype=dtype)
    out = [torch.rand(50, device="axon", dtype=dtype), torch.randn(7, 9, device="axon", dtype=dtype),
           torch.bernoulli(torch.full((64,), 0.3, device="axon", dtype=dtype)),
           F.dropout(x, 0.4, training=True),
           torch.multinomial(torch.arange(1.0, 11.0, device="axon"), 6),
           torch.multinomial(torch.ones(4, device="axon"), 30, replacement=True),
           torch.empty(33, device="axon", dtype=dtype).uniform_(-2, 2),
           torch.empty(20, device="axon", dtype=dtype).normal_(1, 3)]
    return [t.cpu() for t in out]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_random_ops_reproducible_with_same_seed(dtype):
    a = random_draws(31, dtype=dtype)
    b = random_draws(31, dtype=dtype)
    c = random_draws(32, dtype=dtype)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert sum(not torch.equal(x, y) for x, y in zip(a, c)) >= len(a) - 1


def test_random_ops_independent_of_stream_timing():
    """The generator's offsets are reserved on the host at the call, so the
    results do not depend on when the kernels run (or on which stream)."""
    a = random_draws(41, busy=True)
    torch.manual_seed(41)
    b = []
    for f in (lambda: torch.rand(50, device="axon"), lambda: torch.randn(7, 9, device="axon"),
              lambda: torch.bernoulli(torch.full((64,), 0.3, device="axon"))):
        b.append(f().cpu())
        torch.axon.synchronize()
    side = torch.axon.Stream()
    with torch.axon.stream(side):
        b.append(F.dropout(torch.ones(200, device="axon"), 0.4, training=True).cpu())
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_native_dropout_mask_matches_output(dtype, no_fallback):
    x = make((40, 50), dtype, 0.5, 2, seed=1)
    torch.manual_seed(3)
    out, mask = torch.native_dropout(x.axon(), 0.3, True)
    assert mask.dtype == torch.bool and mask.shape == x.shape
    out, mask = out.cpu(), mask.cpu()
    torch.testing.assert_close(out, x * mask * (1 / 0.7), **tol(dtype))
    frac = mask.double().mean().item()
    assert abs(frac - 0.7) < Z * math.sqrt(0.21 / mask.numel())
    # backward uses the same mask
    xa = leaf(x, "axon")
    torch.manual_seed(3)
    y = F.dropout(xa, 0.3, training=True)
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(y.detach().cpu(), out, rtol=0, atol=0)
    torch.testing.assert_close(xa.grad.cpu(), (mask * (1 / 0.7)).to(dtype), **tol(dtype))


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_recomputes_the_same_attention_dropout(use_reentrant):
    """Extends test_random's checkpoint test to the fused attention kernel's
    dropout, which draws from the axon generator inside the kernel."""
    from torch.utils.checkpoint import checkpoint

    q0, k0, v0 = (make((2, 2, 6, 8), torch.float32, -1, 1, seed=s) for s in (1, 2, 3))

    def f(q, k, v):
        return (F.scaled_dot_product_attention(q, k, v, dropout_p=0.5) ** 2).sum()

    results = []
    for ckpt in (False, True):
        q, k, v = (leaf(t, "axon") for t in (q0, k0, v0))
        torch.manual_seed(8)
        y = checkpoint(f, q, k, v, use_reentrant=use_reentrant) if ckpt else f(q, k, v)
        y.backward()
        results.append([y.detach().cpu()] + [t.grad.cpu() for t in (q, k, v)])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---------------------------------------------------------------- linear layers

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 5, 8, 9])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "strided_rows", "contiguous_weight_t"])
def test_linear_few_rows_matches_cpu(rows, bias, layout, dtype, no_fallback):
    """F.linear / mm / addmm with up to 8 rows take kernels/linear (x @ W^T read at
    memory speed; float32, bfloat16, float16); more rows and other layouts take
    ATen's GEMM."""
    if layout == "strided_rows":  # row stride 40, unit column stride
        x = make((rows, 40), dtype, seed=1)[:, :37]
    else:
        x = make((rows, 37), dtype, seed=1)
    w = make((53, 37), dtype, seed=2)
    b = make((53,), dtype, seed=3) if bias else None
    if layout == "contiguous_weight_t":  # mm(x, W) with W [K, N] row-major: the GEMM path
        wt = make((37, 53), dtype, seed=4)
        compare_fwd_bwd(lambda x, wt: x @ wt, [x, wt], dtype)
        return
    compare_fwd_bwd(lambda x, w, *b: F.linear(x, w, *b), [x, w] + ([b] if bias else []),
                    dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_few_rows_long_rows_16bit_matches_cpu(dtype, no_fallback):
    """Rows of 1408 (a down projection): 8 rows do not fit the kernel's L1 panel
    together and go in two groups over blocks of the weight."""
    x = make((8, 1408), dtype, -1, 1, seed=9)
    w = make((300, 1408), dtype, -0.05, 0.05, seed=10)
    b = make((300,), dtype, seed=11)
    assert_same(F.linear(x.axon(), w.axon(), b.axon()), F.linear(x, w, b), dtype=dtype,
                accum=True)


@pytest.mark.parametrize("xdtype,wdtype", [(torch.bfloat16, torch.float32),
                                           (torch.float32, torch.float16),
                                           (torch.bfloat16, torch.float16)])
def test_linear_few_rows_mixed_dtypes_raise_like_cpu(xdtype, wdtype):
    x, w = make((2, 16), xdtype, seed=1), make((8, 16), wdtype, seed=2)
    with pytest.raises(RuntimeError) as cpu_error:
        F.linear(x, w)
    with pytest.raises(RuntimeError) as axon_error:
        F.linear(x.axon(), w.axon())
    assert str(axon_error.value).split("\n")[0] == str(cpu_error.value).split("\n")[0]


@pytest.mark.parametrize("case", ["bias_float32", "out_float32", "out_bfloat16_for_half"])
def test_linear_few_rows_other_bias_or_out_dtype_like_cpu(case):
    """A bias or out= of another dtype than the 16-bit operands is not the
    few-rows kernel's: ATen's addmm/mm decide (result or error), as on the CPU."""
    dt = torch.float16 if case == "out_bfloat16_for_half" else torch.bfloat16
    x, w = make((3, 16), dt, seed=1), make((8, 16), dt, seed=2)
    b = make((8,), torch.float32 if case == "bias_float32" else dt, seed=3)

    def run(device):
        xd, wd, bd = x.to(device), w.to(device), b.to(device)
        if case == "bias_float32":
            return torch.addmm(bd, xd, wd.t())
        out = torch.zeros(3, 8, device=device,
                          dtype=torch.float32 if case == "out_float32" else torch.bfloat16)
        return torch.mm(xd, wd.t(), out=out)

    try:
        expected = run("cpu")
    except RuntimeError as e:
        with pytest.raises(RuntimeError) as axon_error:
            run("axon")
        assert str(axon_error.value).split("\n")[0] == str(e).split("\n")[0]
        return
    assert_same(run("axon"), expected, dtype=dt, accum=True)


def test_linear_decode_shape_in_a_model_matches_cpu(no_fallback):
    lin = torch.nn.Linear(64, 300)
    x = make((3, 1, 64), torch.float32, seed=5)
    lin_a = copy.deepcopy(lin).axon()  # 3 rows after folding (3, 1): the few-rows kernel
    assert_same(lin_a(x.axon()), lin(x), accum=True)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_large_weight_on_all_threads_matches_cpu(rows, bias, dtype, no_fallback):
    """A weight of 4M elements or more (an output projection) is split over the
    device's whole thread team; the columns the threads share out must all be
    written, once."""
    k, n = 512, 8195  # 4.2M elements; odd n: the split has a ragged end
    x = make((rows, k), dtype, -1, 1, seed=6)
    w = make((n, k), dtype, -0.1, 0.1, seed=7)
    b = make((n,), dtype, seed=8) if bias else None
    got = F.linear(x.axon(), w.axon(), None if b is None else b.axon())
    assert_same(got, F.linear(x, w, b), dtype=dtype, accum=True)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("out_kind", ["exact", "strided_rows", "wrong_shape", "aliases_input"])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_few_rows_out_variant_matches_cpu(out_kind, bias, dtype, no_fallback):
    """mm.out / addmm.out (what torch.compile's generated code calls) take the
    few-rows kernel when out is a fresh buffer of the operands' dtype and the
    right shape; else ATen's out= path (resize, overlap rules)."""
    if out_kind == "aliases_input" and dtype != torch.float32:
        # An out= overlapping its input gives whatever the kernel's order gives:
        # ATen's float32 GEMM packs its inputs first; its 16-bit kernels do not,
        # and 20 runs of the same call on the CPU alone give different results.
        pytest.skip("out= overlapping the input: undefined in bf16/fp16, on the CPU too")
    x = make((4, 37), dtype, seed=1)
    w = make((53, 37), dtype, seed=2)
    b = make((53,), dtype, seed=3)

    def run(device):
        xd, wd, bd = x.to(device), w.to(device), b.to(device)
        if out_kind == "exact":
            out = torch.full((4, 53), 7.0, device=device, dtype=dtype)
        elif out_kind == "strided_rows":
            out = torch.full((4, 60), 7.0, device=device, dtype=dtype)[:, :53]
        elif out_kind == "wrong_shape":
            out = torch.empty(0, device=device, dtype=dtype)
        else:  # out shares memory with x (a [4, 53] view of a bigger buffer)
            xd = torch.cat([xd, torch.zeros(4, 16, device=device, dtype=dtype)], 1)[:, :37]
            out = xd.as_strided((4, 53), (53, 1))
        result = torch.addmm(bd, xd, wd.t(), out=out) if bias else torch.mm(xd, wd.t(), out=out)
        assert result.data_ptr() == out.data_ptr()
        return out

    expected = run("cpu")
    assert_same(run("axon"), expected, dtype=dtype, accum=True)


# ---------------------------------------------------------------- review regressions

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_layer_norm_bias_only_in_another_dtype(dtype):
    x = make((4, 8), dtype, seed=1)
    b = make((8,), torch.float32, seed=2)
    assert_same(F.layer_norm(x.axon(), (8,), None, b.axon()), F.layer_norm(x, (8,), None, b),
                dtype=dtype, accum=True)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_rms_norm_default_eps_on_small_activations(dtype):
    """ATen's default eps is that of the type it computes in (float32 for half types)."""
    x = (make((2, 8), torch.float32, seed=3) * 1e-3).to(dtype)
    assert_same(F.rms_norm(x.axon(), (8,)), F.rms_norm(x, (8,)), dtype=dtype, accum=True)


def test_random_op_rejects_a_cpu_generator_like_cuda():
    with pytest.raises(RuntimeError, match="Expected a 'axon' device type for generator"):
        torch.empty(3, device="axon").uniform_(generator=torch.Generator())


def test_fused_adam_reads_cpu_scalars_at_the_call():
    """A CPU grad_scale is read when the step is launched, not when the stream gets to
    it: changing it right after the call (stream still busy) changes nothing."""
    def step(device, scale):
        p = torch.ones(4, device=device)
        torch._fused_adamw_([p], [torch.full((4,), 2.0, device=device)],
                            [torch.zeros(4, device=device)], [torch.zeros(4, device=device)], [],
                            [torch.ones((), device=device)], lr=0.1, beta1=0.9, beta2=0.999,
                            weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False,
                            grad_scale=scale)
        return p

    scale = torch.tensor(2.0)
    sleep_on_stream(0, 200)
    p = step("axon", scale)
    scale.fill_(1e30)
    torch.testing.assert_close(p.cpu(), step("cpu", torch.tensor(2.0)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("found_inf", [0.0, 1.0])
def test_fused_adamw_unscales_gradients_like_cpu(dtype, found_inf):
    """With grad_scale, ATen's fused kernels leave grad / grad_scale in the gradients
    (when no inf was found); so does axon's."""
    def step(device):
        p = make((37,), dtype, seed=1).to(device)
        g = make((37,), dtype, seed=2).to(device)
        torch._fused_adamw_([p], [g], [torch.zeros_like(p)], [torch.zeros_like(p)], [],
                            [torch.ones((), device=device)], lr=0.1, beta1=0.9, beta2=0.999,
                            weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False,
                            grad_scale=torch.tensor(4.0, device=device),
                            found_inf=torch.tensor(found_inf, device=device))
        return p, g

    (pa, ga), (pc, gc) = step("axon"), step("cpu")
    assert_same(pa, pc, dtype=dtype, accum=True)
    assert_same(ga, gc, dtype=dtype, accum=True)


def test_relu_and_dropout_keep_channels_last_like_cpu():
    x = make((2, 3, 4, 5), torch.float32, seed=4).to(memory_format=torch.channels_last)
    assert torch.relu(x.axon()).stride() == torch.relu(x).stride()
    assert F.dropout(x.axon(), 0.5).stride() == F.dropout(x, 0.5).stride()
    assert_same(torch.relu(x.axon()), torch.relu(x))


@pytest.mark.parametrize("lo,hi", [(3.0, 1.0), (float("nan"), 1.0), (0.0, float("inf"))])
def test_histc_bad_range_raises_at_the_call_like_cpu(lo, hi):
    cpu_and_axon_raise_alike(lambda a: torch.histc(a, bins=4, min=lo, max=hi), [torch.ones(3)])


@pytest.mark.parametrize("layout", ["contiguous", "bhld_from_blhd", "fused_qkv_slices"])
def test_sdpa_output_and_grad_strides_match_the_meta_kernel(layout):
    """Fake-tensor tracing (torch.compile) checks real strides against the Meta
    kernel's: output like the query (empty_like: dense in the query's dimension
    order when the query is not dense), gradients like their inputs."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def make_qkv():
        t = make((2, 5, 4, 8), torch.float32, seed=6)
        return t.transpose(1, 2) if layout == "bhld_from_blhd" else t.reshape(2, 4, 5, 8)

    if layout == "fused_qkv_slices":  # q, k, v: slices of one [B, L, 3 * H * D] projection
        qkv = make((2, 5, 96), torch.float32, seed=6).axon()
        q, k, v = (t.view(2, 5, 4, 8).transpose(1, 2) for t in qkv.split(32, -1))
        assert not q.is_contiguous() and q.stride()[1] == 8  # heads interleaved with k, v
    else:
        q, k, v = (make_qkv().axon() for _ in range(3))
    op = torch.ops.aten._scaled_dot_product_fused_attention_overrideable
    real = op(q, k, v, None, 0.0, True)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = op(*(mode.from_tensor(t) for t in (q, k, v)), None, 0.0, True)
    assert real[0].stride() == fake[0].stride()
    # Gradients as the backward op returns them (autograd.grad: no AccumulateGrad
    # relayout), against the same under fake tensors.
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    grads = torch.autograd.grad(op(*leaves, None, 0.0, True)[0].sum(), leaves)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake_leaves = [mode.from_tensor(t).detach().requires_grad_() for t in (q, k, v)]
        fake_grads = torch.autograd.grad(op(*fake_leaves, None, 0.0, True)[0].sum(), fake_leaves)
    for g, f, t in zip(grads, fake_grads, (q, k, v)):
        assert g.stride() == f.stride() == torch.empty_like(t).stride()
