"""Ops the generic stream kernel runs since an OpInfo sweep of the fallback
(2026-11-30): dot products and reductions, elementwise and special functions
(torch.special's Bessel functions and orthogonal polynomials), 1-D and 3-D
pooling, upsampling and padding, more losses, FFTs, gcd/lcm. Each runs as stream
work (no fallback), equal to the CPU, contiguous and on a non-contiguous input,
in float32 and bfloat16; where the CPU has no bfloat16 kernel, axon raises too.
Differentiable ones are checked backward as well.

(The sweep itself, not part of the suite: every op of PyTorch's op_db on its
first sample inputs, forward in float32/bfloat16/float16/int64/complex64
and backward in float32, compared with the CPU; it also found the fallback
dropping a kernel's conjugate bit, tested last here; what is left in the fallback is linear algebra
(LAPACK errors stay synchronous), data-dependent shapes (unique, histogram,
segment_reduce), index-checking ops (take, put_, index_reduce, max_unpool),
and embedding_bag.)
"""

import copy

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_same, make

# name: (function of the inputs, input shapes, value range, differentiable)
POS = (0.2, 3.0)
OPS = {
    "dot": (lambda a, b: torch.dot(a, b), [(7,), (7,)], None, True),
    "vdot": (lambda a, b: torch.vdot(a, b), [(7,), (7,)], None, True),
    "trace": (lambda a: torch.trace(a), [(5, 5)], None, True),
    "addmv": (lambda b, m, v: torch.addmv(b, m, v, beta=0.5, alpha=2), [(4,), (4, 6), (6,)],
              None, True),
    "addbmm": (lambda m, a, b: torch.addbmm(m, a, b), [(3, 5), (2, 3, 4), (2, 4, 5)], None, True),
    "rsub_tensor": (lambda a, b: torch.rsub(a, b, alpha=2), [(4, 6), (4, 6)], None, True),
    "rsub_scalar": (lambda a: 1.5 - a, [(4, 6)], None, True),
    "nansum": (lambda a: torch.nansum(torch.where(a > 2, float("nan"), a), dim=1), [(4, 6)],
               None, True),
    "count_nonzero": (lambda a: torch.count_nonzero(a > 0.5, dim=1), [(4, 6)], None, False),
    "renorm": (lambda a: torch.renorm(a, 2, 0, 1.5), [(4, 6)], None, True),
    "hardtanh": (lambda a: F.hardtanh(a, -1.0, 2.0), [(4, 6)], None, True),
    "hardtanh_": (lambda a: F.hardtanh(a.clone(), -1.0, 2.0, inplace=True), [(4, 6)], None,
                  True),
    "relu6": (lambda a: F.relu6(a), [(4, 6)], None, True),
    "logit": (lambda a: torch.logit(a, eps=1e-3), [(4, 6)], (0.01, 0.99), True),
    "erfc": (lambda a: torch.erfc(a), [(4, 6)], None, True),
    "sinc": (lambda a: torch.sinc(a), [(4, 6)], None, True),
    "threshold": (lambda a: F.threshold(a, 0.3, -2.0), [(4, 6)], None, True),
    "round_decimals": (lambda a: torch.round(a * 10, decimals=1), [(4, 6)], None, False),
    "logaddexp": (lambda a, b: torch.logaddexp(a, b), [(4, 6), (4, 6)], None, True),
    "logaddexp2": (lambda a, b: torch.logaddexp2(a, b), [(4, 6), (4, 6)], None, True),
    "fmax": (lambda a, b: torch.fmax(a, b), [(4, 6), (4, 6)], None, True),
    "fmin": (lambda a, b: torch.fmin(a, b), [(4, 6), (4, 6)], None, True),
    "hardshrink": (lambda a: F.hardshrink(a, 0.7), [(4, 6)], None, True),
    "softshrink": (lambda a: F.softshrink(a, 0.7), [(4, 6)], None, True),
    "frexp": (lambda a: torch.frexp(a), [(4, 6)], None, False),
    "i0": (lambda a: torch.i0(a), [(4, 6)], None, True),
    "i1": (lambda a: torch.special.i1(a), [(4, 6)], None, True),
    "nextafter": (lambda a, b: torch.nextafter(a, b), [(4, 6), (4, 6)], None, False),
    "igamma": (lambda a, b: torch.igamma(a, b), [(4, 6), (4, 6)], POS, False),
    "igammac": (lambda a, b: torch.igammac(a, b), [(4, 6), (4, 6)], POS, False),
    "polygamma": (lambda a: torch.polygamma(1, a), [(4, 6)], POS, True),
    "angle": (lambda a: torch.angle(a), [(4, 6)], None, False),
    "median": (lambda a: torch.median(a), [(4, 6)], None, True),
    "nanmedian": (lambda a: torch.nanmedian(torch.where(a > 2, float("nan"), a)), [(4, 6)],
                  None, True),
    "nanmedian_dim": (lambda a: torch.nanmedian(a, dim=1), [(4, 6)], None, True),
    "nonzero_static": (lambda a: torch.nonzero_static(a > 0, size=30), [(4, 6)], None, False),
    "prelu": (lambda a, w: F.prelu(a, w), [(2, 3, 4, 5), (3,)], None, True),
    "rrelu_eval": (lambda a: F.rrelu(a, training=False), [(4, 6)], None, True),
    "adaptive_avg_pool2d": (lambda a: F.adaptive_avg_pool2d(a, (3, 2)), [(2, 3, 7, 6)], None,
                            True),
    "adaptive_max_pool2d": (lambda a: F.adaptive_max_pool2d(a, (3, 2)), [(2, 3, 7, 6)], None,
                            True),
    "adaptive_avg_pool3d": (lambda a: F.adaptive_avg_pool3d(a, 2), [(1, 2, 5, 4, 6)], None,
                            True),
    "adaptive_max_pool3d": (lambda a: F.adaptive_max_pool3d(a, 2), [(1, 2, 5, 4, 6)], None,
                            True),
    "avg_pool3d": (lambda a: F.avg_pool3d(a, 2), [(1, 2, 4, 4, 6)], None, True),
    "max_pool3d": (lambda a: F.max_pool3d(a, 2), [(1, 2, 4, 4, 6)], None, True),
    "fractional_max_pool2d": (
        lambda a: F.fractional_max_pool2d(a, 2, output_size=(3, 3), _random_samples=torch.full(
            (2, 3, 2), 0.3, dtype=a.dtype, device=a.device)), [(2, 3, 7, 8)], None, True),
    "nearest1d": (lambda a: F.interpolate(a, scale_factor=2, mode="nearest"), [(2, 3, 5)],
                  None, True),
    "linear1d": (lambda a: F.interpolate(a, size=9, mode="linear"), [(2, 3, 5)], None, True),
    "nearest_exact1d": (lambda a: F.interpolate(a, size=8, mode="nearest-exact"), [(2, 3, 5)],
                        None, True),
    "nearest_exact2d": (lambda a: F.interpolate(a, size=(7, 9), mode="nearest-exact"),
                        [(2, 3, 4, 5)], None, True),
    "bilinear_aa": (lambda a: F.interpolate(a, size=(3, 4), mode="bilinear", antialias=True),
                    [(2, 3, 7, 9)], None, True),
    "nearest3d": (lambda a: F.interpolate(a, scale_factor=2, mode="nearest"), [(1, 2, 3, 3, 4)],
                  None, True),
    "trilinear": (lambda a: F.interpolate(a, size=(4, 5, 6), mode="trilinear"),
                  [(1, 2, 3, 3, 4)], None, True),
    "reflect_pad1d": (lambda a: F.pad(a, (2, 1), mode="reflect"), [(2, 3, 5)], None, True),
    "replicate_pad1d": (lambda a: F.pad(a, (2, 1), mode="replicate"), [(2, 3, 5)], None, True),
    "reflect_pad3d": (lambda a: F.pad(a, (1, 1, 2, 1, 1, 0), mode="reflect"),
                      [(1, 2, 3, 4, 5)], None, True),
    "replicate_pad3d": (lambda a: F.pad(a, (1, 1, 2, 1, 1, 0), mode="replicate"),
                        [(1, 2, 3, 4, 5)], None, True),
    "grid_sample3d": (lambda a: F.grid_sample(a, torch.linspace(
        -0.9, 0.9, 1 * 2 * 3 * 2 * 3, dtype=a.dtype).view(1, 2, 3, 2, 3).to(a.device),
        align_corners=False), [(1, 2, 3, 4, 5)], None, True),
    "channel_shuffle": (lambda a: F.channel_shuffle(a, 2), [(2, 4, 3, 3)], None, False),
    "pdist": (lambda a: F.pdist(a), [(5, 4)], None, True),
    "nll_loss2d": (lambda a: F.nll_loss(F.log_softmax(a, 1), torch.tensor(
        [[[0, 1, 2], [2, 1, 0]]]).expand(2, 2, 3).to(a.device)), [(2, 3, 2, 3)], None, True),
    "i0e": (lambda a: torch.special.i0e(a), [(4, 6)], None, True),
    "i1e": (lambda a: torch.special.i1e(a), [(4, 6)], None, True),
    "entr": (lambda a: torch.special.entr(a), [(4, 6)], None, True),
    "erfcx": (lambda a: torch.special.erfcx(a), [(4, 6)], None, True),
    "log_ndtr": (lambda a: torch.special.log_ndtr(a), [(4, 6)], None, True),
    "ndtri": (lambda a: torch.special.ndtri(a), [(4, 6)], (0.01, 0.99), True),
    "xlog1py": (lambda a, b: torch.special.xlog1py(a, b), [(4, 6), (4, 6)], POS, True),
    "zeta": (lambda a, b: torch.special.zeta(a + 1, b), [(4, 6), (4, 6)], POS, False),
    "bessel_j0": (lambda a: torch.special.bessel_j0(a), [(4, 6)], None, False),
    "modified_bessel_k1": (lambda a: torch.special.modified_bessel_k1(a), [(4, 6)], POS, False),
    "chebyshev_t": (lambda a: torch.special.chebyshev_polynomial_t(a, 3), [(4, 6)], (-1, 1),
                    False),
    "hermite_h": (lambda a: torch.special.hermite_polynomial_h(a, 4), [(4, 6)], None, False),
    "weight_norm": (lambda v, g: torch._weight_norm(v, g, 0), [(6, 4, 3), (6, 1, 1)], None,
                    True),
    "weight_norm_dim2": (lambda v, g: torch._weight_norm(v, g, 2), [(6, 4, 3), (1, 1, 3)], None,
                         True),
    # ops without Meta kernels (AsyncOps.cpp's without_meta): margin losses' and
    # CTC's backwards, logcumsumexp, cummax/cummin
    "multi_margin_loss": (lambda a: F.multi_margin_loss(a, torch.tensor(
        [1, 0, 3, 2]).to(a.device)), [(4, 6)], None, True),
    "multilabel_margin_loss": (lambda a: F.multilabel_margin_loss(a, torch.tensor(
        [[1, 0, -1, 0, 0, 0]] * 4).to(a.device)), [(4, 6)], None, True),
    "logcumsumexp": (lambda a: torch.logcumsumexp(a, 1), [(4, 6)], None, True),
    "logcumsumexp_dim0": (lambda a: torch.logcumsumexp(a, 0), [(4, 6)], None, True),
    "cummax": (lambda a: torch.cummax(a, 1), [(4, 6)], None, True),
    "cummin": (lambda a: torch.cummin(a, 0), [(4, 6)], None, True),
}


