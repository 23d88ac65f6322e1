"""torch.compile on axon: Inductor's C++ kernels enqueued on the current axon
stream, buffers from the axon caching allocator, extern calls (mm, attention)
to axon's eager kernels.

Every numerical check compiles a function with fullgraph=True and compares
its result with the same function run eagerly on axon and on the CPU (fresh
inputs of the same values and layouts for each run, so in-place updates of
inputs are compared too), at conftest's tolerances: tol(dtype) for
elementwise results, tol(dtype, accum=True) for anything that sums or fuses a
chain of low-precision ops (Inductor keeps fused intermediates in float32,
eager rounds after every op).  Each compiled call is also checked to run
without the synchronous CPU fallback.

Also covered: random ops (statistics, reproducibility), a training step
(backward), backends, recompilation and graph-break counts, dynamic shapes,
stream ordering (no host synchronisation per kernel, events, the stream
context), another device than the current one, the FX graph cache across
processes, and mixed-device errors.

In this process Inductor's FX-graph and AOTAutograd caches are off, so every
compile here really runs axon's code generation (C++ kernel binaries are
still cached by source); test_fx_graph_cache_hit_in_a_second_process covers
the cache.
"""

from __future__ import annotations

import copy
import json
import math
import time

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.utils import counters

from conftest import FLOAT_DTYPES, assert_same, make, run_python, to_cpu, tol

sleep_on_stream = torch.axon._C._test_sleep_on_stream  # (device index, milliseconds)
# Long enough that "still pending right after the call" cannot be a race on a
# loaded 2-core machine; short enough to keep the file fast.
BUSY_MS = 300
Z = 6.0  # standard errors allowed in statistical checks
SAME_DEVICE = "Expected all tensors to be on the same device"


@pytest.fixture(scope="module", autouse=True)
def _no_graph_caches(no_graph_caches):
    """Compiles in this module run the whole pipeline (conftest.no_graph_caches)."""


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # conftest: empty Dynamo caches and counters


# ---------------------------------------------------------------- helpers

def tensor(shape, dtype, device, seed, view=None, low=-3.0, high=3.0):
    """make(shape, ...) on device, optionally through a view (same on every device)."""
    t = make(shape, dtype, low, high, seed).to(device)
    return view(t) if view is not None else t


T = lambda t: t.t()  # noqa: E731  (a transposed, non-contiguous view)
SLICED = lambda t: t[1:, 1::2]  # noqa: E731  (a strided slice, not dense)


def tensors(x):
    return [t for t in (x if isinstance(x, (list, tuple)) else [x]) if isinstance(t, torch.Tensor)]


def call_compiled(cf, args):
    """cf(*args) on axon, checked to compile one new graph and to run without the
    CPU fallback; returns the result (after the streams drained)."""
    graphs = counters["stats"]["unique_graphs"]
    torch.axon.synchronize()
    torch.axon.reset_fallback_stats()
    out = cf(*args)
    torch.axon.synchronize()
    assert torch.axon.fallback_stats() == {}
    assert counters["stats"]["unique_graphs"] == graphs + 1, "nothing was compiled"
    return out


def check_compiled(fn, make_args, dtype=torch.float32, accum=False, backend="axon", **kw):
    """fn compiled (whole graph) on axon gives what fn gives eagerly on axon and
    on the CPU: results, and the inputs afterwards (in-place updates).
    make_args(device) builds fresh arguments; returns (compiled fn, its result)."""
    cf = torch.compile(fn, backend=backend, fullgraph=True, **kw)
    args_cpu, args_eager, args_comp = make_args("cpu"), make_args("axon"), make_args("axon")
    expected_cpu = fn(*args_cpu)
    expected_eager = to_cpu(fn(*args_eager))
    out = call_compiled(cf, args_comp)
    assert len(tensors(out)) == len(tensors(expected_cpu)) > 0
    assert_same(out, expected_eager, dtype=dtype, accum=accum)
    assert_same(out, expected_cpu, dtype=dtype, accum=accum)
    for a, e, c in zip(tensors(args_comp), tensors(args_eager), tensors(args_cpu)):
        assert a.shape == c.shape and a.stride() == c.stride()
        assert_same(a, e.cpu(), dtype=dtype, accum=accum)
        assert_same(a, c, dtype=dtype, accum=accum)
    return cf, out


# ---------------------------------------------------------------- compiled == eager

def pointwise_and_views(a, b, c):
    y = (a * 2 + b).sigmoid() * c.exp() - torch.tanh(a) / (1 + b.abs())
    z = torch.clamp(y * a - c, -2, 2).pow(2) + F.silu(b)
    v = y.t().reshape(3, 8)[:, 1::2]  # views of a fused result
    w = z.unsqueeze(0).expand(2, 4, 6).permute(2, 0, 1).flatten(1)
    return y, z, v * 3, w + 1, b[1:, ::2] * c[:-1, 1::2]  # slicing non-contiguous inputs


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_pointwise_fusion_views_and_non_contiguous_inputs(dtype):
    def args(dev):
        return [tensor((4, 6), dtype, dev, 1), tensor((6, 4), dtype, dev, 2, T),
                tensor((5, 13), dtype, dev, 3, SLICED, -1, 1)]
    _, out = check_compiled(pointwise_and_views, args, dtype, accum=True)
    assert not args("axon")[1].is_contiguous() and not args("axon")[2].is_contiguous()
    assert out[0].shape == (4, 6) and out[3].shape == (6, 8)


