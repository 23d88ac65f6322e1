"""Normalisation and softmax on axon against the CPU, forward and backward:
the fused kernels (layer_norm, rms_norm, softmax/log_softmax) on every float
dtype, layout and affine form, non-contiguous upstream gradients, batch,
group and weight norm, normalize and renorm.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import FLOAT_DTYPES, assert_same, layout_pair, make, tol
from op_util import compare, compare_fwd_bwd, leaf, nn_functional_test, stream_op_test


# ---------------------------------------------------------------- layer_norm and rms_norm (fused kernels)

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


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("shape,ns", [((3, 8), (8,)), ((3, 8), (3, 8)), ((2, 3, 8), (2, 3, 8)),
                                      ((6,), (6,)), ((2, 3, 8), (3, 8))],
                         ids=["rows", "whole_2d", "whole_3d", "whole_1d", "two_dims"])
def test_norms_float64_like_cpu(op, shape, ns):
    """float64 (ATen's ops as stream work, not the kernel), normalized over
    the last dims or over the whole input (no row dimensions left)."""
    x = make(shape, torch.float64, seed=1)
    w = make(ns, torch.float64, 0.5, 1.5, seed=2)
    fn = {"rms_norm": lambda x, w: F.rms_norm(x, ns, w),
          "layer_norm": lambda x, w: F.layer_norm(x, ns, w, w * 0.5)}[op]
    compare_fwd_bwd(fn, [x, w], torch.float64)


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


# ---------------------------------------------------------------- softmax

@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "zero_size"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("fn", ["softmax", "log_softmax", "softmax_f32"])
def test_softmax(fn, dtype, layout, dim):
    f = {"softmax": lambda x: torch.softmax(x, dim),
         "log_softmax": lambda x: F.log_softmax(x, dim),
         "softmax_f32": lambda x: torch.softmax(x, dim, dtype=torch.float32)}[fn]
    c, a = layout_pair(layout, dtype, seed=8)
    compare(f, [c], [a], accum=True)


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


# ---------------------------------------------------------------- other norms

# name: (input shape, function of the input)
NN = {
    "layer_norm": ((2, 3, 8), lambda x: F.layer_norm(x, (8,), torch.linspace(0.5, 1.5, 8, dtype=x.dtype, device=x.device), torch.linspace(-1, 1, 8, dtype=x.dtype, device=x.device))),
    "layer_norm_2d": ((2, 3, 8), lambda x: F.layer_norm(x, (3, 8))),
    "rms_norm": ((2, 3, 8), lambda x: F.rms_norm(x, (8,), torch.linspace(0.5, 1.5, 8, dtype=x.dtype, device=x.device))),
    "group_norm": ((2, 4, 5), lambda x: F.group_norm(x, 2)),
    "batch_norm_eval": ((4, 3, 5), lambda x: F.batch_norm(x, torch.zeros(3, dtype=x.dtype, device=x.device), torch.ones(3, dtype=x.dtype, device=x.device))),
    "normalize": ((3, 4), lambda x: F.normalize(x, dim=1)),
    "cosine_similarity": ((3, 4), lambda x: F.cosine_similarity(x, x.flip(0))),
}

test_nn_functional = nn_functional_test(NN)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_batch_norm_training_updates_running_stats(dtype):
    x = make((6, 3, 4), dtype, seed=16)
    bn_c = torch.nn.BatchNorm1d(3).to(dtype)
    bn_a = copy.deepcopy(bn_c).axon()
    for _ in range(2):
        yc, ya = bn_c(x), bn_a(x.axon())
        assert_same(ya, yc, accum=True)
    assert_same(bn_a.running_mean, bn_c.running_mean, accum=True)
    assert_same(bn_a.running_var, bn_c.running_var, accum=True)
    assert_same(bn_a.num_batches_tracked, bn_c.num_batches_tracked)


# Ops the generic stream kernel runs (found by an OpInfo sweep of the fallback);
# name: (function of the inputs, input shapes, value range, differentiable)
STREAM_OPS = {
    "renorm": (lambda a: torch.renorm(a, 2, 0, 1.5), [(4, 6)], None, True),
    "weight_norm": (lambda v, g: torch._weight_norm(v, g, 0), [(6, 4, 3), (6, 1, 1)], None,
                    True),
    "weight_norm_dim2": (lambda v, g: torch._weight_norm(v, g, 2), [(6, 4, 3), (1, 1, 3)], None,
                         True),
}


test_stream_op_matches_cpu = stream_op_test(STREAM_OPS)


# ---------------------------------------------------------------- numerics and layouts found by
# PyTorch's own test_nn / test_modules run on axon

@pytest.mark.parametrize("mode", ["own", "library"])
def test_log_softmax_of_large_values_matches_cpu(mode, kernel_select_isolated):
    """log_softmax next to a large maximum: (x - max) - log(sum), as the CPU
    computes (x - (max + log(sum))) rounded log(sum) away: [-3, -2, -1, 0]);
    cross_entropy and its gradient with it.  Both sides of kernel selection."""
    torch.ops.axon._set_kernel_select(mode)
    for offset in [1e7, -1e7, 3e4, 0.0]:
        x = torch.tensor([[0.0, 1.0, 2.0, 3.0], [5.0, -1.0, 0.5, 2.0]]) + offset
        for fn in [lambda t: F.log_softmax(t, -1), lambda t: F.softmax(t, -1)]:
            assert_same(fn(x.to("axon")), fn(x))
        target = torch.tensor([0, 2])
        xc, xa = leaf(x, "cpu"), leaf(x, "axon")
        lc, la = F.cross_entropy(xc, target), F.cross_entropy(xa, target.to("axon"))
        lc.backward()
        la.backward()
        assert_same(la, lc.detach())
        assert_same(xa.grad, xc.grad)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "softmax", "log_softmax"])
def test_long_rows_keep_float32_accuracy(op, kernel_select_isolated):
    """float32 rows of 2**21 elements: the row sums of axon's fused kernels
    (selection forced to them) stay accurate (block sums in double), within 2x
    of the CPU's error against a float64 reference (they accumulated in
    float32: 1e-6 and more at 2**20)."""
    torch.ops.axon._set_kernel_select("own")
    n = 1 << 21
    x = make((1, n), torch.float64, low=-1.0, high=3.0, seed=7)
    fn = {"layer_norm": lambda t: F.layer_norm(t, [n]),
          "rms_norm": lambda t: F.rms_norm(t, [n]),
          "softmax": lambda t: F.softmax(t, -1) * n,
          "log_softmax": lambda t: F.log_softmax(t, -1)}[op]
    want = fn(x)
    err_cpu = (fn(x.float()).double() - want).abs().max().item()
    err_axon = (fn(x.float().to("axon")).cpu().double() - want).abs().max().item()
    assert err_axon <= 2 * err_cpu + 1e-7, (err_axon, err_cpu)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("log", [False, True])
def test_softmax_values_do_not_depend_on_the_input_layout(dtype, log):
    """A transposed (or channels_last) input gives bit for bit the values of
    the same input made contiguous, forward and backward (a strided input went
    to the CPU's kernel, a contiguous one to axon's: 13% apart in float16)."""
    fn = F.log_softmax if log else F.softmax
    base = make((3, 5, 7), dtype, seed=3).to("axon")
    for strided in [base.transpose(0, 1), base.permute(2, 0, 1), base[:, :, ::2]]:
        dense = strided.contiguous()
        a, b = leaf(strided, "axon"), leaf(dense, "axon")
        ya, yb = fn(a, -1), fn(b, -1)
        assert torch.equal(ya.cpu(), yb.cpu())
        g = make(tuple(ya.shape), dtype, seed=4).to("axon")
        ya.backward(g.transpose(0, 1).contiguous().transpose(0, 1) if g.dim() > 1 else g)
        yb.backward(g)
        assert torch.equal(a.grad.cpu(), b.grad.cpu())


RMS_LAYOUTS = {
    "channels_last": lambda: make((2, 4, 6, 6), torch.float32).contiguous(
        memory_format=torch.channels_last),
    "transposed": lambda: make((6, 5), torch.float32).t(),
    "permuted_3d": lambda: make((5, 2, 6), torch.float32).permute(1, 0, 2).transpose(1, 2)
    .contiguous().transpose(1, 2),
    "sliced": lambda: make((3, 12), torch.float32)[:, ::2],
}


@pytest.mark.parametrize("layout", list(RMS_LAYOUTS))
@pytest.mark.parametrize("weight", [False, True])
def test_rms_norm_result_layout_like_cpu(weight, layout):
    """F.rms_norm (the fused kernel on axon) of a non-contiguous input: result
    and input gradient in the CPU's layout (channels_last kept, others
    contiguous, as ATen's rms_norm), with its values."""
    x = RMS_LAYOUTS[layout]()
    assert not x.is_contiguous()
    w = make((6,), torch.float32, seed=2) if weight else None
    xc, xa = leaf(x, "cpu"), leaf(x, "axon")
    yc = F.rms_norm(xc, [6], w)
    ya = F.rms_norm(xa, [6], None if w is None else w.to("axon"))
    assert ya.stride() == yc.stride()
    g = make(tuple(x.shape), torch.float32, seed=5)
    yc.backward(g)
    ya.backward(g.to("axon"))
    assert xa.grad.stride() == xc.grad.stride()
    assert_same(ya, yc.detach())
    assert_same(xa.grad, xc.grad)