def inputs(shapes, rng, dtype, strided, device):
    """The inputs on device; strided: every one a view of every other element
    of a wider tensor made on the device (the same values on both devices)."""
    low, high = rng or (-3.0, 3.0)
    out = []
    for i, shape in enumerate(shapes):
        if strided:
            wide = shape[:-1] + (2 * shape[-1],)
            out.append(make(wide, dtype, low, high, seed=10 + i).to(device)[..., ::2])
        else:
            out.append(make(shape, dtype, low, high, seed=10 + i).to(device))
    return out


def floats(x):
    return [t for t in (x if isinstance(x, (tuple, list)) else [x])
            if isinstance(t, torch.Tensor) and t.is_floating_point()]


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(OPS))
def test_stream_op_matches_cpu(name, dtype, strided):
    fn, shapes, rng, grad = OPS[name]
    cpu_in = inputs(shapes, rng, dtype, strided, "cpu")
    ax_in = inputs(shapes, rng, dtype, strided, "axon")
    if strided:
        assert not any(t.is_contiguous() for t in ax_in)
    try:
        want = fn(*cpu_in)
    except (RuntimeError, NotImplementedError) as e:
        # No kernel for this dtype on the CPU: axon says the same.
        with pytest.raises(type(e), match=str(e).split("\n")[0][:40].replace("(", r"\(")
                           .replace(")", r"\)").replace("'", ".")):
            fn(*ax_in)
        return
    torch.axon.reset_fallback_stats()
    got = fn(*ax_in)
    assert_same(got, want, dtype=dtype, accum=True)
    if grad:
        leaves_c = [t.detach().requires_grad_() for t in cpu_in]
        leaves_a = [t.detach().requires_grad_() for t in ax_in]
        outs_c, outs_a = floats(fn(*leaves_c)), floats(fn(*leaves_a))
        try:
            gc = torch.autograd.grad(sum((o.float() ** 2).sum() for o in outs_c), leaves_c)
        except NotImplementedError as e:  # i1's backward in bfloat16: as on the CPU
            with pytest.raises(NotImplementedError, match=str(e)[:20]):
                torch.autograd.grad(sum((o.float() ** 2).sum() for o in outs_a), leaves_a)
        else:
            ga = torch.autograd.grad(sum((o.float() ** 2).sum() for o in outs_a), leaves_a)
            for a, c in zip(ga, gc):
                assert_same(a, c, dtype=dtype, accum=True)
    assert torch.axon.fallback_stats() == {}


