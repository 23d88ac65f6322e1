"""scaled_dot_product_attention on axon against the CPU: the fused kernel
forward and backward (masks, causal, GQA, non-contiguous and strided inputs,
KV caches, head sizes, empty inputs), the math path where it applies, the
fused dropout (reproducible, keep fraction and scaling, backward with the
same mask, under activation checkpointing), errors and strides as the Meta
kernel gives them. FlexAttention: test_flex_attention.py.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import FLOAT_DTYPES, assert_same, make, tol
from op_util import Z, compare_fwd_bwd, leaf


FUSED_SDPA = "ScaledDotProductFusedAttentionOverrideableBackward0"


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

    def apply_views(q, k, v):
        q, k, v = (view(t) for view, t in zip(views, (q, k, v)))
        if layout != "bhld" and q.numel() > 0:
            assert not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous())
        return q, k, v

    def fn(q, k, v, mask=None):
        return F.scaled_dot_product_attention(*apply_views(q, k, v), attn_mask=mask, **kw)
    fn.apply_views = apply_views
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


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_recomputes_the_same_attention_dropout(use_reentrant):
    """Extends test_random.py's checkpoint test to the fused attention kernel's
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


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
@pytest.mark.parametrize("case", ["eval_no_grad", "eval_grad", "train", "final_norm", "src_mask",
                                  "left_padded"])
def test_transformer_encoder_with_padding_mask_matches_cpu(mask_dtype, case):
    # nn.TransformerEncoder's inference fast path packs a padded batch into a nested
    # tensor on the CPU (zeros at padded positions, before the final norm); on axon the
    # same results, in the cases upstream takes that path and in those it does not
    import copy

    torch.manual_seed(0)
    norm = None
    if case == "final_norm":
        norm = torch.nn.LayerNorm(16)
        torch.nn.init.normal_(norm.bias)
    enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(
        16, 4, 32, batch_first=True, dropout=0.0), 2, norm=norm)
    enc.train(case == "train")
    x = make((3, 6, 16), torch.float32, seed=11)
    kpm = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [False] * 1 + [True] * 5])
    if case == "left_padded":
        kpm = kpm.flip(1)
    if mask_dtype != torch.bool:
        kpm = torch.zeros(kpm.shape).masked_fill(kpm, float("-inf"))
    src_mask = torch.nn.Transformer.generate_square_subsequent_mask(6) if case == "src_mask" \
        else None
    dev = copy.deepcopy(enc).axon()

    with torch.set_grad_enabled(case in ("eval_grad", "train")):
        want = enc(x, src_mask, kpm)
        got = dev(x.axon(), None if src_mask is None else src_mask.axon(), kpm.axon())
    assert_same(got, want, accum=True)