def reductions(a, b):
    return (a.sum(-1), a.mean(0), a.amax(1), a.var(-1), torch.softmax(a, -1),
            torch.log_softmax(a, 0), b.sum(0), b.amax(0), b.var(0, correction=0),
            torch.softmax(b * 2, 0), torch.log_softmax(b, -1), (a * a).sum())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_reductions_and_softmax(dtype):
    def args(dev):
        return [tensor((8, 33), dtype, dev, 4), tensor((33, 8), dtype, dev, 5, T)]
    check_compiled(reductions, args, dtype, accum=True)


def update_inputs(x, cache, idx, v, counter):
    x.add_(1)                          # in-place on a (non-contiguous) input
    cache.index_copy_(2, idx, v)       # a static KV-cache-like buffer
    counter.add_(1)
    return x * 2, cache[:, :, :4].sum(-1), cache.shape[2] * counter


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_in_place_updates_of_inputs(dtype):
    def args(dev):
        return [tensor((6, 4), dtype, dev, 6, T),
                torch.zeros(2, 3, 10, 4, dtype=dtype, device=dev),
                torch.tensor([3, 4, 5], device=dev),
                tensor((2, 3, 3, 4), dtype, dev, 7),
                torch.zeros((), dtype=torch.int64, device=dev)]
    cf, _ = check_compiled(update_inputs, args, dtype, accum=True)
    # The same compiled function again on the updated inputs: a second step.
    a_cpu, a_comp = args("cpu"), args("axon")
    for _ in range(2):
        expected = update_inputs(*a_cpu)
        out = cf(*a_comp)
    assert_same(out, expected, dtype=dtype, accum=True)
    assert_same(a_comp[0], a_cpu[0], dtype=dtype)  # x updated twice through its view
    assert a_comp[4].item() == 2


def selections(a, b, mask, w, ids, gidx, sidx):
    return (torch.cat([a, b, a[:1]], 0), torch.cat([a, b], 1), torch.where(a > 0, a, b * 2),
            a.masked_fill(mask, -1.5), F.embedding(ids, w) * 2, a.gather(1, gidx),
            b.index_select(0, sidx) + 1, a[sidx, 1:3])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cat_where_masked_fill_and_indexing(dtype):
    def args(dev):
        g = torch.Generator().manual_seed(8)
        return [tensor((4, 6), dtype, dev, 9), tensor((6, 4), dtype, dev, 10, T),
                torch.rand(4, 6, generator=g).gt(0.5).to(dev), tensor((10, 5), dtype, dev, 11),
                torch.randint(0, 10, (3, 2), generator=g).to(dev),
                torch.randint(0, 6, (4, 3), generator=g).to(dev), torch.tensor([3, 0, 3], device=dev)]
    check_compiled(selections, args, dtype)


def matmuls(a, w, bias, x, y):
    h = torch.addmm(bias, a, w).relu() * 0.5 + 1        # extern mm + fused epilogue
    g = F.gelu(F.linear(a, w.t(), bias))
    return h, g, torch.tanh(a @ w), torch.bmm(x, y) * 2 - 1, torch.baddbmm(y[:, :1], x, y)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_matmuls_with_epilogues(dtype):
    def args(dev):
        return [tensor((5, 8), dtype, dev, 12, low=-1, high=1),
                tensor((6, 8), dtype, dev, 13, T, -1, 1), tensor((6,), dtype, dev, 14),
                tensor((2, 3, 8), dtype, dev, 15, low=-1, high=1),
                tensor((2, 8, 4), dtype, dev, 16, low=-1, high=1)]
    check_compiled(matmuls, args, dtype, accum=True)


def attention_and_norms(q, k, v, mask, x, w, b):
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    m = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return (o * 2 + 1, m.transpose(1, 2).flatten(2), F.layer_norm(x, (8,), w, b),
            F.rms_norm(x, (8,), w, eps=1e-5), F.layer_norm(x * 2, (8,)).relu())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_attention_layer_norm_and_rms_norm(dtype):
    blhd = lambda t: t.transpose(1, 2)  # noqa: E731  [B, L, H, D] memory (dense, permuted)

    def args(dev):
        return [tensor((2, 5, 2, 8), dtype, dev, 17, blhd, -1, 1),
                tensor((2, 2, 6, 8), dtype, dev, 18, low=-1, high=1),
                tensor((2, 2, 6, 8), dtype, dev, 19, low=-1, high=1),
                tensor((1, 1, 5, 6), dtype, dev, 20, low=-1, high=0),
                tensor((3, 8, 5), dtype, dev, 21, lambda t: t.transpose(1, 2)),
                tensor((8,), dtype, dev, 22, low=0.5, high=1.5), tensor((8,), dtype, dev, 23)]
    check_compiled(attention_and_norms, args, dtype, accum=True)


def test_attention_on_a_fused_qkv_projection():
    """q/k/v sliced from one projection (not dense): the output and gradients
    are laid out as the Meta kernel says (empty_like: q's dimension order), or
    Inductor's stride assertions fail."""
    def attn(qkv):
        q, k, v = (t.view(2, 5, 2, 8).transpose(1, 2) for t in qkv.split(16, -1))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    check_compiled(attn, lambda dev: [tensor((2, 5, 48), torch.float32, dev, 24, low=-1, high=1)],
                   accum=True)