ZERO_SIZE = {  # name: shapes of its inputs with no elements
    "trace": [(0, 0)],
    "hardtanh": [(4, 0)],
    "logaddexp": [(4, 0), (4, 0)],
    "adaptive_avg_pool2d": [(0, 3, 7, 6)],
    "nearest1d": [(0, 3, 5)],
    "reflect_pad3d": [(0, 2, 3, 4, 5)],
    "rsub_scalar": [(4, 0)],
}


@pytest.mark.parametrize("name", list(ZERO_SIZE))
def test_stream_op_zero_size(name):
    fn = OPS[name][0]
    cpu_in = [make(s, torch.float32, seed=3) for s in ZERO_SIZE[name]]
    torch.axon.reset_fallback_stats()
    assert_same(fn(*[t.axon() for t in cpu_in]), fn(*cpu_in))
    assert torch.axon.fallback_stats() == {}


def test_ctc_loss_matches_cpu():
    """CTC loss (speech fine-tuning), forward and backward, as stream work
    (the backward has no Meta kernel: its gradient is shaped like log_probs)."""
    log_probs = make((12, 2, 5), torch.float32, seed=7).log_softmax(2)
    targets = torch.tensor([[1, 2, 2, 3], [4, 1, 0, 0]])
    lengths = (torch.tensor([12, 10]), torch.tensor([4, 2]))
    torch.axon.reset_fallback_stats()
    for reduction in ("mean", "sum", "none"):
        lc, la = log_probs.clone().requires_grad_(), log_probs.axon().requires_grad_()
        want = F.ctc_loss(lc, targets, *lengths, reduction=reduction)
        got = F.ctc_loss(la, targets.axon(), *lengths, reduction=reduction)
        assert_same(got, want.detach(), accum=True)
        gc, = torch.autograd.grad(want.sum(), lc)
        ga, = torch.autograd.grad(got.sum(), la)
        assert_same(ga, gc, accum=True)
    assert torch.axon.fallback_stats() == {}


