"""The shipped hub kernels (examples/kernels/axon-*) against PyTorch on the CPU.

Each kernel runs on axon and is compared with the same math computed by
PyTorch on the CPU in float32 (inputs rounded to the tested dtype first), at
the tolerances of conftest.TOL (elementwise kernels) or TOL_ACCUM (kernels
with a reduction: norms, attention), for float32, bfloat16 and float16, on
contiguous, strided and zero-size inputs; gradients through the registered
backward against autograd of the reference; torch.compile with
fullgraph=True (no graph break) against eager.  Each repository is loaded once
(kernels.get_local_kernel caches the module; the JIT caches the library).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import AXON, FLOAT_DTYPES, REPO_ROOT, tol

kernels = pytest.importorskip("kernels", reason="the kernels library is not installed")

REPOS = Path(REPO_ROOT) / "examples" / "kernels"


@pytest.fixture(scope="module")
def act():
    return kernels.get_local_kernel(REPOS / "axon-activation")


@pytest.fixture(scope="module")
def ln():
    return kernels.get_local_kernel(REPOS / "axon-layernorm")


@pytest.fixture(scope="module")
def rot():
    return kernels.get_local_kernel(REPOS / "axon-rotary")


@pytest.fixture(scope="module")
def vit():
    return kernels.get_local_kernel(REPOS / "axon-vit")


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def close(actual, expected, dtype, accum=False):
    torch.testing.assert_close(actual.cpu().float(), expected.float(), **tol(dtype, accum))


# ---- activation ----------------------------------------------------------------------------

ACTS = {
    "silu_and_mul": lambda g, u: F.silu(g) * u,
    "gelu_and_mul": lambda g, u: F.gelu(g) * u,
    "gelu_tanh_and_mul": lambda g, u: F.gelu(g, approximate="tanh") * u,
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("name", list(ACTS))
def test_act_and_mul(act, name, dtype):
    # 2 * 37 + a strided view of a wider tensor (row stride 96) and a tail of 37 % lanes
    base = rand(3, 5, 96, dtype=dtype)
    for x in (rand(3, 5, 74, dtype=dtype), base[..., :74]):
        out = torch.empty(3, 5, 37, dtype=dtype, device=AXON)
        getattr(act, name)(out, x.to(AXON) if x.is_contiguous() else base.to(AXON)[..., :74])
        close(out, ACTS[name](x.float()[..., :37], x.float()[..., 37:]), dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_act_mul_functional_strided_and_empty(act, dtype):
    gate = rand(40, 24, dtype=dtype).t()          # column-major: the op makes it row-major
    up = rand(24, 40, dtype=dtype, seed=1)
    close(act.silu_mul(gate.to(AXON), up.to(AXON)), F.silu(gate.float()) * up.float(), dtype)
    e = torch.empty(0, 16, dtype=dtype, device=AXON)
    assert act.gelu_mul(e, e).shape == (0, 16)
    out = torch.empty(4, 0, dtype=dtype, device=AXON)
    act.silu_and_mul(out, torch.empty(4, 0, dtype=dtype, device=AXON))


def test_act_extremes(act):
    """Saturation, overflow of exp and NaN propagate as in PyTorch."""
    x = torch.tensor([-1e4, -200.0, -90.0, -50.0, -10.0, -1e-30, 0.0, 1e-30, 10.0, 90.0, 1e4,
                      float("nan"), float("-inf"), 3.0, -3.0, 0.5])
    one = torch.ones_like(x)
    for name in ("silu_mul", "gelu_mul", "gelu_tanh_mul"):
        ref_fn = ACTS[name.replace("_mul", "_and_mul")]
        got = getattr(act, name)(x.to(AXON), one.to(AXON)).cpu()
        torch.testing.assert_close(got, ref_fn(x, one), equal_nan=True, **tol(torch.float32))


def test_act_errors(act):
    a = torch.ones(2, 4, device=AXON)
    with pytest.raises(RuntimeError, match=r"act_mul: gate and up must have the same shape, "
                                           r"got \(2, 4\) and \(2, 3\)"):
        act.silu_mul(a, torch.ones(2, 3, device=AXON))
    with pytest.raises(RuntimeError, match="act_mul: out must have shape"):
        act.silu_and_mul(torch.empty(2, 3, device=AXON), a)
    with pytest.raises(RuntimeError, match="act_mul: gate and up must have the same dtype, got "
                                           "torch.float32 and torch.float16"):
        act.silu_mul(a, a.half())


def test_kernel_checks_surface_as_async_errors(act):
    """The C++ argument checks (the Python wrappers check first) report through the launch."""
    lib = act._ops._kernels()
    x = torch.ones(2, 4, device=AXON)
    with pytest.raises(RuntimeError, match="'act_mul_bad' failed: act_mul: kind must be 0"):
        # raised by the launch (if the kernel already ran) or the synchronize
        lib.act_mul(x, x, torch.empty(2, 4, device=AXON), ints=(7,), written=(2,), name="act_mul_bad")
        torch.axon.synchronize()
    torch.axon.synchronize()  # reported once


@pytest.mark.parametrize("kind", ["silu_mul", "gelu_mul", "gelu_tanh_mul"])
def test_act_backward(act, kind):
    ref_fn = {"silu_mul": ACTS["silu_and_mul"], "gelu_mul": ACTS["gelu_and_mul"],
              "gelu_tanh_mul": ACTS["gelu_tanh_and_mul"]}[kind]
    g, u, go = rand(6, 33), rand(6, 33, seed=1), rand(6, 33, seed=2)
    ga, ua = (t.to(AXON).requires_grad_() for t in (g, u))
    out = getattr(act, kind)(ga, ua)  # through the custom op (autograd), not the direct call
    close(out, ref_fn(g, u), torch.float32)
    out.backward(go.to(AXON))
    gc, uc = (t.clone().requires_grad_() for t in (g, u))
    ref_fn(gc, uc).backward(go)
    close(ga.grad, gc.grad, torch.float32, accum=True)
    close(ua.grad, uc.grad, torch.float32, accum=True)


# ---- layer norms ---------------------------------------------------------------------------

def rms_ref(h, w, eps):
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_rms_norm(ln, dtype):
    x, w = rand(4, 7, 100, dtype=dtype), rand(100, dtype=dtype, seed=1)
    r = rand(4, 7, 100, dtype=dtype, seed=2)
    close(ln.rms_norm(x.to(AXON), w.to(AXON), 1e-6), rms_ref(x.float(), w.float(), 1e-6), dtype, True)
    y, h = ln.rms_norm(x.to(AXON), w.to(AXON), 1e-6, residual=r.to(AXON))
    href = (x + r)  # the residual sum in the input dtype, as the unfused add
    close(h, href, dtype)
    close(y, rms_ref(href.float(), w.float(), 1e-6), dtype, True)
    # strided rows (every other row of a wider tensor) and no weight
    xs = rand(8, 130, dtype=dtype)
    xa = xs.to(AXON)[::2, 3:103]
    close(ln.rms_norm(xa, None, 1e-5), rms_ref(xs[::2, 3:103].float(), 1.0, 1e-5), dtype, True)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_layer_norm(ln, dtype):
    x, w, b = rand(5, 96, dtype=dtype), rand(96, dtype=dtype, seed=1), rand(96, dtype=dtype, seed=2)
    r = rand(5, 96, dtype=dtype, seed=3)
    expect = F.layer_norm(x.float(), (96,), w.float(), b.float(), 1e-5)
    close(ln.layer_norm(x.to(AXON), w.to(AXON), b.to(AXON), 1e-5), expect, dtype, True)
    y, h = ln.layer_norm(x.to(AXON), w.to(AXON), b.to(AXON), 1e-5, residual=r.to(AXON))
    close(y, F.layer_norm((x + r).float(), (96,), w.float(), b.float(), 1e-5), dtype, True)
    xt = rand(96, 5, dtype=dtype).t()  # last dim not unit-stride
    close(ln.layer_norm(xt.to(AXON), None, None, 1e-5), F.layer_norm(xt.float(), (96,)), dtype, True)


def test_norm_empty_and_errors(ln):
    e = torch.empty(0, 8, device=AXON)
    assert ln.rms_norm(e, torch.ones(8, device=AXON), 1e-6).shape == (0, 8)
    y, h = ln.layer_norm(e, None, None, 1e-5, residual=e)
    assert y.shape == h.shape == (0, 8)
    with pytest.raises(RuntimeError, match=r"rms_norm: weight must have shape \(8,\), got \(7,\)"):
        ln.rms_norm(torch.ones(2, 8, device=AXON), torch.ones(7, device=AXON), 1e-6)
    with pytest.raises(RuntimeError, match="layer_norm: residual must have the shape of x"):
        ln.layer_norm(torch.ones(2, 8, device=AXON), None, None, 1e-5,
                      residual=torch.ones(3, 8, device=AXON))
    with pytest.raises(RuntimeError, match="rms_norm: expected a tensor with at least one dim"):
        ln.rms_norm(torch.tensor(1.0, device=AXON), None, 1e-6)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_norm_backward(ln, kind, residual):
    x, w, b, r, go = (rand(6, 40, seed=s) for s in range(5))
    w, b = w[0], b[0]

    def run(x, w, b, r):
        if kind == "rms":
            out = ln.rms_norm(x, w, 1e-6, residual=r) if x.device.type == "axon" else \
                rms_ref(x + (r if r is not None else 0), w, 1e-6)
        else:
            out = ln.layer_norm(x, w, b, 1e-5, residual=r) if x.device.type == "axon" else \
                F.layer_norm(x + (r if r is not None else 0), (40,), w, b, 1e-5)
        if isinstance(out, tuple):
            out = out[0] + 0.5 * out[1]  # both outputs feed the loss
        elif residual and x.device.type != "axon":
            out = out + 0.5 * (x + r)
        return (out * go.to(x.device)).sum()

    leaves_a = [t.to(AXON).requires_grad_() for t in (x, w, b, r)]
    leaves_c = [t.clone().requires_grad_() for t in (x, w, b, r)]
    run(*leaves_a[:3], leaves_a[3] if residual else None).backward()
    run(*leaves_c[:3], leaves_c[3] if residual else None).backward()
    names = ["x", "w"] + (["b"] if kind == "layer" else []) + (["r"] if residual else [])
    for name in names:
        i = "xwbr".index(name)
        close(leaves_a[i].grad, leaves_c[i].grad, torch.float32, accum=True)


# ---- rotary --------------------------------------------------------------------------------

def rope_ref(x, cos, sin, dim=1):
    c, s = cos.unsqueeze(dim), sin.unsqueeze(dim)
    h = x.shape[-1] // 2
    return x * c + torch.cat((-x[..., h:], x[..., :h]), -1) * s


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_rotary(rot, dtype):
    B, S, H, KV, D = 2, 9, 4, 2, 40
    # Llama's layout: the projection output [B, S, H, D] transposed to [B, H, S, D]
    q = rand(B, S, H, D, dtype=dtype).transpose(1, 2)
    k = rand(B, S, KV, D, dtype=dtype, seed=1).transpose(1, 2)
    pos = torch.arange(S).float()[None, :, None] * torch.rand(D // 2)[None, None]
    emb = torch.cat((pos, pos), -1).expand(B, S, D)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    oq, ok = rot.apply_rotary_pos_emb(q.to(AXON), k.to(AXON), cos.to(AXON), sin.to(AXON))
    close(oq, rope_ref(q.float(), cos.float(), sin.float()), dtype)
    close(ok, rope_ref(k.float(), cos.float(), sin.float()), dtype)
    # unsqueeze_dim=2 ([B, S, H, D] inputs), and zero-size
    q2 = rand(B, S, H, D, dtype=dtype)
    oq, _ = rot.apply_rotary_pos_emb(q2.to(AXON), q2.to(AXON), cos.to(AXON), sin.to(AXON), 2)
    close(oq, rope_ref(q2.float(), cos.float(), sin.float(), 2), dtype)
    z = torch.empty(B, H, 0, D, dtype=dtype, device=AXON)
    zc = torch.empty(B, 0, D, dtype=dtype, device=AXON)
    assert rot.apply_rotary_pos_emb(z, z, zc, zc)[0].shape == (B, H, 0, D)


def test_rotary_backward_and_errors(rot):
    q, k = rand(1, 2, 5, 8), rand(1, 1, 5, 8, seed=1)
    cos, sin = rand(1, 5, 8, seed=2), rand(1, 5, 8, seed=3)
    gq, gk = rand(1, 2, 5, 8, seed=4), rand(1, 1, 5, 8, seed=5)
    la = [t.to(AXON).requires_grad_() for t in (q, k, cos, sin)]
    lc = [t.clone().requires_grad_() for t in (q, k, cos, sin)]
    oq, ok = rot.apply_rotary_pos_emb(*la)
    ((oq * gq.to(AXON)).sum() + (ok * gk.to(AXON)).sum()).backward()
    ((rope_ref(lc[0], lc[2], lc[3]) * gq).sum() + (rope_ref(lc[1], lc[2], lc[3]) * gk).sum()).backward()
    for a, c in zip(la, lc):
        close(a.grad, c.grad, torch.float32, accum=True)
    c = torch.ones(1, 5, 8, device=AXON)
    with pytest.raises(RuntimeError, match="apply_rotary_pos_emb: cos and sin shapes differ"):
        rot.apply_rotary_pos_emb(la[0], la[1], c, c[:, :4])
    with pytest.raises(RuntimeError, match=r"apply_rotary_pos_emb: cos/sin of shape \(1, 4, 8\) "
                                           r"\(unsqueezed at 1\) do not broadcast"):
        rot.apply_rotary_pos_emb(la[0], la[1], c[:, :4], c[:, :4])
    with pytest.raises(RuntimeError, match="apply_rotary_pos_emb: q and k need the same even last dim"):
        rot.apply_rotary_pos_emb(torch.ones(1, 1, 2, 7, device=AXON), torch.ones(1, 1, 2, 7, device=AXON),
                                 torch.ones(1, 2, 7, device=AXON), torch.ones(1, 2, 7, device=AXON))


# ---- ViT -----------------------------------------------------------------------------------

def attn_ref(q, k, v, scale):
    qh, kh, vh = (t.transpose(1, 2).float() for t in (q, k, v))
    return (torch.softmax(qh @ kh.transpose(-1, -2) * scale, -1) @ vh).transpose(1, 2)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_vit_attention(vit, dtype):
    B, S, H, D = 2, 197, 3, 64
    qkv = rand(B, S, 3 * H * D, dtype=dtype)  # q, k, v as strided views of one projection
    q, k, v = (t.view(B, S, H, D) for t in qkv.split(H * D, -1))
    qa, ka, va = (t.view(B, S, H, D) for t in qkv.to(AXON).split(H * D, -1))
    close(vit.attention(qa, ka, va, D ** -0.5), attn_ref(q, k, v, D ** -0.5), dtype, True)
    # a head dim that is not a multiple of the vector width, and a short sequence
    q3 = rand(1, 5, 2, 20, dtype=dtype)
    close(vit.attention(*(q3.to(AXON),) * 3, 0.3), attn_ref(q3, q3, q3, 0.3), dtype, True)
    e = torch.empty(1, 0, 2, 8, dtype=dtype, device=AXON)
    assert vit.attention(e, e, e, 1.0).shape == e.shape


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_vit_add_layer_norm_and_bias_gelu(vit, dtype):
    x, r = rand(7, 77, dtype=dtype), rand(7, 77, dtype=dtype, seed=1)
    w, b = rand(77, dtype=dtype, seed=2), rand(77, dtype=dtype, seed=3)
    y, h = vit.add_layer_norm(x.to(AXON), r.to(AXON), w.to(AXON), b.to(AXON), 1e-12)
    close(h, x + r, dtype)
    close(y, F.layer_norm((x + r).float(), (77,), w.float(), b.float(), 1e-12), dtype, True)
    close(vit.bias_gelu(x.to(AXON), w.to(AXON)), F.gelu(x.float() + w.float()), dtype)
    with pytest.raises(RuntimeError, match=r"bias_gelu: bias must have shape \(last dim of x,\)"):
        vit.bias_gelu(x.to(AXON), w[:5].to(AXON))
    with pytest.raises(RuntimeError, match="add_layer_norm: x and residual of one shape"):
        vit.add_layer_norm(x.to(AXON), r[:3].to(AXON), w.to(AXON), b.to(AXON), 1e-12)
    with pytest.raises(RuntimeError, match=r"attention: q, k and v must be \[batch, seq, heads, "
                                           r"head_dim\] of one shape"):
        vit.attention(*(torch.ones(2, 3, 4, device=AXON),) * 3, 1.0)


def test_vit_backward(vit):
    q, k, v, g = (rand(1, 6, 2, 16, seed=s) for s in range(4))
    la = [t.to(AXON).requires_grad_() for t in (q, k, v)]
    lc = [t.clone().requires_grad_() for t in (q, k, v)]
    (vit.attention(*la, 0.25) * g.to(AXON)).sum().backward()
    (attn_ref(*lc, 0.25) * g).sum().backward()
    for a, c in zip(la, lc):
        close(a.grad, c.grad, torch.float32, accum=True)
    x, bias, go = rand(4, 10), rand(10, seed=1), rand(4, 10, seed=2)
    xa, ba = x.to(AXON).requires_grad_(), bias.to(AXON).requires_grad_()
    xc, bc = x.clone().requires_grad_(), bias.clone().requires_grad_()
    (vit.bias_gelu(xa, ba) * go.to(AXON)).sum().backward()
    (F.gelu(xc + bc) * go).sum().backward()
    close(xa.grad, xc.grad, torch.float32, accum=True)
    close(ba.grad, bc.grad, torch.float32, accum=True)


# ---- torch.compile -------------------------------------------------------------------------

def test_compiled_block_uses_the_ops_without_graph_break(act, ln, rot):
    """A small block calling the three kernels compiles whole (fullgraph) and equals eager."""
    torch._dynamo.reset()
    w = torch.randn(32, device=AXON)

    def block(x, cos, sin):
        h = ln.rms_norm(x, w, 1e-6)
        q = h.view(2, 5, 2, 16).transpose(1, 2)
        q, k = rot.apply_rotary_pos_emb(q, q, cos, sin)
        y = act.silu_mul(q, k).transpose(1, 2).reshape(2, 5, 32)
        return ln.rms_norm(y, w, 1e-6, residual=x)

    x = torch.randn(2, 5, 32, device=AXON)
    cos, sin = torch.randn(2, 5, 16, device=AXON), torch.randn(2, 5, 16, device=AXON)
    eager = block(x, cos, sin)
    compiled = torch.compile(block, backend="inductor", fullgraph=True)(x, cos, sin)
    for e, c in zip(eager, compiled):
        torch.testing.assert_close(c.cpu(), e.cpu(), **tol(torch.float32))


# ---- 1-d and 0-d inputs --------------------------------------------------------------------

def test_backward_of_1d_inputs(ln, vit):
    """A 1-d x has no leading dim: the weight/bias gradients are still of shape (d,)."""
    x, r, w, b, go = (rand(8, seed=s) for s in range(5))

    def grads(fn, *leaves, device):
        leaves = [t.detach().to(device, copy=True).requires_grad_() for t in leaves]
        out = fn(*leaves)
        if isinstance(out, tuple):
            out = out[0] + 0.5 * out[1]
        (out * go.to(device)).sum().backward()
        return [t.grad for t in leaves]

    cases = [
        (lambda x, w: ln.rms_norm(x, w, 1e-6), lambda x, w: rms_ref(x, w, 1e-6), (x, w)),
        (lambda x, w, b: ln.layer_norm(x, w, b, 1e-5), lambda x, w, b: F.layer_norm(x, (8,), w, b, 1e-5),
         (x, w, b)),
        (lambda x, r, w: ln.rms_norm(x, w, 1e-6, residual=r),
         lambda x, r, w: (rms_ref(x + r, w, 1e-6), x + r), (x, r, w)),
        (lambda x, r, w, b: vit.add_layer_norm(x, r, w, b, 1e-12),
         lambda x, r, w, b: (F.layer_norm(x + r, (8,), w, b, 1e-12), x + r), (x, r, w, b)),
        (vit.bias_gelu, lambda x, b: F.gelu(x + b), (x, b)),
    ]
    for fn, ref, leaves in cases:
        for got, expect in zip(grads(fn, *leaves, device=AXON), grads(ref, *leaves, device="cpu")):
            assert got.shape == expect.shape
            close(got, expect, torch.float32, accum=True)


@pytest.mark.parametrize("name", ["silu_mul", "gelu_mul", "gelu_tanh_mul"])
def test_act_mul_0d(act, name):
    g, u = torch.tensor(0.7), torch.tensor(-1.5)
    got = getattr(act, name)(g.to(AXON), u.to(AXON))
    assert got.shape == ()
    close(got, ACTS[name.replace("_mul", "_and_mul")](g, u), torch.float32)


# ---- the fake implementations describe the real results -------------------------------------

def _meta(t):
    return tuple(t.shape), t.stride(), t.dtype, t.device.type


def assert_fake_matches(fn, *args):
    """fn's real results have the shape, strides, dtype and device its fake (the custom op
    under FakeTensorMode, as torch.compile sees it) promises."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = fn(*args)
    mode = FakeTensorMode()
    fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    with mode:
        fake = fn(*fake_args)
    real, fake = (r if isinstance(r, tuple) else (r,) for r in (real, fake))
    assert [_meta(t) for t in real] == [_meta(t) for t in fake]