def zero_size(a, b, w):
    return (a * 2 + b, a.sum(0), a.sum(1), torch.softmax(a, -1), a @ w, w.t()[:, :0] @ w[:0],
            torch.cat([a, b]), F.layer_norm(a, (6,)), b.t()[:, :0].amax(0))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_zero_size_inputs(dtype):
    def args(dev):
        return [tensor((0, 6), dtype, dev, 25), tensor((6, 0), dtype, dev, 26, T),
                tensor((6, 3), dtype, dev, 27)]
    _, out = check_compiled(zero_size, args, dtype, accum=True)
    assert [tuple(o.shape) for o in out] == [(0, 6), (6,), (0,), (0, 6), (0, 3), (3, 3),
                                             (0, 6), (0, 6), (0,)]
    assert (out[1].cpu() == 0).all() and (out[5].cpu() == 0).all()


# ---------------------------------------------------------------- sweep regressions
# Found by compiling PyTorch's OpInfo samples on axon (compiled vs eager).

def test_python_number_arguments_are_read_at_the_call():
    """A Python float that changes between calls reaches the kernel as a 0-d CPU
    tensor: the queued kernel must read the value of its own call, even when the
    stream runs late and the CPU tensor has been freed and its memory reused."""
    cf = torch.compile(lambda x, a: x * a + 1, backend="axon")
    x = tensor((1 << 16,), torch.float32, "axon", 30)
    results = []
    for i in range(6):
        a = 0.25 + i
        sleep_on_stream(torch.axon.current_device(), 20)  # the kernel runs after the loop body
        results.append((a, cf(x, a)))
        _ = [torch.tensor(float(-j)) for j in range(50)]  # reuse freed host memory
    torch.axon.synchronize()
    for a, y in results:
        assert_same(y, x.cpu() * a + 1)
    assert counters["stats"]["unique_graphs"] <= 2  # specialised once, then dynamic


@pytest.mark.parametrize("view", ["t", "permute", "t_sliced"])
@pytest.mark.parametrize("op", [torch.argmax, torch.argmin])
def test_arg_reductions_over_all_dims_of_non_contiguous_input(op, view):
    """argmax/argmin of a non-contiguous tensor: the index in logical order, not
    memory order (Inductor's C++ backend computes it; the generic path did not)."""
    views = {"t": lambda t: t.t(), "permute": lambda t: t.permute(1, 0),
             "t_sliced": lambda t: t.t()[:, :10]}
    check_compiled(lambda x: op(x), lambda dev: [tensor((40, 30), torch.float32, dev, 31,
                                                        views[view])])


def test_rng_state_saved_and_restored_around_compiled_code():
    """torch.axon.get/set_rng_state inside a compiled function (as
    torch.testing's freeze_rng_state does, under no_dispatch) run eagerly."""
    from torch.utils._mode_utils import no_dispatch

    def f(x):
        with no_dispatch():
            state = torch.axon.get_rng_state()
        y = F.dropout(x, 0.5) * 2
        with no_dispatch():
            torch.axon.set_rng_state(state)
        return y

    x = torch.ones(256, device="axon")
    torch.manual_seed(5)
    eager = f(x).cpu()
    torch.manual_seed(5)
    compiled = torch.compile(f, backend="axon")(x).cpu()
    assert ((compiled == 0) | (compiled == 4)).all()
    assert 0 < (eager == 0).sum() < 256 and 0 < (compiled == 0).sum() < 256


def test_rms_norm_with_dynamic_shapes():
    def f(x, w):
        return F.rms_norm(x, (x.shape[-2], x.shape[-1]), w) * 2

    cf = torch.compile(f, backend="axon", dynamic=True)
    for n in (3, 5):
        x, w = make((n, 2, 3), torch.float32, seed=n), make((2, 3), torch.float32, seed=9)
        assert_same(cf(x.axon(), w.axon()), f(x, w), accum=True)


@pytest.mark.parametrize("mask", ["none", "bool", "float", "causal"])
@pytest.mark.parametrize("backend", ["inductor", "axon"])
def test_attention_training_with_dynamic_shapes(mask, backend):
    # SDPA's backend choice is traced with symbolic sizes (dynamic=True, or the second
    # sequence length of a padded batch): forward and gradients as on the CPU
    def f(q, k, v, m):
        kw = {"is_causal": True} if mask == "causal" else {"attn_mask": m}
        return F.scaled_dot_product_attention(q, k, v, **kw).square().sum()

    cf = torch.compile(f, backend=backend, dynamic=True)
    for n in (9, 13, 11):
        q, k, v = (make((2, 4, n, 8), torch.float32, seed=n + i) for i in range(3))
        m = None
        if mask == "bool":
            m = torch.ones(n, n, dtype=torch.bool).tril()
        elif mask == "float":
            m = make((n, n), torch.float32, seed=n + 7)
        dev = [t.axon().requires_grad_() for t in (q, k, v)]
        ref = [t.clone().requires_grad_() for t in (q, k, v)]
        got = cf(*dev, None if m is None else m.axon())
        want = f(*ref, m)
        got.backward()
        want.backward()
        assert_same(got, want, accum=True)
        for a, b in zip(dev, ref):
            assert_same(a.grad, b.grad, accum=True)