def test_ops_without_meta_kernels_check_on_the_host():
    """logcumsumexp's dimension is checked when it is called (the op has no
    Meta kernel to do it), with PyTorch's error."""
    for x in (torch.ones(3, 4), torch.ones(3, 4, device="axon")):
        with pytest.raises(IndexError, match="Dimension out of range"):
            torch.logcumsumexp(x, 2)


def test_integer_fft_and_embedding_ops_match_cpu():
    """gcd/lcm on integers, FFTs (complex results), embedding max_norm renorm."""
    a, b = make((4, 6), torch.int64, 1, 60, seed=1), make((4, 6), torch.int64, 1, 60, seed=2)
    x = make((4, 8), torch.float32, seed=3)
    torch.axon.reset_fallback_stats()
    assert_same(torch.gcd(a.axon(), b.axon()), torch.gcd(a, b))
    assert_same(torch.lcm(a.axon()[:, ::2], b.axon()[:, ::2]), torch.lcm(a[:, ::2], b[:, ::2]))
    assert_same(torch.fft.rfft(x.axon()), torch.fft.rfft(x), accum=True)
    assert_same(torch.fft.fft(x.axon().to(torch.complex64)), torch.fft.fft(x.to(torch.complex64)),
                accum=True)
    spec = torch.fft.rfft(x)
    assert_same(torch.fft.irfft(spec.axon(), n=8), torch.fft.irfft(spec, n=8), accum=True)
    weights = make((10, 4), torch.float32, seed=4)
    ids = torch.tensor([[1, 3, 3], [7, 0, 9]])
    wc, wa = weights.clone(), weights.axon()
    assert_same(F.embedding(ids.axon(), wa, max_norm=1.0), F.embedding(ids, wc, max_norm=1.0))
    assert_same(wa, wc)  # rows looked up renormalised in place
    assert torch.axon.fallback_stats() == {}