def test_sdpa_kernel_context_chooses_the_backend():
    """torch.nn.attention.sdpa_kernel as on the CPU and CUDA: MATH alone runs the math
    path, the fused backends run axon's fused kernel, a backend axon lacks is PyTorch's
    "No viable backend" error."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (make((1, 2, 5, 4), torch.float32, seed=s).to("axon").requires_grad_()
               for s in (1, 2, 3))
    fused = "ScaledDotProductFusedAttentionOverrideableBackward0"
    assert F.scaled_dot_product_attention(q, k, v).grad_fn.name() == fused
    for backend, want_fused in ((SDPBackend.MATH, False), (SDPBackend.OVERRIDEABLE, True),
                                (SDPBackend.FLASH_ATTENTION, True),
                                (SDPBackend.EFFICIENT_ATTENTION, True)):
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v)
        assert (out.grad_fn.name() == fused) == want_fused, backend
        expected = F.scaled_dot_product_attention(q.detach().cpu(), k.detach().cpu(),
                                                  v.detach().cpu())
        torch.testing.assert_close(out.detach().cpu(), expected, atol=1e-5, rtol=1e-5)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        with pytest.raises(RuntimeError, match="No viable backend for scaled_dot_product_attention"):
            F.scaled_dot_product_attention(q, k, v)
    # fused backends only, inputs the fused kernel does not take (3-D): an error, as
    # CUDA's, not the disabled math path
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        with pytest.raises(RuntimeError, match="No available kernel"):
            F.scaled_dot_product_attention(q[0], k[0], v[0])
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]):
        out = F.scaled_dot_product_attention(q[0], k[0], v[0])
    torch.testing.assert_close(out.detach().cpu(), F.scaled_dot_product_attention(
        q[0].detach().cpu(), k[0].detach().cpu(), v[0].detach().cpu()), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("transform", ["vmap", "vmap_grad", "jacfwd", "dual"])
def test_sdpa_under_torch_func_transforms_matches_cpu(transform):
    """The fused op has no vmap batching rule and no forward derivative: inside
    torch.func transforms and for dual tensors axon takes the math path, as the CPU can
    (the CPU's forward AD needs MATH: its flash kernel has no forward derivative)."""
    import torch.autograd.forward_ad as fwAD
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def f(a):
        return F.scaled_dot_product_attention(a, a * 0.5, a, is_causal=True)

    def run(x):
        if transform == "vmap":
            return torch.func.vmap(f)(x)
        if transform == "vmap_grad":
            return torch.func.vmap(torch.func.grad(lambda a: f(a).square().sum()))(x)
        if transform == "jacfwd":
            return torch.func.jacfwd(lambda a: f(a).sum(-1))(x[0])
        with fwAD.dual_level():
            dual = fwAD.make_dual(x[0], torch.ones_like(x[0]))
            return fwAD.unpack_dual(f(dual)).tangent

    x = make((3, 1, 2, 5, 4), torch.float32, seed=7)
    with sdpa_kernel(SDPBackend.MATH):
        expected = run(x)
    torch.testing.assert_close(run(x.to("axon")).cpu(), expected, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- jagged nested tensors

NJT_CASES = {
    "self": dict(q=(3, 5, 2), kv=None),
    "cross": dict(q=(3, 5, 2), kv=(4, 1, 6)),  # other key/value lengths per sequence
    "one_sequence": dict(q=(7,), kv=None),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", list(NJT_CASES))
def test_sdpa_on_jagged_nested_tensors_matches_cpu(case, dtype):
    # upstream's math path for jagged inputs goes through strided nested tensors (which
    # axon lacks); axon computes it sequence by sequence; forward and gradients vs the CPU
    heads, dim = 2, 8
    spec = NJT_CASES[case]
    q_parts = [make((n, heads, dim), dtype, seed=i) for i, n in enumerate(spec["q"])]
    kv_lens = spec["kv"] or spec["q"]
    k_parts = [make((n, heads, dim), dtype, seed=10 + i) for i, n in enumerate(kv_lens)]
    v_parts = [make((n, heads, dim), dtype, seed=20 + i) for i, n in enumerate(kv_lens)]
    g_parts = [make((n, heads, dim), dtype, seed=30 + i) for i, n in enumerate(spec["q"])]
    results = {}
    for dev in ("cpu", "axon"):
        leaves = [[p.detach().clone().to(dev).requires_grad_() for p in parts]
                  for parts in (q_parts, k_parts, v_parts)]
        q, k, v = (torch.nested.as_nested_tensor(ps, layout=torch.jagged).transpose(1, 2)
                   for ps in leaves)
        out = F.scaled_dot_product_attention(q, k, v, scale=0.3)
        assert out.is_nested and out.shape[0] == len(spec["q"])
        values = out.transpose(1, 2).values()
        values.backward(torch.cat(g_parts).to(dev))
        results[dev] = [values.detach().cpu()] + [p.grad.cpu() for ps in leaves for p in ps]
    t = tol(dtype, accum=True)
    for got, expected in zip(results["axon"], results["cpu"]):
        torch.testing.assert_close(got, expected, **t)


def test_sdpa_on_jagged_nested_tensors_keeps_upstream_errors():
    parts = [torch.randn(n, 2, 8, device="axon") for n in (3, 4)]
    nt = torch.nested.as_nested_tensor(parts, layout=torch.jagged).transpose(1, 2)
    with pytest.raises(ValueError, match="Masks are not yet supported"):
        F.scaled_dot_product_attention(nt, nt, nt, attn_mask=torch.ones(2, 2, device="axon"))


# ------------------------------------------- CUDA's backend ops, called directly
#
# torch.distributed's context parallelism and Diffusers' ring attention call
# aten::_scaled_dot_product_flash_attention / _efficient_attention themselves
# (they need the logsumexp).  Reference: the CPU's math SDPA for the output and
# gradients, the float32 logsumexp of the scaled, masked scores.

FLASH_CASES = ["plain", "causal", "q_shorter", "q_longer_causal", "gqa", "noncontig",
               "noncontig_gqa_causal", "head_dim_64", "scale", "tiles", "kv_cache_slice",
               "expanded_kv", "strided_head_dim", "zero_batch"]
EFFICIENT_CASES = FLASH_CASES + ["dv_differs", "bool_mask_4d", "additive_mask_2d",
                                 "additive_mask_b1ls", "bool_mask_full_row", "float32_mask",
                                 "zero_kv_len"]
MASKED_CASES = ["bool_mask_4d", "additive_mask_b1ls", "bool_mask_full_row"]


def backend_op_call(kind, case, dtype, compute_log_sumexp=True):
    """(op on axon leaves -> (out, lse), reference on CPU leaves -> (out, lse),
    CPU leaves) for a SDPA_CASES case."""
    fn, inputs = sdpa_inputs(case, dtype)
    (_, _, _, _, _, D, _), kw = SDPA_CASES[case]
    causal, scale = kw.get("is_causal", False), kw.get("scale")
    viewed = fn.apply_views
    mask = inputs[3] if len(inputs) == 4 else None

    def on_axon(q, k, v):
        q, k, v = viewed(q, k, v)
        m = None if mask is None else mask.to("axon")
        if m is not None and m.dtype == torch.bool:  # as SDPA converts it
            m = torch.zeros(m.shape, dtype=q.dtype, device="axon").masked_fill(~m, float("-inf"))
        if kind == "flash":
            r = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal,
                                                                   scale=scale)
            return r[0], r[1]
        r = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, m, compute_log_sumexp, 0.0, causal, scale=scale)
        return r[0], r[1][..., :q.shape[2]]

    def reference(q, k, v):
        q, k, v = viewed(q, k, v)
        gqa = q.shape[1] != k.shape[1]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                             scale=scale, enable_gqa=gqa)
        kr = k.detach().float().repeat_interleave(q.shape[1] // max(k.shape[1], 1), 1)
        s = q.detach().float() @ kr.transpose(-1, -2) * (scale or 1 / math.sqrt(D))
        if causal:
            s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.float()
        return out, torch.logsumexp(s, -1)
    return on_axon, reference, inputs[:3]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("kind,case", [("flash", c) for c in FLASH_CASES] +
                         [("efficient", c) for c in EFFICIENT_CASES])
def test_flash_and_efficient_attention_ops_match_cpu(kind, case, dtype, no_fallback):
    check_backend_op(kind, case, dtype)


def check_backend_op(kind, case, dtype, compute_log_sumexp=True):
    on_axon, reference, inputs = backend_op_call(kind, case, dtype, compute_log_sumexp)
    q, k, v = (leaf(t, "axon") for t in inputs)
    qc, kc, vc = (leaf(t, "cpu") for t in inputs)
    out, lse = on_axon(q, k, v)
    out_c, lse_c = reference(qc, kc, vc)
    assert_same(out, out_c, dtype=dtype, accum=True)
    assert lse.dtype == torch.float32
    if compute_log_sumexp:  # (-inf for a row that sees no key, as the reference)
        torch.testing.assert_close(lse.cpu(), lse_c, rtol=1e-4, atol=1e-4)
    else:
        assert lse.numel() == 0
    grad = make(out_c.shape, dtype, -1, 1, seed=9)
    grads = torch.autograd.grad(out, (q, k, v), grad.to("axon"))
    grads_c = torch.autograd.grad(out_c, (qc, kc, vc), grad)
    for g, gc in zip(grads, grads_c):
        assert_same(g, gc, dtype=dtype, accum=True)


@pytest.mark.parametrize("mode", ["own", "library"])
@pytest.mark.parametrize("case", MASKED_CASES)
def test_efficient_attention_op_logsumexp_with_either_kernel_selection(
        case, mode, kernel_select_isolated, no_fallback):
    """The logsumexp goes to the caller (ring attention merges partial results by
    it): -inf for a row that sees no key whichever kernel the selection prefers."""
    torch.ops.axon._set_kernel_select(mode)
    check_backend_op("efficient", case, torch.float32)


@pytest.mark.parametrize("case", ["causal", "additive_mask_b1ls", "gqa"])
def test_efficient_attention_op_without_logsumexp_backward(case, no_fallback):
    """compute_log_sumexp=False returns an empty logsumexp; the backward
    recomputes it."""
    check_backend_op("efficient", case, torch.float32, compute_log_sumexp=False)


def test_flash_and_efficient_attention_ops_strides_match_the_meta_kernel():
    """Outputs, logsumexp and gradients laid out as the ops' Meta kernels say
    (flash: like the query; memory-efficient: [B, L, H, D] memory order and a
    logsumexp padded to 32), so compiled graphs calling them agree."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    t = make((2, 5, 4, 8), torch.float32, seed=6)
    q, k, v = (t.transpose(1, 2).to("axon"), t.reshape(2, 4, 5, 8).to("axon"),
               t.reshape(2, 4, 5, 8).to("axon"))
    flash = torch.ops.aten._scaled_dot_product_flash_attention
    eff = torch.ops.aten._scaled_dot_product_efficient_attention
    calls = {"flash": lambda q, k, v: flash(q, k, v, 0.0, True),
             "efficient": lambda q, k, v: eff(q, k, v, None, True, 0.0, True),
             "efficient_no_lse": lambda q, k, v: eff(q, k, v, None, False, 0.0, False)}
    for name, call in calls.items():
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        real = call(*leaves)
        grads = torch.autograd.grad(real[0].sum(), leaves)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fl = [mode.from_tensor(x).detach().requires_grad_() for x in (q, k, v)]
            fake = call(*fl)
            fake_grads = torch.autograd.grad(fake[0].sum(), fl)
        for r, f in zip(real[:2], fake[:2]):
            assert (r.shape, r.stride(), r.dtype) == (f.shape, f.stride(), f.dtype), name
        # the random-number state (flash: rng_state [seed, offset] and unused, uint64)
        seeds = (6, 7) if name == "flash" else (2, 3)
        for i in seeds:
            assert (real[i].shape, real[i].dtype) == (fake[i].shape, fake[i].dtype), (name, i)
        for g, f in zip(grads, fake_grads):
            assert g.stride() == f.stride(), name
    assert eff(q, k, v, None, True)[1].shape == (2, 4, 32)
    assert eff(q, k, v, None, False)[1].shape == (2, 4, 0)


@pytest.mark.parametrize("kind", ["flash", "efficient"])
def test_backend_attention_ops_in_a_compiled_function_match_eager(kind):
    """Forward and backward under torch.compile (Inductor checks every output's
    size and strides against the Meta kernel's, the random-number state too)."""
    qkv = [make((1, 2, 6, 8), torch.float32, seed=s).to("axon") for s in (1, 2, 3)]

    def f(q, k, v):
        if kind == "flash":
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[:2]
        else:
            out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, None, True, 0.0, True)[:2]
        return out * 2, lse + 1

    def run(fn):
        leaves = [t.clone().requires_grad_() for t in qkv]
        out, lse = fn(*leaves)
        out.sum().backward()
        return [out.detach(), lse] + [t.grad for t in leaves]

    got = run(torch.compile(f, backend="inductor", fullgraph=True))
    for a, b in zip(got, run(f)):
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-6, atol=1e-6)