@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
@pytest.mark.parametrize("transposed", [False, True])
def test_convolution_training_in_channels_last(layout, transposed):
    # Compiled convolution and its backward give the CPU's values and, like
    # eager axon and the CPU, channels_last results for channels_last inputs
    # (the fake convolutions on axon say so: integrations/torch_compile.py).
    fmt = getattr(torch, layout + "_format") if layout == "contiguous" else torch.channels_last
    cls = nn.ConvTranspose2d if transposed else nn.Conv2d
    torch.manual_seed(0)
    ref = cls(3, 8, 3, padding=1)
    mod = copy.deepcopy(ref).axon().to(memory_format=fmt)
    cm = torch.compile(mod, backend="inductor")
    x = make((2, 3, 8, 8), torch.float32, seed=5)
    xd = x.axon().to(memory_format=fmt).requires_grad_()
    xr = x.clone().requires_grad_()
    got, want = cm(xd), ref(xr.to(memory_format=fmt))
    assert got.stride() == want.stride() == mod(xd).stride()
    got.square().sum().backward()
    want.square().sum().backward()
    assert_same(got, want, accum=True)
    assert_same(xd.grad, xr.grad, accum=True)
    for a, b in zip(mod.parameters(), ref.parameters()):
        assert_same(a.grad, b.grad, accum=True)


def test_batched_then_unbatched_convolution_with_bias():
    """A batched then an unbatched input (the second call compiles again, with
    dynamic sizes): the bias stays in the convolution call as on the CPU."""
    def conv(x, w, b):
        return F.conv2d(x, w, b, stride=(2, 2), padding=2)

    cf = torch.compile(conv, backend="axon")
    w, b = make((3, 3, 3, 3), torch.float32, seed=37), make((3,), torch.float32, seed=38)
    for shape in ((1, 3, 4, 4), (3, 4, 4)):
        x = make(shape, torch.float32, seed=len(shape))
        assert_same(cf(x.axon(), w.axon(), b.axon()), conv(x, w, b), accum=True)


def test_batch_norm_eval_statistics_shapes_match_eager():
    """Eval-mode native_batch_norm returns empty saved statistics on axon (its
    kernel is the CPU's); the decomposition torch.compile traces agrees."""
    def f(x, w, b, rm, rv):
        return torch.native_batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5)

    def args(dev):
        return [tensor((3, 2, 4), torch.float32, dev, 32), tensor((2,), torch.float32, dev, 33),
                tensor((2,), torch.float32, dev, 34), tensor((2,), torch.float32, dev, 35),
                tensor((2,), torch.float32, dev, 36, low=0.5, high=2.0)]
    _, out = check_compiled(f, args, accum=True)
    assert [tuple(o.shape) for o in out] == [(3, 2, 4), (0,), (0,)]


@pytest.mark.parametrize("params", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_batch_norm_statistics_dtypes_match_eager(training, params):
    """bf16 activations with bf16 or float32 parameters: the saved statistics
    take the CPU kernel's shapes and dtypes, compiled as in eager."""
    def f(x, w, b, rm, rv):
        return torch.native_batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5)

    x = tensor((3, 2, 4), torch.bfloat16, "axon", 41)
    p = [tensor((2,), params, "axon", 42 + i, low=0.5, high=2.0) for i in range(4)]
    eager = f(x, *[t.clone() for t in p])
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="axon")(x, *[t.clone() for t in p])
    cpu = f(x.cpu(), *[t.cpu() for t in p])
    for e, c, r in zip(eager, compiled, cpu):
        assert e.shape == c.shape == r.shape and e.dtype == c.dtype == r.dtype
        assert_same(c, e.cpu(), dtype=torch.bfloat16, accum=True)


def test_control_flow_subgraphs():
    """torch.cond / while_loop: their subgraphs get axon's wrapper too (kernels
    launched on the stream, buffers from the axon allocator)."""
    def branches(x, p):
        return torch.cond(p, lambda x: (x * 2).sin(), lambda x: (x + 1).cos(), (x,)) + 1

    for flag in (True, False):
        check_compiled(branches, lambda dev: [tensor((16,), torch.float32, dev, 40),
                                              torch.tensor(flag, device=dev)])
        torch._dynamo.reset()

    def loop(x):
        def body(i, x):
            return i + 1, x * 1.5
        return torch._higher_order_ops.while_loop(
            lambda i, x: i < 3, body, (torch.zeros((), dtype=torch.int64, device=x.device), x))[1]

    check_compiled(loop, lambda dev: [tensor((16,), torch.float32, dev, 41)])


def test_small_kernels_stay_on_one_thread():
    """Generated loops under 2^20 iterations run on the stream worker alone (no
    OpenMP team, as axon's eager kernels); larger ones are parallel."""
    from torch._inductor.utils import run_and_get_code

    def f(x):
        return (x * 2).sin() + 1

    small = torch.randn(4096, device="axon")
    large = torch.randn(1 << 21, device="axon")
    codes = {}
    for name, x in (("small", small), ("large", large)):
        torch._dynamo.reset()
        out, code = run_and_get_code(torch.compile(f, backend="axon", dynamic=False), x)
        assert_same(out, f(x.cpu()))
        codes[name] = "\n".join(code)
    assert "omp parallel" not in codes["small"]
    if torch.get_num_threads() > 1:
        assert "omp parallel" in codes["large"]