def test_fallback_keeps_a_kernels_conjugate_bit():
    """linalg.lu_solve(left=False) returns X^H by flipping its out's conjugate
    bit (it stays in the fallback, which carried back sizes and strides but
    not that bit: the result was the conjugate of the right one)."""
    A = make((3, 3), torch.float32, seed=5) + 1j * make((3, 3), torch.float32, seed=6)
    B = make((4, 3), torch.float32, seed=7) + 1j * make((4, 3), torch.float32, seed=8)
    LU, piv = torch.linalg.lu_factor(A)
    for adjoint in (False, True):
        want = torch.linalg.lu_solve(LU, piv, B, left=False, adjoint=adjoint)
        got = torch.linalg.lu_solve(LU.axon(), piv.axon(), B.axon(), left=False, adjoint=adjoint)
        assert got.is_conj() == want.is_conj()
        assert_same(got, want, accum=True)
        # and it solves X A = B (X A^H = B): checked without lu_solve
        lhs = got.cpu() @ (A.mH if adjoint else A)
        torch.testing.assert_close(lhs.resolve_conj(), B, rtol=1e-4, atol=1e-4)


# RNNs: ATen's lstm_cell / gru_cell call the fused cell ops on every device but
# the CPU, and only CUDA had kernels for them: nn.LSTM, nn.GRU and their cells
# raised on axon (csrc/aten/RnnOps.cpp).
RNNS = {
    "lstm": lambda: torch.nn.LSTM(5, 7, num_layers=2, bidirectional=True, batch_first=True),
    "lstm_proj_nobias": lambda: torch.nn.LSTM(5, 7, proj_size=3, bias=False),
    "gru": lambda: torch.nn.GRU(5, 7, num_layers=2, dropout=0.0),
    "gru_bidir_nobias": lambda: torch.nn.GRU(5, 7, bidirectional=True, bias=False),
    "lstm_cell": lambda: torch.nn.LSTMCell(5, 7),
    "gru_cell": lambda: torch.nn.GRUCell(5, 7),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(RNNS))