def test_flash_and_efficient_attention_ops_raise_clear_errors():
    q = torch.ones(1, 2, 3, 8, device="axon")
    flash = torch.ops.aten._scaled_dot_product_flash_attention
    eff = torch.ops.aten._scaled_dot_product_efficient_attention
    with pytest.raises(RuntimeError, match="same head_dim"):
        flash(q, q, torch.ones(1, 2, 3, 4, device="axon"))
    with pytest.raises(RuntimeError, match="must divide the number of query heads"):
        flash(q, torch.ones(1, 3, 3, 8, device="axon"), torch.ones(1, 3, 3, 8, device="axon"))
    with pytest.raises(RuntimeError, match="float32, bfloat16 or float16"):
        flash(q.double(), q.double(), q.double())
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        eff(q, q.cpu(), q, None, True)
    with pytest.raises(NotImplementedError, match="return_debug_mask"):
        flash(q, q, q, 0.0, False, True)
    # a mask requiring its gradient: the kernel does not compute it
    bias = torch.zeros(1, 2, 3, 3, device="axon", requires_grad=True)
    leaves = [q.clone().requires_grad_() for _ in range(3)]
    out = eff(*leaves, bias, True)[0]
    with pytest.raises(NotImplementedError, match="gradient of the mask"):
        out.sum().backward()