def test_current_device_is_a_guarded_constant():
    """torch.axon.current_device() inside a compiled function: folded (no graph
    break), and guarded: another current device compiles again."""
    if torch.axon.device_count() < 2:
        pytest.skip("needs two axon devices (AXON_NUM_DEVICES >= 2)")
    cf = torch.compile(lambda x: x + torch.axon.current_device(), backend="axon")
    x = torch.zeros(4, device="axon:0")
    assert_same(cf(x), torch.zeros(4))
    assert sum(counters["graph_break"].values()) == 0
    with torch.axon.device(1):
        assert_same(cf(x), torch.ones(4))
    assert counters["stats"]["unique_graphs"] == 2


# ---------------------------------------------------------------- random ops

def random_ops(x):
    return F.dropout(x, 0.5, training=True), torch.rand_like(x), torch.randn_like(x) * 2 + 1


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_random_ops_statistics_and_reproducibility(dtype):
    n = 1 << 16
    x = torch.ones(n, dtype=dtype, device="axon")
    cf = torch.compile(random_ops, backend="axon", fullgraph=True)
    torch.manual_seed(1234)
    drop, r, g = call_compiled(cf, [x])
    torch.manual_seed(1234)
    again = cf(x)
    following = cf(x)
    for t in (drop, r, g):
        assert t.device.type == "axon" and t.dtype == dtype and t.shape == (n,)
    # The same seed gives the same values; the next call draws new ones.
    for a, b, c in zip((drop, r, g), again, following):
        assert torch.equal(a.cpu(), b.cpu())
        assert not torch.equal(a.cpu(), c.cpu())
    # dropout(p=0.5): kept elements scaled by exactly 2, about half of them kept.
    d = drop.cpu().double()
    kept = d != 0
    assert set(d.unique().tolist()) == {0.0, 2.0}
    assert abs(kept.double().mean().item() - 0.5) < Z * math.sqrt(0.25 / n)
    # rand_like: uniform on [0, 1); randn_like * 2 + 1: mean 1, std 2.
    u = r.cpu().double()
    assert u.min().item() >= 0
    if dtype == torch.float32:
        assert u.max().item() < 1
    else:
        # Inductor draws in float32 and rounds to the dtype, so draws within
        # half an ulp of 1 become 1.0 -- the same with Inductor on the CPU.
        assert u.max().item() <= 1
    for s, mean, std in ((u, 0.5, 1 / math.sqrt(12)), (g.cpu().double(), 1.0, 2.0)):
        assert abs(s.mean().item() - mean) < Z * std / math.sqrt(n), (s.mean().item(), mean)
        assert abs(s.var().item() - std ** 2) < Z * 2 * std ** 2 / math.sqrt(n)
    # Not the same bits in every position: the elements are independent draws.
    assert abs(torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1].item()) < Z / math.sqrt(n)


# ---------------------------------------------------------------- backward

class Block(nn.Module):
    """A pre-norm transformer block (separate q/k/v projections) and an MLP head."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.RMSNorm(d)
        self.q, self.k, self.v, self.proj = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.head = nn.Sequential(nn.Linear(d, 8), nn.Tanh(), nn.Linear(8, 3))

    def forward(self, x):
        B, L, D = x.shape
        h = self.ln1(x)
        q, k, v = (p(h).view(B, L, self.heads, D // self.heads).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, L, D))
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return self.head(x)


def train(model, x, target, steps, compiled):
    """steps of SGD on model; returns (losses, grads of the last step, parameters)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss_of(x, target):
        return F.mse_loss(model(x), target)

    if compiled:  # forward and loss compiled; AOTAutograd compiles their backward
        loss_of = torch.compile(loss_of, backend="axon", fullgraph=True)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_of(x, target)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    grads = [p.grad for p in model.parameters()]
    return torch.stack(losses), grads, [p.detach() for p in model.parameters()]


def test_training_step_backward_matches_eager():
    torch.manual_seed(0)
    base = Block()
    x, target = make((2, 5, 16), torch.float32, seed=30), make((2, 5, 3), torch.float32, seed=31)
    cpu = train(copy.deepcopy(base), x, target, 3, compiled=False)
    eager = train(copy.deepcopy(base).to("axon"), x.axon(), target.axon(), 3, compiled=False)
    torch.axon.synchronize()
    torch.axon.reset_fallback_stats()
    comp = train(copy.deepcopy(base).to("axon"), x.axon(), target.axon(), 3, compiled=True)
    torch.axon.synchronize()
    assert torch.axon.fallback_stats() == {}
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["inductor"]["fxgraph_cache_miss"] + counters["inductor"]["fxgraph_cache_bypass"] \
        == 0  # caches off: both graphs (forward, backward) really compiled
    assert comp[0][0] > comp[0][-1]  # it trains
    for got, e, c in zip(comp, eager, cpu):
        for g_, e_, c_ in zip(tensors(got), tensors(e), tensors(c)):
            assert_same(g_, e_.cpu(), accum=True)
            assert_same(g_, c_, accum=True)


# ---------------------------------------------------------------- backends

def backend_fn(x, w):
    return torch.softmax((x @ w).relu() * 2, -1) + x.sum(-1, keepdim=True)