def test_rnn_modules_match_cpu(name, dtype):
    torch.manual_seed(0)
    cpu = RNNS[name]().to(dtype)
    ax = copy.deepcopy(cpu).to("axon")
    cell = name.endswith("cell")
    x = make((3, 5) if cell else (3, 4, 5), dtype, seed=1)
    h0 = make((3, 7), dtype, seed=2) if cell else None
    torch.axon.reset_fallback_stats()
    results = []
    for dev, mod in (("cpu", cpu), ("axon", ax)):
        xd = x.to(dev).requires_grad_()
        hd = h0.to(dev).requires_grad_() if h0 is not None else None
        out = mod(xd, hd) if cell and name == "gru_cell" else \
            mod(xd, (hd, hd.clone())) if cell else mod(xd)
        outs = [t for t in (out if isinstance(out, tuple) else (out,))]
        flat = [t for o in outs for t in (o if isinstance(o, tuple) else (o,))]
        loss = sum((t.float() ** 2).sum() for t in flat)
        leaves = [xd] + ([hd] if hd is not None else []) + list(mod.parameters())
        grads = torch.autograd.grad(loss, leaves)
        results.append((flat, grads))
    for got, want in zip(results[1][0] + list(results[1][1]), results[0][0] + list(results[0][1])):
        assert_same(got, want, dtype=dtype, accum=True)
    assert torch.axon.fallback_stats() == {}


def test_rnn_cells_double_backward_and_errors():
    """create_graph=True takes autograd's differentiable composition; bad state
    shapes raise PyTorch's errors."""
    torch.manual_seed(0)
    cpu = torch.nn.LSTMCell(4, 3)
    ax = copy.deepcopy(cpu).to("axon")
    x = make((2, 4), torch.float32, seed=3)
    res = []
    for dev, mod in (("cpu", cpu), ("axon", ax)):
        xd = x.to(dev).requires_grad_()
        h, c = mod(xd)
        g, = torch.autograd.grad((h * c).sum(), xd, create_graph=True)
        gg, = torch.autograd.grad((g ** 2).sum(), xd)
        res.append((g, gg))
    assert_same(res[1][0], res[0][0], accum=True)
    assert_same(res[1][1], res[0][1], accum=True)
    with pytest.raises(RuntimeError, match="hidden"):
        torch.nn.GRUCell(4, 3).to("axon")(x.axon(), torch.zeros(2, 5, device="axon"))
    with pytest.raises(RuntimeError, match="_thnn_fused_gru_cell: input_gates and hidden_gates "
                       "must be 2-D tensors of the same shape"):
        torch.ops.aten._thnn_fused_gru_cell(torch.zeros(2, 9, device="axon"),
                                            torch.zeros(2, 6, device="axon"),
                                            torch.zeros(2, 3, device="axon"))
    with pytest.raises(RuntimeError, match="_thnn_fused_lstm_cell: the state must be"):
        torch.ops.aten._thnn_fused_lstm_cell(torch.zeros(2, 12, device="axon"),
                                             torch.zeros(2, 12, device="axon"),
                                             torch.zeros(2, 4, device="axon"))
