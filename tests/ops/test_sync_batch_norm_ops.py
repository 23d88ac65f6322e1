"""The ops nn.SyncBatchNorm runs (batch_norm_stats, batch_norm_gather_stats(_with_counts),
batch_norm_elemt, batch_norm_backward_reduce, batch_norm_backward_elemt) and the
out_dtype matmuls (mm/bmm/addmm/baddbmm with out_dtype): ATen has them for CUDA only,
so the CPU fallback cannot run them; axon composes them from its own ops.

The references are independent CPU computations: SyncBatchNorm's algorithm run on
axon over the chunks of a batch (as ranks would) must give the CPU's F.batch_norm of
the whole batch (output, running statistics, input/weight/bias gradients); the
out_dtype products must equal the CPU's product of the inputs in float32.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import FLOAT_DTYPES, make, tol

EPS = 1e-5
MOMENTUM = 0.1


def input_of(layout, dtype, n=6, c=3):
    x = make((n, c, 4, 5), dtype, seed=3)
    if layout == "channels_last":
        return x.contiguous(memory_format=torch.channels_last)
    if layout == "sliced":  # non-contiguous: every other column of a wider tensor
        return make((n, c, 4, 10), dtype, seed=3)[..., ::2]
    return x


def sync_bn_on_axon(x, weight, bias, running_mean, running_var, grad_out, splits):
    """SyncBatchNorm's forward and backward (torch/nn/modules/_functions.py) with
    the batch split into `splits` chunks, one per pretend rank; all_gather and
    all_reduce are a stack and a sum over the chunks."""
    xs, gs = x.split(splits), grad_out.split(splits)
    stats = [torch.batch_norm_stats(c, EPS) for c in xs]
    counts = torch.tensor([[c.numel() // c.size(1)] for c in xs], device=x.device,
                          dtype=running_mean.dtype)
    mean_all = torch.stack([m for m, _ in stats])
    invstd_all = torch.stack([s for _, s in stats])
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        x, mean_all, invstd_all, running_mean, running_var, MOMENTUM, EPS, counts.view(-1))
    outs = [torch.batch_norm_elemt(c, weight, bias, mean, invstd, EPS) for c in xs]
    reduced = [torch.batch_norm_backward_reduce(g, c, mean, invstd, weight, True, True, True)
               for g, c in zip(gs, xs)]
    sum_dy = sum(r[0] for r in reduced)
    sum_dy_xmu = sum(r[1] for r in reduced)
    count_int = counts.view(-1).to(torch.int32)
    grads = [torch.batch_norm_backward_elemt(g, c, mean, invstd, weight, sum_dy, sum_dy_xmu,
                                             count_int) for g, c in zip(gs, xs)]
    grad_weight = sum(r[2] for r in reduced)
    grad_bias = sum(r[3] for r in reduced)
    return torch.cat(outs), torch.cat(grads), grad_weight, grad_bias


def batch_norm_on_cpu(x, weight, bias, running_mean, running_var, grad_out):
    xl = x.detach().double().requires_grad_()
    w = weight.detach().double().requires_grad_()
    b = bias.detach().double().requires_grad_()
    rm, rv = running_mean.double().clone(), running_var.double().clone()
    out = F.batch_norm(xl, rm, rv, w, b, training=True, momentum=MOMENTUM, eps=EPS)
    out.backward(grad_out.double())
    return out.detach(), xl.grad, w.grad, b.grad, rm, rv


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "sliced"])
@pytest.mark.parametrize("splits", [[6], [2, 4], [1, 2, 3]], ids=["1rank", "2ranks", "3ranks"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_sync_batch_norm_algorithm_matches_batch_norm_of_the_whole_batch(dtype, splits, layout):
    x = input_of(layout, dtype)
    c = x.size(1)
    weight = make((c,), torch.float32, 0.5, 1.5, seed=4)
    bias = make((c,), torch.float32, seed=5)
    grad_out = make(x.shape, dtype, seed=6)
    rm0, rv0 = make((c,), torch.float32, seed=7), make((c,), torch.float32, 0.5, 2.0, seed=8)
    expected = batch_norm_on_cpu(x, weight, bias, rm0, rv0, grad_out)

    rm, rv = rm0.to("axon"), rv0.to("axon")
    out, grad_in, grad_w, grad_b = sync_bn_on_axon(
        x.to("axon"), weight.to("axon"), bias.to("axon"), rm, rv, grad_out.to("axon"), splits)
    assert out.dtype == dtype and grad_in.dtype == dtype
    assert grad_w.dtype == torch.float32 and grad_b.dtype == torch.float32
    t = tol(dtype, accum=True)
    torch.testing.assert_close(out.cpu().double(), expected[0], **t)
    torch.testing.assert_close(grad_in.cpu().double(), expected[1], **t)
    # weight/bias gradients sum a whole channel: float32 sums of rounded inputs
    wt = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=1e-1)
    torch.testing.assert_close(grad_w.cpu().double(), expected[2], **wt)
    torch.testing.assert_close(grad_b.cpu().double(), expected[3], **wt)
    torch.testing.assert_close(rm.cpu().double(), expected[4], **tol(torch.float32, accum=True))
    torch.testing.assert_close(rv.cpu().double(), expected[5], **tol(torch.float32, accum=True))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_batch_norm_stats_dtypes_and_values(dtype):
    x = make((5, 4, 7), dtype, seed=1)
    mean, invstd = torch.batch_norm_stats(x.to("axon"), EPS)
    assert mean.dtype == invstd.dtype == torch.float32  # the accumulate type, as CUDA's
    var, m = torch.var_mean(x.double(), dim=(0, 2), correction=0)
    torch.testing.assert_close(mean.cpu().double(), m, **tol(torch.float32, accum=True))
    torch.testing.assert_close(invstd.cpu().double(), (var + EPS).rsqrt(),
                               **tol(torch.float32, accum=True))


def test_batch_norm_gather_stats_with_a_fixed_count():
    x = make((8, 3, 5), torch.float32, seed=2)
    chunks = x.to("axon").split(4)
    stats = [torch.batch_norm_stats(c, EPS) for c in chunks]
    mean, invstd = torch.batch_norm_gather_stats(
        x.to("axon"), torch.stack([s[0] for s in stats]), torch.stack([s[1] for s in stats]),
        None, None, MOMENTUM, EPS, 4 * 5)
    var, m = torch.var_mean(x.double(), dim=(0, 2), correction=0)
    torch.testing.assert_close(mean.cpu().double(), m, **tol(torch.float32, accum=True))
    torch.testing.assert_close(invstd.cpu().double(), (var + EPS).rsqrt(),
                               **tol(torch.float32, accum=True))


def test_batch_norm_elemt_out_and_zero_size():
    x = make((4, 3, 2), torch.float32, seed=3).to("axon")
    mean, invstd = torch.batch_norm_stats(x, EPS)
    out = torch.empty(0, device="axon")
    torch.batch_norm_elemt(x, None, None, mean, invstd, EPS, out=out)
    expected = (x.cpu() - mean.cpu().view(1, 3, 1)) * invstd.cpu().view(1, 3, 1)
    torch.testing.assert_close(out.cpu(), expected, **tol(torch.float32))
    empty = torch.empty(0, 3, 2, device="axon")
    assert torch.batch_norm_elemt(empty, None, None, mean, invstd, EPS).shape == (0, 3, 2)


def test_sync_batch_norm_ops_refuse_bad_input_like_cuda():
    x = torch.ones(4, 3, device="axon", dtype=torch.int64)
    with pytest.raises(NotImplementedError, match="batch_norm_stats.*Long"):
        torch.batch_norm_stats(x, EPS)
    xf = x.float()
    mean, invstd = torch.batch_norm_stats(xf, EPS)
    with pytest.raises(RuntimeError, match="mean and invstd need to have the same data types"):
        torch.batch_norm_backward_reduce(xf, xf, mean, invstd.double(), None, True, False, False)
    with pytest.raises(RuntimeError, match="same device"):
        torch.batch_norm_elemt(xf, None, None, mean.cpu(), invstd, EPS)


# ---------------------------------------------------------------- out_dtype matmuls

@pytest.mark.parametrize("in_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_out_dtype_matmuls_match_the_float32_product(in_dtype):
    a, b = make((5, 7), in_dtype, seed=1), make((7, 3), in_dtype, seed=2)
    b1, b2 = make((2, 5, 7), in_dtype, seed=3), make((2, 7, 3), in_dtype, seed=4)
    bias, bbias = make((5, 3), in_dtype, seed=5), make((2, 5, 3), in_dtype, seed=6)
    f = torch.float32
    cases = {
        "mm": (lambda d, *t: torch.mm(*t, out_dtype=d), (a, b),
               lambda: a.to(f) @ b.to(f)),
        "bmm": (lambda d, *t: torch.bmm(*t, out_dtype=d), (b1, b2),
                lambda: b1.to(f) @ b2.to(f)),
        "addmm": (lambda d, *t: torch.addmm(*t, out_dtype=d, beta=0.5, alpha=2.0), (bias, a, b),
                  lambda: 0.5 * bias.to(f) + 2.0 * (a.to(f) @ b.to(f))),
        "baddbmm": (lambda d, *t: torch.baddbmm(*t, out_dtype=d, beta=0.5, alpha=2.0),
                    (bbias, b1, b2), lambda: 0.5 * bbias.to(f) + 2.0 * (b1.to(f) @ b2.to(f))),
    }
    for name, (fn, args, ref) in cases.items():
        got = fn(torch.float32, *(t.to("axon") for t in args))
        assert got.dtype == torch.float32, name
        # inputs exact in float32: the product is float32 arithmetic on both sides
        torch.testing.assert_close(got.cpu(), ref(), **tol(torch.float32, accum=True), msg=name)
        same = fn(in_dtype, *(t.to("axon") for t in args))
        assert same.dtype == in_dtype, name
        torch.testing.assert_close(same.cpu().float(), ref(), **tol(in_dtype, accum=True), msg=name)
    out = torch.empty(5, 3, device="axon")
    torch.mm(a.to("axon"), b.to("axon"), out_dtype=torch.float32, out=out)
    torch.testing.assert_close(out.cpu(), a.to(f) @ b.to(f), **tol(torch.float32, accum=True))


def test_out_dtype_matmul_errors_as_cuda():
    a = torch.ones(2, 3, device="axon", dtype=torch.float32)
    with pytest.raises(RuntimeError, match="out_dtype must be the same as input dtype or fp32"):
        torch.mm(a, a.t(), out_dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
        torch.mm(a.bfloat16(), a.bfloat16(), out_dtype=torch.float32)
    with pytest.raises(RuntimeError, match="out_dtype must be the same as the dtype of the provided"):
        torch.mm(a.half(), a.t().half(), out_dtype=torch.float32,
                 out=torch.empty(2, 2, device="axon", dtype=torch.half))
    with pytest.raises(RuntimeError, match="self must have the same shape as the output"):
        torch.baddbmm(torch.ones(1, 2, 2, device="axon", dtype=torch.half),
                      torch.ones(3, 2, 3, device="axon", dtype=torch.half),
                      torch.ones(3, 3, 2, device="axon", dtype=torch.half), out_dtype=torch.float32)


def test_constant_channel_without_epsilon_has_invstd_zero_as_cuda():
    x = make((4, 2, 3), torch.float32, seed=1)
    x[:, 1] = 2.5  # constant channel: variance 0
    mean, invstd = torch.batch_norm_stats(x.to("axon"), 0.0)
    assert invstd[1].item() == 0.0 and torch.isfinite(invstd).all()
    torch.testing.assert_close(mean.cpu()[1], torch.tensor(2.5))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sync_batch_norm_with_16_bit_parameters(dtype):
    """A module converted to 16 bits: weight, bias and running statistics in the
    input's dtype; grad_weight/grad_bias come out in it too (CUDA's rule)."""
    x = input_of("contiguous", dtype)
    c = x.size(1)
    weight = make((c,), dtype, 0.5, 1.5, seed=4)
    bias = make((c,), dtype, seed=5)
    grad_out = make(x.shape, dtype, seed=6)
    rm0, rv0 = make((c,), dtype, seed=7), make((c,), dtype, 0.5, 2.0, seed=8)
    expected = batch_norm_on_cpu(x, weight, bias, rm0, rv0, grad_out)
    rm, rv = rm0.to("axon"), rv0.to("axon")
    out, grad_in, grad_w, grad_b = sync_bn_on_axon(
        x.to("axon"), weight.to("axon"), bias.to("axon"), rm, rv, grad_out.to("axon"), [2, 4])
    assert grad_w.dtype == dtype and grad_b.dtype == dtype and rm.dtype == dtype
    t = tol(dtype, accum=True)
    torch.testing.assert_close(out.cpu().double(), expected[0], **t)
    torch.testing.assert_close(grad_in.cpu().double(), expected[1], **t)
    torch.testing.assert_close(grad_w.cpu().double(), expected[2], rtol=2e-2, atol=2e-1)
    torch.testing.assert_close(rm.cpu().double(), expected[4], **t)
    torch.testing.assert_close(rv.cpu().double(), expected[5], **t)


def test_sync_batch_norm_ops_check_stat_shapes_and_out_dtype():
    x = torch.ones(4, 3, 2, device="axon")
    mean, invstd = torch.batch_norm_stats(x, EPS)
    with pytest.raises(RuntimeError, match=r"expected mean and invstd of shape \[3\]"):
        torch.batch_norm_elemt(x, None, None, mean[:2], invstd[:2], EPS)
    with pytest.raises(RuntimeError, match=r"expected mean and invstd of shape \[3\]"):
        torch.batch_norm_backward_reduce(x, x, mean[:2], invstd[:2], None, True, False, False)
    with pytest.raises(RuntimeError, match="expected out of dtype"):
        torch.batch_norm_elemt(x, None, None, mean, invstd, EPS,
                               out=torch.empty(0, device="axon", dtype=torch.float64))