@pytest.mark.parametrize("backend", ["axon", "default", "axon_mode"])
def test_backends(backend):
    from torch._inductor.utils import run_and_get_code

    assert "axon" in torch._dynamo.list_backends()
    kw = {"axon": dict(backend="axon"), "default": {},
          # Transformers' default mode (its graphs: test_reduce_overhead.py)
          "axon_mode": dict(backend="axon", mode="reduce-overhead")}[backend]
    x, w = make((4, 8), torch.float32, seed=32), make((8, 8), torch.float32, seed=33)
    cf = torch.compile(backend_fn, fullgraph=True, **kw)
    torch.axon.reset_fallback_stats()
    out, code = run_and_get_code(cf, x.axon(), w.axon())
    torch.axon.synchronize()
    assert torch.axon.fallback_stats() == {}
    assert_same(out, backend_fn(x, w), accum=True)
    assert_same(out, backend_fn(x.axon(), w.axon()).cpu(), accum=True)
    wrapper = "\n".join(code)
    # Kernels are axon's stream-launched C++ kernels, buffers axon allocations.
    assert "axon_async_compile.cpp_pybinding(" in wrapper
    assert "empty_strided_axon(" in wrapper
    assert "empty_strided_cpu(" not in wrapper and "cudagraph" not in wrapper.lower()


# ---------------------------------------------------------------- recompiles, graph breaks

def small_fn(x):
    return torch.softmax(x * 2, -1) + x.mean(-1, keepdim=True)


def axon_rows(n, seed=0):
    return make((3, n), torch.float32, seed=seed).axon()


def test_static_shapes_compile_once_per_shape():
    cf = torch.compile(small_fn, backend="axon", dynamic=False)
    for seed in range(3):
        x = axon_rows(8, seed)
        assert_same(cf(x), small_fn(x.cpu()), accum=True)
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["frames"]["total"] == 1
    x = axon_rows(9)
    assert_same(cf(x), small_fn(x.cpu()), accum=True)
    assert counters["stats"]["unique_graphs"] == 2  # static: a new shape is a new graph
    cf(axon_rows(8))
    assert counters["stats"]["unique_graphs"] == 2


def with_graph_break(x):
    y = torch.sin(x) * 2
    torch._dynamo.graph_break()
    return y.sum(-1) + x.amax(-1)


