"""Linear algebra on axon against the CPU. Matrix products: mm/bmm/matmul
with broadcasting and empty dimensions, addmm/baddbmm/addmv/addbmm,
dot/vdot/outer, einsum, linear (the few-rows kernel, its out= forms and mixed
dtypes, the GEMM path), trace. torch.linalg (inv, solve, qr, cholesky, det,
svdvals, eigvalsh, lu, lstsq, norms, pinv, matrix_exp...), cdist/pdist,
cross/kron; FFTs, complex views and the conjugate and negative bits; gcd/lcm.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F

from conftest import AXON, FLOAT_DTYPES, assert_same, make, run_python
from op_util import compare, compare_fwd_bwd, stream_op_test, stream_op_zero_size_test


# ---------------------------------------------------------------- matrix products

MATMUL = {
    "mm": ((3, 5), (5, 4), torch.mm),
    "mm_t": ((5, 3), (4, 5), lambda a, b: torch.mm(a.t(), b.t())),
    "bmm": ((2, 3, 5), (2, 5, 4), torch.bmm),
    "matmul_bcast": ((2, 1, 3, 5), (3, 5, 4), torch.matmul),
    "matmul_vec": ((3, 5), (5,), torch.matmul),
    "matmul_1d_2d": ((5,), (5, 4), torch.matmul),
    "mv": ((3, 5), (5,), torch.mv),
    "dot": ((5,), (5,), torch.dot),
    "vdot": ((5,), (5,), torch.vdot),
    "outer": ((3,), (4,), torch.outer),
    "addmm": ((3, 5), (5, 4), lambda a, b: torch.addmm(torch.ones(3, 4, dtype=a.dtype, device=a.device), a, b, beta=0.5, alpha=2)),
    "baddbmm": ((2, 3, 5), (2, 5, 4), lambda a, b: torch.baddbmm(torch.ones(1, 3, 4, dtype=a.dtype, device=a.device), a, b)),
    "linear": ((3, 5), (4, 5), lambda a, b: F.linear(a, b, b[:, 0])),
    "linear_nobias": ((2, 3, 5), (4, 5), F.linear),
    "einsum": ((2, 3, 5), (2, 5, 4), lambda a, b: torch.einsum("bij,bjk->bik", a, b)),
    "einsum_trace": ((4, 5), (5, 4), lambda a, b: torch.einsum("ij,ji->", a, b)),
    "tensordot": ((3, 5), (5, 4), lambda a, b: torch.tensordot(a, b, dims=1)),
    "matmul_empty_k": ((3, 0), (0, 4), torch.matmul),
    "matmul_empty_m": ((0, 5), (5, 4), torch.matmul),
    "bmm_empty_batch": ((0, 3, 5), (0, 5, 4), torch.bmm),
    "sdpa": ((2, 4, 8), (2, 4, 8), lambda q, k: F.scaled_dot_product_attention(q, k, k)),
    "sdpa_causal": ((1, 2, 4, 8), (1, 2, 4, 8), lambda q, k: F.scaled_dot_product_attention(q, k, k, is_causal=True)),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op", list(MATMUL))
def test_matmul(op, dtype):
    sa, sb, fn = MATMUL[op]
    a, b = make(sa, dtype, -1, 1, seed=10), make(sb, dtype, -1, 1, seed=11)
    compare(fn, [a, b], [a.axon(), b.axon()], accum=True)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_matmul_noncontiguous_operands(dtype):
    a = make((6, 10), dtype, -1, 1, seed=12)
    b = make((10, 5), dtype, -1, 1, seed=13)
    fn = lambda x, y: x[::2, ::2] @ y[::2, :]  # noqa: E731  (3x5) @ (5x5)
    compare(fn, [a, b], [a.axon(), b.axon()], accum=True)
    compare(lambda x, y: x.t()[::2].t() @ y.t()[:, ::2], [a, b], [a.axon(), b.axon()], accum=True)


def test_matmul_int():
    a = make((3, 4), torch.int64, -5, 5, seed=1)
    b = make((4, 2), torch.int64, -5, 5, seed=2)
    compare(torch.mm, [a, b], [a.axon(), b.axon()])


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


# ---------------------------------------------------------------- torch.linalg, FFTs, complex numbers

def _spd(a):
    return a @ a.t() + torch.eye(a.shape[0], dtype=a.dtype, device=a.device)


LINALG = {
    "inv": lambda a, b: torch.linalg.inv(a), "solve": lambda a, b: torch.linalg.solve(a, b),
    "qr": lambda a, b: torch.linalg.qr(a), "cholesky": lambda a, b: torch.linalg.cholesky(_spd(a)),
    "cholesky_ex": lambda a, b: torch.linalg.cholesky_ex(_spd(a)),
    "cholesky_ex_not_pd": lambda a, b: torch.linalg.cholesky_ex(-_spd(a)),
    "det": lambda a, b: torch.linalg.det(a), "slogdet": lambda a, b: torch.linalg.slogdet(a),
    "svdvals": lambda a, b: torch.linalg.svdvals(a), "eigvalsh": lambda a, b: torch.linalg.eigvalsh(_spd(a)),
    "lu_factor": lambda a, b: torch.linalg.lu_factor(a), "lstsq": lambda a, b: torch.linalg.lstsq(a, b).solution,
    "matrix_norm": lambda a, b: torch.linalg.matrix_norm(a), "vector_norm": lambda a, b: torch.linalg.vector_norm(a, 3),
    "pinv": lambda a, b: torch.linalg.pinv(a), "cdist": lambda a, b: torch.cdist(a, b.t()),
    "solve_triangular": lambda a, b: torch.linalg.solve_triangular(a.triu(), b, upper=True),
    "matrix_exp": lambda a, b: torch.linalg.matrix_exp(a / 10), "cross": lambda a, b: torch.linalg.cross(a[:, :3], a[:, 1:]),
    "kron": lambda a, b: torch.kron(a[:2, :2], b[:2]), "rfft": lambda a, b: torch.fft.rfft(a),
    "fft2_abs": lambda a, b: torch.fft.fft2(a).abs(), "complex_ops": lambda a, b: torch.complex(a, -a) * torch.complex(a, a.flip(0)),
    "view_as_real": lambda a, b: torch.view_as_real(torch.complex(a, a)), "bincount": lambda a, b: torch.bincount((a.abs() * 3).long().flatten()),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("op", list(LINALG))
def test_linalg_and_misc(op, dtype, transposed):
    a = make((4, 4), dtype, seed=40) + 4 * torch.eye(4, dtype=dtype)
    b = make((4, 2), dtype, seed=41)
    ac, aa = (a.t(), a.axon().t()) if transposed else (a, a.axon())
    compare(LINALG[op], [ac, b], [aa, b.axon()], accum=True)


def test_conj_and_neg_bits():
    # in a subprocess: the failure mode is a crash of the interpreter
    r = run_python("""
        import torch
        a = torch.complex(torch.arange(4.0), torch.arange(4.0) - 2)
        x = a.axon()
        r = torch.arange(4.0)

        def grad_of(t):  # complex autograd conjugates gradients
            t = t.detach().requires_grad_()
            (t * t).abs().sum().backward()
            return t.grad.cpu()

        cases = {
            "conj_to_cpu": (lambda: x.conj().cpu(), a.conj().resolve_conj()),
            "mul_by_conj": (lambda: (x * x.conj()).cpu(), a * a.conj()),
            "neg_view": (lambda: (r.axon()._neg_view() + 1).cpu(), r._neg_view() + 1),
            "complex_autograd": (lambda: grad_of(x), grad_of(a)),
        }
        for name, (fn, ref) in cases.items():
            print(name, flush=True)
            torch.testing.assert_close(fn(), ref, rtol=0, atol=0)
        print("OK")
    """)
    assert r.returncode == 0 and r.stdout.split()[-1] == "OK", (r.returncode, r.stdout, r.stderr[-300:])


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


# ---------------------------------------------------------------- the generic stream kernel

# Ops the generic stream kernel runs (found by an OpInfo sweep of the fallback);
# name: (function of the inputs, input shapes, value range, differentiable)
STREAM_OPS = {
    "dot": (lambda a, b: torch.dot(a, b), [(7,), (7,)], None, True),
    "vdot": (lambda a, b: torch.vdot(a, b), [(7,), (7,)], None, True),
    "trace": (lambda a: torch.trace(a), [(5, 5)], None, True),
    "addmv": (lambda b, m, v: torch.addmv(b, m, v, beta=0.5, alpha=2), [(4,), (4, 6), (6,)],
              None, True),
    "addbmm": (lambda m, a, b: torch.addbmm(m, a, b), [(3, 5), (2, 3, 4), (2, 4, 5)], None, True),
    "pdist": (lambda a: F.pdist(a), [(5, 4)], None, True),
}


test_stream_op_matches_cpu = stream_op_test(STREAM_OPS)


ZERO_SIZE = {  # name: shapes of its inputs with no elements
    "trace": [(0, 0)],
}

test_stream_op_zero_size = stream_op_zero_size_test(STREAM_OPS, ZERO_SIZE)


@pytest.mark.parametrize("other", ["cpu", "axon:1"])
@pytest.mark.parametrize("which", ["A", "B"])
def test_solve_with_tensors_on_two_devices_is_pytorchs_error(other, which):
    # was an internal assert of ATen's structured wrapper ("structured kernels don't
    # support multi-device outputs")
    A = make((3, 3), torch.float32, seed=1) + 3 * torch.eye(3)
    B = make((3, 2), torch.float32, seed=2)
    A, B = (A.to(other), B.axon()) if which == "A" else (A.axon(), B.to(other))
    for fn in (torch.linalg.solve, torch.linalg.solve_ex):
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            fn(A, B)


ADDR_SCALAR_CASES = [
    (torch.float32, dict(beta=True)), (torch.float32, dict(alpha=True)),
    (torch.int64, dict(beta=2.0)), (torch.int64, dict(alpha=1.5)),
    (torch.bool, dict(beta=True, alpha=False)), (torch.int64, dict(beta=2, alpha=-1)),
    (torch.bfloat16, dict(beta=0.5, alpha=2)),
]


@pytest.mark.parametrize("dtype, scalars", ADDR_SCALAR_CASES)
@pytest.mark.parametrize("form", ["functional", "out", "inplace"])
def test_addr_checks_its_scalars_like_cpu(dtype, scalars, form):
    # a bool beta/alpha on non-bool results, or a float one on integer results, is the
    # CPU's error; valid ones compute the CPU's values
    m, v1, v2 = (make(s, dtype, seed=i) for i, s in enumerate([(3, 4), (3,), (4,)]))

    def run(dev):
        a, b, c = m.clone().to(dev), v1.to(dev), v2.to(dev)
        if form == "functional":
            return torch.addr(a, b, c, **scalars)
        if form == "out":
            return torch.addr(a, b, c, out=torch.empty_like(a), **scalars)
        return a.addr_(b, c, **scalars)

    try:
        expected = run("cpu")
    except RuntimeError as e:
        with pytest.raises(RuntimeError, match=re.escape(str(e))):
            run(AXON)
        return
    assert_same(run(AXON), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
def test_eigvals_matches_cpu_and_rejects_non_finite_input_without_crashing(dtype):
    """linalg.eigvals without gradients: the CPU's eigenvalues (batched,
    non-contiguous, zero-size), and for an input with inf or NaN linalg.eig's
    error: ATen's CPU _linalg_eigvals skips that check and LAPACK crashes the
    process (run in a child so that a crash fails only this test)."""
    for shape, view in (((3, 5, 5), lambda t: t), ((5, 5), lambda t: t.mT),
                        ((0, 4, 4), lambda t: t)):
        a = view(make(shape, dtype, seed=4))
        want = torch.linalg.eigvals(a)
        got = torch.linalg.eigvals(a.axon()).cpu()
        assert got.dtype == want.dtype and got.shape == want.shape
        # The same eigenvalues up to order: sorted by (real, imag).
        key = lambda v: v.real * 1e6 + v.imag  # noqa: E731
        torch.testing.assert_close(got.gather(-1, key(got).argsort(-1)),
                                   want.gather(-1, key(want).argsort(-1)),
                                   rtol=1e-4, atol=1e-4)
        # out=: resized, cast to its dtype (complex128 takes complex64's values),
        # and ATen's error for a dtype the values cannot be cast to
        out = torch.empty(7, dtype=torch.complex128, device="axon")
        torch.linalg.eigvals(a.axon(), out=out)
        want_out = torch.linalg.eigvals(a, out=torch.empty(7, dtype=torch.complex128))
        assert out.shape == want_out.shape
        torch.testing.assert_close(out.cpu().gather(-1, key(out.cpu()).argsort(-1)),
                                   want_out.gather(-1, key(want_out).argsort(-1)),
                                   rtol=1e-4, atol=1e-4)
        with pytest.raises(RuntimeError, match="safely castable") as cpu_err:
            torch.linalg.eigvals(a, out=torch.empty(0, dtype=torch.float32))
        with pytest.raises(RuntimeError, match="safely castable") as axon_err:
            torch.linalg.eigvals(a.axon(), out=torch.empty(0, dtype=torch.float32, device="axon"))
        assert str(axon_err.value) == str(cpu_err.value)
    r = run_python(f"""
        import torch
        for bad in (float("nan"), float("inf")):
            a = torch.randn(4, 4, dtype={dtype})
            a[1, 2] = bad
            for out in (False, True):
                try:
                    if out:
                        torch.linalg.eigvals(a.to("axon"), out=torch.empty(0, dtype=torch.complex128, device="axon"))
                    else:
                        torch.linalg.eigvals(a.to("axon"))
                    print("no error")
                except RuntimeError as e:
                    print("error", "should not contain infs or NaNs" in str(e))
    """)
    assert r.returncode == 0, r.stderr[-800:]
    assert r.stdout.split() == ["error", "True"] * 4, r.stdout