@pytest.mark.parametrize("device", ["cpu", AXON])
def test_fake_matches_real(act, ln, rot, vit, device):
    """Every path (the kernel and the PyTorch fallback for other devices and dtypes) returns
    what the fake says: contiguous results of the promoted dtypes, also for strided inputs."""
    bf, f32, f16 = torch.bfloat16, torch.float32, torch.float16

    def t(*shape, dtype=f32, seed=0, transpose=False):
        x = rand(*shape, dtype=dtype, seed=seed)
        return (x.t() if transpose else x).to(device)

    # activation: column-major inputs, float64 (no kernel), 0-d and zero-size
    for gate, up in ((t(24, 40, transpose=True), t(24, 40, seed=1, transpose=True)),
                     (t(5, 6, dtype=torch.float64), t(5, 6, dtype=torch.float64, seed=1)),
                     (t(), t(seed=1)), (t(0, 3, transpose=True), t(0, 3, transpose=True))):
        assert_fake_matches(act.silu_mul, gate, up)
    # norms: transposed x, mixed dtypes of x and residual / weight
    xt, rt, w, b = t(16, 6, transpose=True), t(16, 6, seed=1, transpose=True), t(16, seed=2), t(16, seed=3)
    for x, r, w_ in ((xt, rt, w), (xt.to(bf), rt, w), (xt, rt.to(bf), w.to(bf)), (t(16), t(16), w)):
        assert_fake_matches(lambda x, w: ln.rms_norm(x, w, 1e-6), x, w_)
        assert_fake_matches(lambda x, r, w: ln.rms_norm(x, w, 1e-6, residual=r), x, r, w_)
        assert_fake_matches(lambda x, r, w, b: ln.layer_norm(x, w, b, 1e-5, residual=r), x, r, w_, b)
        assert_fake_matches(lambda x, r, w, b: vit.add_layer_norm(x, r, w, b, 1e-12), x, r, w_, b)
        assert_fake_matches(vit.bias_gelu, x, b)
        assert_fake_matches(vit.bias_gelu, x, b.to(f16))
    # rotary: Llama's [B, S, H, D] -> [B, H, S, D] transposed q and k; mixed dtypes
    q, k = t(2, 3, 4, 8).transpose(1, 2), t(2, 3, 2, 8, seed=1).transpose(1, 2)
    cos, sin = t(2, 3, 8, seed=2), t(2, 3, 8, seed=3)
    for args in ((q, k, cos, sin), (q.to(bf), k.to(bf), cos, sin), (q, k.to(bf), cos.to(bf), sin.to(bf)),
                 (q.to(f16), k.to(bf), cos.to(f16), sin.to(f16))):
        assert_fake_matches(rot.apply_rotary_pos_emb, *args)
    # attention: [B, S, H, D] views of a [B, H, S, D] tensor
    qa = t(1, 2, 5, 8).transpose(1, 2)
    assert_fake_matches(lambda q, k, v: vit.attention(q, k, v, 0.3), qa, qa, qa)
    assert_fake_matches(lambda q, k, v: vit.attention(q, k, v, 0.3), qa.to(bf), qa, qa)