def test_graph_break_is_counted_and_results_match_eager():
    cf = torch.compile(with_graph_break, backend="axon")
    x = axon_rows(8, 1)
    torch.axon.reset_fallback_stats()
    out = cf(x)
    torch.axon.synchronize()
    assert torch.axon.fallback_stats() == {}
    assert sum(counters["graph_break"].values()) == 1
    assert any("graph_break()" in k for k in counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 2  # before and after the break
    assert_same(out, with_graph_break(x).cpu(), accum=True)
    assert_same(out, with_graph_break(x.cpu()), accum=True)
    cf(axon_rows(8, 2))  # no new graphs, breaks are not counted again
    assert counters["stats"]["unique_graphs"] == 2
    assert sum(counters["graph_break"].values()) == 1


def dyn_fn(x, w):
    return torch.softmax(x @ w, -1).sum(0) + x.t().amax(-1)


def test_automatic_dynamic_shapes_recompile_once():
    cf = torch.compile(dyn_fn, backend="axon")
    w = make((6, 6), torch.float32, seed=40).axon()
    for i, (n, graphs) in enumerate([(6, 1), (7, 2), (11, 2), (4, 2)]):
        x = make((n, 6), torch.float32, seed=41 + i).axon()
        assert_same(cf(x, w), dyn_fn(x, w).cpu(), accum=True)
        assert_same(cf(x, w), dyn_fn(x.cpu(), w.cpu()), accum=True)
        assert counters["stats"]["unique_graphs"] == graphs, n
    assert counters["frames"]["total"] == 2  # the first compile and the dynamic one


def test_dynamic_true_compiles_once_for_all_lengths():
    cf = torch.compile(dyn_fn, backend="axon", dynamic=True)
    w = make((6, 6), torch.float32, seed=50).axon()
    torch.axon.reset_fallback_stats()
    for i, n in enumerate((3, 5, 8, 13)):
        x = make((n, 6), torch.float32, seed=51 + i).axon()
        out = cf(x, w)
        assert out.shape == (6,)
        assert_same(out, dyn_fn(x, w).cpu(), accum=True)
        assert_same(out, dyn_fn(x.cpu(), w.cpu()), accum=True)
    torch.axon.synchronize()
    assert torch.axon.fallback_stats() == {}
    assert counters["stats"]["unique_graphs"] == 1


# ---------------------------------------------------------------- streams

def stream_fn(x, w):
    y = (x * 2 + 1).sigmoid()
    return (torch.softmax(y @ w, -1) + y.sum(-1, keepdim=True)).relu()


@pytest.fixture
def compiled_stream_fn():
    """stream_fn compiled and run once (compiled, kernels loaded); its inputs."""
    x, w = make((16, 32), torch.float32, seed=60), make((32, 32), torch.float32, seed=61)
    cf = torch.compile(stream_fn, backend="axon", fullgraph=True)
    call_compiled(cf, [x.axon(), w.axon()])
    return cf, x, w


def test_no_host_synchronisation_per_kernel(compiled_stream_fn):
    cf, x, w = compiled_stream_fn
    xa, wa = x.axon(), w.axon()
    stream = torch.axon.current_stream()
    torch.axon.synchronize()
    t0 = time.perf_counter()
    sleep_on_stream(0, BUSY_MS)
    out = cf(xa, wa)
    launched = time.perf_counter() - t0
    assert launched < BUSY_MS / 1000 / 2, f"the compiled call took {launched:.3f}s"
    assert not stream.query()  # the sleep and the compiled kernels are still queued
    torch.axon.synchronize()
    assert time.perf_counter() - t0 >= BUSY_MS / 1000 * 0.9
    assert_same(out, stream_fn(x, w), accum=True)


def test_compiled_kernel_waits_for_an_event_from_another_stream(compiled_stream_fn):
    cf, x, w = compiled_stream_fn
    xa, wa = x.axon(), w.axon()
    buf = torch.zeros_like(xa)
    buf.copy_(xa * 3)  # the first launch of an eager kernel for new dtypes runs synchronously
    buf.zero_()
    torch.axon.synchronize()
    side = torch.axon.Stream()
    with torch.axon.stream(side):
        sleep_on_stream(0, BUSY_MS)
        buf.copy_(xa * 3)  # eager kernel on the side stream, pending behind the sleep
        done = torch.axon.Event()
        done.record(side)
    current = torch.axon.current_stream()
    current.wait_event(done)
    out = cf(buf, wa)
    assert not side.query() and not current.query()  # nothing ran yet
    torch.axon.synchronize()
    assert_same(out, stream_fn(x * 3, w), accum=True)


def test_compiled_work_runs_on_the_current_stream(compiled_stream_fn):
    cf, x, w = compiled_stream_fn
    xa, wa = x.axon(), w.axon()
    torch.axon.synchronize()
    s = torch.axon.Stream()
    with torch.axon.stream(s):
        sleep_on_stream(0, BUSY_MS)
        out = cf(xa, wa)
        assert not s.query()
        assert torch.axon.default_stream().query()  # the default stream got nothing
    s.synchronize()
    assert s.query()
    assert_same(out, stream_fn(x, w), accum=True)


def stateful_step(state, x):
    state.mul_(0.5).add_(x)
    return state.sum(-1, keepdim=True), (state * x).relu()


def test_eager_ops_interleaved_with_compiled_calls():
    cf = torch.compile(stateful_step, backend="axon", fullgraph=True)

    def inputs(device):
        return [make((4, 6), torch.float32, seed=70).to(device),
                make((4, 6), torch.float32, seed=71).to(device)]

    def run(step, state, x):
        outs = []
        for _ in range(3):
            s, r = step(state, x)
            x = x + r * 0.1 - s  # eager, reads the compiled results
            state[:, 0].fill_(1.0)  # eager in-place on the compiled function's input
            outs += [s, r]
        return outs + [state, x]

    call_compiled(cf, inputs("axon"))
    expected_cpu = run(stateful_step, *inputs("cpu"))
    expected_eager = to_cpu(run(stateful_step, *inputs("axon")))
    args = inputs("axon")  # (a copy from pageable memory waits for the stream: before the sleep)
    torch.axon.synchronize()
    t0 = time.perf_counter()
    sleep_on_stream(0, BUSY_MS)  # everything below is queued behind the sleep
    got = run(cf, *args)
    assert time.perf_counter() - t0 < BUSY_MS / 1000 / 2
    assert not torch.axon.current_stream().query()
    assert_same(got, expected_eager, accum=True)
    assert_same(got, expected_cpu, accum=True)
    assert counters["stats"]["unique_graphs"] == 1


# ---------------------------------------------------------------- another device

def device_fn(a, b):
    return (a @ b).relu() + a.sum(-1, keepdim=True), torch.rand_like(a)


def test_inputs_on_another_device_than_the_current_one():
    if torch.axon.device_count() < 2:
        pytest.skip("needs two axon devices (AXON_NUM_DEVICES < 2)")
    a, b = make((8, 8), torch.float32, seed=80), make((8, 8), torch.float32, seed=81)
    a1, b1 = a.to("axon:1"), b.to("axon:1")
    cf = torch.compile(device_fn, backend="axon", fullgraph=True)
    call_compiled(cf, [a1, b1])
    torch.axon.synchronize(1)
    sleep_on_stream(1, BUSY_MS)
    t0 = time.perf_counter()
    out, r = cf(a1, b1)
    assert time.perf_counter() - t0 < BUSY_MS / 1000 / 2
    assert torch.axon.current_device() == 0
    assert not torch.axon.current_stream(1).query()  # the work is on axon:1's stream
    assert torch.axon.current_stream(0).query()
    assert out.device == torch.device("axon:1") and r.device == torch.device("axon:1")
    torch.axon.synchronize(1)
    expected = device_fn(a1, b1)[0]
    assert expected.device == torch.device("axon:1")
    assert_same(out, expected.cpu(), accum=True)
    assert_same(out, device_fn(a, b)[0], accum=True)
    assert r.cpu().min() >= 0 and r.cpu().max() < 1 and r.cpu().std() > 0.1


# ---------------------------------------------------------------- FX graph cache

FX_CACHE_SCRIPT = """
import json
import torch
from torch._dynamo.utils import counters

def f(x, w):
    return torch.softmax((x @ w) * 2 + 1, -1).sum(0) + x.amax(0)

g = torch.Generator().manual_seed(0)
x, w = torch.randn(4, 8, generator=g), torch.randn(8, 8, generator=g)
out = torch.compile(f, backend="axon", fullgraph=True)(x.axon(), w.axon())
eager = f(x.axon(), w.axon())
print(json.dumps({
    "inductor": dict(counters["inductor"]),
    "device": str(out.device),
    "compiled": out.cpu().tolist(),
    "eager": eager.cpu().tolist(),
    "cpu": f(x, w).tolist(),
}))
"""


def test_fx_graph_cache_hit_in_a_second_process(tmp_path):
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
    runs = []
    for _ in range(2):
        p = run_python(FX_CACHE_SCRIPT, env=env, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["inductor"].get("fxgraph_cache_miss", 0) >= 1
    assert first["inductor"].get("fxgraph_cache_hit", 0) == 0
    assert second["inductor"].get("fxgraph_cache_hit", 0) >= 1, second
    assert second["inductor"].get("fxgraph_cache_miss", 0) == 0, second
    for r in runs:
        assert r["inductor"].get("fxgraph_cache_bypass", 0) == 0, r
        assert r["device"] == "axon:0"
        got = torch.tensor(r["compiled"])
        assert got.shape == (8,)
        for ref in ("eager", "cpu"):
            torch.testing.assert_close(got, torch.tensor(r[ref]), **tol(torch.float32, accum=True))


# ---------------------------------------------------------------- errors

MIXED = {
    "add": lambda a, c: a * 2 + c,
    "mm": lambda a, c: torch.mm(a, c).relu(),
    "cat": lambda a, c: torch.cat([a, c]).sum(),
}


@pytest.mark.parametrize("op", list(MIXED))
@pytest.mark.parametrize("other", ["cpu", "axon:1"])
def test_mixed_devices_raise_like_eager(op, other):
    if other == "axon:1" and torch.axon.device_count() < 2:
        pytest.skip("needs two axon devices (AXON_NUM_DEVICES < 2)")
    a = torch.ones(3, 3, device="axon")
    c = torch.ones(3, 3, device=other)
    with pytest.raises(RuntimeError, match=SAME_DEVICE) as eager:
        MIXED[op](a, c)
    with pytest.raises(RuntimeError, match=SAME_DEVICE) as compiled:
        torch.compile(MIXED[op], backend="axon")(a, c)
    assert isinstance(compiled.value, type(eager.value))
    assert "axon:0" in str(compiled.value) and other in str(compiled.value)


@pytest.mark.parametrize("use_sdpa_dropout", [False, True])
def test_compiled_checkpoint_with_random_ops_matches_eager(use_sdpa_dropout):
    """Activation checkpointing under torch.compile wraps each random op of the recomputed
    region (SDPA counts as one) in run_and_save_rng_state / run_with_rng_state, whose
    kernels knew cuda, cpu, hpu and xpu only ("Backend not supported for axon": every
    compiled HF model with gradient checkpointing). With fallback_random, compiled draws
    the eager numbers: forward and gradients equal eager's."""
    import torch._inductor.config as inductor_config
    from torch.utils.checkpoint import checkpoint

    p = 0.2 if use_sdpa_dropout else 0.0

    def block(q, k, v):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        return F.dropout(out.relu(), 0.1)

    def f(q, k, v):
        return checkpoint(block, q, k, v, use_reentrant=False).square().sum()

    torch._dynamo.reset()
    results = {}
    with inductor_config.patch(fallback_random=True):
        for name, fn in (("eager", f), ("compiled", torch.compile(f))):
            q, k, v = (t.to("axon").requires_grad_() for t in make((3, 1, 2, 8, 16),
                                                                    torch.float32, seed=4))
            torch.axon.manual_seed(3)
            out = fn(q, k, v)
            out.backward()
            results[name] = (out.detach().cpu(), q.grad.cpu(), k.grad.cpu(), v.grad.cpu())
    for got, want in zip(results["compiled"], results["eager"]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_cpp_wrapper_and_aotinductor_say_they_are_not_supported(tmp_path):
    """Inductor's C++ wrapper is not built for axon: cpp_wrapper=True and AOTInductor raise
    a NotImplementedError saying so (not Inductor's "Device axon not supported" assertion),
    and the default wrapper still compiles."""
    m = nn.Linear(4, 4).to("axon")
    x = torch.randn(2, 4, device="axon")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="axon: Inductor's C\\+\\+ wrapper is not supported"):
        torch.compile(m, options={"cpp_wrapper": True})(x)
    ep = torch.export.export(m, (x,))
    with pytest.raises(Exception, match="AOTInductor"):
        torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "m.pt2"))
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(m)(x).cpu(), m(x).cpu())
    torch.testing.assert_close(ep.module()(x).cpu(), m(x).cpu())


def test_dynamic_batch_conv3d_channels_last_follows_eager_layout():
    """A channels_last_3d Conv3d compiled with dynamic shapes: the CPU's backend
    (so eager axon) lays the result out channels_last_3d for batch 2 and 3 but
    contiguous for batch 1; the compiled graph specialises what the choice
    depends on, so every batch gets eager's layout and values."""
    torch.manual_seed(0)
    m = nn.Conv3d(4, 8, 3).axon()
    f = torch.compile(lambda x: m(x) * 2, backend="axon", dynamic=True)
    layouts = set()
    for n in [2, 3, 1, 4]:
        x = make((n, 4, 6, 6, 6), torch.float32, seed=n).axon().contiguous(
            memory_format=torch.channels_last_3d)
        got, want = f(x), m(x) * 2
        assert got.stride() == want.stride()
        layouts.add(want.is_contiguous())
        assert_same(got, want.detach().cpu(), accum=True)
    assert layouts == {True, False}  # both layouts were exercised