def test_compiled_rotary_on_cpu_llama_layout_equals_eager(rot):
    """The rotary layer replaces Transformers' apply_rotary_pos_emb for every model of the
    family, CPU models too: compiled (Inductor checks the fake's strides) equals eager."""
    torch._dynamo.reset()
    q = rand(2, 5, 4, 8).transpose(1, 2)      # [B, S, H, D] projections -> [B, H, S, D]
    k = rand(2, 5, 2, 8, seed=1).transpose(1, 2)
    cos, sin = rand(2, 5, 8, seed=2), rand(2, 5, 8, seed=3)

    def f(q, k, cos, sin):
        oq, ok = rot.apply_rotary_pos_emb(q, k, cos, sin)
        return oq * 2, ok + 1

    compiled = torch.compile(f, backend="inductor", fullgraph=True)(q, k, cos, sin)
    eager = f(q, k, cos, sin)
    for c, e in zip(compiled, eager):
        torch.testing.assert_close(c, e, **tol(torch.float32))
    torch.testing.assert_close(eager[0], rope_ref(q, cos, sin) * 2, **tol(torch.float32))


# ---- direct launches with a last dim of 0 ----------------------------------------------------

def test_direct_launch_with_empty_rows_does_not_crash():
    """rows > 0 of 0 elements: the kernels' chunk sizes must not divide by the row length
    (SIGFPE kills the process, so this runs in a fresh interpreter)."""
    code = textwrap.dedent(f"""
        import torch, torch_axon, kernels
        from pathlib import Path
        R = Path({str(REPOS)!r})
        e = lambda *s: torch.empty(*s, device="axon")
        act = kernels.get_local_kernel(R / "axon-activation")._ops._kernels()
        act.act_mul(e(4, 0), e(4, 0), e(4, 0), ints=(0,), written=(2,), name="act")
        ln = kernels.get_local_kernel(R / "axon-layernorm")._ops._kernels()
        ln.norm(e(4, 0), e(1, 0), e(1, 0), e(4, 0), ints=(1, 0, 1, 1), floats=(1e-5,),
                written=(3,), name="norm")
        rot = kernels.get_local_kernel(R / "axon-rotary")._ops._kernels()
        rot.rotary(*[e(1, 2, 3, 0)] * 8, written=(3, 7), name="rotary")
        vit = kernels.get_local_kernel(R / "axon-vit")._ops._kernels()
        vit.add_layer_norm(e(4, 0), e(4, 0), e(1, 0), e(1, 0), e(4, 0), e(4, 0), floats=(1e-5,),
                           written=(4, 5), name="aln")
        vit.bias_gelu(e(4, 0), e(1, 0), e(4, 0), written=(2,), name="bg")
        vit.attention(*[e(1, 3, 2, 0)] * 4, floats=(1.0,), written=(3,), name="attn")
        torch.axon.synchronize()
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stderr[-2000:])


def test_vit_attention_in_head_groups(vit):
    """Heads whose float32 k/v exceed the kernel's 16 MiB group of scratch run in several
    groups (here 2 + 1 heads of 7.6 MiB each)."""
    q, k, v = (rand(1, 13, 3, 65536, seed=s) for s in range(3))
    got = vit.attention(q.to(AXON), k.to(AXON), v.to(AXON), 0.01)
    close(got, attn_ref(q, k, v, 0.01), torch.float32, True)
